"""workshop.env: reading rank information from each launcher, choosing the backend
and world size, describing the Slurm allocation, counting GPUs without CUDA."""

from __future__ import annotations

import os
import re

import pytest
import torch
import torch.distributed as dist

from workshop import env
from workshop.allocation import (
    SlurmAllocation,
    job_variables,
    slurm_allocation,
    task_variables,
)
from workshop.env import (
    RankInfo,
    backend_name,
    choose_backend,
    default_world_size,
    group_backend,
    launcher_hosts_store,
    rank_info,
    torchrun_restart_risk,
    visible_gpu_count,
)

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "node01",
    "MASTER_PORT": "29411",
}

OPEN_MPI = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
}

SRUN = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "6",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "2",
    "SLURM_NODEID": "1",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_JOB_NODELIST": "gpu[003-005,9],cpu1",
}


def exactly(message: str) -> str:
    """A pattern for pytest.raises(match=...) that accepts this message only."""
    return "^" + re.escape(message) + "$"


# --- rank_info -----------------------------------------------------------------------


def test_open_mpi_node_rank_is_not_its_node_number():
    # As a real `mpirun -np 2` on one machine sets them (seen with Open MPI 4.1).
    second = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_COMM_WORLD_NODE_RANK": "1",
    }
    assert rank_info(second).node_rank == 0
    assert rank_info(OPEN_MPI).node_rank == 1  # rank 5, 4 per node: the second node


def test_no_launcher_is_rank_0_of_1():
    info = rank_info({})
    assert info == RankInfo(
        rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0
    )
    assert info.launcher == "none"
    assert info.is_main


def test_no_launcher_still_reads_master_addr_and_port():
    info = rank_info({"MASTER_ADDR": "login1", "MASTER_PORT": "12345"})
    assert (info.rank, info.world_size, info.launcher) == (0, 1, "none")
    assert (info.master_addr, info.master_port) == ("login1", 12345)


def test_torchrun():
    assert rank_info(TORCHRUN) == RankInfo(
        rank=3,
        local_rank=1,
        world_size=8,
        local_world_size=2,
        node_rank=1,
        master_addr="node01",
        master_port=29411,
        launcher="torchrun",
    )


def test_torchrun_style_with_only_rank_and_world_size():
    info = rank_info({"RANK": "2", "WORLD_SIZE": "4"})
    assert (info.rank, info.local_rank, info.world_size) == (2, 2, 4)
    assert (info.local_world_size, info.node_rank) == (4, 0)
    assert (info.master_addr, info.master_port) == (None, None)
    assert not info.is_main


def test_workshop_launch():
    info = rank_info({**TORCHRUN, "WORKSHOP_LAUNCHER_STORE": "1"})
    assert info.launcher == "workshop"
    assert (info.rank, info.local_rank, info.world_size) == (3, 1, 8)


def test_open_mpi():
    assert rank_info(OPEN_MPI) == RankInfo(
        rank=5,
        local_rank=1,
        world_size=8,
        local_world_size=4,
        node_rank=1,
        launcher="mpirun",
    )


def test_srun():
    assert rank_info(SRUN) == RankInfo(
        rank=6,
        local_rank=2,
        world_size=8,
        local_world_size=4,
        node_rank=1,
        master_addr="gpu003",
        master_port=None,
        launcher="srun",
    )


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("gpu[003-005,9],cpu1", "gpu003"),
        ("node7", "node7"),
        ("node7,node8", "node7"),
        ("node[12,15-16]", "node12"),
        ("cn[1-2],gpu[1-4]", "cn1"),
        (" gpu[01-02] ", "gpu01"),
    ],
)
def test_srun_master_is_the_first_host_of_the_node_list(nodelist, first):
    info = rank_info({**SRUN, "SLURM_JOB_NODELIST": nodelist})
    assert info.master_addr == first


def test_srun_master_addr_set_by_the_user_wins_over_the_node_list():
    info = rank_info({**SRUN, "MASTER_ADDR": "ib-gpu003", "MASTER_PORT": "29500"})
    assert (info.master_addr, info.master_port) == ("ib-gpu003", 29500)


