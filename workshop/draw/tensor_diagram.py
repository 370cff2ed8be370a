"""Tensor parallelism of an MLP block, drawn: its two weight matrices cut into per-rank
slices, and where the all-reduce happens forward and backward.

In the maths' view ``Y = GELU(X W1) W2``, W1 is cut by columns and W2 by rows, a
colour per rank; the all-reduces sit at g
(:func:`~workshop.parallel.tensor.reduce_from_ranks`, forward) and f
(:func:`~workshop.parallel.tensor.copy_to_ranks`, backward), labelled with the bytes
a trace recorded when one is given. No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..checks import whole
from ..comm.costmodel import bus_factor
from .comm_diagrams import _TIMES, CENTRE, OP_COLOURS, PALETTE, _event, _ink
from .diagrams import DIAGRAM_FONT, HEIGHT_IN, WIDTH_IN, _pyplot, patch

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["draw_tensor_parallel"]

_REDUCE = OP_COLOURS["all_reduce"]
_REPLICATED = "0.88"  # grey: the same on every rank
_LONG, _SHORT = 3.0, 1.5  # the sides of a matrix in data units (14.6 wide)
_MID = 4.8  # height of the row of boxes
_WIDTH_IN = WIDTH_IN - 0.2  # the drawing's width in inches
_NOTE_TOP = 3.2  # where the notes under f and g begin, below every matrix
_MAX_RANKS = 6  # a colour per rank, none the all-reduce's vermillion


def draw_tensor_parallel(
    world_size: int,
    d_model: int,
    d_hidden: int,
    events: Sequence[Any] | None = None,
    batch: int | None = None,
) -> Figure:
    """Draw an MLP block cut across ``world_size`` ranks, Megatron-style.

    Args:
        world_size: ranks, 1 to 6 (a colour each; the cut looks the same for
            more).
        d_model: the block's input and output features.
        d_hidden: its hidden features, a multiple of ``world_size``.
        events: optional, what ``launch(check_tensor_parallel, ..., trace=True)``
            recorded (``.traces``, or one flat list of events); the lowest rank's
            first two all_reduce calls label the picture with their bytes.
        batch: optional, the input's rows, shown in the shapes when given.

    Returns:
        The matplotlib Figure, whole on a 1280x720 projector (see
        :mod:`workshop.draw.projector`); the legend names each rank's colour.

    Raises:
        ValueError: a size out of range, ``d_hidden`` not divisible by
            ``world_size``, or events that hold no all_reduce.

    Example:
        >>> fig = draw_tensor_parallel(2, 16, 64)
        >>> "rank 1" in [t.get_text() for t in fig.axes[0].texts]
        True
    """
    _check(world_size, d_model, d_hidden, batch)
    traced = _all_reduces(events) if events is not None else None
    plt = _pyplot()
    rows = "batch" if batch is None else str(batch)
    with plt.rc_context(DIAGRAM_FONT):
        # Whole on a 1280x720 projector (workshop.draw.projector).
        fig, ax = plt.subplots(figsize=(WIDTH_IN, HEIGHT_IN), dpi=100)
        fig.subplots_adjust(left=0.005, right=0.995, bottom=0.005, top=0.86)
        ax.set_aspect("equal")
        ax.axis("off")
        _box(ax, 0.1, 1.5, "X", f"{rows} {_TIMES} {d_model}\nsame on\nevery rank")
        _node(ax, 2.3, "f")
        w1 = _matrix(ax, 3.0, d_model, d_hidden, world_size, "columns")
        _box(ax, w1 + 0.3, 1.7, "GELU", "each rank,\nits slice:\nno talking")
        w2 = _matrix(ax, w1 + 2.3, d_hidden, d_model, world_size, "rows")
        _node(ax, w2 + 0.7, "g")
        y_text = f"{rows} {_TIMES} {d_model}\nsum of the\nranks' parts\n+ b2"
        _box(ax, w2 + 1.45, 2.1, "Y", y_text)
        for x0, x1 in ((1.6, 2.0), (2.6, 3.0), (w2 + 0.05, w2 + 0.4)):
            _arrow(ax, x0, x1)
        _arrow(ax, w2 + 1.0, w2 + 1.45)
        _arrow(ax, w1 + 0.02, w1 + 0.3)
        _arrow(ax, w1 + 2.0, w1 + 2.3)
        one = f"{rows} {_TIMES} {d_model} numbers"
        forward, backward = _byte_labels(traced, one, world_size)
        # The notes say what f and g are, under each: where the ranks talk.
        # Each note starts left of its node and runs right.
        g_note = (
            f"g = reduce_from_ranks: forward\nall_reduce of the partial Y\n{forward}"
        )
        f_note = (
            f"f = copy_to_ranks: backward\nall_reduce of the gradient of X\n{backward}"
        )
        _note(ax, w2 + 0.7, g_note, -0.45)
        _note(ax, 2.3, f_note, -2.2)
        # The data units' size on the page: as wide as the drawing needs with g's
        # note (at about 0.62 em a character) inside it; as tall as what is drawn
        # above the matrices and the notes below need at that scale.
        note_in = max(map(len, g_note.splitlines())) * 0.62 * 12 / 72
        right = max(w2 + 3.6, (w2 + 0.25) / (1 - note_in / _WIDTH_IN))
        per_in = right / _WIDTH_IN  # data units per inch
        lines = max(f_note.count("\n"), g_note.count("\n")) + 1
        # (One of W1, W2 has d_hidden rows or more: it stands _LONG tall.)
        top = _MID + _LONG / 2 + 0.1 + 44 / 72 * per_in
        ax.set_xlim(0, right)
        ax.set_ylim(_NOTE_TOP - (lines * 14.5 / 72 + 0.05) * per_in, top)
        ax.set_title(
            f"Tensor parallelism of an MLP on {world_size} ranks: W1 cut by columns, "
            "W2 by rows",
            fontsize=14,
            pad=30,
        )
        handles = [
            patch(PALETTE[r % len(PALETTE)], f"rank {r}") for r in range(world_size)
        ]
        handles.append(patch(_REDUCE, "all_reduce"))
        ax.legend(
            handles=handles,
            loc="lower center",
            bbox_to_anchor=(0.5, 1.0),
            ncols=len(handles),
            frameon=False,
            fontsize=12,
            borderaxespad=0.2,
        )
    plt.close(fig)
    return fig


# --- private helpers -----------------------------------------------------------------


def _check(world_size: int, d_model: int, d_hidden: int, batch: int | None) -> None:
    # One colour per rank; more ranks are cut the same way.
    fix = "e.g. draw_tensor_parallel(4, 16, 64)"
    whole("world_size", world_size, most=_MAX_RANKS, fix=fix)
    whole("d_model", d_model)
    whole("d_hidden", d_hidden)
    if batch is not None:
        whole("batch", batch)
    if d_hidden % world_size:
        raise ValueError(
            f"d_hidden={d_hidden} is not divisible by world_size={world_size}, so the "
            f"slices would differ in size; pass a d_hidden that is a multiple of "
            f"{world_size}, e.g. {d_hidden + world_size - d_hidden % world_size}"
        )


def _all_reduces(events: Sequence[Any]) -> list[dict[str, Any]]:
    """The lowest rank's all_reduce calls in the order made."""
    flat = []
    for item in events:
        is_lane = isinstance(item, (list, tuple))
        flat.extend(_event(e) for e in (item if is_lane else [item]))
    reduces = [e for e in flat if e["op"] == "all_reduce"]
    if not reduces:
        ops = sorted({e["op"] for e in flat}) or "none"
        raise ValueError(
            f"the events hold no all_reduce (ops: {ops}); pass the trace of "
            "launch(check_tensor_parallel, world_size=N, trace=True).traces"
        )
    first = min(e["rank"] for e in reduces)
    mine = [e for e in reduces if e["rank"] == first]
    return sorted(mine, key=lambda e: (e["seq"] is None, e["seq"] or 0))


