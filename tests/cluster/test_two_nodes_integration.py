"""The slow tests of test_two_nodes.py (they start ranks, subprocesses or jobs): make
test runs them, make test-fast leaves them out: the private cluster's two nodes, each
with its own slurmd."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, gone, needs_private_slurm

NODES = ["127.0.0.2", "127.0.0.3"]


@pytest.fixture(scope="module")
def cluster(private_slurm):
    """The folder of the run's private two-node cluster (local_slurm.sh's, started
    by slurm_cluster()), lent to this module with its nodes idle; stopped with all
    it ran at the end of the run (tests/conftest.py)."""
    return private_slurm.folder


def _env(folder: Path) -> dict[str, str]:
    # Both nodes are this machine: on a GPU machine two "nodes" would share its GPU,
    # which NCCL refuses, so the jobs here run on CPUs, with gloo.
    return clean_env(SLURM_CONF=str(folder / "slurm.conf"), CUDA_VISIBLE_DEVICES="")


def _slurm(folder: Path, *command: str, timeout: float = 60) -> str:
    done = subprocess.run(command, env=_env(folder), cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, f"{command}: {done.stderr}"
    return done.stdout


# The states a job ends in (squeue's JOB STATE CODES): COMPLETING is not one yet.
_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
          "PREEMPTED", "BOOT_FAIL", "DEADLINE")  # fmt: skip


def _sbatch(folder: Path, tmp_path: Path, *args: str, timeout: float = 180) -> tuple:
    """Submit from the repository root and wait for the end; the job id, its exit
    code (as ``sbatch --wait`` gives it) and its output. A job still running at the
    timeout is cancelled.

    Polled every 0.2 s with scontrol: ``sbatch --wait`` polls too, but every 2, 4,
    8, then 10 s, and so saw a job of 10 s end up to 20 s late."""
    submitted = _slurm(folder, "sbatch", "--parsable", f"--output={tmp_path}/%j.out",
                       *args)  # fmt: skip
    job_id = submitted.strip().split(";")[0]
    assert job_id.isdigit(), submitted
    deadline = time.monotonic() + timeout
    while True:
        shown = _slurm(folder, "scontrol", "show", "job", "-o", job_id)
        state = re.search(r"\bJobState=(\S+)", shown)[1]
        if state in _ENDED:
            break
        if time.monotonic() > deadline:
            _slurm(folder, "scancel", job_id)
            pytest.fail(f"job {job_id} is still {state} after {timeout:g} s")
        time.sleep(0.2)
    code, sig = map(int, re.search(r"\bExitCode=(\d+):(\d+)", shown).groups())
    return (
        job_id,
        code or (128 + sig if sig else 0),
        (tmp_path / f"{job_id}.out").read_text(),
    )


def _launched_on(folder: Path, step: str) -> list[str]:
    """The nodes whose slurmd started ``step`` (JOBID.STEP), from their own logs."""
    return [
        node
        for node in NODES
        if f"launch task StepId={step} "
        in (folder / "log" / f"slurmd-{node}.log").read_text()
    ]


@needs_private_slurm
def test_two_nodes_each_with_its_own_slurmd(cluster):
    nodes = _slurm(cluster, "sinfo", "-h", "-N", "-o", "%N %T %c")
    # The cores this process may use, whatever OMP_NUM_THREADS says (nproc caps
    # its count at it; the cluster's nodes do not).
    cpus = str(len(os.sched_getaffinity(0)))
    assert nodes.splitlines() == [f"{node} idle {cpus}" for node in NODES]
    for node in NODES:  # a daemon each, with its own pid file, spool and log
        pid = int((cluster / "run" / f"slurmd-{node}.pid").read_text())
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert command[-3:-1] == [b"-N", node.encode()], command
        assert (cluster / node).is_dir()  # its spool: the node's "local disk"


@needs_private_slurm
def test_a_two_node_step_runs_a_task_on_each_node(cluster):
    said = _slurm(cluster, "srun", "--nodes=2", "--ntasks-per-node=1", "bash", "-c",
                  'echo "$SLURM_NODEID $SLURMD_NODENAME $SLURM_PROCID"')  # fmt: skip
    assert sorted(said.splitlines()) == [f"0 {NODES[0]} 0", f"1 {NODES[1]} 1"]


@needs_private_slurm
def test_hello_ranks_spans_both_nodes(cluster, tmp_path):
    job, code, text = _sbatch(
        cluster, tmp_path, "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=0",
        "--cpus-per-task=1", "slurm/hello_ranks.sbatch",
    )  # fmt: skip
    assert code == 0, text
    assert f"job {job}: 2 nodes (127.0.0.[2-3]), 2 tasks" in text
    assert f"rendezvous at {NODES[0]}:" in text  # the first node of the job
    for rank in (0, 1):  # one rank a node: each is local rank 0 of its node
        assert (
            f"hello from rank {rank} of 2 (local rank 0, node {rank}, started by "
            "srun, gloo): sum of ranks = 1"
        ) in text, text
    assert _launched_on(cluster, f"{job}.0") == NODES


@needs_private_slurm
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_mpirun_sbatch_starts_a_rank_on_each_node(cluster, tmp_path):
    job, code, text = _sbatch(
        cluster, tmp_path, "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=0",
        "--cpus-per-task=1", "slurm/mpirun.sbatch", timeout=240,
    )  # fmt: skip
    checkpoint = ROOT / "runs" / "checkpoints" / f"mpirun-{job}.pt"
    try:
        assert code == 0, text
        assert f"job {job}: 2 nodes (127.0.0.[2-3]), 2 tasks" in text
        assert f"rendezvous at {NODES[0]}:" in text
        assert "mpirun (Open MPI)" in text
        # mpirun read the allocation: a rank on each node, started by that node's
        # slurmd (Open MPI's daemon for the node is step 0, the training step 1).
        assert "rank 0 of 2 on 127.0.0.2" in text and "rank 1 of 2 on 127.0.0.3" in text
        assert _launched_on(cluster, f"{job}.0") == NODES
        assert _launched_on(cluster, f"{job}.1") == NODES
        # Both ranks trained, to the same weights (DDP keeps them equal).
        sums = dict(re.findall(r"rank (\d): weights sum to (-?\d+\.\d+)", text))
        assert sorted(sums) == ["0", "1"] and sums["0"] == sums["1"], text
        assert "epoch 2: loss" in text
        assert checkpoint.is_file()  # rank 0 saved it, where the script said
    finally:
        checkpoint.unlink(missing_ok=True)


def _mpirun_processes() -> dict[int, str]:
    """The processes of an mpirun job (private-cluster tests run one at a time):
    mpirun, srun starting Open MPI's daemons, the daemons (orted), the ranks."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone since
        if re.search(r"\b(mpirun|orted)\b|slurm/ddp_minimal\.py", command):
            found[int(entry.name)] = command[:120]
    return found


