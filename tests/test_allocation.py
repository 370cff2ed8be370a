"""What a process may use (workshop/allocation.py): cores and
memory from the affinity mask, cgroup v2 and v1 files (stand-ins written here, laid
out as Slurm's cgroup plugins and containers lay them out) and a Slurm job's
variables."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workshop import allocation
from workshop.allocation import (
    CpuLimit,
    MemoryLimit,
    cgroup_cpus,
    cgroup_memory,
    cpu_limit,
    memory_limit,
    slurm_allocation,
)

JOB = "slurm/uid_1000/job_8/step_0/user/task_0"


def _write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


@pytest.fixture
def v2(tmp_path):
    """A cgroup v2 tree with this process in a Slurm task's cgroup; the job's level
    has the quota and the cpuset, as Slurm's cgroup/v2 plugin sets them."""
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    _write(proc, {"cgroup": f"0::/{JOB}"})
    _write(root, {"cgroup.controllers": "cpuset cpu memory", "cpu.max": "max 100000"})
    job = {"cpu.max": "150000 100000", "memory.max": str(512 << 20),
           "memory.current": str(100 << 20)}  # fmt: skip
    _write(root / "slurm/uid_1000/job_8", job)
    _write(root / JOB, {"cpu.max": "max 100000", "memory.max": "max",
                        "memory.current": str(50 << 20),
                        "cpuset.cpus.effective": "2-3,6"})  # fmt: skip
    return root, proc


def test_cgroup_v2_limits_come_from_the_task_and_every_level_above(v2):
    root, proc = v2
    # 1.5 CPUs of time keep 2 threads busy; the cpuset names 3 CPUs.
    assert cgroup_cpus(root, proc) == [
        ("cgroup cpu.max", 2),
        ("cgroup cpuset.cpus.effective", 3),
    ]
    # The job's limit holds for its task: 512 MiB, of which the job uses 100 MiB.
    assert cgroup_memory(root, proc) == (512 << 20, 100 << 20)


def test_cgroup_v1_limits_in_their_controllers_hierarchies(tmp_path):
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    _write(proc, {"cgroup": f"5:cpuset:/{JOB}\n4:memory:/{JOB}\n3:cpu,cpuacct:/{JOB}"
                            "\n1:name=systemd:/"})  # fmt: skip
    _write(root / "cpu,cpuacct" / JOB, {"cpu.cfs_quota_us": "200000",
                                       "cpu.cfs_period_us": "100000"})  # fmt: skip
    _write(root / "cpuset" / JOB, {"cpuset.effective_cpus": "0-7"})
    _write(root / "memory", {"memory.limit_in_bytes": "9223372036854771712"})
    _write(root / "memory" / JOB, {"memory.limit_in_bytes": str(1 << 30),
                                  "memory.usage_in_bytes": str(1 << 28)})  # fmt: skip
    assert cgroup_cpus(root, proc) == [
        ("cgroup cpu.max", 2),
        ("cgroup cpuset.effective_cpus", 8),
    ]
    assert cgroup_memory(root, proc) == (1 << 30, 1 << 28)


def test_no_cgroup_limits_and_no_cgroups_at_all(tmp_path):
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    assert cgroup_cpus(root, proc) == [] and cgroup_memory(root, proc) is None
    _write(proc, {"cgroup": "0::/user.slice"})
    _write(root, {"cgroup.controllers": "cpu memory", "cpu.max": "max 100000"})
    _write(root / "user.slice", {"memory.max": "max", "cpu.max": "max 100000"})
    assert cgroup_cpus(root, proc) == [] and cgroup_memory(root, proc) is None


