"""Diagrams of communication between ranks, drawn from plain data.

The diagrams take what the tracer recorded inside the ranks (objects or dicts with
the fields of ``_FIELDS``) and return a Figure sized for a projector, in the look of
:mod:`workshop.draw.diagrams`; no torch here, so a saved trace redraws anywhere.
This module draws :func:`draw_rank_layout` (notebook 02) and holds what the others
(:mod:`~workshop.draw.p2p_diagram`, :mod:`~workshop.draw.collective_diagram`,
:mod:`~workshop.draw.ring_diagram`, :mod:`~workshop.draw.timeline_diagram`) share:
op colours, how an event is read, and a canvas laid out in the pixels of the PNG a
notebook shows. Figures are closed in pyplot once drawn (a cell shows one once).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..checks import whole
from .diagrams import DIAGRAM_FONT, _count, _pyplot

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["OP_COLOURS", "draw_rank_layout"]

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
UNKNOWN = "#999999"
_TIMES = "\u00d7"  # a multiplication sign
# One colour per rank (or chunk), cycling after seven; white text on the dark ones.
PALETTE = ["#56B4E9", "#E69F00", "#009E73", "#F0E442", "#CC79A7", "#0072B2", "#D55E00"]
_DARK = {"#0072B2", "#D55E00", "#000000", "#666666"}
CENTRE = {"ha": "center", "va": "center"}
EDGE = {"edgecolor": "black", "linewidth": 1.5}
REDUCED = "white"  # a cell that holds a reduction over ranks
_FIELDS = ("rank", "op", "label", "peer", "root", "reduce_op", "world_size")  # who
_FIELDS += ("shapes", "dtype", "nbytes", "before", "after")  # what
_FIELDS += ("start", "end", "blocking", "seq")  # when
SENDS, RECVS = {"send", "isend"}, {"recv", "irecv"}


# --- rank layout ---------------------------------------------------------------------


def draw_rank_layout(nodes: int, ranks_per_node: int, gpus: bool = True) -> Figure:
    """Draw nodes as boxes, a slot per GPU (or CPU process) in each, showing its
    ``rank``, ``local_rank`` and ``node_rank``.

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
        whole(name, n, most=16, fix="e.g. draw_rank_layout(2, 4)")
    plt = _pyplot()
    from matplotlib.patches import FancyBboxPatch

    per_row = max(1, min(nodes, 8 // ranks_per_node))  # about 8 slots across
    rows = math.ceil(nodes / per_row)
    slot, gap, pad = 1.7, 0.2, 0.25
    node_w = ranks_per_node * (slot + gap) - gap + 2 * pad
    node_h, node_gap = slot + 2 * pad + 0.55, 0.5
    width = per_row * (node_w + node_gap) - node_gap
    height = rows * (node_h + node_gap) - node_gap
    # Inches per data unit: 0.9, less where 8 slots across would pass the
    # projector's 1,100 px; the type shrinks with the slots, down to 13 px.
    inch = min(0.9, 10.4 / width)
    shrink = inch / 0.9
    with plt.rc_context(DIAGRAM_FONT):
        fig, ax = plt.subplots(
            figsize=(max(inch * width, 7), inch * height + 1.2), layout="constrained"
        )
        for node in range(nodes):
            x0 = (node % per_row) * (node_w + node_gap)
            y0 = height - (node // per_row + 1) * (node_h + node_gap) + node_gap
            colour = PALETTE[node % len(PALETTE)]
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
                fontsize=17 * shrink,
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
                small = max(9.5, 13 * shrink)  # 13 px at the least
                rank = node * ranks_per_node + local
                rows_of_text = (
                    (0.82, f"rank {rank}", 17 * shrink, "bold"),
                    (0.57, device, small, "normal"),
                    (0.36, f"local_rank {local}", small, "normal"),
                    (0.16, f"node_rank {node}", small, "normal"),
                )
                for frac, text, size, weight in rows_of_text:
                    at = (cx, sy + frac * slot)
                    style = {"fontsize": size, "fontweight": weight, "color": ink}
                    ax.text(*at, text, **CENTRE, **style)
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


# --- drawing in pixels ---------------------------------------------------------------

# The diagrams below are laid out in the pixels of the inline backend's PNG (100 dpi),
# so that what fits the projector (workshop.draw.projector) is decided while drawing.
DPI = 100
LABEL_PT = 10  # 13.9 px: the smallest type these diagrams use (the projector's 12 px)
_RENDERER: list[Any] = []


def points(px: float) -> float:
    """A font size in points for text ``px`` pixels high at 100 dpi."""
    return px * 72 / DPI


def text_px(label: str, size: float, bold: bool = False) -> tuple[float, float]:
    """(width, height) in pixels of ``label`` at ``size`` points, drawn at 100 dpi."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties

    if not _RENDERER:
        _RENDERER.append(RendererAgg(10, 10, DPI))
    font = FontProperties(size=size, weight="bold" if bold else "normal")
    lines = label.split("\n")
    width = max(
        _RENDERER[0].get_text_width_height_descent(line, font, ismath=False)[0]
        for line in lines
    )
    return width, len(lines) * size * DPI / 72 * 1.2


def bottom_legend(fig: Any, handles: list, across: int, size: float) -> None:
    """The legend centred under the picture, ``across`` entries a row, unframed (so
    it does not look like one of the picture's boxes)."""
    fig.legend(
        handles=handles,
        loc="lower center",
        frameon=False,
        ncols=across,
        fontsize=size,
        borderaxespad=0.2,
    )


def canvas(width: float, height: float, top: float = 0, bottom: float = 0) -> Any:
    """A figure ``width`` x ``top + height + bottom`` pixels (room for a title and a
    legend), and its axes: the middle, in pixels from its top left (y down)."""
    plt = _pyplot()
    total = top + height + bottom
    fig = plt.figure(figsize=(width / DPI, total / DPI), dpi=DPI)
    ax = fig.add_axes((0, bottom / total, 1, height / total))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    return fig, ax


# --- private helpers -----------------------------------------------------------------


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


def _flat(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return [x for v in value for x in _flat(v)]
    return [value]


def num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _values(value: Any, limit: int = 6) -> str:
    flat = _flat(value)
    shown = ", ".join(num(v) for v in flat[:limit])
    return f"[{shown}{', …' if len(flat) > limit else ''}]"


def _shapes(event: dict[str, Any]) -> str:
    shapes = [tuple(s) for s in event["shapes"] or []]
    text = ", ".join(str(s) for s in dict.fromkeys(shapes))
    if len(set(shapes)) == 1 and len(shapes) > 1:
        text = f"{len(shapes)} {_TIMES} {shapes[0]}"
    text = f"shape {text}" if text else "shape unknown"
    return f"{text} {event['dtype']}" if event["dtype"] else text