def _byte_labels(
    traced: list[dict[str, Any]] | None, one: str, world_size: int
) -> tuple[str, str]:
    """What each all-reduce moves: its size, and what a ring sends from each rank."""
    if traced is None:
        return one, one
    labels = []
    for e in traced[:2]:
        shape = f" {_TIMES} ".join(map(str, e["shapes"][0])) if e["shapes"] else "?"
        sent = bus_factor(world_size) * e["nbytes"]
        labels.append(
            f"traced: {e['nbytes']:,} bytes ({shape})\n"
            f"ring: {sent:,.0f} bytes sent per rank"
        )
    labels += ["not in the trace"] * (2 - len(labels))
    return labels[0], labels[1]


def _matrix(
    ax: Axes, x0: float, n_rows: int, n_cols: int, world_size: int, cut: str
) -> float:
    """A ``n_rows x n_cols`` matrix cut into a slice per rank; returns its right edge.

    The longer side is drawn ``_LONG`` long and the other at least ``_SHORT``, so a
    thin matrix still has room for its labels; the sizes are written beside it.
    """
    from matplotlib.patches import Rectangle

    long_side = max(n_rows, n_cols)
    width = max(_SHORT, _LONG * n_cols / long_side)
    height = max(_SHORT, _LONG * n_rows / long_side)
    y0 = _MID - height / 2
    name = "W1" if cut == "columns" else "W2"
    size = 13 if world_size <= 4 else 12
    for r in range(world_size):
        colour = PALETTE[r % len(PALETTE)]
        if cut == "columns":
            w = width / world_size
            xy, w_h, centre = (x0 + r * w, y0), (w, height), (x0 + (r + 0.5) * w, _MID)
            rotation = 90
        else:
            h = height / world_size
            top = y0 + height - (r + 1) * h
            xy, w_h, centre = (x0, top), (width, h), (x0 + width / 2, top + h / 2)
            rotation = 0
        ax.add_patch(Rectangle(xy, *w_h, facecolor=colour, edgecolor="black", lw=1.5))
        ax.text(
            *centre,
            f"rank {r}",
            **CENTRE,
            rotation=rotation,
            fontsize=size,
            color=_ink(colour),
        )
    shape = f"{n_rows} {_TIMES} {n_cols}"
    if cut == "columns":
        slice_ = f"{n_rows} {_TIMES} {n_cols // world_size} each"
    else:
        slice_ = f"{n_rows // world_size} {_TIMES} {n_cols} each"
    # Above the matrix (the notes take the room below): its slices' size, and
    # over that its name and cut, clear of the grey boxes beside it.
    at = (x0 + width / 2, max(y0 + height, _MID + 1.0) + 0.1)
    ax.text(*at, slice_, ha="center", va="bottom", fontsize=12)
    ax.annotate(
        f"{name} ({shape})\ncut by {cut}",
        at,
        xytext=(0, 16),
        textcoords="offset points",
        ha="center",
        va="bottom",
        fontsize=13,
        fontweight="bold",
    )
    return x0 + width


