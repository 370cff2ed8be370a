"""All-reduce time, algbw and busbw per message size, and the ring model fitted to them.

From a shell (it starts the ranks itself) or under a launcher::

    python -m workshop.bench allreduce --world-size 2 --plot
    torchrun --standalone --nproc-per-node 4 -m workshop.bench allreduce
    srun python -m workshop.bench allreduce --max-size 1G --out runs/allreduce

and from a notebook, ``measure_allreduce(4)`` or ``launch(allreduce_sweep, ...)``.

Every size is warmed up, then timed at least ``repeats`` times and for at least
``min_time`` seconds, each call after a barrier; a repetition's time is the slowest
rank's, as nccl-tests reports. The sizes take turns in a shuffled order, so that
other work on a shared machine slows every size alike instead of a few. The same run
times a reference: a large memory copy on the rank's device (``copy_``), counted as
bytes copied per second (STREAM would count each byte twice, read and written): a
ceiling for busbw in practice, since every byte an all-reduce sends is copied on its
way at least once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .allreduce_result import (
    AllreduceResult,
    KiB,
    MiB,
    human_size,
    message_sizes,
    parse_size,
    save_allreduce,
)
from .allreduce_worker import (
    MIN_REFERENCE_BYTES,
    allreduce_sweep,
    check_reference,
    check_sweep,
    measure_allreduce,
)
from .bench_output import check_writable, save_or_keep

__all__ = ["add_arguments", "main"]


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _reference_arg(text: str) -> int:
    try:
        return check_reference(parse_size(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m workshop.bench allreduce``."""
    parser.add_argument(
        "--world-size",
        type=int,
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
        "--min-size", type=_size_arg, default=4 * KiB, help="smallest message (4K)"
    )
    parser.add_argument(
        "--max-size",
        type=_size_arg,
        default=64 * MiB,
        help="largest message, e.g. 64M or 1G (default 64M; sizes that do not fit "
        "in memory are skipped)",
    )
    parser.add_argument(
        "--factor", type=int, default=4, help="each size is this times the last (4)"
    )
    parser.add_argument(
        "--repeats", type=int, default=20, help="timed calls per size, at least (20)"
    )
    parser.add_argument(
        "--min-time",
        type=float,
        default=1.0,
        help="seconds of timed calls per size: small sizes repeat more (1.0)",
    )
    parser.add_argument(
        "--warmup", type=int, default=5, help="untimed calls per size (5)"
    )
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
        "--timeout", type=float, default=600.0, help="seconds before ranks are stopped"
    )


def _default_world_size() -> int:
    from ..env import visible_gpu_count

    gpus = visible_gpu_count()
    return gpus if gpus >= 2 else 2


def _report(result: AllreduceResult, args: argparse.Namespace, started: float) -> bool:
    """Print the table and the fit, and write the files; False if they could not
    be written (the JSON was printed instead)."""
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
        from .allreduce_plots import plot_allreduce

        written.append(Path(f"{prefix}.png"))
        plot_allreduce(result).savefig(written[-1], dpi=110)
    print(f"wrote {', '.join(map(str, written))}")
    print(f"took {time.perf_counter() - started:.1f} s")
    return True


def main(args: argparse.Namespace) -> int:
    """Run the sweep (starting ranks, or as one of a launcher's) and report it."""
    from ..env import rank_info
    from ..ranks.results import LaunchError
    from ..ranks.worker import process_group

    started = time.perf_counter()
    options = {
        "repeats": args.repeats,
        "warmup": args.warmup,
        "min_time": args.min_time,
        "reference_bytes": args.reference_size,
    }
    try:
        sizes = message_sizes(args.min_size, args.max_size, args.factor)
        check_sweep(sizes, args.repeats, args.warmup, args.min_time)
        if args.world_size is not None and args.world_size < 2:
            raise ValueError(
                f"--world-size {args.world_size}: an all-reduce needs 2 ranks or "
                "more; pass --world-size 2"
            )
        # Before minutes of measuring, not after; on every rank, so that all of
        # them stop if rank 0 (the one that writes) would fail.
        check_writable(args.out or "allreduce", "--out")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    info = rank_info()
    if info.launcher != "none":
        # One of torchrun's (srun's, mpirun's) ranks: join the job and run the same
        # function that workshop.launch runs on each rank.
        if info.world_size < 2:
            print(
                f"error: {info.launcher} started 1 rank, and an all-reduce needs 2 or "
                "more; start 2 (torchrun --nproc-per-node 2, srun -n 2)",
                file=sys.stderr,
            )
            return 2
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
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0 if _report(result, args, started) else 1