def test_srun_ntasks_per_node_wins_over_tasks_per_node():
    info = rank_info({**SRUN, "SLURM_NTASKS_PER_NODE": "2"})
    assert info.local_world_size == 2


def test_srun_without_tasks_per_node_or_node_list():
    bare = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEPID": "3"}
    info = rank_info(bare)
    assert info == RankInfo(launcher="srun")


def test_slurm_job_without_a_step_is_rank_0_of_1():
    # salloc or a batch script without srun: SLURM_JOB_ID but no task variables.
    info = rank_info({"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu001"})
    assert (info.rank, info.world_size, info.launcher) == (0, 1, "none")


def test_a_batch_script_without_srun_is_one_process():
    # sbatch's script (and an salloc shell) see SLURM_PROCID=0 and the job's
    # SLURM_NTASKS, but no step: plain python there is a single process.
    batch = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"}
    batch["SLURM_PROCID"] = "0"
    info = rank_info(batch)
    assert (info.rank, info.world_size, info.launcher) == (0, 1, "none")


def test_srun_step_tasks_win_over_the_jobs_tasks():
    # `srun -n 2` inside a job of 8 tasks starts a world of 2.
    info = rank_info(
        {
            **SRUN,
            "SLURM_PROCID": "1",
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_TASKS_PER_NODE": "2",
        }
    )
    assert (info.rank, info.world_size, info.local_world_size) == (1, 2, 2)


def test_open_mpi_wins_over_slurm():
    # mpirun inside an allocation sees both; only Open MPI's describe its processes.
    assert rank_info({**SRUN, **OPEN_MPI}).launcher == "mpirun"
    assert rank_info({**SRUN, **OPEN_MPI}).rank == 5


def test_torchrun_wins_over_open_mpi_and_slurm():
    info = rank_info({**SRUN, **OPEN_MPI, **TORCHRUN})
    assert (info.launcher, info.rank) == ("torchrun", 3)


def test_rank_info_reads_os_environ_when_given_nothing(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_")):
            monkeypatch.delenv(name)
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WORKSHOP_LAUNCHER_STORE", raising=False)
    assert rank_info() == rank_info(TORCHRUN)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"RANK": "one", "WORLD_SIZE": "2"},
            (
                "environment variable RANK='one' is not an integer; unset it or give "
                "it a whole number"
            ),
        ),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0.5"},
            (
                "environment variable LOCAL_RANK='0.5' is not an integer; unset it or "
                "give it a whole number"
            ),
        ),
        (
            {"MASTER_PORT": "http"},
            (
                "environment variable MASTER_PORT='http' is not an integer; unset it "
                "or give it a whole number"
            ),
        ),
        (
            {"SLURM_PROCID": "0", "SLURM_NTASKS": "four", "SLURM_STEP_ID": "0"},
            (
                "environment variable SLURM_NTASKS='four' is not an integer; unset it "
                "or give it a whole number"
            ),
        ),
        (
            {"RANK": "0", "WORLD_SIZE": ""},
            (
                "environment variable WORLD_SIZE is missing or empty, but other "
                "variables of the same launcher are set; set WORLD_SIZE to a whole "
                "number or unset the others"
            ),
        ),
        (
            {"OMPI_COMM_WORLD_RANK": "0"},
            (
                "environment variable OMPI_COMM_WORLD_SIZE is missing or empty, "
                "but other variables of the same launcher are set; set "
                "OMPI_COMM_WORLD_SIZE to a whole number or unset the others"
            ),
        ),
    ],
)
def test_values_that_are_not_integers(environ, message):
    with pytest.raises(ValueError, match=exactly(message)):
        rank_info(environ)


@pytest.mark.parametrize(
    ("environ", "launcher", "rank", "world_size"),
    [
        ({"RANK": "4", "WORLD_SIZE": "4"}, "torchrun", 4, 4),
        ({"RANK": "-1", "WORLD_SIZE": "4"}, "torchrun", -1, 4),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "torchrun", 0, 0),
        (
            {"RANK": "2", "WORLD_SIZE": "2", "WORKSHOP_LAUNCHER_STORE": "1"},
            "workshop",
            2,
            2,
        ),
        ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "2"}, "mpirun", 3, 2),
        (
            {"SLURM_PROCID": "8", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0"},
            "srun",
            8,
            8,
        ),
    ],
)
def test_rank_outside_the_world(environ, launcher, rank, world_size):
    message = (
        f"{launcher} set rank={rank} and world_size={world_size}; the rank must lie "
        f"in 0..world_size-1. Check the launcher's variables in this environment"
    )
    with pytest.raises(ValueError, match=exactly(message)):
        rank_info(environ)


