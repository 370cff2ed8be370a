"""The collective diagram: every rank's tensor before and after one collective call,
side by side in a row per rank, coloured by whose data each value is. Drawn from
plain trace data (see :mod:`workshop.draw.comm_diagrams`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from .comm_diagrams import (
    CENTRE,
    DPI,
    LABEL_PT,
    PALETTE,
    REDUCED,
    _event,
    _flat,
    _ink,
    _shapes,
    bottom_legend,
    canvas,
    num,
    text_px,
)
from .diagrams import _pyplot, patch

__all__ = ["draw_collective"]

_LIST_IN = {"scatter", "reduce_scatter", "all_to_all"}  # input: a tensor per rank
_LIST_OUT = {"gather", "all_gather", "all_to_all"}  # output: a tensor per rank
_MAX_CELLS = 16  # more values than this on one side: show the shape instead
# Sizes in pixels of the inline backend's PNG: the projector's area is 1100 x 456 px,
# less the 10 px the tight bounding box pads each side with.
_MAX_W, _MAX_H = 1075, 434
_TITLE_PT, _TEXT_PT = 13, 12  # 18 and 17 px
_TITLE_H, _HEAD_H = 52, 26  # the two-line title; "before" and "after"
_PITCH_MIN, _PITCH_MAX = 36, 60  # a rank's row, its cells 10 px less
_CELL_MIN_W, _GAP, _ARROW_W = 46, 8, 64
_MEANING = {
    "broadcast": "the root's tensor is copied to every rank",
    "scatter": "the root's list is dealt out: tensor i goes to rank i",
    "gather": "every rank's tensor is collected in a list on the root",
    "reduce": "the root gets the {op} of every rank's tensor",
    "all_reduce": "every rank gets the {op} of every rank's tensor",
    "all_gather": "every rank gets a list of every rank's tensor",
    "reduce_scatter": "rank i gets the {op} of every rank's tensor i",
    "all_to_all": "rank j's tensor i goes to rank i, as its tensor j",
    "all_to_all_single": "piece i of rank j's tensor goes to rank i, as its piece j",
}


def draw_collective(events_for_one_call: Sequence[Any]) -> Figure:
    """Draw every rank's tensor before and after one collective call, a row per rank,
    cells coloured by whose data they hold (white: a reduction over all ranks), or
    the shapes where values were not recorded. Fits a projector up to 8 ranks.

    Args:
        events_for_one_call: the same call's event on each rank, index = rank:
            broadcast, scatter, gather, all_gather, reduce, all_reduce,
            reduce_scatter, all_to_all or all_to_all_single with equal pieces
            (others are drawn without provenance).

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
    if op == "all_to_all_single" and _cut_in_pieces(sides, world):
        # Equal pieces, one per rank: the same exchange as all_to_all's lists.
        sides = [[_pieces(s, world) for s in side] for side in sides]
        flow = "all_to_all"
    else:
        flow = op
    labels = [
        f"rank {e['rank']}" + (" (root)" if e["rank"] == root else "") for e in events
    ]
    label_w = max(text_px(t, _TEXT_PT)[0] for t in labels) + 12
    cell_w = max(
        [_CELL_MIN_W]
        + [
            text_px(num(v), _TEXT_PT)[0] + 20
            for side in sides
            for s in side
            if not isinstance(s, str)
            for g in s
            for v in g
        ]
    )
    widths = [max(_width(s, cell_w) for s in side) for side in sides]
    while label_w + sum(widths) + _ARROW_W > _MAX_W:
        # Too wide for the screen: the rank with most cells shows its shape instead.
        col, row = max(
            ((c, r) for c in (0, 1) for r in range(len(events))),
            key=lambda cr: _cells_in(sides[cr[0]][cr[1]]),
        )
        if not _cells_in(sides[col][row]):
            break
        sides[col][row] = _summary(events[row], sides[col][row])
        widths = [max(_width(s, cell_w) for s in side) for side in sides]
    x_after = label_w + widths[0] + _ARROW_W
    width = x_after + widths[1]
    owners = {  # whose data is drawn, for the legend
        _owner(flow, e["rank"], root, g, after=col == 1)
        for col in (0, 1)
        for e, side in zip(events, sides[col], strict=True)
        if not isinstance(side, str)
        for g in range(len(side))
    }
    ranks_of: dict[str, list[int]] = {}  # a colour's ranks (the palette cycles)
    for r in sorted(o for o in owners if o is not None):
        ranks_of.setdefault(_colour(r), []).append(r)
    handles = [patch(c, _whose(ranks)) for c, ranks in ranks_of.items()]
    if None in owners:
        handles.append(patch(REDUCED, f"{reduce_op} over all ranks"))
    # A legend entry: its patch (2 em), a gap (0.8 em), its text, 2 em to the next.
    em = _TEXT_PT * DPI / 72
    entry_w = max(
        [text_px(h.get_label(), _TEXT_PT)[0] + 4.8 * em for h in handles], default=0
    )
    # The legend goes right of the rows where it fits, or under them in columns.
    beside = bool(handles) and width + entry_w <= _MAX_W
    across = max(1, min(len(handles), int(width // max(entry_w, 1))))
    bottom = -(-len(handles) // across) * 27 + 6 if handles and not beside else 0
    # Rows share what the screen leaves, down to a legible height.
    room = _MAX_H - _TITLE_H - _HEAD_H - bottom
    pitch = min(_PITCH_MAX, max(_PITCH_MIN, room / len(events)))
    cell_h = pitch - 10
    rows_h = _HEAD_H + pitch * len(events)
    fig, ax = canvas(width + entry_w * beside, rows_h, _TITLE_H, bottom)
    for row, e in enumerate(events):
        y = _HEAD_H + (row + 0.5) * pitch
        ax.text(
            label_w - 12, y, labels[row], ha="right", va="center", fontsize=_TEXT_PT
        )
        for col, x0 in ((0, label_w), (1, x_after)):
            side = sides[col][row]
            if isinstance(side, str):  # no values: a box with what is known
                one_line = side.replace("\n", "  ")
                if text_px(one_line, LABEL_PT)[0] + 24 <= widths[col]:
                    side = one_line
                box = ((x0, y - cell_h / 2), widths[col], cell_h)
                rounded = "round,pad=0,rounding_size=4"
                style = {"facecolor": "0.95", "edgecolor": "0.5", "boxstyle": rounded}
                ax.add_patch(FancyBboxPatch(*box, **style))
                style = {"fontsize": LABEL_PT, "color": "0.2", "linespacing": 1.0}
                ax.text(x0 + widths[col] / 2, y, side, **CENTRE, **style)
                continue
            x = x0
            for g, values in enumerate(side):
                colour = _colour(_owner(flow, e["rank"], root, g, after=col == 1))
                edge = {"edgecolor": "black", "linewidth": 1.2}
                for v in values:
                    cell = ((x, y - cell_h / 2), cell_w, cell_h)
                    ax.add_patch(Rectangle(*cell, facecolor=colour, **edge))
                    style = {"fontsize": _TEXT_PT, "color": _ink(colour)}
                    ax.text(x + cell_w / 2, y, num(v), **CENTRE, **style)
                    x += cell_w
                x += _GAP
        arrow_x = label_w + widths[0] + _ARROW_W / 2
        ax.text(arrow_x, y, "→", **CENTRE, fontsize=20, color="0.35")
    for x, head in (
        (label_w + widths[0] / 2, "before"),
        (x_after + widths[1] / 2, "after"),
    ):
        ax.text(x, _HEAD_H / 2, head, **CENTRE, fontsize=12, fontweight="bold")
    name = f"{op} ({reduce_op})" if "reduce" in op else op
    if root is not None:
        where = "to" if op in {"gather", "reduce"} else "from"
        name += f" {where} root {root}"
    meaning = _MEANING.get(op, "").format(op=reduce_op)
    ax.set_title(
        f"{name} on {world} ranks" + (f"\n{meaning}" if meaning else ""),
        fontsize=_TITLE_PT,
        pad=6,
    )
    if beside:  # centred on the rows, not on the heading above them
        middle = rows_h - _HEAD_H - pitch * len(events) / 2
        fig.legend(
            handles=handles,
            loc="center left",
            bbox_to_anchor=(width / (width + entry_w), middle / (_TITLE_H + rows_h)),
            frameon=False,
            fontsize=_TEXT_PT,
            borderaxespad=0,
        )
    elif handles:
        bottom_legend(fig, handles, across, _TEXT_PT)
    plt.close(fig)
    return fig


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
        return _summary(event, groups)
    return groups


def _cut_in_pieces(sides: list[list[Any]], world: int) -> bool:
    """True when every side is one recorded tensor that ``world`` divides evenly."""
    return all(
        not isinstance(side, str) and len(side) == 1 and len(side[0]) % world == 0
        for row in sides
        for side in row
    )


def _pieces(side: list[list[Any]], world: int) -> list[list[Any]]:
    values = side[0]
    size = len(values) // world
    return [values[i * size : (i + 1) * size] for i in range(world)]


def _width(side: list[list[Any]] | str, cell_w: float) -> float:
    """A side's width in pixels: its cells and the gaps between its tensors."""
    if isinstance(side, str):
        return text_px(side, LABEL_PT)[0] + 24
    return sum(len(g) for g in side) * cell_w + (len(side) - 1) * _GAP


def _cells_in(side: list[list[Any]] | str) -> int:
    return 0 if isinstance(side, str) else sum(len(g) for g in side)


def _summary(event: dict[str, Any], side: list[list[Any]]) -> str:
    return f"{_cells_in(side)} values\n{_shapes(event)}"


def _owner(op: str, rank: int, root: Any, group: int, after: bool) -> int | None:
    """Whose data a cell holds: a rank, or None for a reduction over all ranks."""
    owner = rank
    if after and op in {"broadcast", "scatter"} and root is not None:
        owner = root
    elif after and op in _LIST_OUT:
        owner = group
    elif after and op in {"all_reduce", "reduce_scatter"}:
        return None
    if after and op == "reduce" and rank == root:
        return None
    return owner


def _whose(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}'s data"
    return f"ranks {', '.join(map(str, ranks))}'s data"


def _colour(owner: int | None) -> str:
    return REDUCED if owner is None else PALETTE[owner % len(PALETTE)]
