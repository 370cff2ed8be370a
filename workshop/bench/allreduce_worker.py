"""All-reduce time, algbw and busbw per message size, and the ring model fitted to them:
what every rank runs (:func:`allreduce_sweep`), :func:`measure_allreduce` for a
notebook, and ``python -m workshop.bench allreduce`` (it starts the ranks itself, or
runs as one of torchrun's, srun's or mpirun's).

Each size is warmed up, then timed ``repeats`` times and for ``min_time`` seconds at
least, each call after a barrier; a repetition's time is the slowest rank's, as
nccl-tests reports. The sizes take turns in a shuffled order, so that other work on a
shared machine slows every size alike. A large memory copy on the rank's device,
counted as bytes copied per second, is a ceiling for busbw in practice: every byte an
all-reduce sends is copied on its way at least once.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._cli import above_zero, whole_number, zero_or_more
from ..allocation import available_memory
from ..checks import whole
from .allreduce_result import (
    DTYPE_BYTES,
    AllreduceResult,
    KiB,
    MiB,
    human_size,
    message_sizes,
    parse_size,
    plot_allreduce,
    save_allreduce,
)
from .bench_output import check_writable, count_option, save_or_keep

__all__ = [
    "MIN_REFERENCE_BYTES",
    "add_arguments",
    "allreduce_sweep",
    "check_reference",
    "check_sweep",
    "main",
    "measure_allreduce",
]

#: The smallest reference copy timed. A smaller one takes a few microseconds, where
#: the call's own cost and the timer, not memory, set the time: 4 bytes "copied" at
#: 0.004 GB/s made a 2-rank gloo sweep's busbw 160% to 800% of the "reference".
MIN_REFERENCE_BYTES = 1 * MiB


def check_reference(reference_bytes: int) -> int:
    """Check the size of the reference memory copy before any rank starts.

    Returns:
        ``reference_bytes``.

    Raises:
        ValueError: not a whole number of bytes, or below :data:`MIN_REFERENCE_BYTES`.

    Example:
        >>> check_reference(256 << 20)
        268435456
    """
    if (
        isinstance(reference_bytes, bool)
        or not isinstance(reference_bytes, int)
        or reference_bytes < MIN_REFERENCE_BYTES
    ):
        raise ValueError(
            f"a reference copy of {reference_bytes!r} bytes is too small to time: "
            f"give {human_size(MIN_REFERENCE_BYTES)} or more (--reference-size 1M, "
            f"reference_bytes={MIN_REFERENCE_BYTES}); the default is 256 MiB. A "
            "smaller copy takes a few microseconds, mostly the call's own cost, so "
            "its bandwidth says nothing about memory, and busbw would be compared "
            "with a meaningless figure"
        )
    return reference_bytes


def check_sweep(
    sizes: Sequence[int], repeats: int, warmup: int, min_time: float
) -> list[int]:
    """Check a sweep's options before any rank starts.

    Returns:
        The sizes, sorted and without repeats.

    Raises:
        ValueError: no sizes, a size that is not a positive multiple of 4 bytes,
            repeats below 1, warmup below 0 or min_time below 0.

    Example:
        >>> check_sweep([65536, 4096], repeats=20, warmup=5, min_time=1.0)
        [4096, 65536]
    """
    if not sizes:
        raise ValueError("sizes is empty; pass message sizes in bytes, e.g. [4096]")
    bad = [s for s in sizes if not isinstance(s, int) or s < 4 or s % DTYPE_BYTES]
    if bad:
        raise ValueError(
            f"sizes {bad} are not whole numbers of float32 values; give positive "
            f"multiples of {DTYPE_BYTES} bytes"
        )
    whole("repeats", repeats, fix="time each size at least once")
    whole("warmup", warmup, 0, fix="untimed calls per size")
    if not (isinstance(min_time, (int, float)) and 0 <= min_time < math.inf):
        raise ValueError(
            f"min_time={min_time!r}: give 0 or more seconds per size, a finite "
            "number; e.g. min_time=1.0"
        )
    return sorted(set(sizes))


def _usable_bytes(device: Any, ranks_here: int) -> int | None:
    """Its GPU's free memory, or the node's RAM shared by its ranks; None if unknown."""
    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    available = available_memory()
    return None if available is None else available // ranks_here


def _timed(call: Callable[[], object], device: Any) -> float:
    """Seconds ``call()`` took, the device's queued work included."""
    import torch

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    call()
    if cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _copy_seconds(device: Any, nbytes: int, repeats: int = 5) -> list[float]:
    """Seconds of each of ``repeats`` copies of ``nbytes`` (after one warm-up)."""
    import torch

    src = torch.ones(nbytes // DTYPE_BYTES, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return [_timed(lambda: dst.copy_(src), device) for _ in range(repeats)]


def _machine(device: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ran the sweep: the machine, and the versions of the software."""
    import torch

    from .._version import __version__

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    machine = {
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
        "gpu": gpu,
        # Other work on the machine shows here: the sweep's own ranks had not
        # started working when this was read.
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    versions["workshop"] = __version__
    if gpu:
        nccl = torch.cuda.nccl.version()  # a tuple; an int in old releases
        versions["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    return machine, versions


def _fit_in_memory(
    sizes: list[int], device: Any, ranks_here: int
) -> tuple[list[int], int]:
    """The sizes that fit in a quarter of a rank's memory, and that quarter."""
    import torch
    import torch.distributed as dist

    usable = _usable_bytes(device, max(1, ranks_here)) or 2**60
    cap = torch.tensor([usable // 4], dtype=torch.float64, device=device)
    dist.all_reduce(cap, op=dist.ReduceOp.MIN)
    cap_bytes = int(cap.item())
    keep = [s for i, s in enumerate(sizes) if sum(sizes[: i + 1]) <= cap_bytes]
    if not keep:
        raise ValueError(
            f"no size fits in memory: a rank may hold about {cap_bytes} bytes of "
            f"messages and the smallest size is {sizes[0]} bytes; pass smaller sizes"
        )
    return keep, cap_bytes


def _reference_copy(device: Any, nbytes: int) -> list[float]:
    """Rank 0 times copies of ``nbytes``; every rank gets its times (collective)."""
    import torch
    import torch.distributed as dist

    copies = torch.zeros(5, dtype=torch.float64)
    if dist.get_rank() == 0:
        copies[:] = torch.tensor(_copy_seconds(device, nbytes, len(copies)))
    copies = copies.to(device)
    dist.broadcast(copies, src=0)
    return copies.tolist()


def _repetitions(
    tensors: list[Any], warmup: int, repeats: int, min_time: float, most: int
) -> list[int]:
    """Calls per size to last ``min_time`` by the slowest rank's warm-up."""
    import torch
    import torch.distributed as dist

    device = tensors[0].device
    estimate = torch.zeros(len(tensors), dtype=torch.float64)
    for j, x in enumerate(tensors):
        times = [_timed(lambda x=x: dist.all_reduce(x), device) for _ in range(warmup)]
        estimate[j] = statistics.median(times) if times else 0.0
    estimate = estimate.to(device)
    dist.all_reduce(estimate, op=dist.ReduceOp.MAX)
    return [
        min(most, max(repeats, math.ceil(min_time / t))) if t > 0 else repeats
        for t in estimate.tolist()
    ]


def _time_rounds(tensors: list[Any], counts: list[int]) -> list[list[float]]:
    """Each size's timed calls, the slowest rank's time of each (collective)."""
    import torch
    import torch.distributed as dist

    device = tensors[0].device
    # NCCL's barrier must be told the rank's GPU, or it guesses one and warns.
    ids = {"device_ids": [device.index]} if device.type == "cuda" else {}
    mine = torch.zeros(len(tensors), max(counts), dtype=torch.float64)
    # The sizes take turns in a shuffled order, so that a burst of other work on
    # the machine slows a few repetitions of every size, not every repetition of
    # one size, and no size always follows the largest.
    for i in range(max(counts)):
        turn = [j for j, count in enumerate(counts) if count > i]
        random.Random(i).shuffle(turn)  # the same order on every rank
        for j in turn:
            dist.barrier(**ids)
            mine[j, i] = _timed(lambda x=tensors[j]: dist.all_reduce(x), device)
    slowest = mine.to(device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return [row[:n] for row, n in zip(slowest.tolist(), counts, strict=True)]


def allreduce_sweep(
    sizes: Sequence[int] | None = None,
    repeats: int = 20,
    warmup: int = 5,
    min_time: float = 1.0,
    max_repeats: int = 1000,
    reference_bytes: int = 256 * MiB,
) -> AllreduceResult:
    """Time ``all_reduce`` of a float32 tensor of each size on this rank's device.

    Call it on every rank: through ``workshop.launch``, or inside ``with
    workshop.process_group():`` under torchrun, srun or mpirun. Sizes that would not fit
    (all together in a quarter of a rank's memory) are skipped on every rank.

    Args:
        sizes: message sizes in bytes; :func:`message_sizes` by default.
        repeats: timed calls per size, at least.
        warmup: untimed calls per size first; their times set the repetitions.
        min_time: seconds of timed calls per size, up to ``max_repeats`` calls.
        max_repeats: most timed calls per size (``repeats`` wins if larger).
        reference_bytes: size of the reference copy, made on rank 0;
            :data:`MIN_REFERENCE_BYTES` at least.

    Returns:
        The same :class:`AllreduceResult` on every rank (rank 0's machine).

    Raises:
        RuntimeError: no process group (called outside a rank).
        ValueError: bad sizes, repeats, warmup, min_time or reference_bytes, or no
            size fits.

    Example:
        >>> run = launch(allreduce_sweep, [4096, 65536], world_size=2)  # doctest: +SKIP
    """
    import torch
    import torch.distributed as dist

    from ..env import backend_name, group_place, rank_device, rank_info

    group_place(
        "allreduce_sweep",
        "measure_allreduce(world_size) or "
        "workshop.launch(allreduce_sweep, world_size=2)",
    )
    sizes = message_sizes() if sizes is None else sizes
    sizes = check_sweep(sizes, repeats, warmup, min_time)
    check_reference(reference_bytes)
    info = rank_info()
    backend = backend_name(dist.get_backend())  # "nccl" for "cpu:gloo,cuda:nccl"
    device = rank_device(backend, info)
    machine, versions = _machine(device)  # before this sweep loads the machine

    keep, cap_bytes = _fit_in_memory(sizes, device, info.local_world_size)
    reference_bytes = min(reference_bytes, cap_bytes)  # two buffers: half the memory
    reference_bytes = max(DTYPE_BYTES, reference_bytes - reference_bytes % DTYPE_BYTES)
    copies = _reference_copy(device, reference_bytes)
    tensors = [torch.ones(s // DTYPE_BYTES, device=device) for s in keep]
    counts = _repetitions(tensors, warmup, repeats, min_time, max(repeats, max_repeats))
    seconds = _time_rounds(tensors, counts)
    del tensors
    # Every rank returns rank 0's account of the machine, so all results are equal.
    shared = [machine, versions, time.strftime("%Y-%m-%dT%H:%M:%S%z")]
    dist.broadcast_object_list(shared, src=0, device=device)
    return AllreduceResult(
        backend=backend,
        world_size=dist.get_world_size(),
        launcher=info.launcher,
        device=device.type,
        sizes=keep,
        seconds=seconds,
        warmup=warmup,
        reference={
            "what": f"{device.type} memory copy of {human_size(reference_bytes)}",
            "counted": "bytes copied / seconds of the fastest copy (not read + write)",
            "bytes": reference_bytes,
            "seconds": copies,
        },
        machine=shared[0],
        versions=shared[1],
        skipped_sizes=[s for s in sizes if s not in keep],
        created=shared[2],
    )


def measure_allreduce(
    world_size: int,
    backend: str = "auto",
    sizes: Sequence[int] | None = None,
    repeats: int = 20,
    warmup: int = 5,
    min_time: float = 1.0,
    max_repeats: int = 1000,
    reference_bytes: int = 256 * MiB,
    timeout: float | None = 600.0,
    show: str = "none",
) -> AllreduceResult:
    """Start ``world_size`` ranks with ``workshop.launch`` and sweep on them.

    Args:
        world_size: ranks, 2 or more.
        backend: "auto", "gloo" or "nccl".
        sizes, repeats, warmup, min_time, max_repeats, reference_bytes: as for
            :func:`allreduce_sweep`.
        timeout: seconds before every rank is stopped.
        show: how the ranks' output is shown: "none", "auto" or "lines".

    Returns:
        Rank 0's :class:`AllreduceResult`.

    Raises:
        ValueError: world_size below 2, or a bad sweep option.
        LaunchError: a rank failed, or the timeout passed.

    Example:
        >>> measure_allreduce(2, sizes=[4096, 1 << 20]).summary()  # doctest: +SKIP
    """
    from ..ranks.launcher import launch

    fix = "an all-reduce on one rank sends nothing, so there is no time to measure"
    whole("world_size", world_size, 2, fix=fix)
    check_sweep(message_sizes() if sizes is None else sizes, repeats, warmup, min_time)
    check_reference(reference_bytes)
    sweep = dict(sizes=sizes, repeats=repeats, warmup=warmup, min_time=min_time)
    sweep |= dict(max_repeats=max_repeats, reference_bytes=reference_bytes)
    ranks = dict(world_size=world_size, backend=backend, timeout=timeout, show=show)
    return launch(allreduce_sweep, **sweep, **ranks).returns[0]


# ------------------------------------------------------------------ command line
def _size_arg(text: str, check: Callable[[int], int] = int) -> int:
    try:
        return check(parse_size(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _message_arg(text: str) -> int:
    """--min-size, --max-size: bytes of whole float32 values, 4 or more."""
    size = _size_arg(text)
    if size < DTYPE_BYTES or size % DTYPE_BYTES:
        raise argparse.ArgumentTypeError(
            f"{text} is not a whole number of float32 values: give a multiple of "
            f"{DTYPE_BYTES} bytes, 4 or more; e.g. 4K or 64M"
        )
    return size


def _reference_arg(text: str) -> int:
    return _size_arg(text, check_reference)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m workshop.bench allreduce``."""
    parser.add_argument(
        "--world-size",
        type=whole_number(2, "--world-size 2", "an all-reduce needs 2 ranks"),
        default=None,
        help="ranks to start when no launcher started this process (default: one "
        "per GPU, else 2); under torchrun, srun or mpirun the job's ranks run",
    )
    parser.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "gloo", "nccl", "mpi"],
        help="auto: NCCL with a GPU per rank, else gloo",
    )
    parser.add_argument(
        "--min-size", type=_message_arg, default=4 * KiB, help="smallest message (4K)"
    )
    parser.add_argument(
        "--max-size",
        type=_message_arg,
        default=64 * MiB,
        help="largest message, e.g. 64M or 1G (default 64M; sizes that do not fit "
        "in memory are skipped)",
    )
    count_option(parser, "--factor", 2, 4, "each size is this times the last (4)")
    count_option(
        parser,
        "--repeats",
        1,
        20,
        "timed calls per size, at least (20)",
        why="each size is timed at least once",
    )
    parser.add_argument(
        "--min-time",
        type=zero_or_more("--min-time 1"),
        default=1.0,
        help="seconds of timed calls per size: small sizes repeat more (1.0)",
    )
    count_option(parser, "--warmup", 0, 5, "untimed calls per size (5)")
    parser.add_argument(
        "--reference-size",
        type=_reference_arg,
        default=256 * MiB,
        help=f"bytes of the reference memory copy (256M; "
        f"{human_size(MIN_REFERENCE_BYTES)} at least)",
    )
    parser.add_argument(
        "--out",
        metavar="PREFIX",
        help="write PREFIX.json and PREFIX.csv (default allreduce-BACKEND-NWORLD)",
    )
    parser.add_argument("--plot", action="store_true", help="also write PREFIX.png")
    parser.add_argument(
        "--timeout",
        type=above_zero("--timeout 600"),
        default=600.0,
        help="seconds before ranks are stopped",
    )


def _default_world_size() -> int:
    from ..env import visible_gpu_count

    gpus = visible_gpu_count()
    return gpus if gpus >= 2 else 2


def _report(result: AllreduceResult, args: argparse.Namespace, started: float) -> bool:
    """Print the table and fit, write the files; False if the JSON was printed."""
    load = result.machine.get("load_average")
    print(
        f"backend {result.backend}, {result.world_size} ranks ({result.launcher}), "
        f"{result.device}, {result.machine['cpu_count']} cores"
        + (f", load average {load[0]:.2f} before the sweep" if load else "")
    )
    print(result.table())
    if result.skipped_sizes:
        skipped = ", ".join(human_size(s) for s in result.skipped_sizes)
        print(f"skipped (would not fit in memory): {skipped}")
    print(result.summary())
    prefix = args.out or f"allreduce-{result.backend}-N{result.world_size}"
    written = save_or_keep(
        lambda p: save_allreduce(result, p),
        prefix,
        lambda: json.dumps(result.to_dict(), indent=2),
    )
    if not written:
        return False
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        written.append(Path(f"{prefix}.png"))
        plot_allreduce(result).savefig(written[-1], dpi=110)
    print(f"wrote {', '.join(map(str, written))}")
    print(f"took {time.perf_counter() - started:.1f} s")
    return True


def main(args: argparse.Namespace) -> int:
    """Run the sweep (starting ranks, or as one of a launcher's) and report it."""
    from ..env import rank_info
    from ..ranks.session import LaunchError
    from ..ranks.worker import process_group

    started = time.perf_counter()
    options = dict(repeats=args.repeats, warmup=args.warmup, min_time=args.min_time)
    options["reference_bytes"] = args.reference_size
    # A ValueError here is python -m workshop.bench's one-line error (status 2).
    sizes = message_sizes(args.min_size, args.max_size, args.factor)
    check_sweep(sizes, args.repeats, args.warmup, args.min_time)
    # Before minutes of measuring, not after; on every rank, so that all of them
    # stop if rank 0 (the one that writes) would fail.
    check_writable(args.out or "allreduce", "--out")
    info = rank_info()
    if info.launcher != "none":
        # One of torchrun's (srun's, mpirun's) ranks: join the job and run the same
        # function that workshop.launch runs on each rank.
        if info.world_size < 2:
            raise ValueError(
                f"{info.launcher} started 1 rank, and an all-reduce needs 2 or more; "
                "start 2 (torchrun --nproc-per-node 2, srun -n 2)"
            )
        if args.world_size not in (None, info.world_size) and info.is_main:
            print(
                f"note: {info.launcher} started {info.world_size} ranks; "
                f"--world-size {args.world_size} is ignored"
            )
        with process_group(args.backend, timeout=args.timeout) as info:
            result = allreduce_sweep(sizes, **options)
        if info.is_main and not _report(result, args, started):
            return 1
        return 0
    world_size = args.world_size or _default_world_size()
    print(
        f"all-reduce of float32 tensors, {human_size(sizes[0])} to "
        f"{human_size(sizes[-1])}, on {world_size} ranks started by workshop.launch"
    )
    try:
        result = measure_allreduce(
            world_size, args.backend, sizes, timeout=args.timeout, **options
        )
    except (ValueError, LaunchError) as exc:
        print(f"python -m workshop.bench allreduce: error: {exc}", file=sys.stderr)
        return 1
    return 0 if _report(result, args, started) else 1
