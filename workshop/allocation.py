"""What this process may use: CPU cores and memory, and the Slurm job it runs in.

``os.cpu_count()`` and ``/proc/meminfo`` describe the whole node. A notebook kernel
on a cluster's Jupyter portal runs inside a Slurm job (JupyterHub's batchspawner
starts it with ``srun``) and may use only the job's share of the node. Each limit is
read where the system keeps it, and the smallest wins:

* the CPU affinity mask (``os.sched_getaffinity``): Slurm's task/affinity plugin and
  cgroup cpusets narrow it;
* the process's cgroup (v2, or v1 controllers): ``cpu.max`` (a quota of CPU time,
  which the affinity mask does not show), ``cpuset.cpus.effective``, ``memory.max``;
* the Slurm job's variables: ``SLURM_CPUS_ON_NODE``, ``SLURM_MEM_PER_NODE``,
  ``SLURM_MEM_PER_CPU``. A site without cgroups (``TaskPlugin=task/none``) enforces
  none of it, but a job that uses more than it asked for slows its neighbours, and
  is killed where memory is accounted.

The cgroup readers handle v2's single tree and v1's controllers (as Slurm's cgroup
plugins and containers set them) and take the mount and ``/proc/self`` folder, so
tests give them stand-in files. Imports nothing of the rest of the package.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CpuLimit",
    "MemoryLimit",
    "SlurmAllocation",
    "available_memory",
    "cpu_limit",
    "job_variables",
    "memory_limit",
    "slurm_allocation",
    "task_variables",
    "usable_cores",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF = Path("/proc/self")
# cgroup v1 writes "no limit" as the largest page-aligned 64-bit number; anything past
# an exbibyte is no limit either.
_NO_MEMORY_LIMIT = 1 << 60


def _cgroup_paths(proc_self: Path) -> dict[str, str]:
    """This process's cgroup per controller ("" for cgroup v2's single tree), from
    ``/proc/self/cgroup`` ("0::/user.slice/..." or "4:memory:/slurm/uid_1/job_7")."""
    try:
        lines = (proc_self / "cgroup").read_text().splitlines()
    except OSError:
        return {}
    paths = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            paths[controller.removeprefix("name=")] = parts[2]
    return paths


def _levels(mount: Path, path: str) -> list[Path]:
    """This process's cgroup folder under ``mount`` and every folder above it, up to
    the mount: a limit set on the job holds for the step and task below it. Where
    the path is not under the mount (a container that sees only its own cgroup as
    the root), the mount alone."""
    here = mount / path.strip("/")
    if not here.is_dir():
        return [mount] if mount.is_dir() else []
    levels = [here]
    while levels[-1] != mount and mount in levels[-1].parents:
        levels.append(levels[-1].parent)
    return levels


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpu_list_size(text: str | None) -> int | None:
    """How many CPUs a cpuset list names ("0-3,8,10-11" -> 7); None if unreadable."""
    if not text:
        return None
    count = 0
    try:
        for part in text.split(","):
            first, _, last = part.partition("-")
            count += (int(last) if last else int(first)) - int(first) + 1
    except ValueError:
        return None
    return count or None


def _v1_mount(root: Path, controller: str) -> Path | None:
    """The cgroup v1 hierarchy that holds ``controller`` ("cpu,cpuacct" holds cpu)."""
    try:
        for entry in root.iterdir():
            if controller in entry.name.split(",") and entry.is_dir():
                return entry
    except OSError:
        pass
    return None


def cgroup_cpus(
    root: Path = CGROUP_ROOT, proc_self: Path = PROC_SELF
) -> list[tuple[str, int]]:
    """The CPU limits of this process's cgroup: ("cgroup cpu.max", 2) for a quota of
    two CPUs' time, ("cgroup cpuset", 4) for four CPUs; empty where none is set or
    there are no cgroups. A quota rounds up: 1.5 CPUs of time keep 2 threads busy.

    Example:
        >>> cgroup_cpus(Path("/nonexistent"), Path("/nonexistent"))
        []
    """
    paths = _cgroup_paths(proc_self)
    limits: list[tuple[str, int]] = []
    quotas: list[float] = []
    if "" in paths and (root / "cgroup.controllers").is_file():  # cgroup v2
        levels = _levels(root, paths[""])
        for level in levels:
            quota, _, period = (_read(level / "cpu.max") or "max").partition(" ")
            if quota != "max" and quota.isdigit() and period.isdigit():
                quotas.append(int(quota) / int(period))
        cpuset = levels[0] / "cpuset.cpus.effective" if levels else None
        cpuset_name = "cgroup cpuset.cpus.effective"
    else:  # cgroup v1: one hierarchy per controller
        cpuset = None
        cpuset_name = "cgroup cpuset.effective_cpus"
        mount = _v1_mount(root, "cpu")
        for level in _levels(mount, paths.get("cpu", "/")) if mount else []:
            quota = _read(level / "cpu.cfs_quota_us") or "-1"
            period = _read(level / "cpu.cfs_period_us") or "0"
            if quota.isdigit() and period.isdigit() and int(period) > 0:
                quotas.append(int(quota) / int(period))
        mount = _v1_mount(root, "cpuset")
        if mount is not None:
            levels = _levels(mount, paths.get("cpuset", "/"))
            cpuset = levels[0] / "cpuset.effective_cpus" if levels else None
    if quotas:
        limits.append(("cgroup cpu.max", max(1, math.ceil(min(quotas) - 1e-9))))
    count = _cpu_list_size(_read(cpuset)) if cpuset is not None else None
    if count:
        limits.append((cpuset_name, count))
    return limits


def cgroup_memory(
    root: Path = CGROUP_ROOT, proc_self: Path = PROC_SELF
) -> tuple[int, int | None] | None:
    """(limit, in use) in bytes of this process's memory cgroup, the smallest limit
    of its folder and those above it; None where no limit is set.

    Example:
        >>> cgroup_memory(Path("/nonexistent"), Path("/nonexistent")) is None
        True
    """
    paths = _cgroup_paths(proc_self)
    if "" in paths and (root / "cgroup.controllers").is_file():
        levels = _levels(root, paths[""])
        limit_file, used_file = "memory.max", "memory.current"
    else:
        mount = _v1_mount(root, "memory")
        levels = _levels(mount, paths.get("memory", "/")) if mount else []
        limit_file, used_file = "memory.limit_in_bytes", "memory.usage_in_bytes"
    found: list[tuple[int, int | None]] = []
    for level in levels:
        limit = _read(level / limit_file) or "max"
        if limit.isdigit() and int(limit) < _NO_MEMORY_LIMIT:
            used = _read(level / used_file) or ""
            found.append((int(limit), int(used) if used.isdigit() else None))
    # The tightest level: the least left over, counting what its cgroup already uses.
    return min(found, key=lambda f: f[0] - (f[1] or 0), default=None)


@dataclass(frozen=True)
class SlurmAllocation:
    """The Slurm job this process runs in (all None outside one)."""

    job_id: str | None = None
    nodes: int | None = None
    nodelist: str | None = None
    tasks: int | None = None
    gpus_on_node: str | None = None
    partition: str | None = None
    cpus_on_node: int | None = None
    memory_on_node: int | None = None  # bytes; None where the job asked for none
    in_step: bool = False  # started by srun (a job step), not the batch script

    @property
    def inside(self) -> bool:
        """True inside a Slurm allocation (batch job, salloc or srun)."""
        return self.job_id is not None


def _slurm_count(env: Mapping[str, str], name: str) -> int | None:
    """``env[name]`` as a whole number; None when unset, empty or not a number
    (Slurm writes some counts as "2(x3)": the first number is this node's)."""
    value = (env.get(name) or "").strip()
    digits = value.split("(")[0]
    return int(digits) if digits.isdigit() else None


def slurm_allocation(environ: Mapping[str, str] | None = None) -> SlurmAllocation:
    """Describe the Slurm allocation from ``SLURM_*`` variables.

    Args:
        environ: variables to read; ``os.environ`` when omitted.

    Returns:
        A :class:`SlurmAllocation`; its ``inside`` is False outside Slurm.

    Example:
        >>> job = slurm_allocation({"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "4"})
        >>> job.cpus_on_node
        4
    """
    env = os.environ if environ is None else environ
    if not env.get("SLURM_JOB_ID"):
        return SlurmAllocation()
    nodes = _slurm_count(env, "SLURM_JOB_NUM_NODES") or _slurm_count(
        env, "SLURM_NNODES"
    )
    cpus = _slurm_count(env, "SLURM_CPUS_ON_NODE")
    # Slurm's memory figures are in MiB ("M"); per node, or per CPU on this node.
    per_node = _slurm_count(env, "SLURM_MEM_PER_NODE")
    per_cpu = _slurm_count(env, "SLURM_MEM_PER_CPU")
    if per_node:
        memory = per_node << 20
    elif per_cpu and cpus:
        memory = (per_cpu * cpus) << 20
    else:
        memory = None  # 0 means "all of the node's memory"
    return SlurmAllocation(
        job_id=env["SLURM_JOB_ID"],
        nodes=nodes,
        nodelist=env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"),
        tasks=_slurm_count(env, "SLURM_NTASKS"),
        gpus_on_node=env.get("SLURM_GPUS_ON_NODE") or env.get("SLURM_JOB_GPUS"),
        partition=env.get("SLURM_JOB_PARTITION"),
        cpus_on_node=cpus,
        memory_on_node=memory,
        in_step=bool(env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")),
    )


# What srun sets for one task of one step, and what Slurm's PMI and PMIx give that
# task's MPI library: they place *this* process in *its* step. A notebook kernel on a
# cluster's portal is such a task (batchspawner starts it with srun), but the ranks it
# launches and the commands it runs are not, and must not take its place for theirs.
_TASK_VARIABLES = frozenset(
    {
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_NODEID",
        "SLURM_GTIDS",
        "SLURM_TASK_PID",
        "SLURM_STEPID",
        "SLURM_PRIO_PROCESS",
        "SLURM_LAUNCH_NODE_IPADDR",
        "SLURM_SRUN_COMM_HOST",
        "SLURM_SRUN_COMM_PORT",
    }
)
# SLURM_STEP_*: the step's id, nodes, tasks and ports. SLURM_CPU_BIND*, SLURM_MEM_BIND*:
# the task's binding, which a nested srun reads as its own --cpu-bind and would pin
# every new task onto the kernel's cores.
_TASK_PREFIXES = ("SLURM_STEP_", "SLURM_CPU_BIND", "SLURM_MEM_BIND", "PMI_", "PMIX_")
# Client settings a user or site exports for Slurm's commands, not the job's own.
_SLURM_CLIENT_SETTINGS = frozenset(
    {"SLURM_CONF", "SLURM_CLUSTERS", "SLURM_TIME_FORMAT"}
)


def task_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """The variables that place this process as one task of a launcher's job step
    (``SLURM_PROCID``, ``SLURM_STEP_ID``, ``SLURM_CPU_BIND``, ``PMIX_RANK``, ...).

    A process this one starts as a rank of its own (``workshop.launch``) or as a new
    job step (``srun`` from a cell) must not inherit them: a nested ``srun`` reads
    ``SLURM_CPU_BIND`` as its own ``--cpu-bind``, and MPI reads ``PMI_RANK``. The
    job's variables (``SLURM_JOB_ID``, ``SLURM_CPUS_ON_NODE``, ...) stay: the new
    process runs in the same job. PMIx's settings (``PMIX_MCA_*``) stay too.

    Args:
        environ: variables to look at; ``os.environ`` when omitted.

    Returns:
        Their names, sorted; empty outside a job step.

    Example:
        >>> task_variables({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "HOME": "/"})
        ['SLURM_PROCID']
    """
    env = os.environ if environ is None else environ
    return sorted(
        name
        for name in env
        if name in _TASK_VARIABLES
        or (name.startswith(_TASK_PREFIXES) and "_MCA_" not in name)
    )


def job_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """The variables a Slurm job gives its processes: every ``SLURM_*`` but the
    client's settings (``SLURM_CONF``, ``SLURM_CLUSTERS``, ``SLURM_TIME_FORMAT``),
    and the task's (:func:`task_variables`); empty outside a job.

    ``sbatch`` passes its whole environment to the job it submits. Submitted from
    inside a job, the new job would inherit what Slurm does not set for it again:
    the old job's ``SLURM_MEM_PER_NODE`` beside its own ``SLURM_MEM_PER_CPU`` makes
    every ``srun`` in it fail ("mutually exclusive"), ``SLURM_NTASKS`` of one task
    makes ``srun`` start one, and a stale ``SLURM_STEP_ID`` makes its batch script
    look like a job step. So they are left out of what ``sbatch`` gets.

    Example:
        >>> job_variables({"SLURM_JOB_ID": "7", "SLURM_CONF": "/etc/slurm.conf"})
        ['SLURM_JOB_ID']
    """
    env = os.environ if environ is None else environ
    if not env.get("SLURM_JOB_ID"):
        return []
    slurm = {
        name
        for name in env
        if name.startswith("SLURM_") and name not in _SLURM_CLIENT_SETTINGS
    }
    return sorted(slurm | set(task_variables(env)))


# ------------------------------------------------------------------ CPUs
@dataclass(frozen=True)
class CpuLimit:
    """How many CPU cores this process may use, and what says so.

    Attributes:
        cores: the smallest of the limits (``node_cores`` without any).
        node_cores: the machine's cores (``os.cpu_count()``).
        limits: each limit found, as (where it was read, cores), in the order
            affinity, cgroup, Slurm.
        job_id: the Slurm job this process runs in, if any.
    """

    cores: int
    node_cores: int
    limits: tuple[tuple[str, int], ...] = ()
    job_id: str | None = None

    @property
    def source(self) -> str:
        """Where the limit that decides ``cores`` was read ("" without a limit)."""
        for name, value in self.limits:
            if value == self.cores and self.cores < self.node_cores:
                return name
        return ""

    def describe(self) -> str:
        """One line: "1 of 2 cores (Slurm job 8 on this node: SLURM_CPUS_ON_NODE=1)".

        Example:
            >>> CpuLimit(2, 8, (("CPU affinity", 2),)).describe()
            '2 of 8 cores (CPU affinity)'
        """
        if self.cores >= self.node_cores:
            return f"{self.node_cores} (all of this machine's)"
        return f"{self.cores} of {self.node_cores} cores ({self.source})"

    def narrow_binding(self) -> str | None:
        """A warning where this process is bound to fewer cores than its Slurm job
        has on this node (a kernel started by ``srun`` without ``--cpus-per-task``
        gets one core since Slurm 22.05): the ranks it starts share them. None
        otherwise.

        Example:
            >>> CpuLimit(1, 8, (("CPU affinity", 1),
            ...                 ("Slurm job 5 on this node: SLURM_CPUS_ON_NODE=4", 4)),
            ...          "5").narrow_binding()[:40]
            'this process may run on 1 core (CPU affi'
        """
        job = [v for n, v in self.limits if n.startswith("Slurm job")]
        if not job or self.cores >= job[0]:
            return None
        return (
            f"this process may run on {self.cores} core{'s' if self.cores != 1 else ''}"
            f" ({self.source}), but Slurm job {self.job_id} has {job[0]} on this node:"
            " ranks started here share those. Start the kernel's step with all of "
            "the job's CPUs (srun --cpus-per-task=$SLURM_CPUS_ON_NODE, or "
            "SRUN_CPUS_PER_TASK exported in the batch script)"
        )


def cpu_limit(
    environ: Mapping[str, str] | None = None,
    cgroup_root: Path = CGROUP_ROOT,
    proc_self: Path = PROC_SELF,
) -> CpuLimit:
    """The CPU cores this process may use: the smallest of its affinity mask, its
    cgroup's quota and cpuset, and its Slurm job's CPUs on this node.

    Args:
        environ: variables to read; ``os.environ`` when omitted.
        cgroup_root: where the cgroup file system is mounted (stand-in files in
            tests).
        proc_self: this process's ``/proc`` folder (its ``cgroup`` file).

    Returns:
        A :class:`CpuLimit`.

    Example:
        >>> cpu_limit().cores >= 1
        True
    """
    env = os.environ if environ is None else environ
    node = os.cpu_count() or 1
    limits: list[tuple[str, int]] = []
    if hasattr(os, "sched_getaffinity"):  # not on macOS
        limits.append(("CPU affinity", len(os.sched_getaffinity(0))))
    limits += cgroup_cpus(cgroup_root, proc_self)
    job = slurm_allocation(env)
    if job.cpus_on_node:
        name = f"Slurm job {job.job_id} on this node: SLURM_CPUS_ON_NODE"
        limits.append((f"{name}={job.cpus_on_node}", job.cpus_on_node))
    cores = min([node, *(value for _, value in limits)])
    return CpuLimit(max(1, cores), node, tuple(limits), job.job_id)


def usable_cores() -> int:
    """The CPU cores this process may use (see :func:`cpu_limit`): inside a Slurm
    job, a container or a cgroup often fewer than ``os.cpu_count()``, the node's.

    Example:
        >>> 1 <= usable_cores() <= (os.cpu_count() or 1)
        True
    """
    return cpu_limit().cores


# ------------------------------------------------------------------ memory
@dataclass(frozen=True)
class MemoryLimit:
    """Memory this process may still take, in bytes, and what limits it.

    Attributes:
        available: bytes it can still get without swapping or being killed.
        node_available: the machine's ``MemAvailable``.
        limit: the smallest limit set on it (cgroup or Slurm job); None without.
        source: where ``limit`` was read ("" without one).
    """

    available: int | None
    node_available: int | None
    limit: int | None = None
    source: str = ""

    def describe(self) -> str:
        """One line, e.g. "0.3 GiB available of a 0.5 GiB limit (Slurm job 8...)".

        Example:
            >>> MemoryLimit(2 << 30, 8 << 30).describe()
            "2.0 GiB available (all of this machine's)"
        """
        if self.available is None:
            return "cannot be read here"
        text = f"{self.available / 2**30:.1f} GiB available"
        if self.limit is None:
            return text + " (all of this machine's)"
        return text + f" of a {self.limit / 2**30:.1f} GiB limit ({self.source})"


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_limit(
    environ: Mapping[str, str] | None = None,
    cgroup_root: Path = CGROUP_ROOT,
    proc_self: Path = PROC_SELF,
) -> MemoryLimit:
    """Memory this process may still take: the machine's ``MemAvailable``, less
    where its cgroup's limit (less what the cgroup uses) or its Slurm job's memory
    on this node is smaller.

    A Slurm job's memory (``--mem``, ``--mem-per-cpu``) counts whole: without a
    cgroup to say what the job already uses, the limit is an upper bound.

    Example:
        >>> memory_limit({}).node_available is None or memory_limit({}).available > 0
        True
    """
    env = os.environ if environ is None else environ
    node = _mem_available()
    candidates: list[tuple[int, int, str]] = []  # (left, limit, source)
    cgroup = cgroup_memory(cgroup_root, proc_self)
    if cgroup is not None:
        limit, used = cgroup
        candidates.append((max(0, limit - (used or 0)), limit, "cgroup memory limit"))
    job = slurm_allocation(env)
    if job.memory_on_node:
        name = f"Slurm job {job.job_id} on this node"
        candidates.append((job.memory_on_node, job.memory_on_node, name))
    if not candidates:
        return MemoryLimit(node, node)
    left, limit, source = min(candidates)
    if node is not None and node <= left:
        return MemoryLimit(node, node, limit, source)
    return MemoryLimit(left, node, limit, source)


def available_memory() -> int | None:
    """Bytes of memory this process can still take without swapping or being
    killed: the machine's ``MemAvailable``, or less inside a cgroup or Slurm job
    that limits memory (see :func:`memory_limit`); None where it cannot be read.

    Example:
        >>> available_memory() is None or available_memory() > 0
        True
    """
    return memory_limit().available
