"""Where the ranks of a single-node launch meet, and the environment each rank gets."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from .env import LAUNCHER_STORE_VAR


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
    race for a port."""

    def __init__(self, world_size: int, timeout: float):
        """Listen on a free loopback port for ``world_size`` ranks."""
        import torch.distributed as dist

        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        kwargs = dict(
            is_master=True, timeout=timedelta(seconds=timeout), wait_for_workers=False
        )
        try:
            # The store takes ownership of the descriptor it is given and closes it.
            self.fd = os.dup(listener.fileno())
            try:
                self.store = dist.TCPStore(
                    "127.0.0.1",
                    self.port,
                    world_size,
                    master_listen_fd=self.fd,
                    **kwargs,
                )
            except (RuntimeError, TypeError, ValueError):
                # Some torch releases serve a pre-bound socket only without libuv.
                self.fd = os.dup(listener.fileno())
                self.store = dist.TCPStore(
                    "127.0.0.1",
                    self.port,
                    world_size,
                    master_listen_fd=self.fd,
                    use_libuv=False,
                    **kwargs,
                )
        finally:
            listener.close()

    def close(self) -> None:
        self.store = None  # closes the listening socket


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The complete environment of ``rank`` in a single-node launch."""
    env = dict(os.environ)
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
