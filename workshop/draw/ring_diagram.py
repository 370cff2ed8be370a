"""The ring all-reduce drawn from its steps (:mod:`workshop.comm.ring`): one step at a
time, as a grid of all steps, or behind an ipywidgets slider.

With N ranks, each holding a vector cut into N chunks, the ring takes 2(N-1) steps:
N-1 of reduce-scatter (each rank passes one chunk to the next, which adds it to its
own) and N-1 of all-gather (the finished chunks travel round). Every rank sends
2(N-1)/N of the data in all, whatever N is: why the ring suits bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..comm.ring import RingStep, ring_allreduce_steps  # noqa: F401  (the doctests')
from .comm_diagrams import CENTRE, PALETTE, _ink, num
from .diagrams import FONT, _pyplot, patch

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["draw_ring_grid", "draw_ring_step", "ring_widget"]


def draw_ring_step(steps: Sequence[RingStep], k: int) -> Figure:
    """Draw step ``k`` of a ring all-reduce: ranks in a circle, chunks as strips.

    Each arrow goes from a rank to the next and names the chunk it carries; each
    rank's strip shows its chunks after the step (a colour per chunk), the one it
    just received framed, fully reduced chunks in bold.

    Args:
        steps: what :func:`ring_allreduce_steps` returned.
        k: which step, 0 to ``len(steps) - 1``.

    Returns:
        The matplotlib Figure.

    Raises:
        ValueError: ``k`` out of range.

    Example:
        >>> steps = ring_allreduce_steps([[1, 2], [10, 20]])
        >>> draw_ring_step(steps, 1).axes[0].get_title().splitlines()[0]
        'step 2 of 2: all-gather 1 of 1'
    """
    if not 0 <= k < len(steps):
        raise ValueError(
            f"step k={k} is not one of the {len(steps)} steps; pass 0 to "
            f"{len(steps) - 1}"
        )
    plt = _pyplot()
    with plt.rc_context(FONT):
        x_reach, y_low, y_high = _ring_size(steps[k])[2]
        inch = min(0.8, 13 / (2 * x_reach))  # inches per data unit
        fig, ax = plt.subplots(
            figsize=(max(2 * x_reach * inch + 1, 9), (y_high - y_low) * inch + 3),
            layout="constrained",
        )
        _ring_on(ax, steps, k, scale=1.0)
        fig.suptitle(
            f"Ring all-reduce of {len(steps[k].after)} ranks (bold: summed over all)",
            fontsize=20,
        )
        _chunk_legend(fig, len(steps[k].after))
    plt.close(fig)
    return fig


def draw_ring_grid(steps: Sequence[RingStep]) -> Figure:
    """Draw all 2(N-1) steps of a ring all-reduce in a grid, for where there are no
    widgets: reduce-scatter steps in the top row, all-gather steps below.

    Args:
        steps: what :func:`ring_allreduce_steps` returned.

    Returns:
        The matplotlib Figure, one axes per step.

    Example:
        >>> len(draw_ring_grid(ring_allreduce_steps([[1, 2], [3, 4]])).axes)
        2
    """
    plt = _pyplot()
    cols = max(1, len(steps) // 2)
    n = len(steps[0].after)
    with plt.rc_context(FONT):
        panel = 5.2 + 0.4 * n
        fig, axes = plt.subplots(
            2,
            cols,
            figsize=(panel * cols, 2 * panel + 0.8),
            layout="constrained",
            squeeze=False,
        )
        for k, ax in enumerate(axes.flat):
            _ring_on(ax, steps, k, scale=0.8)
        fig.suptitle(
            f"Ring all-reduce of {n} ranks: reduce-scatter (top), then all-gather "
            "(bold: summed over all ranks)",
            fontsize=20,
        )
        _chunk_legend(fig, n)
    plt.close(fig)
    return fig


def ring_widget(steps: Sequence[RingStep]) -> Any:
    """An interactive view of a ring all-reduce: a slider (and play button) per step.

    Falls back to :func:`draw_ring_grid` where ipywidgets cannot be imported.

    Args:
        steps: what :func:`ring_allreduce_steps` returned.

    Returns:
        An ipywidgets ``VBox`` (controls above an ``Output`` showing
        :func:`draw_ring_step`), or the grid's Figure without ipywidgets.

    Example:
        >>> steps = ring_allreduce_steps([[r] * 4 for r in range(4)])
        >>> ring_widget(steps)  # doctest: +SKIP
    """
    try:
        import ipywidgets as widgets
        from IPython.display import Image, display
    except ImportError:
        return draw_ring_grid(steps)
    cache: dict[int, bytes] = {}
    out = widgets.Output()
    slider = widgets.IntSlider(
        value=0,
        min=0,
        max=len(steps) - 1,
        description="step",
        continuous_update=False,
    )
    play = widgets.Play(value=0, min=0, max=len(steps) - 1, interval=1500)
    widgets.jslink((play, "value"), (slider, "value"))

    def show(change: Any = None) -> None:
        k = slider.value
        if k not in cache:  # a PNG shows with or without an inline backend
            cache[k] = _png(draw_ring_step(steps, k))
        out.clear_output(wait=True)
        with out:
            display(Image(cache[k]))

    slider.observe(show, names="value")
    show()
    return widgets.VBox([widgets.HBox([play, slider]), out])


def _ring_on(ax: Axes, steps: Sequence[RingStep], k: int, scale: float) -> None:
    """Draw step k of the ring into ax; scale shrinks the type for a grid."""
    from matplotlib.patches import FancyArrowPatch, Rectangle

    step = steps[k]
    n = len(step.after)
    cell = 0.9
    width, radius, (x_reach, y_low, y_high) = _ring_size(step)
    boxes = []
    for r in range(n):
        angle = math.pi / 2 - 2 * math.pi * r / n
        cx, cy = radius * math.cos(angle), radius * math.sin(angle)
        x = cx - width / 2
        ax.text(
            cx,
            cy + 0.75,
            f"rank {r}",
            **CENTRE,
            fontsize=17 * scale,
            fontweight="bold",
        )
        box = Rectangle((x - 0.1, cy - 0.5), width + 0.2, 1.6, visible=False)
        ax.add_patch(box)
        boxes.append(box)
        received = step.sends[(r - 1) % n]
        for c, values in enumerate(step.after[r]):
            colour = PALETTE[c % len(PALETTE)]
            start = x
            for v in values:
                ax.add_patch(
                    Rectangle(
                        (x, cy - 0.4),
                        cell,
                        0.8,
                        facecolor=colour,
                        edgecolor="black",
                        linewidth=0.8,
                    )
                )
                done = step.counts[r][c] == n
                ax.text(
                    x + cell / 2,
                    cy,
                    num(v),
                    **CENTRE,
                    fontsize=15 * scale,
                    color=_ink(colour),
                    fontweight="bold" if done else "normal",
                )
                x += cell
            if c == received:
                ax.add_patch(
                    Rectangle(
                        (start, cy - 0.4),
                        x - start,
                        0.8,
                        fill=False,
                        edgecolor="black",
                        linewidth=4,
                    )
                )
            x += 0.15
    for r in range(n):
        dst = (r + 1) % n
        (x1, y1), (x2, y2) = (b.get_center() for b in (boxes[r], boxes[dst]))
        rad = -0.35
        ax.add_patch(
            FancyArrowPatch(
                (x1, y1),
                (x2, y2),
                patchA=boxes[r],
                patchB=boxes[dst],
                connectionstyle=f"arc3,rad={rad}",
                arrowstyle="-|>",
                mutation_scale=26 * scale,
                linewidth=2.5,
                color="0.25",
            )
        )
        mx = (x1 + x2) / 2 + 0.5 * rad * (y2 - y1)
        my = (y1 + y2) / 2 - 0.5 * rad * (x2 - x1)
        chunk = step.sends[r]
        ax.text(
            mx,
            my,
            f"chunk {chunk}",
            **CENTRE,
            fontsize=14 * scale,
            bbox=dict(
                boxstyle="round,pad=0.25",
                facecolor=PALETTE[chunk % len(PALETTE)],
                edgecolor="black",
            ),
            color=_ink(PALETTE[chunk % len(PALETTE)]),
        )
    ax.set_xlim(-x_reach, x_reach)
    ax.set_ylim(y_low, y_high)
    ax.set_aspect("equal")
    ax.axis("off")
    half = len(steps) // 2
    within = k + 1 if k < half else k + 1 - half
    verb = "adds" if step.phase == "reduce-scatter" else "copies"
    ax.set_title(
        f"step {k + 1} of {len(steps)}: {step.phase} {within} of {half}\n"
        f"each rank {verb} what it receives",
        fontsize=18 * scale,
    )


def _ring_size(step: RingStep) -> tuple[float, float, tuple[float, float, float]]:
    """A ring's strip width, radius and (x reach, y bottom, y top) in data units."""
    n = len(step.after)
    width = sum(len(c) for c in step.after[0]) * 0.9 + (n - 1) * 0.15
    radius = max(2.6, 0.75 * width + 0.9) if n > 2 else width / 2 + 1.5
    x_reach = max((radius if n > 2 else 0) + width / 2, 0.35 * radius + 1.2) + 0.3
    low = -radius - 0.8
    if n % 2:  # no rank at the bottom: the arc between the lowest two is lowest
        low = -radius * (math.cos(math.pi / n) + 0.35 * math.sin(math.pi / n)) - 0.6
    return width, radius, (x_reach, low, radius + 1.3)


def _chunk_legend(fig: Figure, n: int) -> None:
    from matplotlib.patches import Patch

    handles = [patch(PALETTE[c % len(PALETTE)], f"chunk {c}") for c in range(n)]
    handles.append(
        Patch(facecolor="white", edgecolor="black", linewidth=3, label="just received")
    )
    across = max(1, int(fig.get_figwidth() // 2.1))
    fig.legend(
        handles=handles,
        loc="outside lower center",
        frameon=False,
        ncols=min(n + 1, across),
    )


def _png(fig: Figure) -> bytes:
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    return buffer.getvalue()
