"""Watching the interconnect: a network interface's byte counters read around an
all-reduce and set against the ring model (notebook 05, section 5), and InfiniBand's
port counters. The kernel's per-interface counters (what ``iftop`` and ``sar -n DEV``
read) count traffic through its network stack: gloo's TCP, NCCL's sockets. RDMA
(NCCL over InfiniBand or RoCE) bypasses the kernel, so only the adapter's port
counters (``/sys/class/infiniband/<device>/ports/<n>/counters``) see it.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..checks import whole
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
_PROC_NET_DEV = Path("/proc/self/net/dev")
_INFINIBAND = Path("/sys/class/infiniband")


def interface_bytes(interface: str, net: Path = _NET) -> tuple[int, int]:
    """(bytes received, bytes sent) so far by a network interface, as the kernel counts.

    This process's namespace's counts (``/proc/self/net/dev``) where it lists the
    interface: ``/sys/class/net`` shows the namespace of whoever mounted ``/sys``, which
    in a container may be another one, whose ``lo`` never sees this one's traffic.

    Args:
        interface: its name, e.g. "lo", "eth0", "ib0".
        net: another folder than ``/sys/class/net`` to read instead of ``/proc``.

    Raises:
        ValueError: no such interface here; the message lists those there are.

    Example:
        >>> received, sent = interface_bytes("lo")  # doctest: +SKIP
    """
    namespace = _proc_net_dev() if Path(net) == _NET else {}
    if interface in namespace:
        return namespace[interface]
    stats = Path(net) / interface / "statistics"
    try:
        received = int((stats / "rx_bytes").read_text())
        sent = int((stats / "tx_bytes").read_text())
    except (OSError, ValueError) as e:
        folder = Path(net)
        listed = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
        there = sorted(listed | set(namespace))
        raise ValueError(
            f"no byte counters for interface {interface!r} in {net}; this machine has "
            f"{', '.join(there) or 'none'}; pass one of those"
        ) from e
    return received, sent


def _proc_net_dev(path: Path = _PROC_NET_DEV) -> dict[str, tuple[int, int]]:
    """{interface: (bytes received, bytes sent)} from ``/proc/self/net/dev``: two
    header lines, then ``name: rx_bytes rx_packets ... (8 received fields)
    tx_bytes ...``; {} where it cannot be read."""
    counts = {}
    try:
        lines = path.read_text().splitlines()[2:]
    except OSError:
        return {}
    for line in lines:
        name, _, fields = line.partition(":")
        values = fields.split()
        if len(values) >= 9 and values[0].isdigit() and values[8].isdigit():
            counts[name.strip()] = (int(values[0]), int(values[8]))
    return counts


def job_interface(env: dict[str, str] | None = None) -> tuple[str | None, str]:
    """The interface a job's ranks would talk over, and why: ``NCCL_SOCKET_IFNAME``
    or ``GLOO_SOCKET_IFNAME``, else the default route's. A value with "^", "=" or
    several names is returned as written.

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
    """An InfiniBand (or RoCE) port's data counters, in bytes (the kernel's / 4)."""

    device: str
    port: str
    sent: int
    received: int


def infiniband_ports(root: Path = _INFINIBAND) -> list[PortCounters]:
    """Every InfiniBand port's readable byte counters; empty where there is none."""
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
    """What :func:`watch_allreduce` measured: two counts of the same all-reduces.

    The ranks' own TCP connections (``tcpi_bytes_sent``) count only what gloo handed
    them; the interface counts the same plus headers, acknowledgements and other
    programs' traffic.

    Attributes:
        repeats: all-reduces per trial.
        sent: the fewest bytes the interface sent in one trial (all ranks together).
        trials: the bytes the interface sent in each trial.
        own_trials: the bytes the ranks' own connections sent in each trial; empty
            where the kernel gives no per-socket counts.
    """

    interface: str
    world_size: int
    size_bytes: int
    repeats: int
    sent: int
    trials: list[int]
    own_trials: list[int] = field(default_factory=list)

    @property
    def per_rank(self) -> float:
        """Bytes each rank sent per all-reduce on its own connections (the fewest of
        the trials), or as the interface counted them where there are no per-socket
        counts."""
        sent = min(self.own_trials) if self.own_trials else self.sent
        return sent / self.world_size / self.repeats

    @property
    def interface_per_rank(self) -> float:
        """Bytes per rank per all-reduce as the interface counted them."""
        return self.sent / self.world_size / self.repeats

    @property
    def ring_model(self) -> float:
        """Bytes each rank sends per all-reduce in a ring: 2(N-1)/N of the tensor."""
        return bus_factor(self.world_size) * self.size_bytes

    def describe(self) -> str:
        """Two lines of at most 88 characters, in MB (10^6 bytes): what each rank's
        connections sent against the ring model; then what the interface counted, and
        whether that is within :data:`INTERFACE_MARGIN` above it."""
        first = (
            f"{self.world_size} ranks: {self.per_rank / 1e6:.2f} MB sent per rank, "
            f"ring model 2(N-1)/N x {self.size_bytes / 1e6:g} MB = "
            f"{self.ring_model / 1e6:.2f} MB ({self.per_rank / self.ring_model:.2f}x)"
        )
        if not self.own_trials:
            return (
                first + f"\n  (as {self.interface} counted them: no per-socket counts)"
            )
        own, counted = self.per_rank, self.interface_per_rank
        within = own <= counted <= own * (1 + INTERFACE_MARGIN)
        return first + (
            f"\n  {self.interface} counted {self.interface_per_rank / 1e6:.2f} MB per "
            f"rank, headers and acks included; within {INTERFACE_MARGIN:.0%} above: "
            f"{within}"
        )