def _session_folders() -> set[str]:
    """Open MPI's session folders under /tmp (its default place: the batch scripts
    give it no other), two levels down: ompi.NODE.UID/{pid.N, jf.N}."""
    return {
        str(path)
        for top in Path("/tmp").glob("ompi.*")
        for path in [top, *top.glob("*")]
    }


@needs_private_slurm
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_a_cancelled_mpirun_job_leaves_no_process_nor_session_folder(cluster, tmp_path):
    # scancel while the ranks train: Slurm signals mpirun and the daemons' step;
    # mpirun ends its ranks and daemons and removes the session folders it and they
    # made in /tmp (measured with Open MPI 4.1.4: none left).
    before = _session_folders()
    submitted = _slurm(cluster, "sbatch", "--parsable", f"--output={tmp_path}/%j.out",
                       "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=0",
                       "--cpus-per-task=1", "slurm/mpirun.sbatch")  # fmt: skip
    job = submitted.strip().split(";")[0]
    checkpoint = ROOT / "runs" / "checkpoints" / f"mpirun-{job}.pt"
    try:
        # Cancelled while its two ranks and two daemons run (its output says little
        # until the end: a pipe buffers the ranks' prints).
        deadline = time.monotonic() + 120
        running = _mpirun_processes()
        while len([c for c in running.values() if c.startswith("python ")]) < 2:
            assert time.monotonic() < deadline, f"job {job}'s ranks never started"
            time.sleep(0.05)
            running = _mpirun_processes()
        made = _session_folders() - before
        _slurm(cluster, "scancel", job)
        shown = ""
        while "JobState=CANCELLED" not in shown:
            assert time.monotonic() < deadline + 60, f"job {job}: {shown}"
            shown = _slurm(cluster, "scontrol", "show", "job", "-o", job)
            time.sleep(0.2)
        # mpirun, the daemons' srun, two daemons and two ranks.
        daemons = [c for c in running.values() if re.match(r"\S*orted ", c)]
        assert len(running) >= 5 and len(daemons) == 2, running
        assert made, "the job made no session folder in /tmp"
        left = {pid: running[pid] for pid in gone(list(running), within=90)}
        assert left == {}, f"left running after scancel {job}: {left}"
        within = time.monotonic() + 10  # the last of them removes its folder as it ends
        while made & _session_folders() and time.monotonic() < within:
            time.sleep(0.2)
        assert made & _session_folders() == set(), "session folders left in /tmp"
    finally:
        checkpoint.unlink(missing_ok=True)
