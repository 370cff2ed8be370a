"""Ports for services that start later: free now, and out of the system's way.

A port from binding port 0 lies in ``ip_local_port_range``, where any outgoing
connection may take it before the service binds it (the portal's proxy once got
"EADDRINUSE"); one below that range is taken only by a program that asks for it.
"""

from __future__ import annotations

import random
import socket

RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST = 10000  # below this, well-known services (Slurm's 6817, Jupyter's 8888)
ATTEMPTS = 200


def ephemeral_start(path: str = RANGE_FILE) -> int:
    """The first port the system hands out by itself (Linux's 32768 if unknown)."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def quiet_ports(count: int, path: str = RANGE_FILE) -> list[int]:
    """``count`` different TCP ports on 127.0.0.1, each free now and below the
    system's own range (above it only where that range starts too low).

    Raises:
        ValueError: ``count`` is not a positive whole number.
        OSError: no free port was found in ``ATTEMPTS`` tries.

    Example:
        >>> a, b = quiet_ports(2)
        >>> a != b and LOWEST <= min(a, b)
        True
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(
            f"count must be a whole number of ports, 1 or more; got {count!r}"
        )
    top = ephemeral_start(path)
    low, high = (LOWEST, top) if top - LOWEST >= 1000 else (top, 65536)
    sockets: list[socket.socket] = []
    try:
        for _ in range(ATTEMPTS):
            if len(sockets) == count:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", random.randrange(low, high)))
            except OSError:
                s.close()
                continue
            sockets.append(s)  # held until all are found: no number comes twice
        if len(sockets) < count:
            raise OSError(
                f"found {len(sockets)} of {count} free ports between {low} and "
                f"{high - 1} on 127.0.0.1 in {ATTEMPTS} tries; free some, or stop "
                "the services that hold them"
            )
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
