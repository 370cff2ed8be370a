"""What the workshop's machinery costs at start-up: ``workshop.launch`` on each start
path against ``torchrun`` (``python -m workshop.bench launch``).

Each measurement starts N gloo ranks (as the torchrun no-op it is set against; NCCL's
CUDA context per rank is another figure), initialises the process group, passes a
barrier and collects the ranks: what a learner waits for before their own code runs.
Besides, a launch whose ranks build DDP + AdamW and step once is set against a trivial
one, in a fresh process like a kernel: ``ranks.start.preload`` imports what ranks use.
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

from .._cli import names_from
from .._house import ROOT  # run from it, so that a fresh process imports this copy
from .bench_output import count_option, json_option, write_json

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
    from ..ranks.start import SERVER

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


# A DDP + AdamW launch may cost at most this much more than a trivial one (issue 32).
OPTIMIZER_GOAL_S = 0.35


def _nothing() -> None:
    """A trivial rank: the launch sets up and tears down its process group."""


def _ddp_adamw_step() -> None:
    """A rank that builds DDP and AdamW and takes one step: what every lesson does."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(torch.nn.Linear(8, 8))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()


@dataclass
class OptimizerLaunch:
    """Trivial and DDP + AdamW launches timed in one fresh process."""

    method: str
    preload: bool = True
    trivial: list[float] = field(default_factory=list)
    ddp: list[float] = field(default_factory=list)
    first: float = 0.0  # the process's first launch (trivial): one-time costs
    preload_seconds: float | None = None  # the kernel's own import, fork path only
    preload_rss_mb: float | None = None

    @property
    def extra(self) -> float:
        """Seconds a DDP + AdamW launch costs more than a trivial one (medians)."""
        return statistics.median(self.ddp) - statistics.median(self.trivial)


def _fresh_process_launches(method: str, world_size: int, repeats: int) -> None:
    """In the fresh process: the launches, their figures as JSON on the last line."""
    from ..ranks import start as preload
    from ..ranks.launcher import launch

    def timed(fn) -> float:
        t0 = time.perf_counter()
        launch(
            fn, world_size=world_size, backend="gloo", start_method=method, show="none"
        )
        return time.perf_counter() - t0

    figures: dict = {"first": timed(_nothing), "trivial": [], "ddp": []}
    done = preload._DONE  # set by the fork path's first launch
    if done is not None and not done.skipped:
        figures.update(preload_seconds=done.seconds, preload_rss_mb=done.rss_mb)
    for _ in range(repeats):
        figures["trivial"].append(timed(_nothing))
        figures["ddp"].append(timed(_ddp_adamw_step))
    print(json.dumps(figures))


def time_optimizer_launch(
    method: str, world_size: int, repeats: int, preload: bool = True
) -> OptimizerLaunch:
    """Time trivial and DDP + AdamW launches in a fresh process that imported
    ``workshop``, as a kernel has; ``preload=False`` sets ``WORKSHOP_PRELOAD=0``."""
    from ..ranks.start import PRELOAD_VAR

    env = dict(os.environ, **({} if preload else {PRELOAD_VAR: "0"}))
    code = (
        "import workshop\n"
        "from workshop.bench.launch_bench import _fresh_process_launches\n"
        f"_fresh_process_launches({method!r}, {world_size}, {repeats})\n"
    )
    command = [sys.executable, "-c", code]
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT
    )
    if run.returncode != 0:
        raise RuntimeError(
            f"the fresh process timing {method} launches failed:\n{run.stderr[-2000:]}"
        )
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    return OptimizerLaunch(method, preload, **figures)