def _box(ax: Axes, x0: float, width: float, name: str, text: str) -> None:
    """A box that is the same on every rank (grey), named in bold."""
    from matplotlib.patches import FancyBboxPatch

    height = 2.2
    ax.add_patch(
        FancyBboxPatch(
            (x0, _MID - height / 2),
            width,
            height,
            boxstyle="round,pad=0,rounding_size=0.12",
            facecolor=_REPLICATED,
            edgecolor="black",
            linewidth=1.5,
        )
    )
    ax.text(x0 + width / 2, _MID + 0.7, name, **CENTRE, fontsize=14, fontweight="bold")
    ax.text(x0 + width / 2, _MID - 0.3, text, **CENTRE, fontsize=12)


def _node(ax: Axes, x: float, name: str) -> None:
    """A circle where the ranks talk: f or g."""
    from matplotlib.patches import Circle

    ax.add_patch(Circle((x, _MID), 0.3, facecolor=_REDUCE, edgecolor="black", lw=1.5))
    ax.text(x, _MID, name, **CENTRE, fontsize=16, fontweight="bold", color="white")


def _arrow(ax: Axes, x0: float, x1: float) -> None:
    ax.annotate(
        "",
        xy=(x1, _MID),
        xytext=(x0, _MID),
        arrowprops={"arrowstyle": "-|>", "color": "0.3", "lw": 1.8},
    )


def _note(ax: Axes, x: float, text: str, left: float | None = None) -> None:
    """A label under an all-reduce node, joined to it by a line: centred under it,
    or starting ``left`` from it and running right."""
    top = _NOTE_TOP
    ax.plot([x, x], [top + 0.05, _MID - 0.3], color=_REDUCE, lw=1.5)
    ax.text(
        x if left is None else x + left,
        top,
        text,
        ha="center" if left is None else "left",
        va="top",
        fontsize=12,
        color=_REDUCE,
        fontweight="bold",
    )
