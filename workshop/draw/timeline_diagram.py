"""The timeline diagram: a lane per rank, a bar per recorded call, and the compute
phases (forward, backward, optimizer) above them, so overlap shows. Drawn from plain
trace data (see :mod:`workshop.draw.comm_diagrams`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from .comm_diagrams import CENTRE, OP_COLOURS, UNKNOWN, _event, _ink
from .diagrams import (
    _MARGIN_IN,
    FIT_FONT,
    WIDTH_IN,
    _lanes,
    _pyplot,
    fitting_size,
    lane_figsize,
    lane_height,
    patch,
)

__all__ = ["draw_rank_timeline"]

_OUTSIDE_EM = 0.62 * 12 + 1  # points per character of a 12-point label, and a margin

_STRIP_PT = 11  # labels written beside a bar too narrow to hold them

_PHASE_GREYS = ["#DDDDDD", "#AAAAAA", "#666666"]  # compute phases, by first use


def draw_rank_timeline(
    events_by_rank: Sequence[Sequence[Any]],
    phases: Sequence[Any] | None = None,
    title: str | None = None,
) -> Figure:
    """Draw a lane per rank: a bar per recorded call (hatched: non-blocking, ended
    when the call returned), and above it compute phases if given, so overlap shows.

    Args:
        events_by_rank: each rank's recorded events, index = rank.
        phases: ``(rank, name, start, end)`` tuples (or dicts with those keys),
            seconds as ``time.time()`` gives, e.g. forward/backward/optimizer.
        title: the figure's title; by default it says what the lanes show.

    Returns:
        The matplotlib Figure.

    Raises:
        ValueError: nothing to draw, or an event without start and end.

    Example:
        >>> call = dict(rank=0, op="barrier", start=0.0, end=0.002)
        >>> fig = draw_rank_timeline([[call]], phases=[(0, "forward", 0.0, 0.001)])
        >>> sorted(t.get_text() for t in fig.axes[0].texts)
        ['barrier', 'forward']
    """
    plt = _pyplot()
    calls = [_event(e) for lane in events_by_rank for e in lane]
    for e in calls:
        if e["start"] is None or e["end"] is None:
            raise ValueError(f"{e['op']} on rank {e['rank']} has no start and end time")
    work = [_phase(p) for p in phases or []]
    if not calls and not work:
        raise ValueError("nothing to draw; pass the events of a traced run")
    lanes = max([len(events_by_rank)] + [x["rank"] + 1 for x in calls + work])
    t0 = min(x["start"] for x in calls + work)
    span = max((max(x["end"] for x in calls + work) - t0) * 1e3, 1e-6)
    pts_per_ms = (WIDTH_IN - _MARGIN_IN) * 72 / (span * 1.02)
    greys = {name: None for name in (w["name"] for w in work)}
    greys = {name: _PHASE_GREYS[i % 3] for i, name in enumerate(greys)}
    rows = [
        (
            x,
            OP_COLOURS.get(x["op"], UNKNOWN),
            x["label"] or x["op"],
            0.2 if work else 0.0,
        )
        for x in calls
    ]
    rows += [(w, greys[w["name"]], w["name"], -0.2) for w in work]
    height = 0.36 if work else 0.6
    # With compute above communication a lane holds two rows of bars: give it up
    # to 1.2 inches; the title has two lines then.
    shape = (lanes, 2 if work else 1, 1, 1.2 if work else 1.0)
    bar_points = height * 72 * lane_height(*shape)
    with plt.rc_context(FIT_FONT):
        fig, ax = plt.subplots(figsize=lane_figsize(*shape), layout="constrained")
        # A label too wide for its bar goes right of it on a row's last bar, else
        # in the strip between its row and the lane's edge, pushed right past the
        # previous one: a short all-reduce bucket must still say which it is.
        last_in_row: dict[tuple[int, float], float] = {}
        strip_end: dict[tuple[int, float], float] = {}
        for x, _, _, offset in rows:
            key = (x["rank"], offset)
            last_in_row[key] = max(last_in_row.get(key, x["end"]), x["end"])
        right = span * 1.02
        for x, colour, label, offset in rows:
            left = (x["start"] - t0) * 1e3
            width = max((x["end"] - x["start"]) * 1e3, span * 0.004)
            ax.barh(
                x["rank"] + offset,
                width,
                left=left,
                height=height,
                color=colour,
                edgecolor="black",
                linewidth=0.8,
                hatch="//" if x.get("blocking") is False else None,
            )
            size = fitting_size(label, width * pts_per_ms, bar_points)
            if size:
                ax.text(
                    left + width / 2,
                    x["rank"] + offset,
                    label,
                    **CENTRE,
                    fontsize=min(size, 14),
                    color=_ink(colour),
                )
            elif x["end"] != last_in_row[x["rank"], offset]:
                key = (x["rank"], offset)
                text_ms = (0.62 * _STRIP_PT * len(label) + 2) / pts_per_ms
                at = max(left + width / 2 - text_ms / 2, strip_end.get(key, 0.0), 0.0)
                strip_end[key] = at + text_ms + 3 / pts_per_ms
                right = max(right, strip_end[key])
                below = offset >= 0
                ax.text(
                    at,
                    x["rank"] + offset + (height / 2 + 0.01) * (1 if below else -1),
                    label,
                    ha="left",
                    va="top" if below else "bottom",
                    fontsize=_STRIP_PT,
                )
            else:
                gap = 4 / pts_per_ms
                ax.text(
                    left + width + gap,
                    x["rank"] + offset,
                    label,
                    ha="left",
                    va="center",
                    fontsize=12,
                )
                right = max(
                    right, left + width + gap + _OUTSIDE_EM * len(label) / pts_per_ms
                )
        _lanes(ax, [f"rank {r}" for r in range(lanes)], "rank")
        if strip_end:  # room under the last lane for labels written below its bars
            ax.set_ylim(lanes - 0.35, -0.5)
        ax.set_xlim(0, right)
        ax.set_xlabel("time since the first call (ms)")
        ax.set_title(
            (title or "Communication per rank")
            + ("\ncompute above, communication below" if work else "")
        )
        handles = [patch(c, n) for n, c in greys.items()]
        by_colour: dict[str, list[str]] = {}
        for e in calls:
            names = by_colour.setdefault(OP_COLOURS.get(e["op"], UNKNOWN), [])
            if e["op"] not in names:
                names.append(e["op"])
        handles += [patch(c, " / ".join(n)) for c, n in by_colour.items()]
        if any(e["blocking"] is False for e in calls):
            from matplotlib.patches import Patch

            hatched = {"facecolor": "white", "edgecolor": "black", "hatch": "//"}
            handles.append(Patch(**hatched, label="non-blocking call"))
        fig.legend(
            handles=handles,
            loc="outside lower center",
            ncols=len(handles) if len(handles) <= 7 else 5,
            frameon=False,
        )
    plt.close(fig)
    return fig


def _phase(item: Any) -> dict[str, Any]:
    if isinstance(item, Mapping):
        return {k: item[k] for k in ("rank", "name", "start", "end")}
    rank, name, start, end = item
    return {"rank": rank, "name": name, "start": start, "end": end}
