"""Start-up time of ``workshop.launch`` on each start path, against ``torchrun``.

Each measurement starts N ranks, initialises the process group (gloo), passes a
barrier and collects the ranks: the whole cost a learner waits for before the first
line of their own code runs. gloo on every machine, as in the torchrun no-op it is
set against: on a GPU node "auto" would give NCCL, whose start-up (a CUDA context
per rank) is another figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

# The no-op torchrun runs: the same work a launch does around the lesson's function.
_TORCHRUN_NOOP = """\
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


@dataclass
class LaunchTimes:
    """Seconds per launch for one way of starting ranks."""

    method: str
    seconds: list[float] = field(default_factory=list)
    first: float | None = None  # a cold start (the fork server's first launch)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def _launch_barrier(
    world_size: int, method: str = "auto", timeout: float | None = 600.0
) -> None:
    """One launch of a barrier on gloo ranks (see the module's docstring)."""
    from ..ranks.launcher import launch

    launch(
        _barrier,
        world_size=world_size,
        backend="gloo",
        start_method=method,
        timeout=timeout,
        show="none",
    )


def time_launch(method: str, world_size: int, repeats: int) -> LaunchTimes:
    """Time ``repeats`` launches of a barrier with ``start_method=method``."""
    from ..ranks.launcher import SERVER

    times = LaunchTimes(method)
    if method == "server":
        SERVER.close()  # measure the cold start once
        t0 = time.perf_counter()
        _launch_barrier(world_size, method)
        times.first = time.perf_counter() - t0
    elif method == "fork":
        _launch_barrier(world_size, method)
    for _ in range(repeats):
        t0 = time.perf_counter()
        _launch_barrier(world_size, method)
        times.seconds.append(time.perf_counter() - t0)
    return times


def _bare_rank(rank: int, world_size: int, port: int) -> None:
    """What one child of the bare fork-and-join does: join, barrier, leave."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
    )
    dist.barrier()
    dist.destroy_process_group()


def time_bare_fork(world_size: int, repeats: int) -> LaunchTimes:
    """Time the least a forked start can cost: ``os.fork()`` N times, each child
    joining a gloo group, passing a barrier and leaving; the parent waits for all.
    No output, results, checks or clean-up: what ``start_method="fork"`` adds to it
    is the launcher's own cost."""
    import socket
    import warnings

    import torch.distributed  # noqa: F401  (imported before forking, as a kernel has)

    times = LaunchTimes("bare fork+join")
    for _ in range(repeats):
        with socket.socket() as probe:  # a free port (a benchmark may race for it)
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        t0 = time.perf_counter()
        pids = []
        for rank in range(world_size):
            with warnings.catch_warnings():  # forking a threaded process: the child
                warnings.simplefilter("ignore", DeprecationWarning)  # runs fresh code
                pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    _bare_rank(rank, world_size, port)
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        times.seconds.append(time.perf_counter() - t0)
        if any(codes):
            raise RuntimeError(f"a bare forked rank failed (exit codes {codes})")
    return times


def time_torchrun(world_size: int, repeats: int) -> LaunchTimes:
    """Time ``torchrun --standalone --nproc_per_node=N`` running the same no-op."""
    times = LaunchTimes("torchrun")
    with tempfile.TemporaryDirectory(prefix="workshop-bench-") as tmp:
        script = os.path.join(tmp, "noop.py")
        with open(script, "w") as f:
            f.write(_TORCHRUN_NOOP)
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={world_size}",
            script,
        ]
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, timeout=600)
            times.seconds.append(time.perf_counter() - t0)
    return times


def launches_in_a_row(count: int, world_size: int, timeout: float) -> dict:
    """Launch ``count`` times in a row; count those that finished and that hung."""
    from ..ranks.launcher import LaunchError

    done, hung, failed, seconds = 0, 0, 0, []
    for _ in range(count):
        t0 = time.perf_counter()
        try:
            _launch_barrier(world_size, timeout=timeout)
            done += 1
        except LaunchError as exc:
            if exc.running_ranks:
                hung += 1
            else:
                failed += 1
        seconds.append(time.perf_counter() - t0)
    return {
        "count": count,
        "done": done,
        "hung": hung,
        "failed": failed,
        "min": min(seconds),
        "median": statistics.median(seconds),
        "max": max(seconds),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m workshop.bench launch``."""
    parser.add_argument("--world-size", type=int, default=4, help="ranks (default 4)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed launches per fast path (default 5)",
    )
    parser.add_argument(
        "--slow-repeats",
        type=int,
        default=2,
        help="timed runs of spawn and torchrun (default 2)",
    )
    parser.add_argument(
        "--in-a-row",
        type=int,
        default=50,
        help="launches in a row checked for hangs (default 50)",
    )
    parser.add_argument(
        "--methods",
        default="fork,server,spawn",
        help="start paths to time (default fork,server,spawn)",
    )
    parser.add_argument(
        "--no-torchrun",
        action="store_true",
        help="skip torchrun (ratios are then not printed)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")


def main(args: argparse.Namespace) -> int:
    """Run the launch benchmark and print its table."""
    import torch

    n = args.world_size
    print(
        f"workshop.launch start-up, world_size={n}, gloo, {os.cpu_count()} cores, "
        f"torch {torch.__version__}"
    )
    rows = []
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for method in methods:
        repeats = args.slow_repeats if method == "spawn" else args.repeats
        rows.append(time_launch(method, n, repeats))
    # The floor of the fork path, where this process may still fork (forkable.py).
    bare = None
    if "fork" in methods and hasattr(os, "fork"):
        bare = time_bare_fork(n, args.repeats)
    torchrun = None if args.no_torchrun else time_torchrun(n, args.slow_repeats)
    print(
        f"\n{'start path':<22}{'median s':>10}{'min s':>9}{'max s':>9}"
        f"{'x torchrun':>12}"
    )
    for times in rows + [t for t in (bare, torchrun) if t]:
        ratio = f"{times.median / torchrun.median:.4f}" if torchrun else "-"
        print(
            f"{times.method:<22}{times.median:>10.3f}{min(times.seconds):>9.3f}"
            f"{max(times.seconds):>9.3f}{ratio:>12}"
        )
        if times.first is not None:
            print(f"{'  (first, cold start)':<22}{times.first:>10.3f}")
    report: dict = {
        "world_size": n,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "paths": [asdict(t) | {"median": t.median} for t in rows],
    }
    if bare:
        fork = next(t for t in rows if t.method == "fork")
        report["bare_fork"] = asdict(bare) | {"median": bare.median}
        print(
            f"\nfork path: {fork.median / bare.median:.2f} times a bare fork-and-join "
            "of the same ranks (what the launcher adds: output, results, checks)"
        )
    if torchrun:
        fast = min(rows, key=lambda t: t.median)
        slow = max(rows, key=lambda t: t.median)
        report["torchrun"] = asdict(torchrun) | {"median": torchrun.median}
        print(
            f"\nfastest path ({fast.method}): {fast.median / torchrun.median:.4f} of "
            f"torchrun's time (goal: at most 0.02)"
        )
        print(
            f"slowest path ({slow.method}): {slow.median / torchrun.median:.2f} of "
            f"torchrun's time (goal: at most 1)"
        )
    if args.in_a_row:
        row = launches_in_a_row(args.in_a_row, n, timeout=60.0)
        report["in_a_row"] = row
        print(
            f"\n{row['count']} launches in a row: {row['done']} finished, "
            f"{row['hung']} hung, {row['failed']} failed; seconds min "
            f"{row['min']:.3f}, median {row['median']:.3f}, max {row['max']:.3f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"\nwrote {args.json}")
    return 0