def print_optimizer_launches(rows: list[OptimizerLaunch], world_size: int) -> None:
    """The table of :func:`time_optimizer_launch` rows, and whether the goal holds."""
    print(
        f"\na launch whose {world_size} ranks build DDP + AdamW and step once, "
        "against a trivial\nlaunch, each path in a fresh process (medians; first: "
        "its first launch):"
    )
    print(f"{'start path':<22}{'trivial s':>10}{'DDP s':>9}{'more s':>9}{'first s':>9}")
    for row in rows:
        label = row.method + ("" if row.preload else ", no preload")
        print(
            f"{label:<22}{statistics.median(row.trivial):>10.3f}"
            f"{statistics.median(row.ddp):>9.3f}{row.extra:>9.3f}{row.first:>9.3f}"
        )
        if row.preload_seconds is not None:
            print(
                f"  ({row.method}: the kernel's one-time import at its first launch: "
                f"{row.preload_seconds:.2f} s, {row.preload_rss_mb:.0f} MB of RSS)"
            )
    for row in (r for r in rows if r.preload):
        verdict = "met" if row.extra <= OPTIMIZER_GOAL_S else "NOT met"
        print(
            f"{row.method}: DDP + AdamW launch - trivial launch = {row.extra:.3f} s "
            f"(goal: at most {OPTIMIZER_GOAL_S}): {verdict}"
        )


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
    """The least a forked start can cost: N ``os.fork()`` children joining a gloo
    group, passing a barrier and leaving; what ``start_method="fork"`` adds is the
    launcher's own cost."""
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
            # Its logs in this run's folder: without a log dir, torchrun makes a
            # torchelastic_* folder in /tmp per run and leaves it there.
            f"--log-dir={os.path.join(tmp, 'torchrun-logs')}",
            script,
        ]
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, timeout=600)
            times.seconds.append(time.perf_counter() - t0)
    return times


def launches_in_a_row(count: int, world_size: int, timeout: float) -> dict:
    """Launch ``count`` times in a row; count those that finished and that hung."""
    from ..ranks.session import LaunchError

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
    spread = {"min": min(seconds), "median": statistics.median(seconds)}
    counts = {"count": count, "done": done, "hung": hung, "failed": failed}
    return counts | spread | {"max": max(seconds)}


_PATHS = ("fork", "server", "spawn")


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m workshop.bench launch``."""
    count_option(parser, "--world-size", 1, 4, "ranks (default 4)")
    count_option(parser, "--repeats", 1, 5, "timed launches per fast path (default 5)")
    count_option(
        parser, "--slow-repeats", 1, 2, "timed runs of spawn and torchrun (default 2)"
    )
    count_option(
        parser,
        "--in-a-row",
        0,
        50,
        "launches in a row checked for hangs (default 50)",
        "--in-a-row 50 (0 skips it)",
    )
    parser.add_argument(
        "--methods",
        type=names_from(_PATHS, "--methods fork,server"),
        default="fork,server,spawn",
        help="start paths to time (default fork,server,spawn)",
    )
    parser.add_argument(
        "--no-torchrun",
        action="store_true",
        help="skip torchrun (ratios are then not printed)",
    )
    count_option(
        parser,
        "--ddp-repeats",
        0,
        3,
        "timed DDP + AdamW and trivial launches of 2 "
        "ranks in a fresh process, per path (default 3; 0 skips them)",
        "--ddp-repeats 3 (0 skips them)",
    )
    json_option(parser, "--json launch.json", "also write the figures as JSON")


def launch_main(args: argparse.Namespace) -> int:
    """Run the launch benchmark and print its table."""
    import torch

    n = args.world_size
    print(
        f"workshop.launch start-up, world_size={n}, gloo, {os.cpu_count()} cores, "
        f"torch {torch.__version__}"
    )
    methods = args.methods
    repeats = {"spawn": args.slow_repeats}
    rows = [time_launch(m, n, repeats.get(m, args.repeats)) for m in methods]
    # The floor of the fork path, where this process may still fork (fork_hazard).
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
    report: dict = dict(world_size=n, cpu_count=os.cpu_count(), torch=torch.__version__)
    report["paths"] = [asdict(t) | {"median": t.median} for t in rows]
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
    if args.ddp_repeats > 0:
        fresh = []
        for method in (m for m in methods if m in ("fork", "server")):
            fresh.append(time_optimizer_launch(method, 2, args.ddp_repeats))
            if method == "fork":  # the figure before preload(): ranks import it
                fresh.append(time_optimizer_launch(method, 2, args.ddp_repeats, False))
        if fresh:
            print_optimizer_launches(fresh, 2)
            report["optimizer_launch"] = [asdict(r) | {"extra": r.extra} for r in fresh]
    if args.json:
        write_json(args.json, report)
    return 0
