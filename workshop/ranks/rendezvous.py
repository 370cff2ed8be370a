"""Where the ranks of a single-node launch meet, and the environment each rank gets."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from ..allocation import task_variables
from ..env import LAUNCHER_STORE_VAR
from .sweep import TAG_VAR


def _loopback_interface() -> str | None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for candidate in ("lo", "lo0"):
        if candidate in names:
            return candidate
    return None


class Rendezvous:
    """The TCP store every rank meets at, served from this process on a loopback port
    this process bound itself: no other host can reach it, and no two launches can
    race for a port.

    The socket listens from the start, but the store's server (a thread) starts only
    once the ranks are running (:meth:`serve`): a rank forked while that thread is
    busy could inherit one of its locks held, and wait for it forever. Ranks that
    connect earlier wait in the socket's backlog.
    """

    def __init__(self, world_size: int, timeout: float):
        """Listen on a free loopback port for ``world_size`` ranks."""
        self.world_size = world_size
        self.timeout = timeout
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(max(128, world_size))
        self.port = self.listener.getsockname()[1]
        self.fd = self.listener.fileno()
        self.store = None

    def serve(self) -> None:
        """Start serving the store on the listening socket."""
        import torch.distributed as dist

        from ..features import torch_release

        kwargs = dict(
            is_master=True,
            timeout=timedelta(seconds=self.timeout),
            wait_for_workers=False,
        )
        # torch 2.4's default (libuv) store cannot serve a socket bound elsewhere: it
        # refuses, after logging an error line into the cell. Ask for the older
        # store at once there.
        if torch_release() < (2, 5):
            kwargs["use_libuv"] = False
        try:
            # The store takes ownership of the descriptor it is given and closes it.
            self.store = dist.TCPStore(
                "127.0.0.1",
                self.port,
                self.world_size,
                master_listen_fd=os.dup(self.fd),
                **kwargs,
            )
        except (RuntimeError, TypeError, ValueError):
            # Some torch releases serve a pre-bound socket only without libuv.
            kwargs["use_libuv"] = False
            self.store = dist.TCPStore(
                "127.0.0.1",
                self.port,
                self.world_size,
                master_listen_fd=os.dup(self.fd),
                **kwargs,
            )
        finally:
            self.listener.close()

    def close(self) -> None:
        """Stop the store and release the port."""
        self.store = None  # closes the store's copy of the socket
        self.listener.close()


def rank_env(rank: int, world_size: int, port: int, tag: str = "") -> dict[str, str]:
    """The complete environment of ``rank`` in a single-node launch; ``tag`` marks
    every process the rank starts as the launch's (see ``sweep``).

    A kernel that runs as a Slurm job step (a cluster's Jupyter portal starts it with
    ``srun``) has that step's task variables: ``SLURM_PROCID=0``, ``SLURM_STEP_ID``,
    its CPU binding, PMI's rank. The rank gets none of them: it is not that task, and
    a tool or ``srun`` it runs would read them as its own. The job's variables
    (``SLURM_JOB_ID``, ``SLURM_CPUS_ON_NODE``) stay: the rank runs in the job."""
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
    if tag:
        env[TAG_VAR] = tag
    loopback = _loopback_interface()
    if loopback and "GLOO_SOCKET_IFNAME" not in env:
        # Ranks of a single-node launch talk over loopback only; this also spares
        # laptops whose host name does not resolve.
        env["GLOO_SOCKET_IFNAME"] = loopback
    # Ranks leave a kernel's inline plotting backend alone.
    env.pop("MPLBACKEND", None)
    return env
