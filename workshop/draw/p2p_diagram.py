"""The point-to-point diagram: an arrow per message between ranks, numbered in the
order sent, labelled with what was sent. Drawn from plain trace data (see
:mod:`workshop.draw.comm_diagrams`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from .comm_diagrams import (
    CENTRE,
    EDGE,
    PALETTE,
    RECVS,
    SENDS,
    _event,
    _ink,
    _shapes,
    _values,
)
from .diagrams import DIAGRAM_FONT, _count, _pyplot

__all__ = ["draw_point_to_point"]


def draw_point_to_point(events_by_rank: Sequence[Sequence[Any]]) -> Figure:
    """Draw an arrow from sender to receiver for every message, numbered in order
    (sends matched with receives as the library matches them), labelled with the
    values sent or their shape; dashed arrows were sent with isend.

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
    # Inches per data unit: 4 ranks span the projector's 1,100 px (and 8 still
    # fit it, smaller); the two-line title and the legend take about 1.5 in.
    inch = min(0.7, 10 / (world * step), 2.75 / (top - bottom))
    # "rank r" in bold is about 4 em wide: as large as its circle holds.
    name_pt = max(9.5, min(15, 2 * radius * inch * 72 * 0.95 / 4.0))
    with plt.rc_context(DIAGRAM_FONT):
        fig, ax = plt.subplots(
            figsize=(max(world * step * inch + 0.4, 7.4), (top - bottom) * inch + 1.5),
            layout="constrained",
        )
        circles = []
        for r in range(world):
            colour = PALETTE[r % len(PALETTE)]
            circle = Circle((r * step, 0), radius, facecolor=colour, **EDGE, zorder=3)
            ax.add_patch(circle)
            circles.append(circle)
            style = {"fontsize": name_pt, "fontweight": "bold", "color": _ink(colour)}
            ax.text(r * step, 0, f"rank {r}", **CENTRE, **style, zorder=4)
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
            dashed = {"color": "black", "linewidth": 2.5, "linestyle": "--"}
            handles.append(
                Line2D([], [], **dashed, label="isend / irecv (non-blocking)")
            )
        fig.legend(handles=handles, loc="outside lower center", ncols=2, frameon=False)
    plt.close(fig)
    return fig


def _messages(events_by_rank: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """Sends matched to receives, per (sender, receiver) pair in order made."""
    events = [_event(e) for lane in events_by_rank for e in lane]
    events.sort(key=lambda e: (e["start"] or 0.0, e["seq"] or 0, e["rank"]))
    waiting: dict[tuple[Any, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["op"] in RECVS:
            waiting[e["peer"], e["rank"]].append(e)
    messages = []
    for e in events:
        if e["op"] not in SENDS:
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
