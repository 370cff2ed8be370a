"""Real launchers started from a cell leave nothing behind: whatever way a run ends,
no process that its ranks started survives it.

Each rank of a real ``torchrun`` (``python -m torch.distributed.run``) or ``mpirun``
starts the two children that are hardest to stop: one that ignores SIGTERM, and a
daemon that double-forks after ``os.setsid()`` (so it is in no session or process
group of the launcher's, and its parent is gone). The run is started by
``workshop.cluster.run_command`` in a separate "kernel" process, as a notebook cell
would, and ended six ways: a normal end, a rank's error, the timeout, an interrupt of
the kernel (which stops the keeper), the keeper stopped by SIGTERM, and the kernel
SIGKILLed; and ``run_commands`` is checked with one "node" failing. Every process of
the run carries a unique marker in its argv; afterwards /proc must hold none.

World size 2 and ranks that import nothing heavy keep each case to seconds; the
timeout case waits for its timeout.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from conftest import ROOT, children_of, clean_env

PYTHON = sys.executable
WAYS = [
    "normal end", "rank error", "timeout", "interrupt", "keeper stopped",
    "kernel killed",
]  # fmt: skip
GRACE = 1.0  # seconds between the keeper's SIGTERM and SIGKILL
# The timeout case waits this long: enough, on a quiet 2-core machine, for the
# launcher to start both ranks and their children (about 3 s for torchrun, which
# imports torch, and 1 s for mpirun when idle), which then wait to be stopped. A
# busy machine can take longer (a CI run's torchrun did not have both ranks up
# after 12 s): then the run is tried again with the timeout doubled, up to
# TIMEOUT_TRIES times, so the case stays quick where it can and holds where not.
TIMEOUT = {"torchrun": 12.0, "mpirun": 6.0}
TIMEOUT_TRIES = 3

# The child that ignores SIGTERM, as in the brief: only SIGKILL ends it. It says it
# is up (after it ignores SIGTERM) with a file named by its argv.
STUBBORN = (
    "import os, signal, sys, time; signal.signal(15, signal.SIG_IGN); "
    "open(os.path.join(sys.argv[1], sys.argv[2] + '.up'), 'w').close(); "
    "time.sleep(600)"
)

# A rank: starts both children, waits until they are up, then does what WAY says.
# It needs no rank number: the rank that fails is the one that creates 'failer'
# first, and it fails when the test creates 'fail now'. It imports nothing heavy,
# so that a run takes seconds on two cores.
RANK = """
import os, subprocess, sys, time
folder, way = sys.argv[1], sys.argv[2]
code = {stubborn!r}
me = str(os.getpid())
subprocess.Popen([sys.executable, "-c", code, folder, me + "-stubborn"])
middle = os.fork()
if middle == 0:  # the daemon: a new session, then a grandchild whose parent is gone
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.execv(sys.executable, [sys.executable, "-c", code, folder, me + "-daemon"])
    os._exit(0)
os.waitpid(middle, 0)
up = [os.path.join(folder, f"{{me}}-{{kind}}.up") for kind in ("stubborn", "daemon")]
while not all(os.path.exists(path) for path in up):
    time.sleep(0.02)
open(os.path.join(folder, me + ".rank"), "w").close()
sys.stdout.write(f"rank {{me}}: children up" + chr(10))
if way == "normal end":
    sys.exit(0)
