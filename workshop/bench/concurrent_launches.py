"""A classroom on one node: many notebook kernels launching ranks at the same moment
(``python -m workshop.bench concurrent``: 6 kernels, 200 launches by default).

Each "kernel" is a process that imports ``workshop``, as a notebook kernel has, and
waits; all are told to go at once, and each makes its share of the launches with a
notebook's default start method, alternating a job with no collective (the cell
whose ranks once failed to connect, issue 35) and one with an all-reduce and a
broadcast. Counted: launches, failures (their first line) and the lines printed on
stderr, where the launcher writes its notices. A process group that fails to connect
is a failure, never hidden by a restart. The same with plain ``torch.distributed``
was measured once: docs/benchmarks.md, "Many kernels launching at once".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._cli import above_zero
from .._house import ROOT
from ..ranks.forkable import START_METHODS
from .bench_output import count_option, json_option, write_json

__all__ = ["Round", "measure"]


# -- the jobs every launch runs, in turn
def return_rank() -> int:
    """Returns at once, with no collective: a hello-world cell."""
    import torch.distributed as dist

    return dist.get_rank()


def all_reduce_and_broadcast() -> float:
    """An all-reduce and a broadcast of one number: the first cells of notebook 02."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    dist.broadcast(value, src=0)
    return value.item()


JOBS = {"no collective": return_rank, "collectives": all_reduce_and_broadcast}


def expected(job: str, world_size: int) -> list[Any]:
    """What each rank of ``job`` returns when all went well."""
    if job == "no collective":
        return list(range(world_size))
    return [world_size * (world_size + 1) / 2] * world_size


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``, cut where gloo starts its advice."""
    text = str(exc).strip().split("\n")[0].split(" This is typically")[0]
    return f"{type(exc).__name__}: {text}"[:200]


# -- one launch, in a kernel
def workshop_launch(job: str, world_size: int, method: str, timeout: float) -> dict:
    """One ``workshop.launch`` of ``job``: its error's first line, or None."""
    from ..ranks.launcher import launch

    record: dict[str, Any] = {"job": job, "error": None}
    try:
        run = launch(
            JOBS[job],
            world_size=world_size,
            backend="gloo",
            start_method=method,
            timeout=timeout,
            show="none",
        )
    except Exception as exc:  # counted, not raised: the other launches go on
        record["error"] = first_line(exc)
        return record
    if run.returns != expected(job, world_size):
        record["error"] = f"wrong returns: {run.returns!r}"
    return record


# -- one kernel: its own process, told to go at the same moment as the others
def run_kernel(spec_text: str) -> None:
    """A kernel (see :func:`measure`): "ready", wait for "go", launch, write."""
    spec = json.loads(spec_text)
    print("ready", flush=True)
    os.dup2(2, 1)  # from now on, whatever is printed goes to the kernel's log
    if sys.stdin.readline().strip() != "go":
        return
    names = list(JOBS)
    records = []
    for i in range(spec["launches"]):
        # Kernels start on different jobs, so both kinds run at every moment.
        job = names[(spec["kernel"] + i) % len(names)]
        t0 = time.perf_counter()
        record = workshop_launch(
            job, spec["world_size"], spec["method"], spec["timeout"]
        )
        record["seconds"] = time.perf_counter() - t0
        records.append(record)
    Path(spec["out"]).write_text(json.dumps(records))


@dataclass
class Round:
    """K kernels launching at once, and what came of every launch.

    Attributes:
        records: a dict per launch: job, error (None, or its first line), seconds.
        wall_seconds: from "go" until the last kernel ended.
        load: the 1-minute load average before, the highest while running, after.
        stderr_lines: lines the kernels printed on stderr (the launcher's notices).
    """

    kernels: int
    world_size: int
    start_method: str
    records: list[dict] = field(default_factory=list)
    wall_seconds: float = 0.0
    load: dict[str, float] = field(default_factory=dict)
    stderr_lines: list[str] = field(default_factory=list)

    def rows(self) -> list[dict]:
        """Per job and for all: launches, failed, median and max seconds."""
        rows = []
        for job in [*JOBS, "all"]:
            mine = [r for r in self.records if job in ("all", r["job"])]
            seconds = [r["seconds"] for r in mine] or [0.0]
            failed = sum(r["error"] is not None for r in mine)
            row = {"job": job, "launches": len(mine), "failed": failed}
            median = statistics.median(seconds)
            rows.append(row | {"median_s": median, "max_s": max(seconds)})
        return rows

    def failures(self) -> Counter:
        """The failures' first lines (ports made alike) and how often each came."""
        return Counter(
            re.sub(r"\]:\d+", "]:PORT", r["error"]) for r in self.records if r["error"]
        )


