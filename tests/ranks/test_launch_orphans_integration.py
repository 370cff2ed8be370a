"""Nothing a rank starts outlives its launch, on every start method and every way a
launch ends: normally, with an error, at its timeout, on an interrupt, and when the
kernel itself is killed.

Each rank leaves behind the two hard kinds of process: a child that ignores SIGTERM,
and a daemon that left the rank's session (``setsid``) and was orphaned by a double
fork without starting a new program. Both write their process number to a folder
the test reads, so the test knows exactly what must be gone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import gone

import workshop
from workshop import LaunchError
from workshop.ranks import sweep

METHODS = ["fork", "server", "spawn"]
# Two children per rank, two ranks.
PER_LAUNCH = 4
# A spawned rank imports torch first: seconds on 2 busy cores.
TIMEOUT = {"fork": 4, "server": 4, "spawn": 20}

pytestmark = pytest.mark.usefixtures("no_leftover_children")

STUBBORN = (
    "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "open(os.path.join(sys.argv[1], f'{os.getpid()}.pid'), 'w').close(); "
    "time.sleep(600)"
)


def leave_children(folder: str) -> None:
    """Start a SIGTERM-ignoring child and a session-leaving daemon, and wait until
    both have written their process numbers."""
    before = len(os.listdir(folder))
    subprocess.Popen([sys.executable, "-c", STUBBORN, folder])
    if os.fork() == 0:  # the daemon: new session, then fork again and orphan it
        try:
            os.setsid()
            if os.fork() == 0:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                Path(folder, f"{os.getpid()}.pid").touch()
                time.sleep(600)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < before + 2 and time.monotonic() < deadline:
        time.sleep(0.02)


def rank_leaves_children(folder: str, then: str) -> int:
    import torch.distributed as dist

    # One rank at a time, so the count of files tells each rank when its own
    # children are there.
    for turn in range(dist.get_world_size()):
        if turn == dist.get_rank():
            leave_children(folder)
        dist.barrier()
    print("children started", flush=True)
    if then == "error":
        raise ValueError("rank failed after starting children")
    if then == "hang":
        time.sleep(3600)
    return dist.get_rank()


def child_pids(folder: Path, count: int = PER_LAUNCH) -> list[int]:
    pids = [int(p.stem) for p in folder.glob("*.pid")]
    assert len(pids) == count, f"expected {count} children, found {pids}"
    return pids


@pytest.mark.parametrize("method", METHODS)
def test_children_of_ranks_end_with_a_normal_launch(tmp_path, capfd, method):
    result = workshop.launch(
        rank_leaves_children,
        str(tmp_path),
        "return",
        world_size=2,
        backend="gloo",
        start_method=method,
        show="none",
    )
    assert result.returns == [0, 1]
    pids = child_pids(tmp_path)
    assert not gone(pids, within=0.5), "a rank's child outlived the launch"
    err = capfd.readouterr().err
    assert "workshop.launch: the ranks left 4 processes running; stopped them:" in err
    for pid in pids:
        assert f"pid {pid}: " in err


@pytest.mark.parametrize("method", METHODS)
def test_children_of_ranks_end_when_a_rank_fails(tmp_path, method):
    with pytest.raises(LaunchError, match="ValueError: rank failed after starting"):
        workshop.launch(
            rank_leaves_children,
            str(tmp_path),
            "error",
            world_size=2,
            backend="gloo",
            start_method=method,
            show="none",
        )
    assert not gone(child_pids(tmp_path), within=0.5)


@pytest.mark.parametrize("method", METHODS)
def test_children_of_ranks_end_at_the_timeout(tmp_path, method):
    with pytest.raises(LaunchError, match=r"timeout=\d+ s passed"):
        workshop.launch(
            rank_leaves_children,
            str(tmp_path),
            "hang",
            world_size=2,
            backend="gloo",
            start_method=method,
            show="none",
            timeout=TIMEOUT[method],
        )
    assert not gone(child_pids(tmp_path), within=0.5)


KERNEL = """
    import sys, workshop
    sys.path[:0] = {tests!r}
    from test_launch_orphans_integration import rank_leaves_children
    try:
        workshop.launch(rank_leaves_children, {folder!r}, "hang", world_size=2,
                        backend="gloo", start_method={method!r}, show="lines")
    except KeyboardInterrupt:
        print("kernel caught KeyboardInterrupt", flush=True)
