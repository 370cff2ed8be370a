"""Traces as plain data: saved as JSON, read back, put in time order, and each
collective grouped across the ranks; no torch, so a batch job's trace
(:mod:`workshop.comm.tracing`) can be read and drawn anywhere."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

from .tracing import POINT_TO_POINT, TraceEvent

__all__ = ["FORMAT", "collectives", "from_dicts", "load", "merge", "save", "to_dicts"]

FORMAT = "workshop-trace-1"

_FIELDS = tuple(f.name for f in dataclasses.fields(TraceEvent))


def to_dicts(events: Sequence[TraceEvent]) -> list[dict[str, Any]]:
    """Events as JSON-ready dicts (shapes become lists).

    Example:
        >>> json.dumps(to_dicts(events))                        # doctest: +SKIP
    """
    out = []
    for event in events:
        d = {name: getattr(event, name) for name in _FIELDS}
        d["shapes"] = [list(s) for s in event.shapes]
        out.append(d)
    return out


def from_dicts(dicts: Sequence[dict[str, Any]]) -> list[TraceEvent]:
    """The :class:`TraceEvent` list from the dicts :func:`to_dicts` made.

    Raises:
        ValueError: a dict lacks fields of :class:`TraceEvent` or has others.

    Example:
        >>> from_dicts(json.loads(text))                        # doctest: +SKIP
    """
    events = []
    for i, d in enumerate(dicts):
        missing = [f for f in _FIELDS if f not in d]
        extra = [k for k in d if k not in _FIELDS]
        if missing or extra:
            raise ValueError(
                f"event {i} is not a trace event: missing {missing}, unknown {extra}; "
                "read files written by workshop.comm.tracing.save (or to_dicts)"
            )
        fields = dict(d)
        fields["shapes"] = [tuple(s) for s in d["shapes"]]
        events.append(TraceEvent(**fields))
    return events


def save(
    path: str | os.PathLike, events_by_rank: Sequence[Sequence[TraceEvent]]
) -> None:
    """Write every rank's events (``launch(...).returns`` of ``record()`` lists) to
    a JSON file at ``path``.

    Example:
        >>> save("trace.json", launch(step, world_size=4).returns)  # doctest: +SKIP
    """
    data = {"format": FORMAT, "ranks": [to_dicts(events) for events in events_by_rank]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)


def load(path: str | os.PathLike) -> list[list[TraceEvent]]:
    """Read a file written by :func:`save`: one list of :class:`TraceEvent` per rank.

    Raises:
        ValueError: the file is not a workshop trace.

    Example:
        >>> events_by_rank = load("trace.json")                  # doctest: +SKIP
    """
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    found = data.get("format") if isinstance(data, dict) else type(data).__name__
    if found != FORMAT:
        raise ValueError(
            f"{os.fspath(path)!r} is not a workshop trace: format {found!r}, expected "
            f"{FORMAT!r}; write traces with workshop.comm.tracing.save"
        )
    return [from_dicts(events) for events in data["ranks"]]


def merge(events_by_rank: Sequence[Sequence[TraceEvent]]) -> list[TraceEvent]:
    """All ranks' events in one list, by start time (ties by rank, then seq).

    Example:
        >>> [(e.rank, e.op) for e in merge(result.returns)]      # doctest: +SKIP
    """
    everything = [e for events in events_by_rank for e in events]
    return sorted(everything, key=lambda e: (e.start, e.rank, e.seq))


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def collectives(
    events_by_rank: Sequence[Sequence[TraceEvent]],
) -> list[list[TraceEvent]]:
    """Group the same collective call across ranks: the k-th collective of every
    rank belongs together (point-to-point calls are left out), as every rank of the
    default group must call each collective in the same order.

    Args:
        events_by_rank: one list of events per rank, rank 0 first.

    Returns:
        One list per collective call, holding each rank's event in rank order.

    Raises:
        ValueError: the ranks made different numbers of collective calls, or the
            k-th call is not the same function on every rank.

    Example:
        >>> for call in collectives(result.returns):            # doctest: +SKIP
        ...     print(call[0].op, [e.after for e in call])
    """
    per_rank = [
        [e for e in events if e.op not in POINT_TO_POINT] for events in events_by_rank
    ]
    groups: list[list[TraceEvent]] = []
    for k in range(max((len(c) for c in per_rank), default=0)):
        by_op: dict[str, list[int]] = {}
        for rank, calls in enumerate(per_rank):
            op = calls[k].op if k < len(calls) else "nothing (it had stopped)"
            by_op.setdefault(op, []).append(rank)
        if len(by_op) > 1:
            found = "; ".join(f"{_ranks(r)} called {op}" for op, r in by_op.items())
            raise ValueError(
                f"collective call #{k} differs between ranks: {found}. Every rank "
                "must call the same collectives in the same order, because each call "
                "waits for its partners on the other ranks: a rank that calls another "
                "collective, or skips one, leaves the others waiting (a hang) or "
                "mixes up their data. HINT: look for a collective inside "
                "`if rank == ...:` or a loop whose length differs between ranks, and "
                "make every rank reach the same calls"
            )
        groups.append([calls[k] for calls in per_rank])
    return groups
