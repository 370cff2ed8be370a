"""The worker code, the batch script and the benchmarks under the real launchers:
Open MPI's ``mpirun``, and Slurm's ``srun`` and ``sbatch`` on a private one-node
cluster (scripts/local_slurm.sh). ``make setup`` installs both as root; where they
are missing the tests say so and skip."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, free_port

from workshop import load_allreduce

PYTHON = sys.executable
FAST_SWEEP = (
    *("allreduce", "--max-size", "16K", "--repeats", "3", "--warmup", "1"),
    *("--min-time", "0", "--reference-size", "1M"),
)

needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None,
    reason="needs Open MPI's mpirun (make setup installs it as root: openmpi-bin)",
)
needs_slurm = pytest.mark.skipif(
    shutil.which("slurmctld") is None or os.geteuid() != 0,
    reason="needs Slurm's daemons and munge, and root to run slurmd "
    "(make setup installs them as root: slurm-wlm munge)",
)


def _run(command: list[str], env: dict[str, str], cwd: Path, timeout: float = 180):
    return subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


# --- Open MPI -----------------------------------------------------------------------


def _mpirun(n: int, *command: str) -> tuple[list[str], dict[str, str]]:
    # As root (in a container) mpirun must be told that is intended.
    env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return [
        "mpirun", "-np", str(n), "--oversubscribe",
        *("-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "PYTHONPATH"),
        *command,
    ], env  # fmt: skip


@needs_mpirun
def test_hello_ranks_under_mpirun(tmp_path):
    command, env = _mpirun(2, PYTHON, str(ROOT / "slurm" / "hello_ranks.py"))
    done = _run(command, env, tmp_path)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert (
            f"hello from rank {rank} of 2 (local rank {rank}, node 0, started by "
            "mpirun, gloo): sum of ranks = 1"
        ) in done.stdout


@needs_mpirun
def test_the_allreduce_sweep_under_mpirun(tmp_path):
    command, env = _mpirun(2, PYTHON, "-m", "workshop.bench", *FAST_SWEEP, "--out", "s")
    done = _run(command, env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("wrote ") == 1  # rank 0 alone
    result = load_allreduce(tmp_path / "s.json")
    assert (result.launcher, result.world_size, result.sizes) == (
        "mpirun",
        2,
        [4096, 16384],
    )


# --- Slurm --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A private Slurm cluster for this module; its daemons stop afterwards."""
    folder = tmp_path_factory.mktemp("slurm")
    script = ROOT / "scripts" / "local_slurm.sh"
    start = _run(["bash", str(script), "start", str(folder)], dict(os.environ), ROOT)
    assert start.returncode == 0, start.stderr
    try:
        yield clean_env(SLURM_CONF=str(folder / "slurm.conf"))
    finally:
        _run(["bash", str(script), "stop", str(folder)], dict(os.environ), ROOT)
        leftover = subprocess.run(
            ["pgrep", "-f", str(folder)], capture_output=True, text=True
        ).stdout.split()
        assert leftover == [], f"daemons of the test cluster still run: {leftover}"


@needs_slurm
def test_hello_ranks_as_srun_tasks(slurm, tmp_path):
    done = _run(["srun", "-n", "2", PYTHON, str(ROOT / "slurm/hello_ranks.py")],
                slurm, tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = sorted(line for line in done.stdout.splitlines() if "hello" in line)
    assert lines == [
        f"hello from rank {r} of 2 (local rank {r}, node 0, started by srun, gloo): "
        "sum of ranks = 1"
        for r in (0, 1)
    ]


@needs_slurm
def test_the_batch_script_runs_on_slurm(slurm, tmp_path):
    # The script as a learner submits it, with the GPU lines overridden for a CPU
    # node; it activates .venv from the submission directory.
    if not (ROOT / ".venv" / "bin" / "activate").exists():
        pytest.skip("the batch script activates .venv, which make setup creates")
    out = tmp_path / "hello-%j.out"
    submit = _run(
        ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2",
         "--gpus-per-node=0", "--cpus-per-task=1", f"--output={out}",
         "slurm/hello_ranks.sbatch"],
        slurm, ROOT,
    )  # fmt: skip
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = _run(["squeue", "-h", "-j", job, "-o", "%T"], slurm, ROOT).stdout
        if not state.strip():
            break
        time.sleep(0.5)
    else:
        _run(["scancel", job], slurm, ROOT)
        pytest.fail(f"job {job} still queued or running after 120 s")
    text = (tmp_path / f"hello-{job}.out").read_text()
    assert f"job {job}: 1 nodes" in text and ", 2 tasks" in text
    assert f"rendezvous at {socket.gethostname().split('.')[0]}:" in text
    assert text.count("sum of ranks = 1") == 2, text


@needs_slurm
def test_the_allreduce_sweep_as_srun_tasks(slurm, tmp_path):
    done = _run(
        ["srun", "-n", "2", PYTHON, "-m", "workshop.bench", *FAST_SWEEP, "--out", "s"],
        slurm,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    result = load_allreduce(tmp_path / "s.json")
    assert (result.launcher, result.world_size) == ("srun", 2)
