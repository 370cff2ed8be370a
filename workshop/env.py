"""Rank environment: who am I, how many are we, which backend and device.

This is the one module that reads the variables launchers set. Every other part of the
workshop asks it, so a worker behaves the same whether it was started from a notebook
cell (``workshop.launch``), by ``torchrun``, by Slurm's ``srun`` or by Open MPI's
``mpirun``.

Order in which launchers are recognised (the first that matches wins):

1. ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``: torchrun and ``workshop.launch``.
2. ``OMPI_COMM_WORLD_RANK`` / ``_SIZE`` / ``_LOCAL_RANK``: mpirun.
3. ``SLURM_PROCID`` / ``SLURM_STEP_NUM_TASKS`` / ``SLURM_LOCALID`` in a job step
   (``SLURM_STEP_ID`` set): srun. A batch script or ``salloc`` shell has
   ``SLURM_PROCID=0`` and ``SLURM_NTASKS`` too, but a plain ``python`` there is one
   process, not rank 0 of many, so without a step it counts as no launcher.
4. None of them: a single process, rank 0 of 1.

Open MPI comes before Slurm because ``mpirun`` inside an allocation sees both sets and
only Open MPI's describe its own processes.

A process started *by* a task (a rank launched from a kernel that is a Slurm job
step, a command from a cell) must not read the task's variables as its own:
``allocation.task_variables`` names them, and the launchers leave them out.

The other side of the same contract is here too: :func:`rank_env`, the complete
environment ``workshop.launch`` gives each rank of a single-node launch.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from .allocation import task_variables, usable_cores

__all__ = [
    "BACKENDS",
    "RankInfo",
    "backend_name",
    "choose_backend",
    "default_world_size",
    "group_backend",
    "group_place",
    "rank_device",
    "rank_info",
    "visible_gpu_count",
]

#: Backends a user may ask for. "auto" picks NCCL or gloo, see :func:`choose_backend`.
BACKENDS = ("auto", "gloo", "nccl", "mpi")

# Set by workshop.launch: the rendezvous store at MASTER_ADDR:MASTER_PORT is served by
# the launching process, so no rank hosts it (rank 0 would otherwise try to bind it).
LAUNCHER_STORE_VAR = "WORKSHOP_LAUNCHER_STORE"


@dataclass(frozen=True)
class RankInfo:
    """Where one process sits in a distributed job.

    Attributes:
        rank: global rank, 0 .. world_size-1.
        local_rank: rank among the processes on this node (selects the GPU).
        world_size: number of processes in the job.
        local_world_size: number of processes on this node.
        node_rank: index of this node, 0 .. nnodes-1.
        master_addr: host of the rendezvous store (``MASTER_ADDR``), if known.
        master_port: port of the rendezvous store (``MASTER_PORT``), if known.
        launcher: who started the process: "workshop", "torchrun", "mpirun", "srun"
            or "none".
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    launcher: str = "none"

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the rank that prints, saves and plots."""
        return self.rank == 0


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None or value == "":
        if default is None:
            # rank_info documents ValueError only: a bare KeyError named nothing.
            raise ValueError(
                f"environment variable {name} is missing or empty, but other "
                f"variables of the same launcher are set; set {name} to a whole "
                f"number or unset the others"
            )
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"environment variable {name}={value!r} is not an integer; "
            f"unset it or give it a whole number"
        ) from None


def _first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list ("gpu[003-005,9],cpu1" -> "gpu003"), as
    ``scontrol show hostnames`` gives it, without a subprocess (common forms only)."""
    match = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise ValueError(f"cannot read the Slurm node list {nodelist!r}")
    prefix, bracket = match.group(1), match.group(3)
    if not bracket:
        return prefix
    first = bracket.split(",")[0].split("-")[0]
    return prefix + first


