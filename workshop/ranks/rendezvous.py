"""The rendezvous store the ranks of a launch meet at, served by the launching process.

The ranks' environment (:func:`workshop.env.rank_env`) points them at it, and tells
them that the launcher serves it (so no rank tries to bind it).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from ..features import torch_release


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

        def store() -> dist.TCPStore:
            # The store takes ownership of the descriptor it is given and closes it.
            return dist.TCPStore(
                "127.0.0.1",
                self.port,
                self.world_size,
                master_listen_fd=os.dup(self.fd),
                **kwargs,
            )

        try:
            self.store = store()
        except (RuntimeError, TypeError, ValueError):
            # Some torch releases serve a pre-bound socket only without libuv.
            kwargs["use_libuv"] = False
            self.store = store()
        finally:
            self.listener.close()

    def close(self) -> None:
        """Stop the store and release the port."""
        self.store = None  # closes the store's copy of the socket
        self.listener.close()
