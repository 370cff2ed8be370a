"""A classroom on the private portal, driven as learners would: every learner's
server started through the hub's REST API, a kernel in each, notebook cells run in
it, and the servers stopped again (the client:
:mod:`workshop.instructor.portal_client`).

    python -m workshop portal classroom     # on a running portal
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from .portal_client import Hub, HubError, Kernel, notebook_cells

# Notebook 02's first launch cells: the imports, hello on 4 ranks, its results, the
# all-reduce, its check, and a launch in which one rank fails. Each with a line it
# must print.
LAUNCH_CELLS = {
    2: "",
    4: "[rank 3] hello from rank 3 of 4",
    6: "exit codes: [0, 0, 0, 0]",
    11: "after  all_reduce: 6.0",
    12: "every rank holds 6: True",
    15: "ranks that failed: [2]",
}
NOTEBOOK = "02_distributed_data_parallel.ipynb"

# Run in learner B's kernel while learner A's ranks sleep: which of A's processes
# could B signal? (os.kill with signal 0 asks without sending anything.)
_PROBE = """
import os
from pathlib import Path

def _uid(p):
    try:
        return p.stat().st_uid
    except OSError:
        return None

theirs = [int(p.name) for p in Path("/proc").iterdir()
          if p.name.isdigit() and _uid(p) == {uid}]
reachable = []
for pid in theirs:
    try:
        os.kill(pid, 0)
        reachable.append(pid)
    except PermissionError:
        pass
    except ProcessLookupError:
        pass
print(f"probe: {{len(theirs)}} processes of the other learner,",
      f"{{len(reachable)}} reachable")
"""

_SLEEPY = """
import time

def sleepy(seconds):
    time.sleep(seconds)
    return dist.get_rank()

