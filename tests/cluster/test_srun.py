"""workshop.cluster.srun, and what the other launchers' lines and commands do inside a
Slurm job step: the place of a notebook kernel that a cluster's portal started with
``srun``. Checked without Slurm (a stand-in ``srun`` on PATH); the same lines run on
the private cluster in test_in_job_integration.py."""

from __future__ import annotations

import doctest
import os
import shutil
import sys

import pytest
from conftest import ROOT

from workshop.cluster import commands, srun
from workshop.cluster.commands import mpirun_command
from workshop.cluster.run import environment
from workshop.cluster.slurm_options import sbatch_environment
from workshop.cluster.srun import srun_command

SCRIPT = str(ROOT / "slurm" / "hello_ranks.py")
# A kernel's step (measured on the private cluster), its job and the user's settings.
STEP = {"SLURM_JOB_ID": "8", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
        "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_CPUS_ON_NODE": "1",
        "SLURM_MEM_PER_NODE": "400", "SLURM_CPU_BIND": "quiet,mask_cpu:0x1",
        "SLURM_CONF": "/etc/slurm/slurm.conf", "PMIX_RANK": "0"}  # fmt: skip


@pytest.fixture
def fake_srun(tmp_path, monkeypatch):
    """An ``srun`` on PATH (it is never run), and no Slurm variables."""
    (tmp_path / "srun").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    for name in list(os.environ):
        if name.startswith(("SLURM_", "PMI")):
            monkeypatch.delenv(name)
    return tmp_path


def test_srun_inside_a_job_step_overlaps_the_kernels_step(fake_srun):
    assert srun_command(SCRIPT, "--epochs", 1, ntasks=2, environ=STEP) == [
        "srun", "--overlap", "--ntasks=2", sys.executable, SCRIPT, "--epochs", "1",
    ]  # fmt: skip
    # In a batch script or an salloc shell no step holds the job's CPUs.
    batch = {"SLURM_JOB_ID": "8", "SLURM_PROCID": "0"}
    words = srun_command(SCRIPT, ntasks=4, nodes=2, cpus_per_task=3, python="py",
                         environ=batch)  # fmt: skip
    assert words == ["srun", "--ntasks=4", "--nodes=2", "--cpus-per-task=3", "py",
                     SCRIPT]  # fmt: skip
    # os.environ by default.
    assert srun_command(SCRIPT, ntasks=1)[1] == "--ntasks=1"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ntasks": 0}, r"ntasks must be a whole number, 1 or more; got 0\. Pass "
                        r"ntasks=2, for example"),
        ({"ntasks": 2, "nodes": 0}, r"nodes must be a whole number, 1 or more"),
        ({"ntasks": 2, "cpus_per_task": 1.5}, r"cpus_per_task must be a whole number"),
        ({"ntasks": True}, r"ntasks must be a whole number"),
    ],
)  # fmt: skip
def test_srun_command_rejects_bad_counts(fake_srun, kwargs, message):
    with pytest.raises(ValueError, match=message):
        srun_command(SCRIPT, **kwargs)


def test_srun_command_needs_srun_and_the_script(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"program 'srun' not found .* Slurm"):
        srun_command(SCRIPT, ntasks=1)
    (tmp_path / "srun").write_text("#!/bin/sh\n")
    (tmp_path / "srun").chmod(0o755)
    with pytest.raises(FileNotFoundError, match=r"script 'nope\.py' not found"):
        srun_command("nope.py", ntasks=1)


def test_srun_docstring_example_runs(fake_srun, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert doctest.testmod(srun).failed == 0


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_mpirun_inside_a_job_keeps_open_mpi_off_the_allocation(monkeypatch):
    monkeypatch.setattr(commands, "usable_cores", lambda: 1)  # the job's one core
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    found = shutil.which

    def which(name: str, **kwargs):  # no ssh or rsh, as in a slim container
        return None if name in ("ssh", "rsh") else found(name, **kwargs)

    monkeypatch.setattr(shutil, "which", which)
    for name, value in STEP.items():
        monkeypatch.setenv(name, value)
    words = mpirun_command(SCRIPT, np=2, master_port=29400)
    assert words[:9] == ["mpirun", "-np", "2", "--oversubscribe", "--mca", "ras",
                         "^slurm", "--mca", "plm"]  # fmt: skip
    assert words[9] == "^rsh,slurm"  # one --mca plm: Open MPI refuses a repeated one


def test_commands_from_a_cell_get_the_job_but_not_the_kernels_task(monkeypatch):
    for name, value in STEP.items():
        monkeypatch.setenv(name, value)
    child, shown = environment(["srun", "python"], {"SLURM_PROCID": "3", "X": None})
    assert child["SLURM_JOB_ID"] == "8" and child["SLURM_CPUS_ON_NODE"] == "1"
    for name in ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_CPU_BIND", "PMIX_RANK"):
        assert name not in child
    assert child["SLURM_PROCID"] == "3" and shown == {"SLURM_PROCID": "3"}  # asked


def test_sbatch_from_inside_a_job_leaves_the_jobs_variables_out():
    env, left_out = sbatch_environment({**STEP, "HOME": "/home/me"})
    assert env == {"SLURM_CONF": "/etc/slurm/slurm.conf", "HOME": "/home/me"}
    assert left_out == sorted(set(STEP) - {"SLURM_CONF"})
    # Outside a job nothing is touched, a user's own SLURM_* setting included.
    outside = {"SLURM_TIME_FORMAT": "relative", "HOME": "/home/me"}
    assert sbatch_environment(outside) == (outside, [])