if way == "rank error":
    try:
        os.close(os.open(os.path.join(folder, "failer"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        pass
    else:  # the test says when: once every rank's children are up
        while not os.path.exists(os.path.join(folder, "fail now")):
            time.sleep(0.02)
        sys.exit(3)
time.sleep(600)
"""

# The stand-in for a notebook kernel. It imports workshop.cluster.commands alone, not
# the package's __init__ (torch: seconds of start-up on two cores), and says how the
# call ended.
KERNEL = """
import sys, types
sys.modules["workshop"] = package = types.ModuleType("workshop")
package.__path__ = [{package!r}]
from workshop.cluster.commands import CommandError, run_command, run_commands
try:
    results = {call}
except CommandError as exc:
    print("CommandError:", exc, flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
else:
    print("returned", results, flush=True)
"""


def _launcher_or_skip(launcher: str) -> None:
    if launcher == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("needs Open MPI's mpirun (make setup installs it: openmpi-bin)")


def _command(launcher: str, rank: Path, folder: Path, way: str) -> list[str]:
    """The launcher's command line for 2 ranks of ``rank``, as a learner's cell
    builds it (mpirun's from workshop.cluster.mpirun_command: as root, without ssh)."""
    if launcher == "torchrun":
        return [
            PYTHON, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node=2", str(rank), str(folder), way,
        ]  # fmt: skip
    from workshop.cluster.commands import mpirun_command

    return mpirun_command(rank, folder, way, np=2)


def _marked(marker: str) -> list[int]:
    """Live processes with ``marker`` in their argv (zombies have none)."""
    needle = marker.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
        except OSError:  # ended while we looked
            continue
        if needle in argv:
            found.append(int(entry.name))
    return found


def _gone(marker: str, within: float) -> list[int]:
    """Wait until no process carries ``marker``; return those still there."""
    deadline = time.monotonic() + within
    while (left := _marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


class EndedEarly(AssertionError):
    """The kernel ended before the ranks' children were up: what it said, and the
    marked processes still there afterwards."""

    def __init__(self, message: str, out: str, left: list[int]):
        super().__init__(message)
        self.out, self.left = out, left


def _wait_for(condition, within: float, what: str, kernel: subprocess.Popen) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {within:g} s")
        if kernel.poll() is not None:
            out = kernel.stdout.read() if kernel.stdout else ""
            raise EndedEarly(
                f"the kernel ended before {what}; it said:\n{out}", out, []
            )
        time.sleep(0.05)


def _run_kernel(
    call: str, folder: Path, ranks: int, way: str, timeout: float
) -> tuple[str, list[int]]:
    """Run ``call`` in a kernel, end it ``way`` once the children of all ``ranks``
    ranks are up, and return what the kernel printed and the marked processes
    still there 10 s later."""
    source = KERNEL.format(package=str(ROOT / "workshop"), call=call)
    kernel = subprocess.Popen(
        [PYTHON, "-c", textwrap.dedent(source)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(PYTHONUNBUFFERED="1"),
        cwd=folder.parent,
    )
    try:
        try:
            _wait_for(
                lambda: len(list(folder.glob("*.rank"))) == ranks,
                60,
                f"{ranks} ranks had started their children",
                kernel,
            )
        except EndedEarly as early:
            # Even a run stopped before its ranks were up must leave nothing.
            early.left = _gone(folder.name, within=10 + 2 * GRACE)
            raise
        if way == "rank error":
            (folder / "fail now").touch()
        elif way == "interrupt":  # the kernel's stop button: SIGINT to the kernel
            kernel.send_signal(signal.SIGINT)
        elif way == "keeper stopped":  # as by `kill`, or the kernel's atexit hook
            for keeper in children_of(kernel.pid):
                os.kill(keeper, signal.SIGTERM)
        elif way == "kernel killed":
            kernel.kill()
        out, _ = kernel.communicate(timeout=timeout + 30)
        left = _gone(folder.name, within=10 + 2 * GRACE)
    finally:
        if kernel.poll() is None:
            kernel.kill()
            kernel.wait(10)
        for pid in _marked(folder.name):  # so a failure here does not slow the others
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if way == "kernel killed":
        assert kernel.returncode == -signal.SIGKILL
    up = sorted(path.stem for path in folder.glob("*.up"))
    assert len(up) == 2 * ranks, (up, out)  # every rank's two children were up
    return out, left


def _folder(tmp_path: Path) -> Path:
    """A folder whose unique name marks every process of the run: it is in each
    argv (the ranks' and their children's first argument)."""
    folder = tmp_path / f"launcher-children-{uuid.uuid4().hex}"
    folder.mkdir()
    (tmp_path / "rank.py").write_text(textwrap.dedent(RANK.format(stubborn=STUBBORN)))
    return folder


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
def test_no_child_of_a_rank_survives(launcher, way, tmp_path):
    _launcher_or_skip(launcher)
    timeout = TIMEOUT[launcher] if way == "timeout" else 120.0
    for attempt in range(1, TIMEOUT_TRIES + 1):
        folder = _folder(tmp_path)
        command = _command(launcher, tmp_path / "rank.py", folder, way)
        call = f"run_command({command!r}, timeout={timeout!r}, grace={GRACE!r})"
        try:
            out, left = _run_kernel(call, folder, 2, way, timeout)
            break
        except EndedEarly as early:
            # Only the timeout case may end by itself before its ranks are up,
            # and only on a machine too busy for the timeout: nothing may be left
            # even then; try again with more time.
            assert early.left == [], f"left behind: {early.left}; said:\n{early.out}"
            if way != "timeout" or attempt == TIMEOUT_TRIES:
                raise
            timeout *= 2
    assert left == [], f"left behind: {left}; the kernel said:\n{out}"
    said = out.strip().splitlines()[-1] if out.strip() else ""
    if way == "normal end":
        assert said.startswith("returned CommandResult(") and "returncode=0" in said
    elif way in ("rank error", "keeper stopped"):
        # The message names the command and its code: the launcher's own, or -N
        # for the signal that ended it (stopped, a launcher may exit 1, or be
        # SIGKILLed after the grace period while it waits for a rank's pipe).
        assert re.search(r"^CommandError: `.*` exited with code -?\d+", out, re.M)
    elif way == "timeout":
        assert f"ran past timeout={timeout:g} s, so every process was stopped" in said
    elif way == "interrupt":
        assert said == "KeyboardInterrupt", out


def test_when_one_node_fails_no_child_of_any_node_survives(tmp_path):
    # run_commands, as two "nodes" of one job: the mpirun node's rank fails, so the
    # torchrun node, whose ranks wait, is stopped with everything they started.
    _launcher_or_skip("mpirun")
    folder = _folder(tmp_path)
    rank = tmp_path / "rank.py"
    commands = [
        _command("torchrun", rank, folder, "wait"),
        _command("mpirun", rank, folder, "rank error"),
    ]
    call = (
        f"run_commands({commands!r}, labels=['node 0', 'node 1'], timeout=120.0, "
        f"grace={GRACE!r})"
    )
    out, left = _run_kernel(call, folder, 4, "rank error", 120.0)
    assert left == [], f"left behind: {left}; the kernel said:\n{out}"
    assert re.search(
        r"^CommandError: `mpirun .*` exited with code \d+ \(the others were stopped, "
        r"as a job ends when a node fails\)",
        out,
        re.M,
    ), out
