"""One worker code path: the script that notebook 02's lesson becomes runs unchanged
under torchrun and with the variables srun and mpirun give each task."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch
from conftest import ROOT, free_port

from workshop.env import RankInfo, rank_device
from workshop.ranks.worker import _init_method, _shared_gpu, process_group


def test_srun_port_comes_from_the_job_id(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "123456")
    info = RankInfo(rank=0, world_size=2, master_addr="gpu003", launcher="srun")
    assert _init_method(info) == "tcp://gpu003:13456"  # 10000 + 123456 % 20000


def test_missing_rendezvous_address_is_explained(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    info = RankInfo(rank=1, world_size=2, launcher="mpirun")
    with pytest.raises(
        RuntimeError,
        match=r"mpirun started rank 1 of 2 but "
        r"MASTER_ADDR=None and MASTER_PORT=None; export both .* pass them to every "
        r"rank: mpirun -x MASTER_ADDR -x MASTER_PORT$",
    ):
        _init_method(info)


def test_a_single_process_gets_a_group_of_one(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    import torch.distributed as dist

    # gloo: on a GPU node "auto" would start NCCL, and CUDA, in the test process.
    with process_group("gloo") as info:
        assert dist.is_initialized() and dist.get_world_size() == 1
        assert info.launcher == "torchrun"
        assert rank_device() == torch.device("cpu")  # read from the group
    assert not dist.is_initialized()


def test_an_nccl_group_computes_on_the_ranks_gpu():
    info = RankInfo(rank=3, local_rank=1, world_size=4, local_world_size=2)
    # What dist.get_backend() says of a group with gloo beside NCCL.
    assert rank_device("cpu:gloo,cuda:nccl", info) == torch.device("cuda", 1)
    assert rank_device("nccl", info) == torch.device("cuda", 1)
    assert rank_device("gloo", info) == torch.device("cpu")
    assert rank_device() == torch.device("cpu")  # no group: the CPU
    with pytest.raises(ValueError, match=r"backend='glo' is not a process group "):
        rank_device("glo", info)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), "60", True])
def test_process_group_refuses_a_timeout_that_is_no_number_of_seconds(timeout):
    refused = pytest.raises(
        ValueError, match=r"^timeout must be a number of seconds above 0"
    )
    with refused, process_group(timeout=timeout):
        pass


def test_two_ranks_on_one_gpu_are_named_with_the_fix():
    own = [("node1", "GPU-a", 0), ("node1", "GPU-b", 1), ("node2", "GPU-a", 0)]
    assert _shared_gpu(own) is None  # the same GPU name on another host is fine
    shared = [("node1", "GPU-a", 0), ("node2", "GPU-c", 0), ("node1", "GPU-a", 0)]
    message = _shared_gpu(shared)
    assert message.startswith(
        "ranks 0 and 2 both use the same GPU (cuda:0 on host node1), but NCCL needs "
        "one GPU per rank."
    )
    assert message.endswith(
        "Give each launcher its own GPUs (CUDA_VISIBLE_DEVICES), or pass "
        'backend="gloo" to run the ranks on the CPU'
    )


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_slurm_scripts_parse():
    for script in (ROOT / "slurm").glob("*.sbatch"):
        run = subprocess.run(
            ["bash", "-n", str(script)], capture_output=True, text=True, check=False
        )
        assert run.returncode == 0, f"{script.name}: {run.stderr}"
        text = script.read_text()
        assert "set -euo pipefail" in text
        if "MASTER_ADDR" in text:  # a job of several nodes meets on its first host
            assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in text
        assert "# Submit from the repository root:" in text


def test_the_exit_wait_sleeps_only_while_gloo_threads_linger(monkeypatch):
    import workshop.ranks.worker as worker

    slept = []
    monkeypatch.setattr("time.sleep", slept.append)
    for threads in (0, 2, -1):  # none left, two lingering, cannot tell (not Linux)
        monkeypatch.setattr(worker, "_gloo_threads", lambda n=threads: n)
        worker._let_gloo_threads_finish()
    assert slept == [0.1, 0.1]


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_ranks_share_the_cores_this_process_may_use_not_the_hosts(monkeypatch):
    from workshop import allocation
    from workshop.ranks.worker import _configure_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)  # not inside a Slurm job
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the host
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})  # ours
    monkeypatch.setattr(allocation, "cgroup_cpus", lambda *a: [])  # no cgroup limit
    before = torch.get_num_threads()
    try:
        _configure_threads(RankInfo(rank=0, world_size=2, local_world_size=2))
        assert torch.get_num_threads() == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice wins
        _configure_threads(RankInfo(rank=0, world_size=8, local_world_size=8))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_ranks_share_the_cores_of_their_slurm_job_not_the_nodes(monkeypatch):
    # Slurm's task/none binds nothing: the affinity mask is the node's 64 cores, and
    # only SLURM_CPUS_ON_NODE says the job has 4 of them.
    from workshop import allocation
    from workshop.ranks.worker import _configure_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(allocation, "cgroup_cpus", lambda *a: [])
    monkeypatch.setenv("SLURM_JOB_ID", "8")
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "4")
    before = torch.get_num_threads()
    try:
        _configure_threads(RankInfo(rank=0, world_size=2, local_world_size=2))
        assert torch.get_num_threads() == 2  # 4 of the job's cores / 2 ranks, not 32
    finally:
        torch.set_num_threads(before)


# --- ranks leave once all have joined ----------------------------------------------
#
# init_process_group is no barrier: a rank whose block ends at once would close its gloo
# connections while a slower rank is still making its own, and that rank's set-up would
# fail with "Connection closed by peer" (pytorch/pytorch#61396). So no rank leaves
# before every rank's init_process_group has returned. Here rank 1's returns a second
# late (its init is wrapped to sleep after the real one), and rank 0, whose block is
# empty, must still be there when it does.