def test_unreadable_slurm_node_list():
    with pytest.raises(
        ValueError, match=exactly("cannot read the Slurm node list '[1-2]'")
    ):
        rank_info({**SRUN, "SLURM_JOB_NODELIST": "[1-2]"})


def test_launcher_hosts_store():
    assert launcher_hosts_store({"WORKSHOP_LAUNCHER_STORE": "1"})
    assert not launcher_hosts_store({"WORKSHOP_LAUNCHER_STORE": "0"})
    assert not launcher_hosts_store({})


def test_torchrun_restart_risk_needs_the_shared_store_and_restarts():
    shared = {"TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert torchrun_restart_risk({**shared, "TORCHELASTIC_MAX_RESTARTS": "1"})
    assert not torchrun_restart_risk({**shared, "TORCHELASTIC_MAX_RESTARTS": "0"})
    assert not torchrun_restart_risk(shared)
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 makes torchrun export False here.
    assert not torchrun_restart_risk(
        {"TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_MAX_RESTARTS": "3"}
    )


# --- choose_backend ------------------------------------------------------------------


@pytest.fixture
def nccl_built(monkeypatch):
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)


def test_auto_without_gpus_is_gloo():
    assert choose_backend("auto", 4, gpus=0) == "gloo"


def test_auto_with_a_gpu_per_rank_is_nccl(nccl_built):
    assert choose_backend("auto", 4, gpus=4) == "nccl"
    assert choose_backend("auto", 2, gpus=8) == "nccl"


def test_auto_with_too_few_gpus_falls_back_to_gloo(nccl_built):
    assert choose_backend("auto", 4, gpus=2) == "gloo"


def test_auto_on_a_torch_without_nccl_is_gloo(monkeypatch):
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    assert choose_backend("auto", 4, gpus=4) == "gloo"


def test_auto_counts_the_gpus_when_not_told(nccl_built, monkeypatch):
    monkeypatch.setattr(env, "visible_gpu_count", lambda: 2)
    assert choose_backend("auto", 2) == "nccl"
    assert choose_backend("auto", 3) == "gloo"


def test_explicit_backends_and_case(nccl_built):
    assert choose_backend("gloo", 4, gpus=0) == "gloo"
    assert choose_backend("Gloo", 4, gpus=0) == "gloo"
    assert choose_backend("NCCL", 2, gpus=2) == "nccl"


def test_nccl_with_too_few_gpus(nccl_built):
    with pytest.raises(
        ValueError,
        match=exactly(
            'world_size=4 but only 2 GPUs are visible; pass backend="gloo" or '
            "world_size=2"
        ),
    ):
        choose_backend("nccl", 4, gpus=2)


def test_nccl_with_one_gpu_for_two_ranks(nccl_built):
    with pytest.raises(
        ValueError,
        match=exactly(
            'world_size=2 but only 1 GPU is visible; pass backend="gloo" or '
            "world_size=1"
        ),
    ):
        choose_backend("nccl", 2, gpus=1)


def test_nccl_without_gpus(nccl_built):
    with pytest.raises(
        ValueError,
        match=exactly(
            'backend="nccl" needs one CUDA GPU per rank, but no GPU is visible '
            '(world_size=2); pass backend="gloo" to run on CPU ranks'
        ),
    ):
        choose_backend("nccl", 2, gpus=0)


def test_nccl_on_a_torch_without_nccl(monkeypatch):
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    with pytest.raises(
        ValueError,
        match=exactly(
            'backend="nccl" but this torch was built without NCCL (a CPU build); '
            'pass backend="gloo"'
        ),
    ):
        choose_backend("nccl", 1, gpus=1)


