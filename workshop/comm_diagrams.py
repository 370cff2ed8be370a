"""Diagrams of communication between ranks, drawn from plain data.

Each function takes what the tracer recorded inside the ranks (events with ``rank``,
``op``, ``peer``, ``root``, ``reduce_op``, ``shapes``, ``dtype``, ``before``,
``after``, ``start``, ``end``, ``blocking``, ``seq``: objects with those fields or
dicts with those keys) or a layout given by two numbers, and returns a matplotlib
Figure sized for a projector, in the look of :mod:`workshop.diagrams`: large type,
Okabe-Ito colours. Nothing here imports torch or touches a process group, so a
picture can be redrawn from a saved file.

* :func:`draw_rank_layout`: nodes, their GPUs, and each slot's rank, local and node
  rank (notebook 02).
* :func:`draw_point_to_point`: an arrow per message sent, numbered in order.
* :func:`draw_collective`: every rank's tensor before and after one collective call.
* The ring all-reduce, computed step by step and drawn, is in :mod:`workshop.ring`.
* :func:`draw_rank_timeline`: a lane per rank, a bar per call, with compute phases.

Figures are closed in pyplot once drawn, so a cell that ends with one shows it once.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .diagrams import _FONT, _fitting_size, _lanes, _patch, _pyplot

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "OP_COLOURS",
    "draw_collective",
    "draw_point_to_point",
    "draw_rank_layout",
    "draw_rank_timeline",
]

#: Colour of each call (Okabe-Ito); ops of one family share one.
OP_COLOURS = {
    "send": "#0072B2",  # blue
    "isend": "#0072B2",
    "recv": "#56B4E9",  # sky blue
    "irecv": "#56B4E9",
    "broadcast": "#E69F00",  # orange: one to all
    "scatter": "#E69F00",
    "reduce": "#CC79A7",  # reddish purple: all to one
    "gather": "#CC79A7",
    "all_reduce": "#D55E00",  # vermillion
    "all_gather": "#009E73",  # bluish green
    "reduce_scatter": "#009E73",
    "all_to_all": "#F0E442",  # yellow
    "barrier": "#000000",
}
_UNKNOWN = "#999999"
_TIMES = "\u00d7"  # a multiplication sign
# One colour per rank (or chunk), cycling after seven; white text on the dark ones.
_PALETTE = ["#56B4E9", "#E69F00", "#009E73", "#F0E442", "#CC79A7", "#0072B2", "#D55E00"]
_DARK = {"#0072B2", "#D55E00", "#000000", "#666666"}
_CENTRE = {"ha": "center", "va": "center"}
_EDGE = {"edgecolor": "black", "linewidth": 1.5}
_REDUCED = "white"  # a cell that holds a reduction over ranks
_PHASE_GREYS = ["#DDDDDD", "#AAAAAA", "#666666"]  # compute phases, by first use
_FIELDS = (
    "rank",
    "op",
    "label",
    "peer",
    "root",
    "reduce_op",
    "world_size",
    "shapes",
    "dtype",
    "nbytes",
    "before",
    "after",
    "start",
    "end",
    "blocking",
    "seq",
)
_SENDS, _RECVS = {"send", "isend"}, {"recv", "irecv"}
_LIST_IN = {"scatter", "reduce_scatter", "all_to_all"}  # input: a tensor per rank
_LIST_OUT = {"gather", "all_gather", "all_to_all"}  # output: a tensor per rank
_MAX_CELLS = 16  # more values than this on one side: show the shape instead
_MEANING = {
    "broadcast": "the root's tensor is copied to every rank",
    "scatter": "the root's list is dealt out: tensor i goes to rank i",
    "gather": "every rank's tensor is collected in a list on the root",
    "reduce": "the root gets the {op} of every rank's tensor",
    "all_reduce": "every rank gets the {op} of every rank's tensor",
    "all_gather": "every rank gets a list of every rank's tensor",
    "reduce_scatter": "rank i gets the {op} of every rank's tensor i",
    "all_to_all": "rank j's tensor i goes to rank i, as its tensor j",
}


# --- rank layout ---------------------------------------------------------------------


def draw_rank_layout(nodes: int, ranks_per_node: int, gpus: bool = True) -> Figure:
    """Draw nodes as boxes, a slot per GPU (or CPU process) in each, with its ranks.

    Each slot shows its global ``rank``, its ``local_rank`` (its GPU on that node)
    and its ``node_rank``: ``rank = node_rank * ranks_per_node + local_rank``.

    Args:
        nodes: how many nodes (``--nnodes``), 1 to 16.
        ranks_per_node: ranks on each node (``--nproc-per-node``), 1 to 16.
        gpus: label slots ``GPU i`` (``cuda:i``); False labels them ``CPU process i``.

    Returns:
        The matplotlib Figure.

    Raises:
        ValueError: a count below 1, or more than 16.

    Example:
        >>> fig = draw_rank_layout(2, 4)
        >>> "rank 5" in [t.get_text() for t in fig.axes[0].texts]
        True
    """
    for name, n in (("nodes", nodes), ("ranks_per_node", ranks_per_node)):
        if not isinstance(n, int) or not 1 <= n <= 16:
            raise ValueError(
                f"{name}={n!r} cannot be drawn; pass a whole number from 1 to 16, "
                "e.g. draw_rank_layout(2, 4)"
            )
    plt = _pyplot()
    from matplotlib.patches import FancyBboxPatch

    per_row = max(1, min(nodes, 8 // ranks_per_node))  # about 8 slots across
    rows = math.ceil(nodes / per_row)
    slot, gap, pad = 1.7, 0.2, 0.25
    node_w = ranks_per_node * (slot + gap) - gap + 2 * pad
    node_h, node_gap = slot + 2 * pad + 0.55, 0.5
    width = per_row * (node_w + node_gap) - node_gap
    height = rows * (node_h + node_gap) - node_gap
    with plt.rc_context(_FONT):
        fig, ax = plt.subplots(
            figsize=(max(0.9 * width, 7), 0.9 * height + 1.2), layout="constrained"
        )
        for node in range(nodes):
            x0 = (node % per_row) * (node_w + node_gap)
            y0 = height - (node // per_row + 1) * (node_h + node_gap) + node_gap
            colour = _PALETTE[node % len(_PALETTE)]
            ax.add_patch(
                FancyBboxPatch(
                    (x0, y0),
                    node_w,
                    node_h,
                    boxstyle="round,pad=0,rounding_size=0.15",
                    facecolor="0.93",
                    edgecolor="black",
                    linewidth=2,
                )
            )
            ax.text(
                x0 + pad,
                y0 + node_h - 0.3,
                f"node {node}",
                fontsize=17,
                fontweight="bold",
                va="center",
            )
            for local in range(ranks_per_node):
                sx, sy = x0 + pad + local * (slot + gap), y0 + pad
                ax.add_patch(
                    FancyBboxPatch(
                        (sx, sy),
                        slot,
                        slot,
                        boxstyle="round,pad=0,rounding_size=0.1",
                        facecolor=colour,
                        edgecolor="black",
                        linewidth=1.2,
                    )
                )
                ink, cx = _ink(colour), sx + slot / 2
                device = f"GPU {local}" if gpus else f"CPU {local}"
                rows_of_text = (
                    (0.82, f"rank {node * ranks_per_node + local}", 17, "bold"),
                    (0.57, device, 13, "normal"),
                    (0.36, f"local_rank {local}", 13, "normal"),
                    (0.16, f"node_rank {node}", 13, "normal"),
                )
                for frac, text, size, weight in rows_of_text:
                    ax.text(
                        cx,
                        sy + frac * slot,
                        text,
                        **_CENTRE,
                        fontsize=size,
                        fontweight=weight,
                        color=ink,
                    )
        ax.set_xlim(-0.1, width + 0.1)
        ax.set_ylim(-0.1, height + 0.1)
        ax.set_aspect("equal")
        ax.axis("off")
        what = "GPUs" if gpus else "CPU processes"
        ax.set_title(
            f"{_count(nodes, 'node')} {_TIMES} {ranks_per_node} {what} per node = "
            f"world_size {nodes * ranks_per_node}\n"
            f"rank = node_rank {_TIMES} {ranks_per_node} + local_rank"
        )
    plt.close(fig)
    return fig


# --- point to point ------------------------------------------------------------------


def draw_point_to_point(events_by_rank: Sequence[Sequence[Any]]) -> Figure:
    """Draw an arrow from sender to receiver for every message, numbered in order.

    A send (or isend) is matched with its receiver's recv (or irecv) from that
    sender, in the order each rank made them, as the library matches them. Each
    arrow is labelled with the values sent, or their shape where values were not
    recorded; dashed arrows were sent with isend.

    Args:
        events_by_rank: each rank's recorded events, index = rank; calls other than
            send, isend, recv and irecv are left out.

    Returns:
        The matplotlib Figure.

    Raises:
        ValueError: no send or receive with a known peer, or a send with no peer.

    Example:
        >>> send = dict(rank=0, op="send", peer=1, before=[1.0, 2.0], start=0.0)
        >>> fig = draw_point_to_point([[send], []])
        >>> "(1) [1, 2]" in [t.get_text() for t in fig.axes[0].texts]
        True
    """
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Circle, FancyArrowPatch

    messages = _messages(events_by_rank)
    if not messages:
        raise ValueError(
            "no send/recv (or isend/irecv) with a known peer among these events; "
            "pass the events of a run whose function called dist.send and dist.recv"
        )
    world = max(len(events_by_rank), *(max(m["src"], m["dst"]) + 1 for m in messages))
    step, radius = 2.8, 0.6
    seen: dict[tuple[int, int], int] = defaultdict(int)
    for m in messages:  # a wider arc for each further message between the same two
        m["rad"] = -(0.55 + 0.45 * seen[m["src"], m["dst"]])  # above going right
        seen[m["src"], m["dst"]] += 1
        # The arc's middle (aspect is equal, so data units bend like display ones).
        m["apex"] = -0.5 * m["rad"] * (m["dst"] - m["src"]) * step
    top = max([radius] + [m["apex"] + 0.8 for m in messages]) + 0.3
    bottom = min([-radius] + [m["apex"] - 0.8 for m in messages]) - 0.3
    inch = min(0.85, 15 / (world * step))  # inches per data unit
    with plt.rc_context(_FONT):
        fig, ax = plt.subplots(
            figsize=(max(world * step * inch + 1, 8), (top - bottom) * inch + 2.4),
            layout="constrained",
        )
        circles = []
        for r in range(world):
            colour = _PALETTE[r % len(_PALETTE)]
            circle = Circle((r * step, 0), radius, facecolor=colour, **_EDGE, zorder=3)
            ax.add_patch(circle)
            circles.append(circle)
            ax.text(
                r * step,
                0,
                f"rank {r}",
                **_CENTRE,
                fontsize=15,
                fontweight="bold",
                color=_ink(colour),
                zorder=4,
            )
        for number, m in enumerate(messages, start=1):
            src, dst, apex = m["src"], m["dst"], m["apex"]
            ax.add_patch(
                FancyArrowPatch(
                    (src * step, 0),
                    (dst * step, 0),
                    patchA=circles[src],
                    patchB=circles[dst],
                    connectionstyle=f"arc3,rad={m['rad']}",
                    arrowstyle="-|>",
                    mutation_scale=28,
                    linewidth=2.5,
                    color="black",
                    linestyle="--" if m["async"] else "-",
                    zorder=2,
                )
            )
            ax.text(
                (src + dst) * step / 2,
                apex + (0.12 if apex > 0 else -0.12),
                f"({number}) {m['label']}",
                ha="center",
                va="bottom" if apex > 0 else "top",
                fontsize=15,
                zorder=5,
                bbox=dict(
                    boxstyle="round,pad=0.25", facecolor="white", edgecolor="0.6"
                ),
            )
        ax.set_xlim(-step / 2, (world - 0.5) * step)
        ax.set_ylim(bottom, top)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(
            f"Point-to-point: {_count(len(messages), 'message')} between "
            f"{world} ranks\nnumbered in the order sent, labelled with what was sent"
        )
        handles = [
            Line2D([], [], color="black", linewidth=2.5, label="send / recv (blocking)")
        ]
        if any(m["async"] for m in messages):
            handles.append(
                Line2D(
                    [],
                    [],
                    color="black",
                    linewidth=2.5,
                    linestyle="--",
                    label="isend / irecv (non-blocking)",
                )
            )
        fig.legend(handles=handles, loc="outside lower center", ncols=2, frameon=False)
    plt.close(fig)
    return fig


# --- one collective ------------------------------------------------------------------


def draw_collective(events_for_one_call: Sequence[Any]) -> Figure:
    """Draw every rank's tensor before and after one collective call, side by side.

    Cells are coloured by whose data they hold (a colour per rank); white cells hold
    a reduction (a sum, say) over all ranks. Where values were not recorded (large
    tensors) a box gives the shapes instead.

    Args:
        events_for_one_call: the same call's event on each rank, index = rank:
            broadcast, scatter, gather, all_gather, reduce, all_reduce,
            reduce_scatter or all_to_all (others are drawn without provenance).

    Returns:
        The matplotlib Figure.

    Raises:
        ValueError: no events, or events of different ops.

    Example:
        >>> calls = [dict(rank=r, op="all_reduce", reduce_op="sum", before=[r],
        ...               after=[1]) for r in range(2)]
        >>> draw_collective(calls).axes[0].get_title().splitlines()[0]
        'all_reduce (sum) on 2 ranks'
    """
    plt = _pyplot()
    from matplotlib.patches import FancyBboxPatch, Rectangle

    events = sorted((_event(e) for e in events_for_one_call), key=lambda e: e["rank"])
    if not events:
        raise ValueError("no events; pass one call's event from each rank")
    ops = {e["op"] for e in events}
    if len(ops) > 1:
        raise ValueError(
            f"these events are of different calls ({sorted(ops)}); pass the same "
            "call's event from each rank, e.g. [lane[i] for lane in events_by_rank]"
        )
    op, first = events[0]["op"], events[0]
    root, reduce_op = first["root"], first["reduce_op"] or "sum"
    world = first["world_size"] or len(events)
    sides = [
        [_side(e, "before", op in _LIST_IN) for e in events],
        [_side(e, "after", op in _LIST_OUT) for e in events],
    ]
    cell, gap, pitch = 1.0, 0.35, 1.35
    widths = [max(_width(s, cell, gap) for s in side) for side in sides]
    arrow_gap = 2.2
    x_after = widths[0] + arrow_gap
    total = x_after + widths[1]
    pts_per_unit = min((16 - 3) / total, 0.9) * 72
    used: set[str] = set()  # colours drawn, for the legend
    with plt.rc_context(_FONT):
        fig, ax = plt.subplots(
            figsize=(
                min(max(total * pts_per_unit / 72 + 3, 10), 17),
                pitch * len(events) + 2.8,
            ),
            layout="constrained",
        )
        for row, e in enumerate(events):
            y = row * pitch
            for col, (x0, side) in enumerate(
                ((0.0, sides[0][row]), (x_after, sides[1][row]))
            ):
                if isinstance(side, str):  # no values: a box with what is known
                    ax.add_patch(
                        FancyBboxPatch(
                            (x0, y - 0.4),
                            widths[col],
                            0.8,
                            facecolor="0.95",
                            edgecolor="0.5",
                            boxstyle="round,pad=0,rounding_size=0.1",
                        )
                    )
                    ax.text(
                        x0 + widths[col] / 2,
                        y,
                        side,
                        **_CENTRE,
                        fontsize=13,
                        color="0.2",
                    )
                    continue
                x = x0
                for g, values in enumerate(side):
                    colour = _provenance(op, e["rank"], root, g, after=col == 1)
                    used.add(colour)
                    for v in values:
                        ax.add_patch(
                            Rectangle(
                                (x, y - 0.4),
                                cell,
                                0.8,
                                facecolor=colour,
                                edgecolor="black",
                                linewidth=1.2,
                            )
                        )
                        label = _num(v)
                        size = _fitting_size(label, cell * pts_per_unit) or 11
                        ax.text(
                            x + cell / 2,
                            y,
                            label,
                            ha="center",
                            va="center",
                            fontsize=size,
                            color=_ink(colour),
                        )
                        x += cell
                    x += gap
            ax.text(
                widths[0] + arrow_gap / 2,
                y,
                "→",
                **_CENTRE,
                fontsize=26,
                color="0.35",
            )
        for x, head in ((widths[0] / 2, "before"), (x_after + widths[1] / 2, "after")):
            ax.text(
                x, -0.95, head, ha="center", va="center", fontsize=17, fontweight="bold"
            )
        labels = [
            f"rank {e['rank']}" + (" (root)" if e["rank"] == root else "")
            for e in events
        ]
        ax.set_yticks([i * pitch for i in range(len(events))], labels)
        ax.set_ylim(len(events) * pitch - pitch / 2, -1.4)
        ax.set_xlim(-0.2, total + 0.2)
        ax.set_xticks([])
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        ax.tick_params(axis="y", length=0)
        name = f"{op} ({reduce_op})" if "reduce" in op else op
        if root is not None:
            where = "to" if op in {"gather", "reduce"} else "from"
            name += f" {where} root {root}"
        meaning = _MEANING.get(op, "").format(op=reduce_op)
        ax.set_title(f"{name} on {world} ranks" + (f"\n{meaning}" if meaning else ""))
        legend = {_PALETTE[r % len(_PALETTE)]: f"rank {r}'s data" for r in range(world)}
        legend[_REDUCED] = f"{reduce_op} over all ranks"
        handles = [_patch(c, text) for c, text in legend.items() if c in used]
        if handles:  # as many columns as fit across the figure
            across = max(1, int(fig.get_figwidth() // 2.7))
            fig.legend(
                handles=handles,
                loc="outside lower center",
                frameon=False,
                ncols=min(len(handles), across),
            )
    plt.close(fig)
    return fig


# --- ring all-reduce -----------------------------------------------------------------


# --- timeline ------------------------------------------------------------------------


def draw_rank_timeline(
    events_by_rank: Sequence[Sequence[Any]],
    phases: Sequence[Any] | None = None,
    title: str | None = None,
) -> Figure:
    """Draw a lane per rank: a bar per recorded call, and compute phases if given.

    Times are in ms from the earliest start. With phases, each lane has two rows:
    compute (greys) above, communication (a colour per op) below, so an all-reduce
    that overlaps the backward pass shows as overlap. Hatched bars are non-blocking
    calls, which end when the call returned, not when the data arrived.

    Args:
        events_by_rank: each rank's recorded events, index = rank.
        phases: ``(rank, name, start, end)`` tuples (or dicts with those keys),
            seconds as ``time.time()`` gives, e.g. forward/backward/optimizer.
        title: the figure's title; by default it says what the lanes show. An
            event's ``label`` (if it has one) is written on its bar instead of its op.

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
    width_in = 14
    pts_per_ms = (width_in - 3.0) * 72 / (span * 1.02)
    greys = {name: None for name in (w["name"] for w in work)}
    greys = {name: _PHASE_GREYS[i % 3] for i, name in enumerate(greys)}
    rows = [
        (
            x,
            OP_COLOURS.get(x["op"], _UNKNOWN),
            x["label"] or x["op"],
            0.2 if work else 0.0,
        )
        for x in calls
    ]
    rows += [(w, greys[w["name"]], w["name"], -0.2) for w in work]
    height = 0.36 if work else 0.6
    with plt.rc_context(_FONT):
        fig, ax = plt.subplots(
            figsize=(width_in, 1.4 * lanes + 3.0), layout="constrained"
        )
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
            size = _fitting_size(label, width * pts_per_ms)
            if size:
                ax.text(
                    left + width / 2,
                    x["rank"] + offset,
                    label,
                    **_CENTRE,
                    fontsize=min(size, 14),
                    color=_ink(colour),
                )
        _lanes(ax, [f"rank {r}" for r in range(lanes)], "rank")
        ax.set_xlim(0, span * 1.02)
        ax.set_xlabel("time since the first call (ms)")
        ax.set_title(
            (title or "Communication per rank")
            + ("\ncompute above, communication below" if work else "")
        )
        handles = [_patch(c, n) for n, c in greys.items()]
        by_colour: dict[str, list[str]] = {}
        for e in calls:
            names = by_colour.setdefault(OP_COLOURS.get(e["op"], _UNKNOWN), [])
            if e["op"] not in names:
                names.append(e["op"])
        handles += [_patch(c, " / ".join(n)) for c, n in by_colour.items()]
        if any(e["blocking"] is False for e in calls):
            from matplotlib.patches import Patch

            handles.append(
                Patch(
                    facecolor="white",
                    edgecolor="black",
                    hatch="//",
                    label="non-blocking call",
                )
            )
        fig.legend(handles=handles, loc="outside lower center", ncols=4, frameon=False)
    plt.close(fig)
    return fig