def test_a_container_that_sees_its_cgroup_as_the_root(tmp_path):
    # /proc/self/cgroup names the host's path, but the mount shows only our cgroup.
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    _write(proc, {"cgroup": "0::/kubepods/pod1/abc"})
    _write(root, {"cgroup.controllers": "cpu memory", "cpu.max": "400000 100000",
                  "memory.max": str(2 << 30), "memory.current": "0"})  # fmt: skip
    assert cgroup_cpus(root, proc) == [("cgroup cpu.max", 4)]
    assert cgroup_memory(root, proc) == (2 << 30, 0)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_cpu_limit_is_the_smallest_and_says_where_it_was_read(v2, monkeypatch):
    root, proc = v2
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    job = {"SLURM_JOB_ID": "8", "SLURM_CPUS_ON_NODE": "4"}
    limit = cpu_limit(job, root, proc)
    assert limit == CpuLimit(2, 64, (
        ("CPU affinity", 64), ("cgroup cpu.max", 2),
        ("cgroup cpuset.cpus.effective", 3),
        ("Slurm job 8 on this node: SLURM_CPUS_ON_NODE=4", 4)), "8")  # fmt: skip
    assert limit.describe() == "2 of 64 cores (cgroup cpu.max)"
    # Without cgroups (Slurm's task/none): only the job's variable says it.
    none = Path("/nonexistent")
    limit = cpu_limit({**job, "SLURM_CPUS_ON_NODE": "1"}, none, none)
    assert limit.cores == 1
    assert limit.source == "Slurm job 8 on this node: SLURM_CPUS_ON_NODE=1"
    assert limit.narrow_binding() is None  # the kernel may use all the job has
    assert cpu_limit({}, none, none).describe() == "64 (all of this machine's)"
    # Outside a job a stale SLURM_CPUS_ON_NODE counts for nothing.
    assert cpu_limit({"SLURM_CPUS_ON_NODE": "1"}, none, none).cores == 64


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_usable_cores_follows_the_job(monkeypatch):
    monkeypatch.setattr(allocation, "cgroup_cpus", lambda *a: [])
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setenv("SLURM_JOB_ID", "8")
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "3")
    assert allocation.usable_cores() == 3
    monkeypatch.delenv("SLURM_JOB_ID")
    assert allocation.usable_cores() == 8


def test_memory_limit_is_the_tightest_of_node_cgroup_and_job(v2, monkeypatch):
    root, proc = v2
    none = Path("/nonexistent")
    monkeypatch.setattr(allocation, "_mem_available", lambda: 16 << 30)
    assert memory_limit({}, none, none) == MemoryLimit(16 << 30, 16 << 30)
    # The cgroup leaves 412 MiB: 512 MiB, less the 100 MiB the job uses.
    left = memory_limit({}, root, proc)
    assert left == MemoryLimit(412 << 20, 16 << 30, 512 << 20, "cgroup memory limit")
    assert left.describe() == (
        "0.4 GiB available of a 0.5 GiB limit (cgroup memory limit)"
    )
    # --mem-per-cpu=100 on 2 CPUs: 200 MiB, tighter still.
    job = {"SLURM_JOB_ID": "8", "SLURM_MEM_PER_CPU": "100", "SLURM_CPUS_ON_NODE": "2"}
    assert memory_limit(job, root, proc).available == 200 << 20
    assert memory_limit(job, root, proc).source == "Slurm job 8 on this node"
    # A node with less left than the limit: the node's figure, the limit named.
    monkeypatch.setattr(allocation, "_mem_available", lambda: 100 << 20)
    assert memory_limit(job, none, none) == MemoryLimit(
        100 << 20, 100 << 20, 200 << 20, "Slurm job 8 on this node"
    )


def test_slurm_allocation_reads_the_jobs_cpus_memory_and_step():
    job = slurm_allocation({"SLURM_JOB_ID": "8", "SLURM_CPUS_ON_NODE": "2",
                            "SLURM_MEM_PER_NODE": "300", "SLURM_STEP_ID": "0",
                            "SLURM_NTASKS": "2(x3)"})  # fmt: skip
    assert (job.cpus_on_node, job.memory_on_node) == (2, 300 << 20)
    assert job.in_step and job.tasks == 2
    batch = slurm_allocation({"SLURM_JOB_ID": "8", "SLURM_MEM_PER_NODE": "0"})
    assert batch.memory_on_node is None and not batch.in_step  # 0: the whole node
    assert slurm_allocation({"SLURM_CPUS_ON_NODE": "x", "SLURM_JOB_ID": "8"}) == (
        slurm_allocation({"SLURM_JOB_ID": "8"})
    )