@pytest.mark.parametrize(("backend", "shown"), [("tcp", "'tcp'"), (None, "None")])
def test_unknown_backend_lists_the_valid_ones(backend, shown):
    with pytest.raises(
        ValueError,
        match=exactly(
            f"unknown backend={shown}; pass one of 'auto', 'gloo', 'nccl', 'mpi'"
        ),
    ):
        choose_backend(backend, 2, gpus=0)


def test_mpi_without_an_mpi_build(monkeypatch):
    monkeypatch.setattr(dist, "is_mpi_available", lambda: False)
    with pytest.raises(
        ValueError,
        match=exactly(
            'backend="mpi" but this torch was built without MPI support (the usual '
            'case for pip wheels); pass backend="gloo", or "nccl" on GPUs'
        ),
    ):
        choose_backend("mpi", 2, gpus=0)


def test_mpi_with_an_mpi_build(monkeypatch):
    monkeypatch.setattr(dist, "is_mpi_available", lambda: True)
    assert choose_backend("mpi", 2, gpus=0) == "mpi"


def test_this_torch_has_no_mpi_so_mpi_is_refused():
    if dist.is_mpi_available():
        pytest.skip("this torch was built with MPI")
    with pytest.raises(ValueError, match="built without MPI support"):
        choose_backend("mpi", 2, gpus=0)


def test_gloo_on_a_torch_without_gloo(monkeypatch):
    monkeypatch.setattr(dist, "is_gloo_available", lambda: False)
    with pytest.raises(
        ValueError,
        match=exactly('backend="gloo" but this torch was built without gloo'),
    ):
        choose_backend("gloo", 2, gpus=0)


# --- default_world_size, visible_gpu_count -------------------------------------------


def test_default_world_size_is_one_rank_per_gpu():
    assert default_world_size(gpus=3) == 3


@pytest.mark.parametrize(("cores", "expected"), [(8, 4), (2, 4), (1, 2)])
def test_default_world_size_without_gpus(monkeypatch, cores, expected):
    # The cores this process may use: inside a Slurm job of 1 CPU on a node of 64,
    # that is 1 (see test_allocation.py), and 4 ranks would share it.
    monkeypatch.setattr(env, "usable_cores", lambda: cores)
    assert default_world_size(gpus=0) == expected


def test_default_world_size_counts_gpus_when_not_told(monkeypatch):
    monkeypatch.setattr(env, "visible_gpu_count", lambda: 2)
    assert default_world_size() == 2


def test_visible_gpu_count_uses_nvml_not_the_cuda_runtime(monkeypatch):
    def forbidden():
        raise AssertionError("is_available() calls cuInit and poisons later forks")

    monkeypatch.setattr(torch.cuda, "is_available", forbidden)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert visible_gpu_count() == 3
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert visible_gpu_count() == 0


def test_visible_gpu_count_on_this_machine():
    assert visible_gpu_count() == torch.cuda.device_count()
    assert not torch.cuda.is_initialized()


# --- slurm_allocation ----------------------------------------------------------------


def test_outside_slurm():
    allocation = slurm_allocation({})
    assert allocation == SlurmAllocation()
    assert not allocation.inside
    assert not slurm_allocation({"SLURM_JOB_ID": ""}).inside


def test_inside_a_slurm_allocation():
    allocation = slurm_allocation(
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_JOB_NODELIST": "gpu[003-004]",
            "SLURM_NTASKS": "8",
            "SLURM_GPUS_ON_NODE": "4",
            "SLURM_JOB_PARTITION": "gpu",
        }
    )
    assert allocation == SlurmAllocation(
        job_id="4242",
        nodes=2,
        nodelist="gpu[003-004]",
        tasks=8,
        gpus_on_node="4",
        partition="gpu",
    )
    assert allocation.inside


def test_slurm_allocation_older_variable_names():
    allocation = slurm_allocation(
        {
            "SLURM_JOB_ID": "7",
            "SLURM_NNODES": "3",
            "SLURM_NODELIST": "cn[1-3]",
            "SLURM_JOB_GPUS": "0,1",
        }
    )
    assert (allocation.nodes, allocation.nodelist) == (3, "cn[1-3]")
    assert allocation.gpus_on_node == "0,1"
    assert (allocation.tasks, allocation.partition) == (None, None)