def _stop(procs: list[subprocess.Popen]) -> None:
    """Stop every kernel still running and its ranks (TERM, 2 s, KILL)."""
    for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 10.0)):
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.05)


def _log_tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# Seconds a kernel may take to import workshop and torch on a busy machine.
READY_TIMEOUT = 300.0


def measure(
    kernels: int,
    launches: int,
    world_size: int = 4,
    start_method: str = "auto",
    timeout: float = 120.0,
) -> Round:
    """Start ``kernels`` kernel processes, tell them to go at once, and collect what
    came of ``launches`` launches between them (see the module's docstring).

    Args:
        kernels: kernel processes launching at the same time.
        launches: launches in all, shared out as evenly as can be.
        world_size: ranks per launch.
        start_method: ``launch``'s start_method.
        timeout: seconds one launch may take.

    Returns:
        A :class:`Round` with one record per launch.

    Raises:
        RuntimeError: a kernel did not get ready, crashed, or ran out of time; the
            message holds the end of its log.

    Example:
        >>> measure(2, 4, world_size=2).rows()[-1]["failed"]   # doctest: +SKIP
        0
    """
    result = Round(kernels, world_size, start_method)
    shares = [launches // kernels + (k < launches % kernels) for k in range(kernels)]
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="workshop-concurrent-") as tmp:
        logs = [Path(tmp, f"kernel{k}.log") for k in range(kernels)]
        outs = [Path(tmp, f"kernel{k}.json") for k in range(kernels)]
        result.load["before"] = os.getloadavg()[0]
        try:
            for k in range(kernels):
                spec = dict(kernel=k, launches=shares[k], world_size=world_size)
                spec.update(method=start_method, timeout=timeout, out=str(outs[k]))
                # The kernel imports workshop before its first launch, as a
                # notebook has.
                code = (
                    "import workshop\n"
                    "from workshop.bench.concurrent_launches import run_kernel\n"
                    f"run_kernel({json.dumps(spec)!r})\n"
                )
                with open(logs[k], "w") as log:
                    procs.append(
                        subprocess.Popen(
                            [sys.executable, "-c", code],
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE,
                            stderr=log,
                            cwd=ROOT,  # so that a kernel imports this workshop
                            start_new_session=True,
                            text=True,
                        )
                    )
            for k, proc in enumerate(procs):
                ready = select.select([proc.stdout], [], [], READY_TIMEOUT)[0]
                if not ready or proc.stdout.readline().strip() != "ready":
                    raise RuntimeError(
                        f"kernel {k} did not get ready within {READY_TIMEOUT:g} s "
                        f"(importing workshop and torch); its log:\n"
                        + _log_tail(logs[k])
                    )
            t0 = time.perf_counter()
            for proc in procs:  # all at once
                proc.stdin.write("go\n")
                proc.stdin.close()
            deadline = time.monotonic() + max(shares) * (timeout + 30.0) + 60.0
            top = 0.0
            while any(p.poll() is None for p in procs):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the kernels were still launching after "
                        f"{time.perf_counter() - t0:.0f} s; stopped them"
                    )
                top = max(top, os.getloadavg()[0])
                time.sleep(0.5)
            result.wall_seconds = time.perf_counter() - t0
            result.load.update(max=top, after=os.getloadavg()[0])
        finally:
            _stop(procs)
            for proc in procs:
                proc.stdout.close()
        for k, proc in enumerate(procs):
            if proc.returncode != 0 or not outs[k].exists():
                raise RuntimeError(
                    f"kernel {k} ended with code {proc.returncode} before it wrote "
                    f"its records; its log:\n{_log_tail(logs[k])}"
                )
            result.records += json.loads(outs[k].read_text())
            result.stderr_lines += logs[k].read_text(errors="replace").splitlines()
    return result