"""


def _kernel_with_children(script, tmp_path: Path, method: str):
    folder = tmp_path / "pids"
    folder.mkdir()
    here = Path(__file__).resolve()
    tests = [str(here.parent), str(here.parents[1])]  # this module, then conftest.py
    s = script(KERNEL.format(tests=tests, folder=str(folder), method=method))
    s.wait_for("children started", timeout=90)
    deadline = time.monotonic() + 30
    while len(list(folder.glob("*.pid"))) < PER_LAUNCH:
        assert time.monotonic() < deadline, "the ranks' children did not start"
        time.sleep(0.05)
    return s, child_pids(folder)


@pytest.mark.parametrize("method", METHODS)
def test_children_of_ranks_end_on_an_interrupt(script, tmp_path, method):
    s, pids = _kernel_with_children(script, tmp_path, method)
    s.popen.send_signal(signal.SIGINT)
    s.wait_for("kernel caught KeyboardInterrupt", timeout=30)
    assert not gone(pids, within=0.5), "".join(s.lines)
    assert re.search(r"the ranks left \d processes? running; stopped", s.finish())


@pytest.mark.parametrize("method", METHODS)
def test_children_of_ranks_end_when_the_kernel_is_killed(script, tmp_path, method):
    s, pids = _kernel_with_children(script, tmp_path, method)
    stacks = Path(tempfile.gettempdir()).glob(sweep.stacks_prefix(s.popen.pid) + "*")
    stacks = list(stacks)
    assert len(stacks) == 1  # the launch's folder for its ranks' stack dumps
    s.popen.kill()  # what a crashed kernel, or Jupyter's restart, does
    s.popen.wait(10)
    # The kernel's watchdog notices within a quarter of a second, then stops them,
    # and removes the stack-dump folder the launch could not.
    assert not gone(pids, within=10), "a rank's child outlived the killed kernel"
    deadline = time.monotonic() + 10
    while stacks[0].exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not stacks[0].exists(), f"{stacks[0]} outlived the killed kernel"


def test_a_launch_with_no_children_reports_nothing(capfd):
    result = workshop.launch(os.getpid, world_size=2, backend="gloo", show="none")
    assert len(set(result.returns)) == 2
    assert "left" not in capfd.readouterr().err


def test_tags_fit_a_process_name_and_tell_kernels_apart():
    # Linux keeps 15 characters of a process name; the largest process number
    # Linux allows (2**22) and a billion launches still fit.
    tag = sweep.launch_tag(10**9, pid=2**22)
    assert len(tag) <= 15
    assert tag.startswith(sweep.kernel_prefix(2**22))
    assert not sweep.launch_tag(1, pid=12).startswith(sweep.kernel_prefix(1))
    assert sweep.launch_tag(1, pid=12) != sweep.launch_tag(11, pid=1)


def test_sweeping_finds_a_tagged_program_and_leaves_others(tmp_path):
    env = {**os.environ, sweep.TAG_VAR: "wtest.1"}
    tagged = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env=env
    )
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while tagged.pid not in sweep.tagged("wtest.1", exact=True):
            assert time.monotonic() < deadline, "the tagged program was not found"
            time.sleep(0.02)
        assert other.pid not in sweep.tagged("wtest.", exact=False)
        stopped = sweep.stop_tagged("wtest.1")
        assert len(stopped) == 1
        assert stopped[0].startswith(f"pid {tagged.pid}: ")
        assert "time.sleep(60)" in stopped[0]
        assert tagged.wait(5) == -signal.SIGTERM
        assert other.poll() is None
    finally:
        for p in (tagged, other):
            p.kill()
            p.wait()


def test_the_watchdog_outlives_a_sigterm_to_sweep_after_the_kernel(tmp_path):
    # When a Slurm job ends (scancel, its time limit), Slurm sends SIGTERM to every
    # process of the kernel's job step at once. The kernel dies of it; the watchdog
    # must live on and stop what the kernel's launches left. A stand-in "kernel"
    # starts the watchdog and a process tagged as one of its launches'.
    kernel_script = tmp_path / "kernel.py"
    kernel_script.write_text(
        "import importlib.util, os, subprocess, sys, time\n"
        f"spec = importlib.util.spec_from_file_location('sweep', {sweep.__file__!r})\n"
        "sweep = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(sweep)\n"
        "watchdog = sweep.start_watchdog()\n"
        "env = dict(os.environ, WORKSHOP_LAUNCH=sweep.launch_tag(1))\n"
        "left = subprocess.Popen(['sleep', '300'], env=env, start_new_session=True)\n"
        "print(watchdog.pid, left.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    kernel = subprocess.Popen(
        [sys.executable, "-I", str(kernel_script)], stdout=subprocess.PIPE, text=True
    )
    try:
        watchdog, left = map(int, kernel.stdout.readline().split())
        time.sleep(0.5)  # the watchdog has set up its signals
        os.kill(watchdog, signal.SIGTERM)
        time.sleep(0.5)
        assert gone([watchdog], within=0.1) == [watchdog], "SIGTERM ended it"
        os.kill(kernel.pid, signal.SIGTERM)  # as Slurm does, a moment later
        assert gone([left, watchdog], within=10) == []
    finally:
        kernel.kill()
        kernel.wait(10)
        for pid in (locals().get("left"), locals().get("watchdog")):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_the_next_launch_sweeps_the_dump_folders_of_a_kernel_that_is_gone(tmp_path):
    from workshop.ranks.rank import sweep_stale_dumps

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ours = sweep.stacks_prefix()  # this live process: kept
    pid36, start36 = ours.split("-")[2:4]
    names = {
        "dead": f"workshop-stacks-{sweep._base36(dead.pid)}-{start36}-abc",
        # This pid, but another start time: a later process that took the pid.
        "reused": f"workshop-stacks-{pid36}-{sweep._base36(int(start36, 36) + 1)}-abc",
        "live": ours + "abc",
        "other": "workshop-stacks-notes",  # not a dump folder's name: not touched
    }
    for name in names.values():
        (tmp_path / name).mkdir()
    removed = sweep_stale_dumps(str(tmp_path))
    expected = (
        {names["dead"], names["reused"]} if sweep.start_ticks() else {names["dead"]}
    )
    assert {Path(p).name for p in removed} == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        set(names.values()) - expected
    )
    # And a launch does it in the system's temporary folder.
    stale = Path(tempfile.gettempdir()) / names["dead"]
    stale.mkdir(exist_ok=True)
    workshop.launch(os.getpid, world_size=2, backend="gloo", show="none")
    assert not stale.exists()