# --- private helpers -----------------------------------------------------------------


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _ink(colour: str) -> str:
    return "white" if colour in _DARK else "black"


def _event(item: Any) -> dict[str, Any]:
    """A recorded call as a dict with every field (None where missing)."""
    if isinstance(item, Mapping):
        event = {k: item.get(k) for k in _FIELDS}
    else:
        event = {k: getattr(item, k, None) for k in _FIELDS}
    if event["rank"] is None or event["op"] is None:
        raise ValueError(
            f"{item!r} is not a communication event: it needs at least rank and op"
        )
    return event


def _phase(item: Any) -> dict[str, Any]:
    if isinstance(item, Mapping):
        return {k: item[k] for k in ("rank", "name", "start", "end")}
    rank, name, start, end = item
    return {"rank": rank, "name": name, "start": start, "end": end}


def _flat(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return [x for v in value for x in _flat(v)]
    return [value]


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _values(value: Any, limit: int = 6) -> str:
    flat = _flat(value)
    shown = ", ".join(_num(v) for v in flat[:limit])
    return f"[{shown}{', …' if len(flat) > limit else ''}]"


def _shapes(event: dict[str, Any]) -> str:
    shapes = [tuple(s) for s in event["shapes"] or []]
    text = ", ".join(str(s) for s in dict.fromkeys(shapes))
    if len(set(shapes)) == 1 and len(shapes) > 1:
        text = f"{len(shapes)} {_TIMES} {shapes[0]}"
    text = f"shape {text}" if text else "shape unknown"
    return f"{text} {event['dtype']}" if event["dtype"] else text


def _messages(events_by_rank: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """Sends matched to receives, per (sender, receiver) pair in order made."""
    events = [_event(e) for lane in events_by_rank for e in lane]
    events.sort(key=lambda e: (e["start"] or 0.0, e["seq"] or 0, e["rank"]))
    waiting: dict[tuple[Any, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["op"] in _RECVS:
            waiting[e["peer"], e["rank"]].append(e)
    messages = []
    for e in events:
        if e["op"] not in _SENDS:
            continue
        if e["peer"] is None:
            raise ValueError(f"{e['op']} on rank {e['rank']} has no peer to send to")
        queue = waiting[e["rank"], e["peer"]] or waiting[None, e["peer"]]
        messages.append(
            {
                "src": e["rank"],
                "dst": e["peer"],
                "send": e,
                "recv": queue.pop(0) if queue else None,
            }
        )
    for (src, dst), left in waiting.items():  # received, but the send not recorded
        if src is not None:
            messages += [
                {"src": src, "dst": dst, "send": None, "recv": r} for r in left
            ]
    for m in messages:
        send, recv = m["send"], m["recv"]
        values = send["before"] if send and send["before"] is not None else None
        if values is None and recv is not None:
            values = recv["after"]
        m["label"] = _values(values) if values is not None else _shapes(send or recv)
        m["async"] = any(x and x["op"] in {"isend", "irecv"} for x in (send, recv))
        m["when"] = min(x["start"] or 0.0 for x in (send, recv) if x)
    return sorted(messages, key=lambda m: m["when"])


def _side(event: dict[str, Any], key: str, is_list: bool) -> list[list[Any]] | str:
    """One side of a collective as groups of values, or a text where none."""
    value = event[key]
    rooted_list = (key == "before" and event["op"] == "scatter") or (
        key == "after" and event["op"] == "gather"
    )
    if value is None and rooted_list and event["rank"] != event["root"]:
        return "—  (only the root\nhas a list)"
    if value is None:
        return f"values not recorded\n{_shapes(event)}"
    groups = [_flat(v) for v in value] if is_list and isinstance(value, list) else None
    groups = groups or [_flat(value)]
    if sum(len(g) for g in groups) > _MAX_CELLS:
        return f"{sum(len(g) for g in groups)} values\n{_shapes(event)}"
    return groups


def _width(side: list[list[Any]] | str, cell: float, gap: float) -> float:
    if isinstance(side, str):
        return 4.5
    return sum(len(g) for g in side) * cell + (len(side) - 1) * gap


def _provenance(op: str, rank: int, root: Any, group: int, after: bool) -> str:
    """The colour of whose data a cell holds."""
    owner = rank
    if after and op in {"broadcast", "scatter"} and root is not None:
        owner = root
    elif after and op in _LIST_OUT:
        owner = group
    elif after and op in {"all_reduce", "reduce_scatter"}:
        return _REDUCED
    if after and op == "reduce" and rank == root:
        return _REDUCED
    return _PALETTE[owner % len(_PALETTE)]