# -- the command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m workshop.bench concurrent``."""
    count_option(
        parser, "--kernels", 1, 6, "kernel processes launching at once (default 6)"
    )
    count_option(
        parser,
        "--launches",
        1,
        200,
        "launches in all, shared between the kernels (default 200)",
    )
    count_option(
        parser,
        "--world-size",
        2,
        4,
        "ranks per launch (default 4)",
        why="ranks that connect need 2",
    )
    parser.add_argument(
        "--start-method",
        choices=START_METHODS,
        default="auto",
        help="workshop.launch's start_method (default auto, as in a notebook)",
    )
    parser.add_argument(
        "--timeout",
        type=above_zero("--timeout 120"),
        default=120.0,
        help="seconds one launch may take (default 120)",
    )
    json_option(
        parser,
        "--json concurrent.json",
        "also write the figures and every launch as JSON",
    )


def check_options(args: argparse.Namespace) -> None:
    """Refuse options that do not go together, before any kernel starts (ValueError)."""
    from ..ranks.launcher import capacity

    if args.launches < args.kernels:
        raise ValueError(
            f"--launches {args.launches} is fewer than --kernels {args.kernels}: "
            f"each kernel makes one launch at least; pass --launches {args.kernels} "
            "or more"
        )
    ranks = args.kernels * args.world_size
    fit, why = min(capacity("fork"))
    if ranks > fit:
        raise ValueError(
            f"--kernels {args.kernels} x --world-size {args.world_size} = {ranks} "
            f"ranks at once is more than this machine can run ({why}, which fits "
            f"{fit}); pass fewer kernels or a smaller --world-size"
        )


def print_round(round_: Round) -> None:
    """The table of the round, its wall time and load, and its failures."""
    print(f"\n{'job':<15}{'launches':>9}{'failed':>8}{'median s':>10}{'max s':>8}")
    for row in round_.rows():
        print(
            f"{row['job']:<15}{row['launches']:>9}{row['failed']:>8}"
            f"{row['median_s']:>10.3f}{row['max_s']:>8.3f}"
        )
    load = round_.load
    print(
        f"\nwall time {round_.wall_seconds:.1f} s; load average (1 min) "
        f"{load['before']:.1f} before, {load['max']:.1f} at most, "
        f"{load['after']:.1f} after; {len(round_.stderr_lines)} lines on the "
        "kernels' stderr"
    )
    for line, count in round_.failures().most_common():
        print(f"  failed {count}x: {line}")


def main(args: argparse.Namespace) -> int:
    """Run the command: 1 where a launch failed or a kernel wrote on stderr, else 0."""
    import torch

    from ..allocation import usable_cores

    check_options(args)
    print(
        f"concurrent launches: {args.kernels} kernels at once, {args.launches} "
        f"launches of {args.world_size} ranks each (gloo, "
        f"start_method={args.start_method}), {usable_cores()} cores, "
        f"torch {torch.__version__}",
        flush=True,
    )
    round_ = measure(
        args.kernels, args.launches, args.world_size, args.start_method, args.timeout
    )
    print_round(round_)
    if args.json:
        report = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "cores": usable_cores(),
        }
        report |= {"torch": torch.__version__, "python": sys.version.split()[0]}
        failures = {"failures": dict(round_.failures())}
        report |= {"rows": round_.rows(), "round": asdict(round_) | failures}
        write_json(args.json, report)
    failed = round_.rows()[-1]["failed"]
    said = len(round_.stderr_lines)
    met = failed == 0 and said == 0
    print(
        f"goal, 0 failures and nothing on stderr: {failed} failures, {said} "
        f"lines: {'met' if met else 'NOT met'}"
    )
    return 0 if met else 1
