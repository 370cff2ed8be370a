"""The worker side: what runs inside every rank before and after the lesson's code.

The same code path serves a rank started from a notebook cell by ``workshop.launch``
and a rank started by ``torchrun``, ``srun`` or ``mpirun``::

    with workshop.process_group() as info:      # rendezvous, device, process group
        train(info.rank, info.world_size)
    # the process group is destroyed here, whatever happened inside
"""

from __future__ import annotations

import atexit
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from .._procs import thread_names
from ..allocation import slurm_allocation, usable_cores
from ..checks import LONGEST_WAIT_S, positive_number
from ..env import (
    RankInfo,
    choose_backend,
    group_backend,
    launcher_hosts_store,
    rank_info,
    torchrun_restart_risk,
)
from ..features import torch_release

__all__ = ["process_group"]


def _configure_threads(info: RankInfo) -> None:
    # Several ranks on one machine each start one compute thread per core by default;
    # 4 ranks on 2 cores then run 8 threads that fight for 2 cores. torchrun sets
    # OMP_NUM_THREADS=1 for the same reason; a value the user set wins.
    if "OMP_NUM_THREADS" in os.environ:
        return
    import torch

    torch.set_num_threads(max(1, usable_cores() // info.local_world_size))


def _gloo_threads() -> int:
    """How many of gloo's worker threads this process still runs (-1: cannot tell)."""
    if torch_release() < (2, 5):  # torch 2.4 leaves gloo's threads unnamed
        return -1
    names = thread_names()
    return -1 if names is None else names.count("pt_gloo_runloop")  # None: not Linux


def _let_gloo_threads_finish(wait: float = 0.1) -> None:
    """Give gloo's worker threads, which a DDP model (even a freed one) keeps past
    ``destroy_process_group``, time to free the last collective's tensors, which
    needs the GIL: at interpreter shutdown Python ends such a thread inside a C++
    destructor and the rank aborts with "terminate called without an active
    exception" (3 of 40 scaling benchmark runs under mpirun, the rank that exits
    first; 0 of 80 with this wait). Only a rank whose threads linger waits."""
    import time

    if _gloo_threads() != 0:
        time.sleep(wait)


def _old_gloo_would_deadlock(backend: str) -> bool:
    """Whether destroying this rank's gloo group may hang (torch before 2.5) and the
    rank may skip it: only a rank of workshop.launch, which leaves by os._exit."""
    return (
        backend in ("gloo", "nccl")
        and launcher_hosts_store()
        and torch_release() < (2, 5)
    )


# The key under which each rank says its init_process_group returned; torchrun's
# restarted ranks meet under a new one (its store outlives a restart).
JOINED_KEY = "workshop/joined/{restart}/{rank}"


def _joined_keys(world_size: int) -> list[str]:
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return [JOINED_KEY.format(restart=restart, rank=r) for r in range(world_size)]


def join_together(store, rank: int, world_size: int, timeout: timedelta) -> None:
    """Return once every rank's ``init_process_group`` has returned.

    ``init_process_group`` is no barrier (torch 2.1 turned its barrier off by
    default, pytorch/pytorch#103033): it returns on a rank once its own gloo
    connections are made. A rank that then leaves at once (a hello-world), or
    destroys its group, closes its connections under a slower rank, whose set-up
    fails with gloo's "Connection closed by peer" (pytorch/pytorch#61396). With plain
    torch.distributed, six kernels launching 4 ranks at once on two cores: 5 of 200
    launches failed so; a function that only destroys its group, 19 of 120
    (docs/benchmarks.md, "Many kernels launching at once"). So no rank starts its
    function before every rank has joined: one key each in the store they share, no
    collective (no NCCL communicator is made for it).

    A rank that returns while the others still call a collective with it then leaves
    its group, and they fail at once with "Connection closed by peer", which the
    launcher reports as that rank having returned early, instead of every rank
    waiting for the launch's timeout.

    Args:
        store: the store the ranks met at (None: return at once).
        rank, world_size: this rank and how many there are.
        timeout: how long to wait for the others before raising.
    """
    if store is None or world_size < 2:
        return
    keys = _joined_keys(world_size)
    store.set(keys[rank], "1")
    store.wait(keys, timeout)


def _default_store():
    """The store of the default process group that torch made, or None."""
    import torch.distributed.distributed_c10d as c10d

    try:
        return c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None


def _settle_gloo_at_exit() -> None:
    # At exit, not at once: atexit handlers run before Python stops other threads
    # from taking the GIL, and a rank of workshop.launch leaves by os._exit, which
    # cannot race and so pays nothing.
    global _SETTLE_REGISTERED
    if not _SETTLE_REGISTERED:
        atexit.register(_let_gloo_threads_finish)
        _SETTLE_REGISTERED = True


_SETTLE_REGISTERED = False


def _init_method(info: RankInfo) -> str:
    addr = info.master_addr
    port = info.master_port
    job = slurm_allocation().job_id
    if port is None and info.launcher in ("srun", "mpirun") and job:
        # Every task of a job derives the same port from the job id, so a batch
        # script need not choose one (and two jobs on one node do not collide);
        # below 32768, where Linux hands out the ports of outgoing connections.
        port = 10000 + int("".join(c for c in job if c.isdigit()) or 0) % 20000
    if addr is None or port is None:
        raise RuntimeError(
            f"{info.launcher} started rank {info.rank} of {info.world_size} but "
            f"MASTER_ADDR={addr!r} and MASTER_PORT={port!r}; export both (the first "
            "node's host name and a free port) before starting the ranks"
            + (
                ", and pass them to every rank: mpirun -x MASTER_ADDR -x MASTER_PORT"
                if info.launcher == "mpirun"
                else ""
            )
        )
    return f"tcp://{addr}:{port}"


def _check_one_gpu_per_rank(info: RankInfo) -> None:
    """Fail clearly when two ranks on one host got the same GPU: two launchers on
    one machine each count only their own ranks and both hand out cuda:0, and NCCL
    would fail later less tellingly, or hang. Costs one small gather through gloo."""
    import socket

    import torch
    import torch.distributed as dist

    props = torch.cuda.get_device_properties(info.local_rank)
    gpu = str(getattr(props, "uuid", "")) or f"cuda:{info.local_rank}"
    mine = (socket.gethostname(), gpu, info.local_rank)
    everyone: list = [None] * info.world_size
    dist.all_gather_object(everyone, mine)
    problem = _shared_gpu(everyone)
    if problem:
        raise RuntimeError(problem)


def _shared_gpu(everyone: list[tuple[str, str, int]]) -> str | None:
    """The error for ranks that share a GPU, from each rank's (host, GPU, local
    rank) in rank order; None when every rank has its own."""
    owner: dict[tuple[str, str], int] = {}
    for rank, (host, gpu, local_rank) in enumerate(everyone):
        first = owner.setdefault((host, gpu), rank)
        if first != rank:
            return (
                f"ranks {first} and {rank} both use the same GPU (cuda:{local_rank} "
                f"on host {host}), but NCCL needs one GPU per rank. This happens when "
                "several launchers share one machine, each counting only its own "
                "ranks. Give each launcher its own GPUs (CUDA_VISIBLE_DEVICES), or "
                'pass backend="gloo" to run the ranks on the CPU'
            )
    return None


@contextmanager
def process_group(backend: str = "auto", timeout: float = 600.0) -> Iterator[RankInfo]:
    """Join the job's default process group for the duration of a ``with`` block.

    Reads the rank from the launcher's variables (:func:`workshop.env.rank_info`),
    picks the backend (NCCL with one GPU per rank, else gloo), selects this rank's GPU,
    initialises ``torch.distributed`` and always destroys the group on the way out.
    An NCCL group also has gloo for CPU tensors (``"cpu:gloo,cuda:nccl"``), so code
    written for CPU ranks runs unchanged on GPU ranks.

    Args:
        backend: "auto", "gloo", "nccl" or "mpi".
        timeout: seconds a collective may wait for the other ranks before failing
            (gloo raises on the waiting rank; NCCL's watchdog ends the process).

    Yields:
        This rank's :class:`~workshop.env.RankInfo`.

    Raises:
        ValueError: the backend cannot run here (see
            :func:`workshop.env.choose_backend`).
        RuntimeError: the launcher gave no rendezvous address, or two ranks on one
            host were given the same GPU under NCCL.

    Example:
        >>> with process_group() as info:                      # doctest: +SKIP
        ...     print(f"rank {info.rank} of {info.world_size}")
    """
    import torch
    import torch.distributed as dist

    timeout = positive_number(
        "timeout",
        timeout,
        most=LONGEST_WAIT_S,
        what="a number of seconds",
        fix="how long a collective may wait, e.g. timeout=600",
    )
    info = rank_info()
    backend = choose_backend(backend, info.local_world_size)
    _configure_threads(info)
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank)
    wait = timedelta(seconds=timeout)
    # torch reads TORCH_DISTRIBUTED_DEBUG when torch.distributed is imported; a rank
    # forked from a kernel that imported it before the variable was set would
    # otherwise ignore it (DETAIL checks every collective against the other ranks').
    if hasattr(dist, "set_debug_level_from_env"):
        dist.set_debug_level_from_env()
    if info.rank == 0 and torchrun_restart_risk():
        warnings.warn(
            "torchrun may restart these ranks (--max_restarts > 0) while they share "
            "its rendezvous store; after a restart a rank can read a dead rank's "
            "address and fail with 'Connection refused' or hang (pytorch issue "
            "135712). Export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before torchrun.",
            RuntimeWarning,
            stacklevel=3,
        )
    store = None
    if launcher_hosts_store():
        # workshop.launch serves the store from the notebook kernel on a port it bound
        # itself, so every rank connects as a client and no port is ever raced for.
        store = dist.TCPStore(
            info.master_addr, info.master_port, info.world_size, False, timeout=wait
        )
    dist.init_process_group(
        group_backend(backend),
        init_method=None if store is not None else _init_method(info),
        store=store,
        rank=info.rank,
        world_size=info.world_size,
        timeout=wait,
    )
    # Kept now: a body that destroys the group itself also ends the default store.
    meeting = store if store is not None else _default_store()
    try:
        join_together(meeting, info.rank, info.world_size, wait)
        if backend == "nccl":
            _check_one_gpu_per_rank(info)
        yield info
    finally:
        # torch 2.4 can hang in destroy_process_group: freeing the gloo group joins
        # its worker threads while holding the GIL, and a worker that still holds the
        # last collective's tensor needs the GIL to free it (seen in 1 launch of 4;
        # running one more collective first only made it rarer). A rank of
        # workshop.launch leaves by os._exit, which ends the group without that join,
        # so there the group is left to it.
        if dist.is_initialized() and not _old_gloo_would_deadlock(backend):
            dist.destroy_process_group()
            if backend in ("gloo", "nccl"):  # an NCCL group has gloo beside it
                _settle_gloo_at_exit()