def rank_info(environ: Mapping[str, str] | None = None) -> RankInfo:
    """Read this process's place in the job from its launcher's variables.

    Args:
        environ: variables to read; ``os.environ`` when omitted.

    Returns:
        A :class:`RankInfo`. With no launcher variables: rank 0 of 1.

    Raises:
        ValueError: a variable that must be an integer is not one, or the rank is not
            inside ``0 .. world_size-1``.

    Example:
        >>> rank_info({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}).rank
        1
    """
    env = os.environ if environ is None else environ
    master_addr = env.get("MASTER_ADDR") or None
    master_port = _int(env, "MASTER_PORT", 0) or None

    if "RANK" in env and "WORLD_SIZE" in env:
        launcher = "workshop" if launcher_hosts_store(env) else "torchrun"
        rank, world_size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local_rank = _int(env, "LOCAL_RANK", rank)
        local_world_size = _int(env, "LOCAL_WORLD_SIZE", world_size)
        node_rank = _int(env, "GROUP_RANK", 0)
    elif "OMPI_COMM_WORLD_RANK" in env:
        launcher = "mpirun"
        rank = _int(env, "OMPI_COMM_WORLD_RANK")
        world_size = _int(env, "OMPI_COMM_WORLD_SIZE")
        local_rank = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0)
        local_world_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1)
        # Open MPI names no node index: OMPI_COMM_WORLD_NODE_RANK is the process's
        # rank among those on its node, not the node's number. With mpirun's usual
        # mapping (the same number of ranks on each node, filled node by node), the
        # node is how many full nodes of ranks come before this one.
        node_rank = (rank - local_rank) // max(local_world_size, 1)
    elif "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        launcher = "srun"
        rank = _int(env, "SLURM_PROCID")
        # The step's tasks, not the job's: `srun -n 2` inside a 4-task job makes 2.
        world_size = _int(env, "SLURM_STEP_NUM_TASKS", 0) or _int(env, "SLURM_NTASKS")
        local_rank = _int(env, "SLURM_LOCALID", 0)
        node_rank = _int(env, "SLURM_NODEID", 0)
        # SLURM_NTASKS_PER_NODE may read "4(x2)"; SLURM_TASKS_PER_NODE likewise.
        per_node = (
            env.get("SLURM_STEP_TASKS_PER_NODE")
            or env.get("SLURM_NTASKS_PER_NODE")
            or env.get("SLURM_TASKS_PER_NODE")
        )
        local_world_size = int(re.match(r"\d+", per_node).group()) if per_node else 1
        if master_addr is None and env.get("SLURM_JOB_NODELIST"):
            master_addr = _first_slurm_host(env["SLURM_JOB_NODELIST"])
    else:
        return RankInfo(master_addr=master_addr, master_port=master_port)

    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"{launcher} set rank={rank} and world_size={world_size}; the rank must "
            "lie in 0..world_size-1. Check the launcher's variables in this "
            "environment"
        )
    return RankInfo(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        launcher=launcher,
    )


def launcher_hosts_store(environ: Mapping[str, str] | None = None) -> bool:
    """True when the launching process serves the rendezvous store (workshop.launch)."""
    env = os.environ if environ is None else environ
    return env.get(LAUNCHER_STORE_VAR) == "1"


def torchrun_restart_risk(environ: Mapping[str, str] | None = None) -> bool:
    """True when torchrun may restart the ranks while sharing its store with them.

    torchrun's agent lends its rendezvous store to the ranks
    (``TORCHELASTIC_USE_AGENT_STORE=True``). After a restart the new ranks write
    their addresses under the same keys as the old ones, so a rank that reads
    early can get a dead rank's address: gloo fails with "Connection refused",
    NCCL may hang (pytorch issue 135712). ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``,
    exported before torchrun, gives every rendezvous round a fresh store.
    """
    env = os.environ if environ is None else environ
    restarts = env.get("TORCHELASTIC_MAX_RESTARTS", "0")
    return (
        env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        and restarts.isdigit()
        and int(restarts) > 0
    )


def visible_gpu_count() -> int:
    """Number of CUDA GPUs this process may use, without initialising CUDA.

    ``torch.cuda.device_count()`` asks NVML (PyTorch falls back to the runtime where
    NVML cannot answer), so a kernel that calls this can still fork ranks; not so
    ``torch.cuda.is_available()``, which starts the CUDA runtime (``cuInit``)."""
    import torch

    return max(torch.cuda.device_count(), 0)


def choose_backend(backend: str, world_size: int, gpus: int | None = None) -> str:
    """Resolve ``backend`` for ``world_size`` local ranks, or say why it cannot run.

    "auto" gives NCCL (one GPU per rank) when at least ``world_size`` GPUs are visible
    and NCCL is built in, else gloo on the CPU.

    Args:
        backend: "auto", "gloo", "nccl" or "mpi".
        world_size: ranks that will run on this machine.
        gpus: visible GPUs; counted when omitted.

    Returns:
        "gloo", "nccl" or "mpi".

    Raises:
        ValueError: unknown backend, or NCCL without a GPU for every rank, or a backend
            this torch was built without.

    Example:
        >>> choose_backend("auto", 4, gpus=0)
        'gloo'
    """
    import torch.distributed as dist

    if not isinstance(backend, str) or backend.lower() not in BACKENDS:
        raise ValueError(
            f"unknown backend={backend!r}; pass one of "
            + ", ".join(repr(b) for b in BACKENDS)
        )
    backend = backend.lower()
    gpus = visible_gpu_count() if gpus is None else gpus
    if backend == "auto":
        if gpus >= world_size and dist.is_nccl_available():
            return "nccl"
        return "gloo"
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise ValueError(
                'backend="nccl" but this torch was built without NCCL (a CPU build); '
                'pass backend="gloo"'
            )
        if gpus == 0:
            raise ValueError(
                f'backend="nccl" needs one CUDA GPU per rank, but no GPU is visible '
                f'(world_size={world_size}); pass backend="gloo" to run on CPU ranks'
            )
        if gpus < world_size:
            raise ValueError(
                f"world_size={world_size} but only {gpus} GPU"
                f"{'s are' if gpus != 1 else ' is'} visible; "
                f'pass backend="gloo" or world_size={gpus}'
            )
    if backend == "gloo" and not dist.is_gloo_available():
        raise ValueError('backend="gloo" but this torch was built without gloo')
    if backend == "mpi" and not dist.is_mpi_available():
        raise ValueError(
            'backend="mpi" but this torch was built without MPI support (the usual '
            'case for pip wheels); pass backend="gloo", or "nccl" on GPUs'
        )
    return backend


