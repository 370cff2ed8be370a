"""The orders in which one pipeline stage runs its work (GPipe, 1F1B), how many
activations each keeps at once, and the idle share of a measured timeline; no torch.

With ``p`` stages and ``m`` micro-batches both schedules leave the same bubble,
(p-1)/(m+p-1) of the time idle, but GPipe holds all ``m`` micro-batches'
activations before its first backward while 1F1B holds at most ``p - stage``:
1F1B buys memory, not speed. :mod:`workshop.parallel.pipeline_ranks` runs these
orders on real ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..checks import whole

__all__ = [
    "PIPELINE_SCHEDULES",
    "gpipe_order",
    "idle_fraction",
    "one_f_one_b_order",
    "peak_stored",
    "schedule_order",
]

#: The schedules :func:`schedule_order` knows.
PIPELINE_SCHEDULES = ("gpipe", "1f1b")

Work = tuple[str, int]  # ("forward" or "backward", micro-batch)


def _check_place(stage: int, stages: int, micro_batches: int) -> None:
    whole("stages", stages)
    whole("micro_batches", micro_batches, fix="e.g. micro_batches=4")
    fix = f"a pipeline of {stages} stages numbers them 0 to {stages - 1}"
    whole("stage", stage, 0, stages - 1, fix=fix)


def gpipe_order(stage: int, stages: int, micro_batches: int) -> list[Work]:
    """The work of one stage under GPipe: every forward, then every backward (so
    all ``micro_batches`` activations are held when the first backward starts).

    Args:
        stage: this stage, 0 (the first) to ``stages - 1``.
        stages: stages in the pipeline, >= 1.
        micro_batches: pieces of the batch, >= 1.

    Returns:
        ``[("forward", 0), ..., ("forward", m-1), ("backward", 0), ...,
        ("backward", m-1)]``.

    Raises:
        ValueError: a count below 1 or a stage outside 0 .. stages-1.

    Example:
        >>> gpipe_order(0, 2, 2)
        [('forward', 0), ('forward', 1), ('backward', 0), ('backward', 1)]
    """
    _check_place(stage, stages, micro_batches)
    return [("forward", k) for k in range(micro_batches)] + [
        ("backward", k) for k in range(micro_batches)
    ]


def one_f_one_b_order(stage: int, stages: int, micro_batches: int) -> list[Work]:
    """The work of one stage under 1F1B: ``stages - 1 - stage`` forwards to fill
    the stages after this one, then one forward and the oldest held backward in
    turn, then the backwards left.

    Args:
        stage, stages, micro_batches: as for :func:`gpipe_order`.

    Returns:
        ("forward" | "backward", micro-batch) pairs.

    Raises:
        ValueError: a count below 1 or a stage outside 0 .. stages-1.

    Example:
        >>> order = one_f_one_b_order(0, 2, 4)
        >>> " ".join(f"{phase[0].upper()}{k}" for phase, k in order)
        'F0 F1 B0 F2 B1 F3 B2 B3'
    """
    _check_place(stage, stages, micro_batches)
    warm_up = min(stages - 1 - stage, micro_batches)
    order: list[Work] = [("forward", k) for k in range(warm_up)]
    for k in range(micro_batches - warm_up):
        order += [("forward", warm_up + k), ("backward", k)]
    order += [("backward", k) for k in range(micro_batches - warm_up, micro_batches)]
    return order


def schedule_order(
    schedule: str, stage: int, stages: int, micro_batches: int
) -> list[Work]:
    """The order of ``schedule`` ("gpipe" or "1f1b") for one stage.

    Raises:
        ValueError: an unknown schedule, a count below 1 or a stage out of range.

    Example:
        >>> schedule_order("1f1b", 1, 2, 2)
        [('forward', 0), ('backward', 0), ('forward', 1), ('backward', 1)]
    """
    name = schedule.lower() if isinstance(schedule, str) else schedule
    if name == "gpipe":
        return gpipe_order(stage, stages, micro_batches)
    if name == "1f1b":
        return one_f_one_b_order(stage, stages, micro_batches)
    raise ValueError(
        f"schedule={schedule!r} is not a pipeline schedule this workshop knows; "
        f"pass one of {', '.join(repr(s) for s in PIPELINE_SCHEDULES)}"
    )


def peak_stored(order: Sequence[Work]) -> int:
    """The most activations a stage holds at once when it runs ``order`` (a forward
    stores its micro-batch's activations, the backward frees them).

    Args:
        order: ("forward" | "backward", micro-batch) pairs.

    Returns:
        The peak count: ``m`` for GPipe, ``min(m, stages - stage)`` for 1F1B.

    Raises:
        ValueError: a backward before its forward, a micro-batch run twice, or a
            phase that is neither "forward" nor "backward".

    Example:
        >>> peak_stored(gpipe_order(0, 4, 8)), peak_stored(one_f_one_b_order(0, 4, 8))
        (8, 4)
    """
    held: set[int] = set()
    done: set[Work] = set()
    peak = 0
    for phase, k in order:
        if (phase, k) in done:
            raise ValueError(f"the order runs the {phase} of micro-batch {k} twice")
        done.add((phase, k))
        if phase == "forward":
            held.add(k)
            peak = max(peak, len(held))
        elif phase == "backward":
            if k not in held:
                raise ValueError(
                    f"the order runs the backward of micro-batch {k} before its "
                    "forward; every backward needs its forward's activations"
                )
            held.discard(k)
        else:
            raise ValueError(
                f"phase {phase!r} in the order; use 'forward' or 'backward'"
            )
    return peak


def idle_fraction(events_by_rank: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """The measured idle share of each rank and of the whole pipeline, over the span
    from the earliest start to the latest end on any rank (so a rank that starts
    late counts as idle meanwhile, as the bubble does).

    Args:
        events_by_rank: each rank's events (dicts or objects with ``start`` and
            ``end`` in seconds on a common clock).

    Returns:
        ``{"per_rank": [1 - busy / span for each rank], "overall": the mean of
        those (1 - all busy time / (ranks x span)), "span": seconds,
        "busy": [seconds busy for each rank]}``.

    Raises:
        ValueError: no events at all, or an event that ends before it starts.

    Example:
        >>> a = [{"start": 0.0, "end": 1.0}]
        >>> b = [{"start": 1.0, "end": 2.0}]
        >>> idle_fraction([a, b])["overall"]
        0.5
    """
    spans = [[_times(e) for e in events] for events in events_by_rank]
    every = [t for times in spans for t in times]
    if not every:
        raise ValueError(
            "no events to measure; pass each rank's 'events' from run_pipeline"
        )
    first, last = min(s for s, _ in every), max(e for _, e in every)
    span = last - first
    busy = [sum(e - s for s, e in times) for times in spans]
    per_rank = [1.0 - b / span if span > 0 else 0.0 for b in busy]
    return {
        "per_rank": per_rank,
        "overall": sum(per_rank) / len(per_rank),
        "span": span,
        "busy": busy,
    }


def _times(event: Any) -> tuple[float, float]:
    get = event.get if isinstance(event, Mapping) else lambda k: getattr(event, k)
    start, end = float(get("start")), float(get("end"))
    if end < start:
        raise ValueError(
            f"an event ends before it starts (start={start}, end={end}); pass "
            "events measured on one clock"
        )
    return start, end
