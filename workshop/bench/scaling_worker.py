"""The per-rank side of the scaling benchmark: one DDP run at one world size.

:func:`scaling_worker` runs on every rank, inside an initialised process group, the
same whether ``workshop.launch`` or torchrun, srun or mpirun started the rank. It
alternates ordinary DDP steps with the same steps under ``no_sync()`` (no gradient
all-reduce: compute only), timing each, and records with a comm hook when each
bucket's all-reduce was in flight. See :mod:`workshop.bench.scaling_bench` for why.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from .scaling_results import MODES

__all__ = ["scaling_batch", "scaling_worker"]

CNN_NAMES = ("cnn", "smallcnn")
_FIT_REPEATS = 5


def scaling_batch(mode: str, batch: int, world_size: int) -> int:
    """Samples each rank computes per step.

    Args:
        mode: "weak" (``batch`` is per rank) or "strong" (``batch`` is global).
        batch: samples per rank (weak) or per step over all ranks (strong).
        world_size: ranks.

    Returns:
        ``batch`` for weak scaling, ``batch // world_size`` for strong scaling.

    Raises:
        ValueError: an unknown mode, or a global batch that does not divide by the
            world size.

    Example:
        >>> scaling_batch("strong", 64, 4)
        16
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not known; pass 'weak' or 'strong'")
    if mode == "strong":
        check_divides(batch, [world_size])
        return batch // world_size
    return batch


def check_divides(global_batch: int, world_sizes: Sequence[int]) -> None:
    bad = [n for n in world_sizes if global_batch % n]
    if bad:
        step = math.lcm(*world_sizes)
        fix = step * max(1, round(global_batch / step))
        raise ValueError(
            f"strong scaling splits the global batch of {global_batch} samples across "
            f"the ranks, but {global_batch} does not divide by world size "
            f"{', '.join(map(str, bad))}; pass a global batch that is a multiple of "
            f"{step} (for example {fix}), or world sizes that divide {global_batch}"
        )


# ------------------------------------------------------------------ per rank
def _no_buffer_sync() -> dict[str, bool]:
    """DDP's keyword that stops buffers being broadcast in every forward pass.

    torch 2.15 renamed ``broadcast_buffers`` to ``forward_sync_buffers`` and warns on
    the old name (into every rank's output); torch 2.4 knows only the old one.
    """
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    params = inspect.signature(DistributedDataParallel.__init__).parameters
    if "forward_sync_buffers" in params:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


class _AllReduceClock:
    """Start and end of each bucket's all-reduce, read once per step."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.spans: list[tuple[Any, Any]] = []

    def mark(self) -> Any:
        if self.cuda:  # a CUDA event marks a point in the GPU's own timeline
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def take(self) -> float:
        """Seconds in which at least one all-reduce was in flight, since last take."""
        spans, self.spans = self.spans, []
        if self.cuda and spans:
            first = spans[0][0]
            spans = [
                (first.elapsed_time(a) / 1e3, first.elapsed_time(b) / 1e3)
                for a, b in spans
            ]
        total, end = 0.0, -math.inf
        for a, b in sorted(spans):
            total += max(0.0, b - max(a, end))
            end = max(end, b)
        return total


def _timed_allreduce(clock: _AllReduceClock, bucket):
    """DDP's default all-reduce (average of the bucket), with its wall time noted.

    ``bucket`` and the return value are left unannotated on purpose: DDP refuses a
    hook whose annotations are not the very classes ``dist.GradBucket`` and
    ``torch.futures.Future``, and here they would be strings.
    """
    import torch.distributed as dist

    tensor = bucket.buffer().div_(dist.get_world_size())
    start = clock.mark()
    future = dist.all_reduce(tensor, async_op=True).get_future()

    def finish(done: Any) -> Any:
        # Runs when the all-reduce has finished (on the GPU: with the current stream
        # ordered after it, so the event recorded here marks its end).
        clock.spans.append((start, clock.mark()))
        return done.value()[0]

    return future.then(finish)


def default_image_size(model: str) -> int:
    """The synthetic images' side when none is given: CIFAR's 32 for the CNN,
    ImageNet's 224 for a ResNet."""
    return 32 if model in CNN_NAMES else 224


def build_model(name: str) -> tuple[Any, int, int]:
    """(model, image size by default, classes)."""
    from ..training.models import SmallCNN, resnet

    if name in CNN_NAMES:
        return SmallCNN(in_channels=3, num_classes=10), default_image_size(name), 10
    return resnet(name, num_classes=1000), default_image_size(name), 1000


