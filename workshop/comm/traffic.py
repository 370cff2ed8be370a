"""Bytes each rank sent and received, counted from the traces of a launch.

A :class:`~workshop.comm.tracing.TraceEvent` says how many bytes a call *touched* on
its rank; this module counts what it put *on the wire*: for a collective, always the
ring's figures (NCCL's choice for large messages, and the textbook one), with S the
tensor's bytes and N the group's size:

call                      each rank sends                  each rank receives
------------------------  -------------------------------  --------------------------
send / isend              S                                0
recv / irecv              0                                S
all_reduce                2(N-1)/N · S                     2(N-1)/N · S
broadcast                 S, but not root-1 (the end)      S, but not the root
reduce                    S, but not the root              S, but not root-1 (the start)
all_gather(_into_tensor)  (N-1)·c, c = one rank's input    (N-1)·c
reduce_scatter(_tensor)   (N-1)·c, c = one rank's output   (N-1)·c
all_to_all(_single)       (N-1)/N of its input             (N-1)/N of its output
gather                    c, but 0 on the root             (N-1)·c on the root, else 0
scatter                   (N-1)·c on the root, else 0      c, but 0 on the root
barrier                   0                                0

broadcast and reduce are counted as a chain around the ring (broadcast: root ->
root+1 -> ... -> root-1; reduce: the reverse, ending at the root): every link
carries the whole tensor once, (N-1)·S in all. gather and scatter go straight to
or from the root. Rooted calls assume the group is the default one (ranks 0..N-1).

Nothing here needs torch: events may be TraceEvents or their dicts
(:func:`workshop.comm.trace_data.to_dicts`), so a saved trace can be counted anywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..checks import whole
from .costmodel import bus_factor
from .tracing import OPS

__all__ = ["bytes_by_rank", "bytes_per_step", "wire_bytes"]

# Bytes of one element, by the dtype name a trace records ("float32", not
# "torch.float32"); other dtypes are sized from nbytes and the shapes.
_ELEMENT_BYTES = {
    **dict.fromkeys(["complex128"], 16),
    **dict.fromkeys(["float64", "complex64", "int64"], 8),
    **dict.fromkeys(["float32", "int32"], 4),
    **dict.fromkeys(["float16", "bfloat16", "int16"], 2),
    **dict.fromkeys(["int8", "uint8", "bool"], 1),
}


def _field(event: Any, name: str, default: Any = None) -> Any:
    if isinstance(event, dict):
        return event.get(name, default)
    return getattr(event, name, default)


def _numels(event: Any) -> list[int]:
    return [math.prod(shape) for shape in (_field(event, "shapes") or [])]


def _element_bytes(event: Any) -> float:
    """Bytes of one element: from the dtype, else nbytes over the elements."""
    size = _ELEMENT_BYTES.get(_field(event, "dtype") or "")
    if size is not None:
        return float(size)
    numel = sum(_numels(event))
    if numel == 0:
        raise ValueError(
            f"a {_field(event, 'op')!r} event with dtype "
            f"{_field(event, 'dtype')!r} and shapes {_field(event, 'shapes')!r}: "
            "its element size cannot be found; give it the shapes of its tensors "
            "(as a TraceEvent records them)"
        )
    return _field(event, "nbytes") / numel


def _bytes_of(event: Any, which: int | slice) -> float:
    """Bytes of the tensor(s) at ``which`` in the event's shapes."""
    numels = _numels(event)
    picked = numels[which] if isinstance(which, slice) else [numels[which]]
    return sum(picked) * _element_bytes(event)