# How far above the ranks' own bytes the interface's count may be and still be
# called the same traffic: TCP/IP headers and acknowledgements add about 0.1 % on
# loopback (64 KiB segments); the rest of the margin is for other programs' traffic in
# the fewest of five trials, on a machine busy with other work.
INTERFACE_MARGIN = 0.05


def _own_tcp_bytes() -> int | None:
    """Bytes this process's TCP connections have sent, each byte once, summed over
    its sockets (``TCP_INFO``'s ``tcpi_bytes_sent`` less ``tcpi_bytes_retrans``, or
    ``tcpi_bytes_acked`` on a kernel older than 4.19); None where the kernel gives
    no such count."""
    total, found = 0, False
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []:
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except (OSError, ValueError):
            continue  # closed meanwhile (the listing's own descriptor), or no socket
        try:
            inet = sock.family in (socket.AF_INET, socket.AF_INET6)
            if sock.type != socket.SOCK_STREAM or not inet:
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        except (OSError, AttributeError):
            continue
        finally:
            sock.close()  # the duplicate only; gloo's descriptor stays open
        if len(info) >= _BYTES_RETRANS + 8:
            sent, retrans = struct.unpack_from("QQ", info, _BYTES_SENT)
            total += sent - retrans
            found = True
        elif len(info) >= _BYTES_ACKED + 8:
            # acked lags sent by what is still in flight: none after a barrier
            # that every rank has passed.
            total += struct.unpack_from("Q", info, _BYTES_ACKED)[0]
            found = True
    return total if found else None


# Offsets in struct tcp_info (linux/tcp.h) of three u64 counters: tcpi_bytes_acked,
# after 8 bytes of flags, 24 u32 fields, pacing_rate and max_pacing_rate (Linux 4.1);
# tcpi_bytes_sent and right after it tcpi_bytes_retrans (Linux 4.19). Retransmissions
# are taken off because a busy machine drops loopback segments too: a trial then
# sent 64 KiB segments twice, and the count came out 0.01 to 0.05 MB above the ring
# model on one machine and not on another.
_BYTES_ACKED = 120
_BYTES_SENT = 200
_BYTES_RETRANS = 208


def _count_on_interface(
    interface: str, elements: int, repeats: int, trials: int
) -> tuple[list[int | None], list[int] | None]:
    # Runs in each rank: every rank counts its own connections' bytes and rank 0
    # reads the interface's counters, between barriers, around the all-reduces that
    # every rank runs.
    import torch
    import torch.distributed as dist

    tensor = torch.ones(elements, dtype=torch.float32)
    dist.all_reduce(tensor)  # a first all-reduce: any connection set-up happens here
    sent, own = [], []
    for _ in range(trials):
        dist.barrier()
        before = interface_bytes(interface)[1] if dist.get_rank() == 0 else 0
        own_before = _own_tcp_bytes()
        dist.barrier()
        for _ in range(repeats):
            dist.all_reduce(tensor)
        dist.barrier()  # every rank's all-reduces are done: their bytes are sent
        own_after = _own_tcp_bytes()
        if dist.get_rank() == 0:
            sent.append(interface_bytes(interface)[1] - before)
        counted = None not in (own_before, own_after)
        own.append(own_after - own_before if counted else None)
    return own, (sent if dist.get_rank() == 0 else None)


def watch_allreduce(
    size_bytes: float = 16e6,
    world_size: int = 2,
    repeats: int = 4,
    trials: int = 5,
    interface: str | None = None,
) -> AllreduceBytes:
    """Start ``world_size`` gloo ranks here, all-reduce a float32 tensor of
    ``size_bytes`` ``repeats`` times, and count the bytes sent by the ranks' own TCP
    connections and by the interface.

    gloo even on a GPU node: its TCP goes through the kernel's counters. The fewest
    bytes of the trials are kept: other traffic can only add to the interface's.

    Args:
        size_bytes: the tensor's size in bytes (a multiple of 4 is used).
        world_size: ranks, 2 or more.
        repeats: all-reduces per trial.
        trials: trials, the fewest bytes kept.
        interface: default the loopback, which :func:`workshop.launch`'s ranks use.

    Returns:
        An :class:`AllreduceBytes`.

    Raises:
        ValueError: a size below 4 bytes, fewer than 2 ranks, ``repeats`` or
            ``trials`` below 1, or an interface this machine does not have.

    Example:
        >>> print(watch_allreduce(16e6, world_size=2).describe())  # doctest: +SKIP
    """
    from ..ranks.launcher import launch

    if not size_bytes >= 4:
        raise ValueError(
            f"size_bytes must be 4 or more (one float32), got {size_bytes!r}"
        )
    whole("world_size", world_size, least=2, fix="one rank sends nothing")
    whole("repeats", repeats)
    whole("trials", trials)
    if interface is None:
        interface = _loopback() or "lo"
    interface_bytes(interface)  # fails early, naming the interfaces there are
    elements = int(size_bytes) // 4
    ranks = dict(world_size=world_size, backend="gloo", timeout=120, show="none")
    result = launch(_count_on_interface, interface, elements, repeats, trials, **ranks)
    counts = result.returns[0][1]
    by_rank = [own for own, _ in result.returns]
    own_trials = [
        sum(trial)
        for trial in zip(*by_rank, strict=True)
        if None not in trial  # every rank counted its connections in this trial
    ]
    if len(own_trials) != trials:
        own_trials = []
    what = (interface, world_size, elements * 4, repeats)
    return AllreduceBytes(*what, min(counts), list(counts), own_trials)


def _loopback() -> str | None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)
