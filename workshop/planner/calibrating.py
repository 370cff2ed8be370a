"""The machine in front of the learner, measured as the planner's records.

:func:`calibrate` times, with the threads one rank of a job gets, matrix products at
the model's own sizes, memory bandwidth (STREAM's "add"), one small operation's cost
and all-reduce bus bandwidth by size on 2 ranks (nccl-tests' ``busbw``), into a
:class:`~workshop.planner.calibration.Calibration`. Each figure is a median of
samples that each last a few milliseconds, so neither the timer's tick nor one
preempted call on a busy machine decides it.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..env import backend_name
from .calibration import Calibration
from .layout import ModelShape, check_counts, model_shape

__all__ = ["calibrate", "calibrate_here", "matmul_shapes", "rank_threads"]

#: Sequences per micro-batch whose token counts calibrate() times the model's
#: products at by default: a small batch and the large one of the calibrated job
#: (tests/planner/test_calibrate.py trains "tiny" with micro_batch=256).
MICRO_BATCHES = (2, 256)
#: All-reduce message sizes in bytes: from where latency rules to a few MiB, past
#: the 0.86 MB of "tiny"'s gradients that DDP reduces in one bucket.
ALLREDUCE_BYTES = (4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)
_QUICK_ALLREDUCE = (4 << 10, 256 << 10, 1 << 20)


def rank_threads(cpus_per_task: int | None = None, ranks_per_node: int = 1) -> int:
    """The compute threads one CPU rank of a ``write_job`` job runs: its node's
    ``--cpus-per-task`` shared by the node's ranks (1 by default).

    Example:
        >>> rank_threads(), rank_threads(8, 2)
        (1, 4)
    """
    cpus = ranks_per_node if cpus_per_task is None else cpus_per_task
    check_counts("rank_threads", cpus_per_task=cpus, ranks_per_node=ranks_per_node)
    return max(1, cpus // ranks_per_node)


def matmul_shapes(
    model: str | ModelShape = "tiny",
    tokens: Sequence[int] = (),
    squares: Sequence[int] = (64, 256, 1024),
) -> list[tuple[int, int, int]]:
    """The ``(m, n, k)`` of the products to time: ``squares`` and the model's block
    and head products at each token count, smallest FLOPs first, each once.

    Example:
        >>> matmul_shapes("tiny", [64], squares=[128])[:2]
        [(64, 64, 64), (64, 64, 256)]
    """
    shape = model_shape(model)
    if shape.kind != "transformer":
        raise ValueError(
            f"matmul_shapes: model={shape.name!r} is a module; the products timed "
            "are a transformer's: use one of MODELS such as 'tiny'"
        )
    h, f, v = shape.hidden, shape.ffn, shape.vocab
    kv = shape.kv_heads * shape.head_dim
    found = {(s, s, s) for s in squares}
    for t in tokens:
        check_counts("matmul_shapes", tokens=t)
        forward = {(t, h, h), (t, kv, h), (t, f, h), (t, h, f), (t, v, h)}
        # Each weight's gradient: K = tokens (the input's gradient has M = tokens
        # and the forward's shape turned, close to the forward's FLOPs and rate).
        found |= forward | {(k, n, t) for _, n, k in forward}
    return sorted(found, key=lambda mnk: (mnk[0] * mnk[1] * mnk[2], mnk))


def _processor() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it (or platform's guess)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


# --- timing -------------------------------------------------------------------------
def _resolution() -> float:
    """The timer's tick: the least time a sample counts, so none is ever 0."""
    return max(time.get_clock_info("perf_counter").resolution, 1e-9)