def test_slurm_allocation_reads_os_environ(monkeypatch):
    for name in list(os.environ):
        if name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    assert not slurm_allocation().inside
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    monkeypatch.setenv("SLURM_NNODES", "1")
    assert slurm_allocation() == SlurmAllocation(job_id="99", nodes=1)


def test_an_nccl_group_carries_cpu_tensors_with_gloo():
    assert group_backend("nccl") == "cpu:gloo,cuda:nccl"
    assert group_backend("gloo") == "gloo" and group_backend("mpi") == "mpi"
    assert backend_name("cpu:gloo,cuda:nccl") == "nccl"
    assert backend_name("cuda:nccl,cpu:gloo") == "nccl"
    assert backend_name("cpu:gloo") == "gloo"
    assert backend_name("gloo") == "gloo"


# --- task_variables, job_variables ---------------------------------------------------

# What srun gave a notebook kernel that JupyterHub's batchspawner started (measured on
# the private cluster, Slurm 22.05), with PMIx's and the user's own variables beside.
KERNEL_STEP = {
    "SLURM_JOB_ID": "8",
    "SLURM_JOBID": "8",
    "SLURM_CONF": "/etc/slurm/slurm.conf",
    "SLURM_CPUS_ON_NODE": "1",
    "SLURM_MEM_PER_NODE": "300",
    "SLURM_NTASKS": "1",
    "SLURM_JOB_NODELIST": "127.0.0.2",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_GTIDS": "0",
    "SLURM_TASK_PID": "11004",
    "SLURM_STEPID": "0",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "1",
    "SLURM_STEP_NODELIST": "127.0.0.2",
    "SLURM_CPU_BIND": "quiet,mask_cpu:0x1",
    "SLURM_CPU_BIND_LIST": "0x1",
    "SLURM_SRUN_COMM_PORT": "40683",
    "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1",
    "PMIX_RANK": "0",
    "PMIX_MCA_gds": "hash",
    "PMI_FD": "5",
    "HOME": "/home/learner",
    "OMP_PROC_BIND": "true",
}


def test_task_variables_are_the_kernels_own_place_in_its_step():
    assert task_variables(KERNEL_STEP) == [
        "PMIX_RANK", "PMI_FD", "SLURM_CPU_BIND", "SLURM_CPU_BIND_LIST", "SLURM_GTIDS",
        "SLURM_LAUNCH_NODE_IPADDR", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_PROCID",
        "SLURM_SRUN_COMM_PORT", "SLURM_STEPID", "SLURM_STEP_ID", "SLURM_STEP_NODELIST",
        "SLURM_STEP_NUM_TASKS", "SLURM_TASK_PID",
    ]  # fmt: skip
    # What is left reads as the job, not as a step: no launcher, rank 0 of 1.
    task = task_variables(KERNEL_STEP)
    rest = {k: v for k, v in KERNEL_STEP.items() if k not in task}
    assert rank_info(rest) == RankInfo()
    assert rank_info(KERNEL_STEP).launcher == "srun"  # the kernel itself is a task
    assert task_variables({"HOME": "/", "SLURM_JOB_ID": "8"}) == []


def test_job_variables_are_every_slurm_variable_but_the_clients_settings():
    left_out = job_variables(KERNEL_STEP)
    assert "SLURM_CONF" not in left_out
    assert {"SLURM_JOB_ID", "SLURM_MEM_PER_NODE", "SLURM_NTASKS", "PMIX_RANK"} <= set(
        left_out
    )
    assert set(task_variables(KERNEL_STEP)) <= set(left_out)
    assert not {"HOME", "OMP_PROC_BIND", "PMIX_MCA_gds"} & set(left_out)
    # Outside a job a user's own SLURM_* (a time format, say) are theirs to keep.
    assert job_variables({"SLURM_TIME_FORMAT": "relative", "SLURM_X": "1"}) == []


def test_task_and_job_variables_read_os_environ(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("SLURM_", "PMI")):
            monkeypatch.delenv(name)
    assert task_variables() == [] and job_variables() == []
    monkeypatch.setenv("SLURM_JOB_ID", "8")
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert task_variables() == ["SLURM_PROCID"]
    assert job_variables() == ["SLURM_JOB_ID", "SLURM_PROCID"]
