"""Watching the interconnect: the byte counters of a network interface, read around
an all-reduce and compared with the ring model, and InfiniBand's port counters.

Used by notebook 05, section 5::

    watch = watch_allreduce(size_bytes=16e6, world_size=2)
    print(watch.describe())

``iftop -i ib0`` and ``sar -n DEV`` read the kernel's per-interface counters
(``/sys/class/net/<if>/statistics``, ``/proc/net/dev``). Traffic that goes through the
kernel's network stack is counted there: gloo's TCP, NCCL's sockets. RDMA (NCCL over
InfiniBand or RoCE) moves data from the adapter straight to memory, past the kernel,
so it is counted only by the adapter's port counters
(``/sys/class/infiniband/<device>/ports/<n>/counters``, ``perfquery``).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from ..comm.costmodel import bus_factor

__all__ = [
    "AllreduceBytes",
    "PortCounters",
    "infiniband_ports",
    "interface_bytes",
    "job_interface",
    "watch_allreduce",
]

_NET = Path("/sys/class/net")
_INFINIBAND = Path("/sys/class/infiniband")


def interface_bytes(interface: str, net: Path = _NET) -> tuple[int, int]:
    """(bytes received, bytes sent) so far by a network interface, as the kernel counts.

    Args:
        interface: its name, e.g. "lo", "eth0", "ib0".
        net: where the kernel lists interfaces (``/sys/class/net``).

    Raises:
        ValueError: no such interface here; the message lists those there are.

    Example:
        >>> received, sent = interface_bytes("lo")  # doctest: +SKIP
    """
    stats = Path(net) / interface / "statistics"
    try:
        received = int((stats / "rx_bytes").read_text())
        sent = int((stats / "tx_bytes").read_text())
    except (OSError, ValueError) as e:
        folder = Path(net)
        there = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        raise ValueError(
            f"no byte counters for interface {interface!r} in {net}; this machine has "
            f"{', '.join(there) or 'none'}; pass one of those"
        ) from e
    return received, sent


def job_interface(env: dict[str, str] | None = None) -> tuple[str | None, str]:
    """The interface a job's ranks would talk over, and why: a variable that names it
    (``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``), else the default route's.

    A value that starts with "^" (exclude) or "=" (exact) or lists several names is
    returned as written (the first name without its prefix is what to watch).

    Example:
        >>> job_interface({"NCCL_SOCKET_IFNAME": "ib0"})
        ('ib0', 'NCCL_SOCKET_IFNAME=ib0')
    """
    env = dict(os.environ) if env is None else env
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        value = env.get(name, "").strip()
        if value and not value.startswith("^"):
            first = value.lstrip("=").split(",")[0]
            return first, f"{name}={value}"
    route = _default_route_interface()
    if route:
        return route, "the default route's (/proc/net/route)"
    return None, "no interface variable set and no default route found"


def _default_route_interface(route: Path = Path("/proc/net/route")) -> str | None:
    try:
        rows = route.read_text().splitlines()[1:]
    except OSError:
        return None
    for row in rows:
        fields = row.split()
        if len(fields) > 1 and fields[1] == "00000000":  # destination 0.0.0.0
            return fields[0]
    return None


@dataclass(frozen=True)
class PortCounters:
    """An InfiniBand (or RoCE) port's data counters, in bytes.

    The kernel's ``port_xmit_data`` and ``port_rcv_data`` count octets divided by 4
    (the lanes); these are multiplied back.
    """

    device: str
    port: str
    sent: int
    received: int


def infiniband_ports(root: Path = _INFINIBAND) -> list[PortCounters]:
    """Every InfiniBand port's byte counters (``/sys/class/infiniband``); empty where
    there is none. Ports without readable data counters are left out."""
    ports = []
    for counters in sorted(Path(root).glob("*/ports/*/counters")):
        try:
            sent = int((counters / "port_xmit_data").read_text()) * 4
            received = int((counters / "port_rcv_data").read_text()) * 4
        except (OSError, ValueError):
            continue  # "N/A (no PMA)" on some adapters
        ports.append(
            PortCounters(counters.parents[2].name, counters.parent.name, sent, received)
        )
    return ports


@dataclass(frozen=True)
class AllreduceBytes:
    """What :func:`watch_allreduce` measured.

    Attributes:
        interface: the interface watched.
        world_size: ranks that took part, all on this machine.
        size_bytes: the tensor's bytes.
        repeats: all-reduces per trial.
        sent: the fewest bytes the interface sent in one trial (all ranks together).
        trials: the bytes sent in each trial.
    """

    interface: str
    world_size: int
    size_bytes: int
    repeats: int
    sent: int
    trials: list[int]

    @property
    def per_rank(self) -> float:
        """Bytes each rank sent per all-reduce, measured (on one machine the
        interface carries every rank's traffic)."""
        return self.sent / self.world_size / self.repeats

    @property
    def ring_model(self) -> float:
        """Bytes each rank sends per all-reduce in a ring: 2(N-1)/N of the tensor."""
        return bus_factor(self.world_size) * self.size_bytes

    def describe(self) -> str:
        """One line of at most 88 characters: measured against the model, in MB
        (10^6 bytes), e.g. ``2 ranks: 16.02 MB sent per rank, ring model 16.00 MB
        (1.00x)``."""
        return (
            f"{self.world_size} ranks: {self.per_rank / 1e6:.2f} MB sent per rank, "
            f"ring model 2(N-1)/N x {self.size_bytes / 1e6:g} MB = "
            f"{self.ring_model / 1e6:.2f} MB ({self.per_rank / self.ring_model:.2f}x)"
        )


def _count_on_interface(
    interface: str, elements: int, repeats: int, trials: int
) -> list[int] | None:
    # Runs in each rank: rank 0 reads the counters, between barriers, around the
    # all-reduces that every rank runs.
    import torch
    import torch.distributed as dist

    tensor = torch.ones(elements, dtype=torch.float32)
    dist.all_reduce(tensor)  # a first all-reduce: any connection set-up happens here
    sent = []
    for _ in range(trials):
        dist.barrier()
        before = interface_bytes(interface)[1] if dist.get_rank() == 0 else 0
        dist.barrier()
        for _ in range(repeats):
            dist.all_reduce(tensor)
        dist.barrier()
        if dist.get_rank() == 0:
            sent.append(interface_bytes(interface)[1] - before)
    return sent if dist.get_rank() == 0 else None


def watch_allreduce(
    size_bytes: float = 16e6,
    world_size: int = 2,
    repeats: int = 4,
    trials: int = 3,
    interface: str | None = None,
) -> AllreduceBytes:
    """Start ``world_size`` gloo ranks on this machine, all-reduce a float32 tensor of
    ``size_bytes`` ``repeats`` times, and count the bytes the interface sent.

    The ranks are CPU ranks on gloo even on a GPU node: the point is what the
    kernel's counters see, and gloo's TCP goes through them. The fewest bytes of
    ``trials`` trials are kept: other programs' traffic on the same interface can
    only add bytes.

    Args:
        size_bytes: the tensor's size in bytes (a multiple of 4 is used).
        world_size: ranks, 2 or more.
        repeats: all-reduces per trial.
        trials: trials, the fewest bytes kept.
        interface: the interface to watch; default the loopback interface, which
            the ranks of :func:`workshop.launch` use.

    Returns:
        An :class:`AllreduceBytes`.

    Raises:
        ValueError: a size below 4 bytes, fewer than 2 ranks, ``repeats`` or
            ``trials`` below 1, or an interface this machine does not have.

    Example:
        >>> print(watch_allreduce(16e6, world_size=2).describe())  # doctest: +SKIP
        2 ranks: lo carried  16.00 MB per rank per all-reduce; ring model ...
    """
    from ..ranks.launcher import launch

    if not size_bytes >= 4:
        raise ValueError(
            f"size_bytes must be 4 or more (one float32), got {size_bytes!r}"
        )
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        world_size = -1 if isinstance(world_size, bool) else world_size
    if not isinstance(world_size, int) or world_size < 2:
        raise ValueError(
            f"world_size must be 2 or more ranks to send anything, got {world_size!r}"
        )
    for name, value in (("repeats", repeats), ("trials", trials)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number, 1 or more; got {value!r}")
    if interface is None:
        interface = _loopback() or "lo"
    interface_bytes(interface)  # fails early, naming the interfaces there are
    elements = int(size_bytes) // 4
    result = launch(
        _count_on_interface,
        interface,
        elements,
        repeats,
        trials,
        world_size=world_size,
        backend="gloo",
        timeout=120,
        show="none",
    )
    counts = result.returns[0]
    return AllreduceBytes(
        interface, world_size, elements * 4, repeats, min(counts), list(counts)
    )


def _loopback() -> str | None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)