def _per_call(
    call: Callable[[], Any],
    sync: Callable[[], None],
    least: float,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds per call of ``call()``, repeated until the sample lasts ``least``."""
    sync()
    count, start = 0, clock()
    while True:
        call()
        count += 1
        if count & (count - 1) == 0 or count % 64 == 0:  # sync rarely: 1, 2, 4, ...
            sync()
            took = clock() - start
            if took >= least:
                return took / count


def _median_per_call(
    call: Callable[[], Any],
    sync: Callable[[], None],
    samples: int,
    least: float,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """The median of ``samples`` samples of :func:`_per_call`, after one warm-up."""
    _per_call(call, sync, least, clock)
    return statistics.median(
        _per_call(call, sync, least, clock) for _ in range(samples)
    )


def _clock(device: Any) -> Callable[[], float]:
    """CPU time on a CPU (a busy machine does not stretch it; job_train's
    ``step_cpu_s`` is timed the same way), wall clock on a GPU."""
    return time.process_time if device.type == "cpu" else time.perf_counter


def _sync(device: Any) -> Callable[[], None]:
    """What waits for ``device``'s queued work before a clock is read."""
    import torch

    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


# --- what every rank of the all-reduce launch runs ----------------------------------
def allreduce_times(sizes: Sequence[int], samples: int, least: float) -> list[float]:
    """Seconds of one all-reduce of each size in bytes, the slowest rank's median;
    run in every rank of a process group (``workshop.launch``).

    Each sample is the same number of calls on every rank, after a barrier.
    """
    import torch
    import torch.distributed as dist

    from ..env import rank_device

    device = rank_device()
    ids = {"device_ids": [device.index]} if device.type == "cuda" else {}
    sync = _sync(device)
    found = []
    for size in sizes:
        x = torch.ones(max(1, size // 4), device=device)
        for _ in range(3):  # warm-up: the first calls set up connections and buffers
            dist.all_reduce(x)
        sync()
        start = time.perf_counter()
        dist.all_reduce(x)
        sync()
        once = torch.tensor([time.perf_counter() - start], device=device)
        dist.all_reduce(once, op=dist.ReduceOp.MAX)  # every rank the same count
        calls = max(1, min(1000, math.ceil(least / max(once.item(), _resolution()))))
        mine = []
        for _ in range(samples):
            dist.barrier(**ids)
            start = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(x)
            sync()
            mine.append(max(time.perf_counter() - start, _resolution()) / calls)
        slowest = torch.tensor(mine, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        found.append(statistics.median(slowest.tolist()))
    return found


# --- measuring ----------------------------------------------------------------------
def _device_memory_gb(device: Any) -> float:
    import torch

    from ..allocation import available_memory

    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 1e9
    return (available_memory() or 0) / 1e9 or 1.0


def _measure_here(
    shapes: Sequence[tuple[int, int, int]],
    device: Any,
    dtype: Any,
    samples: int,
    least: float,
    stream_bytes: int,
) -> tuple[list[tuple[int, int, int, float]], float, int, float]:
    """Matrix products, memory bandwidth and the small op, in this process."""
    import torch

    sync, clock = _sync(device), _clock(device)
    points = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        c = torch.empty(m, n, device=device, dtype=dtype)
        seconds = _median_per_call(
            lambda a=a, b=b, c=c: torch.mm(a, b, out=c), sync, samples, least, clock
        )
        points.append((m, n, k, 2.0 * m * n * k / seconds))
    del a, b, c
    count = stream_bytes // 4
    x, y = torch.ones(count, device=device), torch.ones(count, device=device)
    z = torch.empty_like(x)
    add = _median_per_call(lambda: torch.add(x, y, out=z), sync, samples, least, clock)
    one = torch.ones(1, device=device)
    out = torch.empty_like(one)
    small = _median_per_call(
        lambda: torch.add(one, one, out=out), sync, samples, least, clock
    )
    return points, 3 * count * 4 / add / 1e9, count * 4, small


def _slowest(found: list[tuple]) -> tuple:
    """Each figure the slowest rank's: a job's step ends with its slowest rank."""
    if len(found) == 1:
        return found[0]
    nbytes, where = found[0][2], found[0][6]

    def worst(lists, width):
        return [
            (*row[0][:width], min(r[width] for r in row))
            for row in zip(*lists, strict=True)
        ]

    return (
        worst([f[0] for f in found], 3),
        min(f[1] for f in found),
        nbytes,
        max(f[3] for f in found),
        worst([f[4] for f in found], 3),
        worst([f[5] for f in found], 1),
        where,
    )


def _measure_rank(
    shapes, shape, tokens, precision, threads, samples, least, stream
) -> tuple:
    """Everything :func:`calibrate` times in one rank of a launch."""
    import torch

    from ..env import rank_device

    device = rank_device()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    torch.set_num_threads(threads)
    here = _measure_here(shapes, device, dtype, samples, least, stream)
    linear, families = _measure_families(shape, tokens, device, dtype, samples, least)
    cuda = device.type == "cuda"
    where = {
        "processor": torch.cuda.get_device_name(device) if cuda else _processor(),
        "device": device.type,
        "memory_gb": _device_memory_gb(device),
    }
    return (*here, linear, families, where)


def _measure_families(
    shape: ModelShape, tokens: int, device: Any, dtype: Any, samples: int, least: float
) -> tuple[list[tuple[int, int, int, float]], list[tuple[str, float]]]:
    """The model's products and each family of operations, forward and backward, as
    rates of what :mod:`~workshop.planner.operations` counts, so that the estimate
    of the same shape on this machine is the time measured."""
    import torch
    from torch import nn

    from .operations import OPTIMIZER_BYTES
    from .transformer import Block, Transformer

    sync = _sync(device)
    e = 2 if dtype == torch.bfloat16 else 4
    h, f, v, s = shape.hidden, shape.ffn, shape.vocab, shape.seq
    b = max(1, tokens // s)
    t = b * s

    def timed(call: Callable[[], Any]) -> float:
        return _median_per_call(call, sync, samples, least, _clock(device))

    def leaf(*size: int, dt: Any = dtype) -> torch.Tensor:
        return torch.randn(*size, device=device, dtype=dt, requires_grad=True)

    def through(fn: Callable[[], torch.Tensor], grad: torch.Tensor) -> float:
        return timed(lambda: fn().backward(grad))

    kv = shape.kv_heads * shape.head_dim
    linear = []
    for n, k in sorted({(h, h), (kv, h), (f, h), (h, f), (v, h)}):
        x, w = leaf(t, k), leaf(n, k)
        g = torch.ones(t, n, device=device, dtype=dtype)
        seconds = through(lambda x=x, w=w: nn.functional.linear(x, w), g)
        linear.append((t, n, k, 3 * 2.0 * t * n * k / seconds))
    block = Block(shape).to(device=device, dtype=dtype)
    x, r = leaf(t, h), leaf(t, h)
    gh = torch.ones(t, h, device=device, dtype=dtype)
    gf = torch.ones(t, f, device=device, dtype=dtype)
    rates = [("norm", 5 * e * t * h / through(lambda: block.attn_norm(x), gh))]
    up = leaf(t, f)
    if shape.mlp == "swiglu":
        gate = leaf(t, f)
        act = through(lambda: nn.functional.silu(gate) * up, gf)
        rates.append(("activation", 8 * e * t * f / act))
    else:
        act = through(lambda: nn.functional.gelu(up), gf)
        rates.append(("activation", 5 * e * t * f / act))
    rates.append(("residual", 6 * e * t * h / through(lambda: x + r, gh)))
    logits = leaf(t, v, dt=torch.float32)
    target = torch.randint(0, v, (t,), device=device)
    loss = timed(lambda: nn.functional.cross_entropy(logits, target).backward())
    rates.append(("loss", 16 * t * v / loss))
    heads, d = shape.heads, shape.head_dim
    q, k_, v_ = (leaf(b, heads, s, d) for _ in range(3))
    go = torch.ones(b, heads, s, d, device=device, dtype=dtype)

    def attend() -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(q, k_, v_, is_causal=True)

    # QK and PV under the causal mask, forward and backward: 3 x 2 s^2 d b a
    rates.append(("attention", 6.0 * s * s * d * b * heads / through(attend, go)))
    # The model's own tensors, as the job's optimizer holds them (fp32 weights).
    model = Transformer(shape).to(device)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    adam = torch.optim.Adam(params, lr=1e-6)
    per_param, _ = OPTIMIZER_BYTES["pytorch"]
    psi = sum(p.numel() for p in params)
    rates.append(("optimizer", per_param * psi / timed(adam.step)))
    return linear, rates


def calibrate(
    threads: int | None = None,
    *,
    quick: bool = False,
    model: str | ModelShape = "tiny",
    tokens: Sequence[int] | None = None,
    precision: str | None = None,
    samples: int | None = None,
    ranks: int = 1,
    timeout: float = 300.0,
) -> Calibration:
    """Measure this machine: matrix products by size, memory bandwidth, one small
    op's cost, and all-reduce busbw by size on 2 ranks.

    Args:
        threads: compute threads for the CPU figures (default :func:`rank_threads`).
        quick: fewer sizes and samples, smaller tensors: seconds, not a minute.
        model: the transformer whose products are timed besides the squares.
        tokens: token counts (default: ``model.seq`` x :data:`MICRO_BATCHES`).
        precision: "fp32" or "bf16" (default: bf16 on a GPU, fp32 on a CPU).
        samples: timed samples per figure (default 5; 3 when quick).
        ranks: processes measuring at once, the slowest kept: as many as the job's
            ranks on one machine, so they share it as the job's do.
        timeout: seconds before the all-reduce's ranks are stopped.

    Returns:
        The :class:`Calibration`.

    Raises:
        ValueError: a bad argument, naming it and the fix.
        LaunchError: the all-reduce's ranks failed.
    """

    from ..env import visible_gpu_count
    from ..ranks.launcher import launch

    shape = model_shape(model)
    matmul_shapes(shape, tokens or ())  # refuses a module or a bad count, at once
    threads = rank_threads() if threads is None else threads
    check_counts("calibrate", threads=threads)
    samples = (3 if quick else 5) if samples is None else samples
    check_counts("calibrate", samples=samples)
    if tokens is None:
        tokens = [shape.seq * b for b in MICRO_BATCHES]
    gpus = visible_gpu_count()
    precision = precision or ("bf16" if gpus else "fp32")
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"calibrate: precision={precision!r}; use 'fp32' or 'bf16'")
    # Nothing touches CUDA here: the rank below measures on its own device.
    cuda = gpus > 0
    squares = (256, 1024, 4096, 8192) if cuda else (64, 256, 1024)
    # The squares alone; the model's own products are timed as its layers run them.
    shapes = matmul_shapes(shape, (), squares[:2] if quick else squares)
    # A sample lasts this long at least: well above the timer's tick and a
    # preempted thread's slice, well below what a busy machine's noise averages.
    least = 0.005 if quick else 0.02
    # Bytes of one tensor of the add: far above any cache (a GPU's L2 is 50 MB).
    stream = (256 << 20 if cuda else 64 << 20) >> (2 * quick)
    # In a rank of its own: a backward pass in the learner's kernel would stop later
    # launches from forking it on a GPU machine (workshop.ranks.forkable.fork_hazard).
    check_counts("calibrate", ranks=ranks)
    here = launch(
        _measure_rank, shapes, shape, max(tokens), precision, threads, samples,
        least, stream, world_size=ranks, backend="gloo", timeout=timeout, show="none",
    )  # fmt: skip
    points, gbs, nbytes, small, linear, families, where = _slowest(here.returns)
    sizes = _QUICK_ALLREDUCE if quick else ALLREDUCE_BYTES
    # NCCL needs a GPU per rank; with fewer than 2 the ranks all-reduce on the CPU.
    backend = "nccl" if gpus >= 2 else "gloo"
    run = launch(
        allreduce_times, sizes, samples, least,
        world_size=2, backend=backend, timeout=timeout, show="none",
    )  # fmt: skip
    measured = (points, gbs, nbytes, small, linear, families, where)
    return _record(measured, precision, threads, sizes, run.returns[0], backend, 2)


def _record(measured, precision, threads, sizes, seconds, backend, n) -> Calibration:
    """The :class:`Calibration` of one process's figures and an all-reduce's."""
    import torch

    points, gbs, nbytes, small, linear, families, where = measured
    busbw = tuple(
        (size, size / t * 2 * (n - 1) / n / 1e9)
        for size, t in zip(sizes, seconds, strict=True)
    )
    return Calibration(
        processor=where["processor"],
        device=where["device"],
        precision=precision,
        threads=threads,
        memory_gb=where["memory_gb"],
        matmul_points=tuple(sorted(points + linear, key=lambda p: p[0] * p[1] * p[2])),
        operation_points=tuple(families),
        memory_gbs=gbs,
        memory_bytes=nbytes,
        launch_s=small,
        allreduce_backend=backend,
        allreduce_ranks=n,
        busbw_points=busbw,
        allreduce_small_s=seconds[0],
        torch_version=torch.__version__,
        host=platform.node() or os.uname().nodename,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )


def calibrate_here(model: str | ModelShape, precision: str, tokens: int) -> Calibration:
    """:func:`calibrate` inside a running job: every rank calls it, measuring the
    machine as its steps will share it, and all-reduces over the job's own group."""
    import torch
    import torch.distributed as dist

    shape = model_shape(model)
    # A job's group on GPUs is "cpu:gloo,cuda:nccl": its all-reduce runs on NCCL.
    backend = backend_name(dist.get_backend())
    cuda = torch.cuda.is_available() and backend == "nccl"
    squares = (256, 1024, 4096) if cuda else (64, 256, 1024)
    least, samples = 0.02, 3
    stream = 256 << 20 if cuda else 64 << 20
    threads = torch.get_num_threads()
    shapes = matmul_shapes(shape, (), squares)
    measured = _measure_rank(
        shapes, shape, tokens, precision, threads, samples, least, stream
    )
    seconds = allreduce_times(ALLREDUCE_BYTES, samples, least)
    return _record(
        measured, precision, threads, ALLREDUCE_BYTES, seconds, backend,
        dist.get_world_size(),
    )  # fmt: skip
