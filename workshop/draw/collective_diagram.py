"""The collective diagram: every rank's tensor before and after one collective call,
side by side, coloured by whose data each value is. Drawn from plain trace data (see
:mod:`workshop.draw.comm_diagrams`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from .comm_diagrams import (
    CENTRE,
    PALETTE,
    REDUCED,
    _event,
    _flat,
    _ink,
    _shapes,
    num,
)
from .diagrams import FONT, _pyplot, fitting_size, patch

__all__ = ["draw_collective"]

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
    "all_to_all_single": "piece i of rank j's tensor goes to rank i, as its piece j",
}


def draw_collective(events_for_one_call: Sequence[Any]) -> Figure:
    """Draw every rank's tensor before and after one collective call, side by side.

    Cells are coloured by whose data they hold (a colour per rank); white cells hold
    a reduction (a sum, say) over all ranks. Where values were not recorded (large
    tensors) a box gives the shapes instead.

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
    cell, gap, pitch = 1.0, 0.35, 1.35
    widths = [max(_width(s, cell, gap) for s in side) for side in sides]
    arrow_gap = 2.2
    x_after = widths[0] + arrow_gap
    total = x_after + widths[1]
    pts_per_unit = min((16 - 3) / total, 0.9) * 72
    used: set[str] = set()  # colours drawn, for the legend
    with plt.rc_context(FONT):
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
                        **CENTRE,
                        fontsize=13,
                        color="0.2",
                    )
                    continue
                x = x0
                for g, values in enumerate(side):
                    colour = _provenance(flow, e["rank"], root, g, after=col == 1)
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
                        label = num(v)
                        size = fitting_size(label, cell * pts_per_unit) or 11
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
                **CENTRE,
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
        legend = {PALETTE[r % len(PALETTE)]: f"rank {r}'s data" for r in range(world)}
        legend[REDUCED] = f"{reduce_op} over all ranks"
        handles = [patch(c, text) for c, text in legend.items() if c in used]
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
        return REDUCED
    if after and op == "reduce" and rank == root:
        return REDUCED
    return PALETTE[owner % len(PALETTE)]