slept = workshop.launch(sleepy, {seconds}, world_size=2, show="none")
print("slept:", slept.returns)
"""


@dataclass
class Learner:
    """One learner's run: how long their server and kernel took, each cell's time,
    and what went wrong."""

    name: str
    server_s: float = 0.0
    kernel_s: float = 0.0
    cells_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


@dataclass
class Classroom:
    """What a classroom run found (see :func:`classroom`)."""

    learners: list[Learner]
    launches: int
    failures: list[str]
    isolation: str
    scancel: str
    seconds: float

    def summary(self) -> str:
        """A few lines for the instructor (and the test's output)."""
        servers = sorted(learner.server_s for learner in self.learners)
        kernels = sorted(learner.kernel_s for learner in self.learners)
        hello = sorted(
            learner.cells_s[1] for learner in self.learners if len(learner.cells_s) > 1
        )
        lines = [
            f"classroom: {len(self.learners)} learners at once, {self.launches} "
            f"launches, {len(self.failures)} failures, {self.seconds:.0f} s in all",
            f"  server start (a Slurm job): {servers[0]:.1f} to {servers[-1]:.1f} s; "
            f"first kernel: {kernels[0]:.1f} to {kernels[-1]:.1f} s",
        ]
        if hello:
            lines.append(
                f"  hello on 4 ranks: {hello[0]:.2f} to {hello[-1]:.2f} s per cell"
            )
        lines += [f"  isolation: {self.isolation}", f"  scancel: {self.scancel}"]
        lines += [f"  FAILED: {failure}" for failure in self.failures]
        return "\n".join(lines)


async def _learner_run(
    hub: Hub, name: str, cells: dict[int, str], root: Path
) -> Learner:
    learner = Learner(name)
    try:
        learner.server_s = await asyncio.to_thread(hub.start_server, name)
        started = time.monotonic()
        async with Kernel(hub, name) as kernel:
            await kernel.run("1")
            learner.kernel_s = time.monotonic() - started
            sources = notebook_cells(root / NOTEBOOK, list(cells))
            for (index, expected), source in zip(cells.items(), sources, strict=True):
                out = await kernel.run(source)
                learner.cells_s.append(out.seconds)
                if out.error or expected not in out.text:
                    learner.failures.append(
                        f"{name}, cell {index}: {out.error or 'no ' + repr(expected)}"
                    )
    except (HubError, OSError, asyncio.TimeoutError) as error:
        learner.failures.append(f"{name}: {error}")
    return learner


async def _isolation(hub: Hub, a: str, b: str) -> str:
    """While ``a``'s ranks run, can ``b`` signal any of ``a``'s processes?"""
    import pwd

    async with Kernel(hub, a) as ka, Kernel(hub, b) as kb:
        await ka.run("import torch.distributed as dist\nimport workshop")
        waiting = asyncio.ensure_future(ka.run(_SLEEPY.format(seconds=6)))
        await asyncio.sleep(3)  # a's ranks are up and sleeping
        probe = await kb.run(_PROBE.format(uid=pwd.getpwnam(a).pw_uid))
        slept = await waiting
    if probe.error or slept.error or "slept: [0, 1]" not in slept.text:
        launch = slept.error or slept.text
        return f"FAILED: probe {probe.error or probe.text!r}, launch {launch!r}"
    return (
        probe.text.strip().removeprefix("probe: ")
        + f" (by {b}); {a}'s launch ended well"
    )


def _queue(slurm_conf: str, user: str | None = None) -> list[str]:
    """The ids of the jobs in the portal's queue (of ``user``, if given)."""
    import os

    from ..cluster.slurm_watchdog import _quiet

    command = ["squeue", "-h", "-o", "%A"] + (["-u", user] if user else [])
    return _quiet(command, dict(os.environ, SLURM_CONF=slurm_conf), 30).split()


def _wait_until_gone(
    users: list[str], slurm_conf: str, within: float
) -> tuple[int, int]:
    """Wait until ``users`` have no process and the queue has no job of theirs;
    (processes, jobs) left after ``within`` seconds, or (0, 0) sooner."""
    from .portal_users import processes_of

    deadline = time.monotonic() + within
    while True:
        processes = processes_of(users)
        jobs = [job for user in users for job in _queue(slurm_conf, user)]
        if (not processes and not jobs) or time.monotonic() > deadline:
            return len(processes), len(jobs)
        time.sleep(0.5)


async def _scancel(hub: Hub, name: str, slurm_conf: str) -> str:
    """Cancel ``name``'s job while their kernel's ranks run: nothing may be left."""
    import subprocess

    async with Kernel(hub, name) as kernel:
        await kernel.run("import torch.distributed as dist\nimport workshop")
        running = asyncio.ensure_future(kernel.run(_SLEEPY.format(seconds=60), 90))
        await asyncio.sleep(4)
        jobs = _queue(slurm_conf, name)
        subprocess.run(
            ["scancel", *jobs],
            capture_output=True,
            timeout=30,
            env={"SLURM_CONF": slurm_conf, "PATH": "/usr/bin:/bin"},
        )
        try:
            await asyncio.wait_for(running, 30)
        except (HubError, asyncio.TimeoutError, OSError):
            pass  # the server went with its job: the cell cannot finish
        kernel.id = None  # nothing left to shut down
    processes, left = await asyncio.to_thread(_wait_until_gone, [name], slurm_conf, 30)
    await asyncio.to_thread(hub.stop_server, name)  # the hub forgets the server
    return (
        f"job {','.join(jobs)} of {name} cancelled during a 2-rank launch: "
        f"{processes} processes and {left} jobs left after it"
    )


def classroom(
    folder: str | Path, learners: int | None = None, cells: dict[int, str] | None = None
) -> Classroom:
    """Run a class on the portal in ``folder``: every learner (or the first
    ``learners``) at once starts a server, opens a kernel and runs ``cells`` of
    notebook 02 (default: its first launch cells); then one learner probes another's
    ranks, one learner's job is cancelled in the middle of a launch, and every
    server is stopped. Failures are collected, not raised.

    Returns:
        A :class:`Classroom`; ``failures`` is empty when every launch worked,
        nobody could reach another's processes and nothing was left behind.
    """
    folder = Path(folder)
    settings = json.loads((folder / "portal.json").read_text())
    names = json.loads((folder / "users.json").read_text())["names"]
    names = [n for n in names if n != settings["instructor"]][:learners]
    hub, conf = Hub.of(folder), settings["slurm_conf"]
    cells = LAUNCH_CELLS if cells is None else cells
    root = Path(settings["root"]) / "notebooks"
    started = time.monotonic()

    async def run() -> Classroom:
        runs = await asyncio.gather(*(_learner_run(hub, n, cells, root) for n in names))
        failures = [f for learner in runs for f in learner.failures]
        isolation = scancel = "not run (needs 2 and 3 learners)"
        if len(names) >= 2 and not failures:
            isolation = await _isolation(hub, names[0], names[1])
            if isolation.startswith("FAILED") or " 0 reachable" not in isolation:
                failures.append(f"isolation: {isolation}")
        if len(names) >= 3 and not failures:
            scancel = await _scancel(hub, names[-1], conf)
            if "0 processes and 0 jobs left" not in scancel:
                failures.append(f"scancel: {scancel}")
        await asyncio.gather(*(asyncio.to_thread(hub.stop_server, n) for n in names))
        processes, jobs = await asyncio.to_thread(_wait_until_gone, names, conf, 30)
        if processes or jobs:
            failures.append(
                f"after every server stopped: {processes} processes and "
                f"{jobs} jobs of the learners left"
            )
        launches = sum(
            sum(1 for i in cells if "launch(" in _source(root, i)) for _ in runs
        )
        return Classroom(
            runs, launches, failures, isolation, scancel, time.monotonic() - started
        )

    return asyncio.run(run())


def _source(root: Path, index: int) -> str:
    return notebook_cells(root / NOTEBOOK, [index])[0]