def _time_allreduce(sizes: Sequence[int], device: Any) -> list[float]:
    """Median seconds of an all-reduce of each size in bytes (float32)."""
    import torch
    import torch.distributed as dist

    medians = []
    for size in sizes:
        tensor = torch.ones(max(1, size // 4), device=device)
        dist.all_reduce(tensor)  # first call sets up buffers: not timed
        times = []
        for _ in range(_FIT_REPEATS):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(tensor)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        medians.append(statistics.median(times))
    return medians


def scaling_worker(
    mode: str = "weak",
    batch: int = 32,
    *,
    steps: int = 20,
    warmup: int = 5,
    model: str = "cnn",
    image_size: int | None = None,
    fit_sizes: Sequence[int] = (),
    seed: int = 0,
) -> dict[str, Any]:
    """Time DDP steps with and without the gradient all-reduce on this rank.

    Runs inside an initialised default process group: on every rank of
    ``workshop.launch(scaling_worker, world_size=N, ...)``, or inside
    ``with workshop.process_group():`` under torchrun, srun or mpirun.

    Args:
        mode: "weak" or "strong" (see :func:`scaling_batch`).
        batch: samples per rank (weak) or global samples per step (strong).
        steps: timed steps of each kind (with and without all-reduce).
        warmup: untimed steps of each kind first.
        model: "cnn" (the workshop's SmallCNN) or a ResNet name such as "resnet18".
        image_size: height and width of the synthetic images (32 for the CNN, 224
            for a ResNet when None).
        fit_sizes: all-reduce sizes in bytes to time afterwards for the alpha-beta
            fit; none on one rank.
        seed: seeds the weights and the data.

    Returns:
        A dict of plain data: the settings, every rank's step times
        (``step_seconds``, ``compute_seconds``: one list per rank), this rank's
        all-reduce time in flight per step, and this rank's times of ``fit_sizes``.

    Raises:
        RuntimeError: no process group is initialised.
        ValueError: a global batch that does not divide by the world size.

    Example:
        >>> run = launch(scaling_worker, world_size=2, steps=5)    # doctest: +SKIP
        >>> run.returns[0]["step_seconds"]                       # doctest: +SKIP
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from ..env import backend_name
    from ..ranks.worker import rank_device
    from ..training.data import synthetic
    from ..training.steps import train_step

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "scaling_worker needs a process group; run it with "
            "workshop.launch(scaling_worker, world_size=2), or inside "
            "`with workshop.process_group():` under torchrun"
        )
    rank, world_size, backend = (
        dist.get_rank(),
        dist.get_world_size(),
        backend_name(dist.get_backend()),  # "nccl" for "cpu:gloo,cuda:nccl"
    )
    device = rank_device(backend)
    per_rank = scaling_batch(mode, batch, world_size)
    torch.manual_seed(seed)
    net, default_size, classes = build_model(model)
    size = default_size if image_size is None else image_size
    net = net.to(device)
    grads = [p for p in net.parameters() if p.requires_grad]
    ddp = DistributedDataParallel(
        net,
        device_ids=[device.index] if device.type == "cuda" else None,
        **_no_buffer_sync(),  # only gradients cross the network (docstring)
    )
    clock = _AllReduceClock(device.type == "cuda")
    ddp.register_comm_hook(clock, _timed_allreduce)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    # One global set of samples, each rank its slice: strong scaling computes the
    # same global batch at every world size.
    data = synthetic(per_rank * world_size, size, 3, classes, seed=seed)
    samples = [data[i] for i in range(rank * per_rank, (rank + 1) * per_rank)]
    x = torch.stack([s[0] for s in samples]).to(device)
    y = torch.stack([s[1] for s in samples]).to(device)

    def timed(sync: bool) -> float:
        t0 = time.perf_counter()
        with nullcontext() if sync else ddp.no_sync():
            train_step(ddp, [(x, y)], optimizer)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    step_times, allreduce_times, compute_times = [], [], []
    for i in range(warmup + steps):
        # A step with the all-reduce, then one without, each started together by a
        # barrier (untimed): both kinds see the same load on the machine, and no
        # rank's step includes waiting for another's previous step. (Parameters
        # drift apart after the steps without all-reduce; timing does not care.)
        for sync, times in ((True, step_times), (False, compute_times)):
            dist.barrier()
            seconds = timed(sync)
            if i >= warmup:
                times.append(seconds)
        in_flight = clock.take()
        if i >= warmup:
            allreduce_times.append(in_flight)
    dist.barrier()
    fit_seconds = _time_allreduce(fit_sizes, device) if world_size > 1 else []
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, (step_times, compute_times))
    return {
        "mode": mode,
        "world_size": world_size,
        "backend": backend,
        "batch_per_rank": per_rank,
        "global_batch": per_rank * world_size,
        "model": model,
        "image_size": size,
        "parameters": sum(p.numel() for p in grads),
        "gradient_bytes": sum(p.numel() * p.element_size() for p in grads),
        "threads_per_rank": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else "CPU",
        "step_seconds": [g[0] for g in gathered],
        "compute_seconds": [g[1] for g in gathered],
        "allreduce_seconds": allreduce_times,
        "fit_sizes": list(fit_sizes) if fit_seconds else [],
        "fit_seconds": fit_seconds,
    }
