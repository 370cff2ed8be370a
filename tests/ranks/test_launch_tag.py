"""Where a launch's tag (``WORKSHOP_LAUNCH``, see workshop/_procs.py) really
shows, for each start method: in the rank's ``os.environ`` always; in
``/proc/PID/environ`` (the environment a program was started with, which the sweep
reads) for a spawned rank and for every program a rank starts, but not for a rank
forked from the kernel or the fork server, whose environment is set after the fork;
and as the process name of the rank and of a process it forks without exec (a
program it execs takes that program's name). Ranks are pinned to gloo."""

from __future__ import annotations

import os
import subprocess
import warnings

import pytest

import workshop
from workshop._procs import TAG_VAR, kernel_prefix

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _name_of_a_forked_child() -> str:
    """/proc/self/comm of a child forked without exec (as a daemon would be)."""
    read, write = os.pipe()
    with warnings.catch_warnings():  # forking a threaded process: the child only
        warnings.simplefilter("ignore", DeprecationWarning)  # reads a file and exits
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, _read("/proc/self/comm"))
        finally:
            os._exit(0)
    os.close(write)
    name = os.read(read, 64).decode().strip()
    os.close(read)
    os.waitpid(pid, 0)
    return name


def _where_the_tag_is() -> dict:
    tag = os.environ.get(TAG_VAR)
    entry = f"{TAG_VAR}={tag}".encode()

    def run(*command: str) -> bytes:
        return subprocess.run(
            command, capture_output=True, check=True, timeout=60
        ).stdout

    return {
        "tag": tag,
        "own_environ": entry in _read("/proc/self/environ").split(b"\0"),
        "own_name": _read("/proc/self/comm").decode().strip(),
        "child_environ": entry in run("cat", "/proc/self/environ").split(b"\0"),
        "child_name": run("cat", "/proc/self/comm").decode().strip(),
        "forked_child_name": _name_of_a_forked_child(),
    }


@pytest.mark.parametrize("method", ["fork", "server", "spawn"])
def test_where_each_process_of_a_launch_carries_its_tag(method):
    result = workshop.launch(
        _where_the_tag_is,
        world_size=2,
        backend="gloo",
        start_method=method,
        show="none",
    )
    first, second = result.returns
    tag = first["tag"]
    # One tag for the launch, of this process's launches, short enough for a name.
    assert tag and tag.startswith(kernel_prefix()) and len(tag) <= 15
    assert second["tag"] == tag
    for facts in result.returns:
        # Only a rank started by exec (spawn) shows the tag in its own /proc environ;
        # a forked rank's variables are set after the fork, which /proc never shows.
        assert facts["own_environ"] is (method == "spawn"), facts
        # Every program a rank starts inherits the tag in its environment...
        assert facts["child_environ"] is True, facts
        # ...and takes the program's name; the rank and what it forks carry the tag.
        assert facts["child_name"] == "cat", facts
        assert facts["own_name"] == tag, facts
        assert facts["forked_child_name"] == tag, facts


def test_a_rank_gets_the_job_but_not_the_kernels_slurm_task(monkeypatch):
    # A kernel on a cluster's portal is task 0 of a Slurm job step; its ranks are not.
    from workshop.env import rank_env

    step = {"SLURM_JOB_ID": "8", "SLURM_CPUS_ON_NODE": "1", "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1",
            "SLURM_CPU_BIND": "quiet,mask_cpu:0x1", "PMI_RANK": "0"}  # fmt: skip
    for name, value in step.items():
        monkeypatch.setenv(name, value)
    env = rank_env(2, 3, 29400, "w1.1")
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("2", "3", "2")
    assert (env["SLURM_JOB_ID"], env["SLURM_CPUS_ON_NODE"]) == ("8", "1")
    assert not {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_ID", "PMI_RANK",
                "SLURM_STEP_NUM_TASKS", "SLURM_CPU_BIND"} & set(env)  # fmt: skip
    assert workshop.env.rank_info(env).launcher == "workshop"


def _stat_line(name: str, state: str, flags: int, start: int) -> bytes:
    # pid (comm) state ppid pgrp session tty tpgid flags ... starttime (field 22)
    rest = [state, "1", "1", "1", "0", "-1", str(flags)] + ["0"] * 12 + [str(start)]
    return f"4242 ({name}) {' '.join(rest)} 0 0\n".encode()


def test_a_process_inside_exit_counts_as_gone_not_as_left_running():
    from workshop._procs import PF_EXITING, parse_stat

    # A name with a space and a parenthesis, as a rank's tag never has but a
    # program may: the name is what lies between the first "(" and the last ")".
    alive = _stat_line("w1a.3 (x)", "S", 0x400040, 123456)
    assert parse_stat(alive) == ("w1a.3 (x)", b"S", 123456)
    exiting = _stat_line("w1a.3", "R", 0x400040 | PF_EXITING, 123456)
    assert parse_stat(exiting) == ("w1a.3", b"X", 123456)


def test_this_process_parses_as_running_with_its_own_start_time():
    from workshop._procs import _stat, start_ticks

    _name, state, start = _stat(str(os.getpid()))
    assert state in (b"R", b"S") and start == start_ticks() > 0
