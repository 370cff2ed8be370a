"""Shared test helpers: process checks, a way to run a small script as a 'kernel', and
the environments launchers give the tasks they start."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from workshop.commands import free_port  # noqa: F401  (the tests' import of it)

ROOT = Path(__file__).resolve().parents[1]
_LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "RANK", "LOCAL_", "WORLD_", "MASTER_")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, the package importable,
    and ``extra`` added."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    env.update(PYTHONPATH=str(ROOT), **extra)
    return env


def task_env(launcher: str, rank: int, world_size: int, port: int) -> dict[str, str]:
    """The environment of task ``rank`` of a one-node job, as ``srun`` or ``mpirun``
    sets it, with the rendezvous port exported (srun's address comes from the node
    list, as in a batch script)."""
    if launcher == "srun":
        return clean_env(
            SLURM_JOB_ID="4242",
            SLURM_STEP_ID="0",
            SLURM_PROCID=str(rank),
            SLURM_NTASKS=str(world_size),
            SLURM_LOCALID=str(rank),
            SLURM_NODEID="0",
            SLURM_TASKS_PER_NODE=str(world_size),
            SLURM_JOB_NODELIST="127.0.0.1",
            MASTER_PORT=str(port),
        )
    return clean_env(
        OMPI_COMM_WORLD_RANK=str(rank),
        OMPI_COMM_WORLD_SIZE=str(world_size),
        OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
        OMPI_COMM_WORLD_LOCAL_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


def gone(pids, within: float = 10.0) -> list[int]:
    """Wait for all of ``pids`` to end; return those alive after ``within``."""
    from workshop._procs import is_alive

    deadline = time.monotonic() + within
    while True:
        alive = [p for p in pids if p and is_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def run_module(module: str, *args: str, timeout: float = 300):
    """Run ``python -m module args`` with this checkout importable; never raises on
    a non-zero exit (the tests read the code and the output)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def children_of(pid: int) -> list[int]:
    """Live (non-zombie) child processes of ``pid``, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] not in (b"Z", b"X"):
            found.append(int(entry.name))
    return found


@pytest.fixture
def no_leftover_children():
    """Fail a test that leaves a child process of the test process behind (the fork
    server is the one child that is meant to outlive a launch)."""
    from workshop.launcher import _SERVER

    yield
    server = _SERVER.popen.pid if _SERVER.popen else None
    deadline = time.monotonic() + 10
    while True:
        left = [p for p in children_of(os.getpid()) if p != server]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"processes left behind: {left}"


class Script:
    """A Python script that plays a notebook kernel, with its output collected by a
    thread so a test can wait for a line without blocking on a pipe."""

    def __init__(self, path: Path):
        import threading

        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        self.popen = subprocess.Popen(
            [sys.executable, str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.lines.append(line)

    def wait_for(self, marker: str, timeout: float = 60.0) -> str:
        """Wait for a line containing ``marker`` and return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if marker in line:
                    return line
            if self.popen.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(
            f"{marker!r} did not appear within {timeout} s; output:\n"
            + "".join(self.lines)
        )

    def finish(self, timeout: float = 60.0) -> str:
        """Wait for the script to end; return all it printed."""
        self.popen.wait(timeout)
        self._reader.join(5)
        return "".join(self.lines)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)


@pytest.fixture
def script(tmp_path):
    """Start a script (source text) as a separate 'kernel' process; killed after."""
    started: list[Script] = []

    def start(source: str) -> Script:
        path = tmp_path / f"kernel{len(started)}.py"
        path.write_text(textwrap.dedent(source))
        started.append(Script(path))
        return started[-1]

    yield start
    for s in started:
        s.kill()