def group_backend(backend: str) -> str:
    """What ``init_process_group`` is given for a resolved ``backend``.

    An NCCL group only carries CUDA tensors: a CPU tensor fails with "No backend type
    associated with device type cpu". Lessons and tools also exchange CPU tensors
    (objects, timings, a CPU model's gradients), so an NCCL group gets gloo beside
    it for CPU tensors: one group, a backend per device type.

    Example:
        >>> group_backend("nccl"), group_backend("gloo")
        ('cpu:gloo,cuda:nccl', 'gloo')
    """
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


def backend_name(backend: str) -> str:
    """The workshop's name for a process group's backend string.

    ``dist.get_backend()`` of a group made by :func:`group_backend` reads
    "cpu:gloo,cuda:nccl"; its GPU backend, "nccl", names it. A single backend is
    returned as it is.

    Example:
        >>> backend_name("cpu:gloo,cuda:nccl"), backend_name("gloo")
        ('nccl', 'gloo')
    """
    backend = str(backend)
    if ":" not in backend:
        return backend
    per_device = dict(part.split(":", 1) for part in backend.split(","))
    return per_device.get("cuda", per_device.get("cpu", backend))


def group_place(who: str, how: str | None = None) -> tuple[int, int]:
    """(rank, world_size) of this rank's default process group, or a clear error
    where ``who`` was called outside the ranks (in the notebook's own process, say).

    Args:
        who: the function that needs the group, named in the error.
        how: how to start it, for the error; ``workshop.launch(who, world_size=2)``
            by default.

    Returns:
        ``(rank, world_size)``.

    Raises:
        RuntimeError: no process group is initialised in this process.

    Example:
        >>> group_place("run_pipeline")  # doctest: +SKIP
        (0, 2)
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        how = how or f"workshop.launch({who}, world_size=2)"
        raise RuntimeError(
            f"{who} runs in every rank of a process group, and no process group is "
            f"initialised in this process; start it with {how} (under torchrun: "
            "inside `with workshop.process_group():`)"
        )
    return dist.get_rank(), dist.get_world_size()


def rank_device(backend: str | None = None, info: RankInfo | None = None):
    """The device a rank computes on: its own GPU for NCCL, the CPU otherwise.

    Args:
        backend: the group's backend: "nccl", "gloo", "mpi", or what
            ``dist.get_backend()`` returns ("cpu:gloo,cuda:nccl" counts as NCCL);
            read from the initialised process group when omitted.
        info: the rank's place; read from the environment when omitted.

    Returns:
        ``torch.device("cuda", local_rank)`` for NCCL, else ``torch.device("cpu")``.

    Example:
        >>> rank_device("gloo")
        device(type='cpu')
    """
    import torch
    import torch.distributed as dist

    if backend is None:
        backend = dist.get_backend() if dist.is_initialized() else "gloo"
    name = backend_name(backend)
    # Every backend this torch knows (the planner's "fake" too); a typo is refused.
    if name not in dist.Backend.backend_list or name == "undefined":
        raise ValueError(
            f"backend={backend!r} is not a process group backend; give 'nccl', "
            "'gloo' or 'mpi' (or what dist.get_backend() returns), or None to read "
            "it from the process group"
        )
    if name == "nccl":
        info = info or rank_info()
        return torch.device("cuda", info.local_rank)
    return torch.device("cpu")


def default_world_size(gpus: int | None = None) -> int:
    """World size the workshop uses when none is given: one rank per GPU, else 4 CPU
    ranks (2 where this process may use a single core: inside a Slurm job, the
    job's CPUs on this node count, not the node's, see :func:`usable_cores`)."""
    gpus = visible_gpu_count() if gpus is None else gpus
    if gpus:
        return gpus
    return 4 if usable_cores() > 1 else 2


def _loopback_interface() -> str | None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((name for name in ("lo", "lo0") if name in names), None)


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The complete environment of ``rank`` in a single-node launch, whose store
    the launching process serves on the loopback ``port``.

    A kernel run as a Slurm job step has that step's task variables
    (:func:`workshop.allocation.task_variables`); the rank is not that task, and a
    tool or ``srun`` it runs would read them as its own, so it gets none of them. The
    job's variables (``SLURM_JOB_ID``, ...) stay: the rank runs in the job."""
    env = dict(os.environ)
    for name in task_variables(env):
        del env[name]
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    env[LAUNCHER_STORE_VAR] = "1"
    loopback = _loopback_interface()
    if loopback and "GLOO_SOCKET_IFNAME" not in env:
        # Ranks of a single-node launch talk over loopback only; this also spares
        # laptops whose host name does not resolve.
        env["GLOO_SOCKET_IFNAME"] = loopback
    # Ranks leave a kernel's inline plotting backend alone.
    env.pop("MPLBACKEND", None)
    return env
