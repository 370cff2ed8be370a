"""Where a launch's tag (``WORKSHOP_LAUNCH``, see workshop/ranks/sweep.py) really
shows, for each start method: in the rank's ``os.environ`` always; in
``/proc/PID/environ`` (the environment a program was started with, which the sweep
reads) for a spawned rank and for every program a rank starts, but not for a rank
forked from the kernel or the fork server, whose environment is set after the fork;
and as the process name of the rank and of a process it forks without exec (a
program it execs takes that program's name). Ranks are pinned to gloo."""

from __future__ import annotations

import os

import pytest

import workshop

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def test_a_rank_gets_the_job_but_not_the_kernels_slurm_task(monkeypatch):
    # A kernel on a cluster's portal is task 0 of a Slurm job step; its ranks are not.
    from workshop.env import rank_env

    step = {"SLURM_JOB_ID": "8", "SLURM_CPUS_ON_NODE": "1", "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1",
            "SLURM_CPU_BIND": "quiet,mask_cpu:0x1", "PMI_RANK": "0"}  # fmt: skip
    for name, value in step.items():
        monkeypatch.setenv(name, value)
    env = rank_env(2, 3, 29400)
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
    from workshop._procs import proc_stat, start_ticks

    _name, state, start = proc_stat(str(os.getpid()))
    assert state in (b"R", b"S") and start == start_ticks() > 0