def wire_bytes(event: Any, rank: int | None = None) -> tuple[float, float]:
    """(sent, received) bytes one traced call put on the wire on its rank, the
    ring's figures for collectives (the table in this module's docstring).

    Args:
        event: a :class:`~workshop.comm.tracing.TraceEvent` or its dict; needs ``op``,
            ``nbytes`` and ``world_size``, rooted calls ``root``, gathering and
            scattering ones ``shapes`` and ``dtype``.
        rank: the rank that made the call; read from the event when omitted.

    Returns:
        Floats: a ring's share of a tensor need not be a whole number of bytes.

    Raises:
        ValueError: an unknown operation, or an event that lacks what it needs.

    Example:
        >>> wire_bytes({"op": "all_reduce", "nbytes": 4000, "world_size": 4})
        (6000.0, 6000.0)
    """
    op = _field(event, "op")
    if op not in OPS:
        raise ValueError(
            f"cannot count the bytes of op={op!r}: it is none of {', '.join(OPS)}; "
            "pass events recorded by workshop.comm.tracing (or dicts with their fields)"
        )
    nbytes, n = _field(event, "nbytes"), _field(event, "world_size")
    if nbytes is None or n is None:
        raise ValueError(
            f"a {op!r} event needs 'nbytes' and 'world_size', got nbytes={nbytes!r}, "
            f"world_size={n!r}; pass events recorded by workshop.comm.tracing"
        )
    size = float(nbytes)
    if op in ("send", "isend"):
        return size, 0.0
    if op in ("recv", "irecv"):
        return 0.0, size
    if op == "barrier" or n == 1:
        return 0.0, 0.0
    if op == "all_reduce":
        share = bus_factor(n) * size
        return share, share
    if op in ("all_gather", "all_gather_into_tensor"):
        chunk = _bytes_of(event, -1)  # the rank's own input, listed last
        return (n - 1) * chunk, (n - 1) * chunk
    if op in ("reduce_scatter", "reduce_scatter_tensor"):
        chunk = _bytes_of(event, 0)  # the rank's output, listed first
        return (n - 1) * chunk, (n - 1) * chunk
    if op in ("all_to_all", "all_to_all_single"):
        half = 1 if op == "all_to_all_single" else len(_numels(event)) // 2
        out, inp = _bytes_of(event, slice(0, half)), _bytes_of(event, slice(half, None))
        return (n - 1) / n * inp, (n - 1) / n * out
    root = _field(event, "root")
    me = _field(event, "rank") if rank is None else rank
    if root is None or me is None:
        raise ValueError(
            f"a {op!r} event needs 'root' and the caller's rank to be counted, got "
            f"root={root!r}, rank={me!r}; pass events recorded by "
            "workshop.comm.tracing, or pass rank="
        )
    place = (me - root) % n  # 0 at the root, then along the ring
    if op == "broadcast":
        return (size if place < n - 1 else 0.0), (size if place > 0 else 0.0)
    if op == "reduce":
        return (size if place > 0 else 0.0), (size if place < n - 1 else 0.0)
    chunk = _bytes_of(event, 0)  # gather's and scatter's own tensor, listed first
    if op == "gather":
        return (0.0, (n - 1) * chunk) if place == 0 else (chunk, 0.0)
    return ((n - 1) * chunk, 0.0) if place == 0 else (0.0, chunk)  # scatter


def bytes_by_rank(traces: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """Bytes each rank sent and received, from the traces of one launch.

    Args:
        traces: one list of events (or their dicts) per rank, rank 0 first
            (``result.traces`` of ``launch(..., trace=True)``).

    Returns:
        A dict per rank: ``rank``, ``sent`` and ``received`` (bytes on the wire),
        ``calls``, and ``by_op``: ``{op: {"calls", "sent", "received"}}``.

    Raises:
        ValueError: ``traces`` is not a list of lists, or an event cannot be
            counted (see :func:`wire_bytes`).

    Example:
        >>> traces = [[{"op": "send", "peer": 1, "nbytes": 8, "world_size": 2}],
        ...           [{"op": "recv", "peer": 0, "nbytes": 8, "world_size": 2}]]
        >>> [(r["sent"], r["received"]) for r in bytes_by_rank(traces)]
        [(8.0, 0.0), (0.0, 8.0)]
    """
    if isinstance(traces, (str, bytes, dict)) or not all(
        isinstance(events, (list, tuple)) for events in traces
    ):
        raise ValueError(
            f"traces must hold one list of events per rank, got {type(traces).__name__}"
            f" of {[type(e).__name__ for e in traces][:4]}; pass result.traces of "
            "launch(..., trace=True)"
        )
    rows = []
    for rank, events in enumerate(traces):
        row: dict[str, Any] = dict(rank=rank, sent=0.0, received=0.0, calls=0, by_op={})
        for event in events:
            sent, received = wire_bytes(event, _field(event, "rank", rank))
            fresh = dict(calls=0, sent=0.0, received=0.0)
            op = row["by_op"].setdefault(_field(event, "op"), fresh)
            for counts in (row, op):
                counts["calls"] += 1
                counts["sent"] += sent
                counts["received"] += received
        rows.append(row)
    return rows


def bytes_per_step(traces: Sequence[Sequence[Any]], steps: int) -> list[dict[str, Any]]:
    """:func:`bytes_by_rank`'s ``rank``, ``sent`` and ``received``, divided by
    the ``steps`` the traced run made.

    Raises:
        ValueError: ``steps`` is not a whole number 1 or more.

    Example:
        >>> bytes_per_step(result.traces, steps=5)[0]["sent"]     # doctest: +SKIP
        16000.0
    """
    whole("steps", steps, fix="pass the number of steps the traced run made")
    return [
        dict(rank=r["rank"], sent=r["sent"] / steps, received=r["received"] / steps)
        for r in bytes_by_rank(traces)
    ]
