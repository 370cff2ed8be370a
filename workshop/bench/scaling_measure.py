"""Measuring scaling: :func:`scaling_worker` on every rank of a process group (however
the rank was started), and :func:`measure_scaling`, which checks the settings, launches
the worker once per world size and mode, and builds a :class:`ScalingResult`.

Every rank alternates a DDP step with the same step under ``no_sync()``, each started
together by an untimed barrier. The difference of the median step times is the
communication a step *waits for* (all-reduce not hidden behind backward, and waiting
for a slower rank): what costs throughput. A DDP comm hook also keeps the all-reduce
time in flight. Only gradients cross the network; the data is synthetic, in memory.
The alpha-beta model (:mod:`workshop.comm.costmodel`) predicts the gradient's
all-reduce from ``--alpha/--beta``, an all-reduce JSON, or a fit made in the run.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from typing import Any

from ..checks import one_of, whole, whole_list
from .allreduce_result import load_allreduce
from .scaling_results import MODES, ScalingResult, _row, assemble, ranks_text

__all__ = ["measure_scaling", "scaling_batch", "scaling_worker"]

CNN_NAMES = ("cnn", "smallcnn")
_FIT_REPEATS = 5
_CNN_MIN_IMAGE = 4  # pixels: SmallCNN's two 2x2 poolings need 4 to leave 1


def scaling_batch(mode: str, batch: int, world_size: int) -> int:
    """Samples each rank computes per step: ``batch`` (weak), or ``batch //
    world_size`` (strong, ``batch`` is global).

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
    """DDP's keyword that stops buffers being broadcast in every forward pass: torch
    2.15 renamed ``broadcast_buffers`` to ``forward_sync_buffers`` and warns on the
    old name (into every rank's output); torch 2.4 knows only the old one."""
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
    ``bucket`` and the result are unannotated on purpose: DDP refuses a hook whose
    annotations are not the very classes ``dist.GradBucket`` and ``Future``."""
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
    """CIFAR's 32 for the CNN, ImageNet's 224 for a ResNet."""
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

    Runs inside an initialised process group: ``workshop.launch(scaling_worker, ...)``,
    or ``with workshop.process_group():`` under torchrun, srun or mpirun.

    Args:
        mode: "weak" or "strong" (see :func:`scaling_batch`).
        batch: samples per rank (weak) or global samples per step (strong).
        steps: timed steps of each kind (with and without all-reduce).
        warmup: untimed steps of each kind first.
        model: "cnn" (the workshop's SmallCNN) or a ResNet name such as "resnet18".
        image_size: the synthetic images' side (None: :func:`default_image_size`).
        fit_sizes: all-reduce sizes in bytes to time afterwards for the alpha-beta
            fit; none on one rank.
        seed: seeds the weights and the data.

    Returns:
        Plain data: the settings, every rank's step times (``step_seconds``,
        ``compute_seconds``: a list per rank), this rank's all-reduce time in flight
        per step, and its times of ``fit_sizes``.

    Raises:
        RuntimeError: no process group is initialised.
        ValueError: a global batch that does not divide by the world size.

    Example:
        >>> run = launch(scaling_worker, world_size=2, steps=5)    # doctest: +SKIP
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from ..env import backend_name, rank_device
    from ..training.data import synthetic
    from ..training.steps import train_step

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "scaling_worker needs a process group; run it with "
            "workshop.launch(scaling_worker, world_size=2), or inside "
            "`with workshop.process_group():` under torchrun"
        )
    rank, world_size = dist.get_rank(), dist.get_world_size()
    backend = backend_name(dist.get_backend())  # "nccl" for "cpu:gloo,cuda:nccl"
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
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
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
        "device": name,
        "step_seconds": [g[0] for g in gathered],
        "compute_seconds": [g[1] for g in gathered],
        "allreduce_seconds": allreduce_times,
        "fit_sizes": list(fit_sizes) if fit_seconds else [],
        "fit_seconds": fit_seconds,
    }


# ------------------------------------------------------------------ measuring
def check_settings(
    world_sizes: Any,
    mode: str,
    steps: int,
    warmup: int,
    batch: int,
    model: str,
    image_size: int | None = None,
) -> tuple[list[int], list[str]]:
    from ..training.models import RESNETS

    world_sizes = whole_list("world_sizes", world_sizes, 1, fix="e.g. (1, 2, 4)")
    if len(set(world_sizes)) != len(world_sizes):
        raise ValueError(f"world_sizes={list(world_sizes)} repeats a rank count")
    one_of("mode", mode, (*MODES, "both"))
    whole("steps", steps, 1, fix="e.g. steps=20")
    whole("warmup", warmup, 0, fix="e.g. warmup=3")
    whole("batch", batch, 1, fix="e.g. batch=32")
    one_of("model", model, (*CNN_NAMES, *RESNETS))
    if image_size is not None:  # None: the model's default; 0 is not that
        # The CNN halves the image twice (2x2 pooling): below 4 pixels nothing is
        # left, and the ranks would fail in their first step.
        least = _CNN_MIN_IMAGE if model in CNN_NAMES else 1
        why = " (its two 2x2 poolings need 4)" if model in CNN_NAMES else ""
        whole(
            "image_size",
            image_size,
            least,
            fix=f"pixels for model {model!r}{why}; pass, e.g., image_size="
            f"{default_image_size(model)}, or None for that default",
        )
    return sorted(world_sizes), list(MODES) if mode == "both" else [mode]


def _gradient_bytes(model: str) -> int:
    net = build_model(model)[0]
    return sum(
        p.numel() * p.element_size() for p in net.parameters() if p.requires_grad
    )


def _fit_sizes(gradient_bytes: int) -> list[int]:
    """4 KiB (for latency), and 1/16, 1/4 and all of the gradient (for bandwidth)."""
    return sorted(
        {4096, *(max(4096, gradient_bytes // k // 4 * 4) for k in (16, 4, 1))}
    )


def _get(holder: Any, name: str) -> Any:
    return (
        holder.get(name) if isinstance(holder, Mapping) else getattr(holder, name, None)
    )


def given_alpha_beta(
    alpha: float | None, beta: float | None, allreduce_json: Any
) -> tuple[float, float, str] | None:
    """(alpha, beta, where they came from), or None to fit them in the run."""
    if (alpha is None) != (beta is None):
        raise ValueError(
            f"got alpha={alpha!r} and beta={beta!r}; pass both (alpha: seconds per "
            "ring step, beta: bytes/s per link) or neither, to fit them in the run"
        )
    if alpha is not None:
        if allreduce_json is not None:
            raise ValueError(
                "pass alpha and beta, or an all-reduce JSON file, not both"
            )
        numbers = all(
            isinstance(v, (int, float)) and not isinstance(v, bool)
            for v in (alpha, beta)
        )
        if not (numbers and 0 <= alpha < math.inf and 0 < beta < math.inf):
            raise ValueError(
                f"need alpha >= 0 and beta > 0, both finite numbers, got {alpha!r} and "
                f"{beta!r}; e.g. alpha=1e-5, beta=1e9"
            )
        where = f"given (alpha {alpha:g} s, beta {beta:g} B/s)"
        return float(alpha), float(beta), where
    if allreduce_json is None:
        return None
    data = load_allreduce(allreduce_json)
    fit = _get(data, "fit")
    fit = fit() if callable(fit) else fit  # a method that fits, or a stored fit
    for holder in (data, fit):
        a, b = _get(holder, "alpha"), _get(holder, "beta")
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
            return float(a), float(b), f"from {allreduce_json}"
    raise ValueError(
        f"{str(allreduce_json)!r} holds no alpha and beta fit; run "
        "`python -m workshop.bench allreduce` with its fit, or pass --alpha and --beta"
    )


def _progress(raw: dict[str, Any]) -> str:
    row = _row(raw, None)
    return (
        f"  {row.mode} scaling, {ranks_text(row.world_size)}, "
        f"{row.batch_per_rank} per rank: {row.samples_per_second:,.0f} samples/s, "
        f"{row.step_seconds * 1e3:.2f} ms per step, "
        f"compute {row.compute_seconds * 1e3:.2f} ms"
    )


def measure_scaling(
    world_sizes: Sequence[int] = (1, 2, 4),
    mode: str = "both",
    *,
    steps: int = 20,
    warmup: int = 5,
    batch: int = 32,
    global_batch: int | None = None,
    model: str = "cnn",
    image_size: int | None = None,
    backend: str = "auto",
    alpha: float | None = None,
    beta: float | None = None,
    allreduce_json: str | os.PathLike[str] | None = None,
    seed: int = 0,
    timeout: float = 600.0,
    verbose: bool = False,
) -> ScalingResult:
    """Measure DDP training at several world sizes, one launch each.

    Args:
        world_sizes: rank counts; speed-up and efficiency are against the smallest.
        mode: "weak" (``batch`` per rank), "strong" (``global_batch`` split across the
            ranks) or "both".
        steps, warmup: timed and untimed steps of each kind (with and without the
            all-reduce).
        batch: samples per rank per step in weak scaling.
        global_batch: samples per step in strong scaling (None: ``batch``); must
            divide by every world size.
        model: "cnn" (the workshop's SmallCNN) or a ResNet name ("resnet18", ...).
        image_size: None for 32 (the CNN, which needs 4 at least) or 224 (a ResNet).
        backend: "auto", "gloo" or "nccl", one for every world size: "auto" gives
            NCCL only where the largest world size has a GPU per rank.
        alpha, beta: the ring model's latency per step (s) and bandwidth per link
            (bytes/s), both or neither; fitted in the run when neither they nor
            ``allreduce_json`` (an all-reduce benchmark's JSON) are given.
        seed: seeds the weights and data.
        timeout: seconds each launch may take.
        verbose: print a line after each launch.

    Returns:
        A :class:`ScalingResult`: ``.table()``, ``.explain()``, ``.save(prefix)``.

    Raises:
        ValueError: bad settings, such as a global batch that does not divide by a
            world size, or NCCL with too few GPUs (before anything starts).
        workshop.LaunchError: a rank failed or a launch passed ``timeout``.

    Example:
        >>> result = measure_scaling((1, 2), mode="weak", steps=10)  # doctest: +SKIP
        >>> print(result.table())                                    # doctest: +SKIP
    """
    from ..env import choose_backend
    from ..ranks.launcher import launch

    sizes, modes = check_settings(
        world_sizes, mode, steps, warmup, batch, model, image_size
    )
    whole("seed", seed, 0, fix="e.g. seed=0")  # here, not in every rank's first line
    global_batch = batch if global_batch is None else global_batch
    if "strong" in modes:
        whole("global_batch", global_batch, 1, fix="e.g. global_batch=128")
        check_divides(global_batch, sizes)
    # Chosen once, for the largest world size: left to each launch, "auto" on a node
    # with 1 GPU would run 1 rank on the GPU (NCCL) and 2 on the CPU (gloo), and the
    # speed-up between them would compare two machines.
    backend = choose_backend(backend, max(sizes))
    given = given_alpha_beta(alpha, beta, allreduce_json)
    fit = [] if given else _fit_sizes(_gradient_bytes(model))
    work = dict(steps=steps, warmup=warmup, model=model, image_size=image_size)
    work["seed"] = seed
    raws = []
    for m in modes:
        for n in sizes:
            ranks = dict(world_size=n, backend=backend, timeout=timeout, show="none")
            batches = {"batch": batch if m == "weak" else global_batch}
            fits = {"fit_sizes": fit if m == modes[0] and n > 1 else []}
            run = launch(scaling_worker, mode=m, **ranks, **batches, **fits, **work)
            raws.append(run.returns[0])
            if verbose:
                print(_progress(raws[-1]), flush=True)
    return assemble(raws, steps=steps, warmup=warmup, launcher="workshop", given=given)
