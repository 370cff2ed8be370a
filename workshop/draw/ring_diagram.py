"""The ring all-reduce drawn from its steps (:mod:`workshop.comm.ring`): one step at a
time, or all steps side by side, or behind an ipywidgets slider (:func:`ring_widget`).

Every picture fits a projector (:mod:`workshop.draw.projector`) for 2 to 4 ranks; a
step stays under 400 px tall so that the widget's slider fits on screen with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..comm.ring import RingStep, ring_all_reduce_steps  # noqa: F401  (the doctests')
from .comm_diagrams import (
    CENTRE,
    DPI,
    PALETTE,
    _ink,
    bottom_legend,
    canvas,
    num,
    text_px,
)
from .diagrams import _pyplot, patch

__all__ = ["RingWidget", "draw_ring_grid", "draw_ring_step", "ring_widget"]

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


# Sizes in pixels of the inline backend's PNG (see workshop.draw.projector).
_MAX_W = 1075  # the projector's 1100 px, less the tight bounding box's padding
_STEP_H = 380  # a step, so that it and the widget's slider fit 456 px
_TITLE_PT, _TEXT_PT, _SMALL_PT = 13, 11, 10  # 18, 15 and 14 px
_PHASES = ("both", "reduce-scatter", "all-gather")
_BOLD = "summed over all ranks"


def draw_ring_step(steps: Sequence[RingStep], k: int) -> Figure:
    """Draw step ``k`` of a ring all-reduce: ranks in a ring, each with its chunks
    after the step (the one just received framed, fully reduced ones bold), and an
    arrow to the next rank naming the chunk it carries. Fits the projector up to 6.

    Args:
        steps: what :func:`ring_all_reduce_steps` returned.
        k: which step, 0 to ``len(steps) - 1`` (the title counts from 1).

    Returns:
        The matplotlib Figure.

    Raises:
        ValueError: ``k`` out of range.

    Example:
        >>> steps = ring_all_reduce_steps([[1, 2], [10, 20]])
        >>> draw_ring_step(steps, 1).axes[0].get_title().splitlines()[0]
        'step 2 of 2: all-gather 1 of 1'
    """
    if not 0 <= k < len(steps):
        raise ValueError(
            f"step k={k} is not one of the {len(steps)} steps; pass 0 to "
            f"{len(steps) - 1}"
        )
    plt = _pyplot()
    from matplotlib.patches import FancyArrowPatch, Rectangle

    step = steps[k]
    n = len(step.after)
    cell_w, cell_h = _cell_width(steps, _TEXT_PT, 30), 28
    strip = sum(len(c) for c in step.after[0]) * cell_w + (n - 1) * 4
    unit_h = 48  # "rank r" over its strip
    rad = -0.5 if n == 2 else -0.3  # how far each arc bends out
    centres, mids, (left, top, right, low) = _ring_layout(n, strip, unit_h, rad)
    # As wide as the title and the legend's one row, where the screen allows.
    title_w = text_px(f"each rank adds what it receives; bold: {_BOLD}", _TITLE_PT)[0]
    wide = min(_MAX_W, max(right - left, _legend_rows(n, 1e9)[2], title_w))
    left, right = left - (wide - right + left) / 2, left + (wide + right - left) / 2
    across, bottom, _ = _legend_rows(n, right - left)
    fig, ax = canvas(right - left, low - top, 52, bottom)
    ax.set_xlim(left, right)
    ax.set_ylim(low, top)
    boxes = []
    for r, (cx, cy) in enumerate(centres):
        ax.text(cx, cy - 13, f"rank {r}", **CENTRE, fontsize=_TEXT_PT, weight="bold")
        box = Rectangle((cx - strip / 2 - 4, cy - 26), strip + 8, 54, visible=False)
        ax.add_patch(box)
        boxes.append(box)
        x = cx - strip / 2
        received = step.sends[(r - 1) % n]
        for c, values in enumerate(step.after[r]):
            colour = PALETTE[c % len(PALETTE)]
            start = x
            weight = "bold" if step.counts[r][c] == n else "normal"
            for v in values:
                cell = ((x, cy + 2), cell_w, cell_h)
                ax.add_patch(Rectangle(*cell, facecolor=colour, ec="black", lw=0.8))
                at = (x + cell_w / 2, cy + 2 + cell_h / 2)
                style = {"fontsize": _TEXT_PT, "color": _ink(colour), "weight": weight}
                ax.text(*at, num(v), **CENTRE, **style)
                x += cell_w
            if c == received:
                ax.add_patch(
                    Rectangle(
                        (start, cy + 2), x - start, cell_h, fill=False, linewidth=3.5
                    )
                )
            x += 4
    for r in range(n):
        dst = (r + 1) % n
        (x1, y1), (x2, y2) = centres[r], centres[dst]
        ax.add_patch(
            FancyArrowPatch(
                (x1, y1),
                (x2, y2),
                patchA=boxes[r],
                patchB=boxes[dst],
                connectionstyle=f"arc3,rad={rad}",
                arrowstyle="-|>",
                mutation_scale=20,
                linewidth=2,
                color="0.25",
            )
        )
        mx, my = mids[r]
        chunk = step.sends[r]
        colour = PALETTE[chunk % len(PALETTE)]
        ax.text(
            mx,
            my,
            f"chunk {chunk}",
            **CENTRE,
            fontsize=_SMALL_PT,
            color=_ink(colour),
            bbox=dict(boxstyle="round,pad=0.25", facecolor=colour, edgecolor="black"),
        )
    ax.set_title(
        f"{_step_name(steps, k)}\neach rank {_verb(step)} what it receives; "
        f"bold: {_BOLD}",
        fontsize=_TITLE_PT,
        pad=6,
    )
    _chunk_legend(fig, n, across)
    plt.close(fig)
    return fig


def draw_ring_grid(steps: Sequence[RingStep], phase: str = "both") -> Figure:
    """Draw the steps of a ring all-reduce side by side, for where there are no
    widgets: after each step, a table of every rank's chunks (ranks as rows), with
    arrows down the columns as in :func:`draw_ring_step`.

    Args:
        steps: what :func:`ring_all_reduce_steps` returned.
        phase: ``"both"`` (every step: fits the projector up to 4 ranks),
            ``"reduce-scatter"`` or ``"all-gather"`` (one phase's N-1 steps: up to
            6 ranks).

    Returns:
        The matplotlib Figure (one axes).

    Raises:
        ValueError: no steps, or an unknown ``phase``.

    Example:
        >>> fig = draw_ring_grid(ring_all_reduce_steps([[1, 2], [3, 4]]))
        >>> [t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("step")]
        ['step 1', 'step 2']
    """
    if phase not in _PHASES:
        raise ValueError(
            f"phase={phase!r} is not one of {', '.join(map(repr, _PHASES))}; "
            'e.g. draw_ring_grid(steps, phase="reduce-scatter")'
        )
    if not steps:
        raise ValueError(
            "steps is empty; pass what ring_all_reduce_steps returned, e.g. "
            "draw_ring_grid(ring_all_reduce_steps([[1, 2], [3, 4]]))"
        )
    plt = _pyplot()
    from matplotlib.patches import Rectangle

    n = len(steps[0].after)
    shown = [k for k, s in enumerate(steps) if phase in ("both", s.phase)]
    cell_w, cell_h, pitch = _cell_width(steps, _TEXT_PT, 36), 24, 38
    table_w = sum(len(c) for c in steps[0].after[0]) * cell_w
    label_w, gap = text_px(f"rank {n - 1}", _TEXT_PT)[0] + 10, 22
    # A slot per step: its table, or more, so that a phase's name fits over its steps.
    heading = max(text_px(_heading(s), _TEXT_PT, bold=True)[0] for s in steps)
    slot = max(table_w + gap, (heading + gap) / (n - 1))
    # All the steps in one row where they fit; else a row per phase, else wrap.
    per_row = len(shown)
    if label_w + per_row * slot > _MAX_W:
        per_row = n - 1 if phase == "both" else per_row
    while per_row > 1 and label_w + per_row * slot > _MAX_W:
        per_row -= 1
    rows = math.ceil(len(shown) / per_row)
    head = 24 + 20 + 14  # the phase over its steps, "step k", the incoming arrow
    table_h = head + n * pitch + 4
    title = (
        f"Ring all-reduce of {n} ranks, step by step: arrows carry a chunk to the "
        "next rank\n(the last rank's comes round to rank 0); bold: summed over all "
        "ranks"
    )
    content = label_w + per_row * slot
    width = min(
        _MAX_W, max(content, text_px(title, _TEXT_PT)[0], _legend_rows(n, 1e9)[2])
    )
    left = max(0, (width - content) / 2) + label_w  # the first slot's left
    across, bottom, _ = _legend_rows(n, width)
    fig, ax = canvas(width, rows * table_h, 30, bottom)
    for i, k in enumerate(shown):
        row, col = divmod(i, per_row)
        x_slot, y0 = left + col * slot, row * table_h + head
        x0 = x_slot + (slot - gap - table_w) / 2
        step = steps[k]
        if col == 0:
            for r in range(n):
                y = y0 + r * pitch + cell_h / 2
                ax.text(
                    x0 - 8, y, f"rank {r}", ha="right", va="center", fontsize=_TEXT_PT
                )
        if col == 0 or steps[shown[i - 1]].phase != step.phase:
            run = [
                j for j in shown[i : i + per_row - col] if steps[j].phase == step.phase
            ]
            span = len(run) * slot - gap
            at = (x_slot + span / 2, y0 - 46)
            ax.text(*at, _heading(step), **CENTRE, fontsize=_TEXT_PT, weight="bold")
            ax.plot([x_slot, x_slot + span], [y0 - 34, y0 - 34], color="0.3", lw=1.5)
        ax.text(x0 + table_w / 2, y0 - 22, f"step {k + 1}", **CENTRE, fontsize=_TEXT_PT)
        for r in range(n):
            x, y = x0, y0 + r * pitch
            received = step.sends[(r - 1) % n]
            for c, values in enumerate(step.after[r]):
                colour = PALETTE[c % len(PALETTE)]
                w = len(values) * cell_w
                ax.add_patch(
                    Rectangle((x, y), w, cell_h, facecolor=colour, ec="black", lw=0.8)
                )
                weight = "bold" if step.counts[r][c] == n else "normal"
                style = {"fontsize": _TEXT_PT, "color": _ink(colour), "weight": weight}
                text = " ".join(num(v) for v in values)
                ax.text(x + w / 2, y + cell_h / 2, text, **CENTRE, **style)
                if c == received:
                    ax.add_patch(Rectangle((x, y), w, cell_h, fill=False, lw=3))
                x += w
        for r, c in enumerate(step.sends):  # rank r sends chunk c to rank r + 1
            x = x0 + _chunk_x(steps[0].after[0], c, cell_w)
            y_from = y0 + r * pitch + cell_h - 2  # from under the value sent
            if r < n - 1:
                _down(ax, x, y_from, y0 + (r + 1) * pitch + 1)
            else:  # round the ring: out at the bottom, in again at the top
                _down(ax, x, y_from, y_from + 16)
                _down(ax, x, y0 - 15, y0 + 1)
    ax.set_title(title, fontsize=_TEXT_PT, pad=4)
    _chunk_legend(fig, n, across)
    plt.close(fig)
    return fig


def _step_name(steps: Sequence[RingStep], k: int) -> str:
    half = len(steps) // 2
    within = k + 1 if k < half else k + 1 - half
    return f"step {k + 1} of {len(steps)}: {steps[k].phase} {within} of {half}"


def _heading(step: RingStep) -> str:
    return f"{step.phase}: each rank {_verb(step)}"


def _verb(step: RingStep) -> str:
    return "adds" if step.phase == "reduce-scatter" else "copies"


def _cell_width(steps: Sequence[RingStep], size: float, least: float) -> float:
    """A cell wide enough for every value any step shows."""
    values = {num(v) for s in steps for chunks in s.after for c in chunks for v in c}
    return max([least] + [text_px(v, size)[0] + 14 for v in values])


def _chunk_x(chunks: list[list[float]], c: int, cell_w: float) -> float:
    """The middle of chunk c in a row of cells."""
    start = sum(len(chunk) for chunk in chunks[:c]) * cell_w
    return start + len(chunks[c]) * cell_w / 2


def _down(ax: Axes, x: float, y_from: float, y_to: float) -> None:
    """A short arrow down a column, white-edged so it shows on any colour."""
    from matplotlib import patheffects
    from matplotlib.patches import FancyArrowPatch

    arrow = FancyArrowPatch(
        (x, y_from),
        (x, y_to),
        arrowstyle="-|>",
        mutation_scale=14,
        lw=2,
        color="black",
        zorder=5,
        shrinkA=0,
        shrinkB=0,
    )
    arrow.set_path_effects([patheffects.withStroke(linewidth=4, foreground="white")])
    ax.add_patch(arrow)


def _on_ring(r: int, n: int, rx: float, ry: float) -> tuple[float, float]:
    """Rank r's place: rank 0 at the top, then clockwise (two ranks: side by side)."""
    angle = math.pi * (1 - r) if n == 2 else math.pi / 2 - 2 * math.pi * r / n
    return rx * math.cos(angle), -ry * math.sin(angle)


def _ring_layout(n: int, strip: float, unit_h: float, rad: float) -> tuple:
    """Rank strips' and arc labels' places and their bounds (pixels, y down), on an
    ellipse as flat as keeps a step under 400 px and as wide as keeps ranks apart."""
    label_w, label_h = text_px("chunk 00", _SMALL_PT)[0] + 12, 26
    best: tuple = ()
    for ry in range(300, 40, -5):  # the roundest ring that fits, else the least over
        rx = strip / 2 + 110.0 if n == 2 else strip + 120.0
        while rx < 2000 and n > 2:  # no two ranks' strips on top of each other
            places = [_on_ring(r, n, rx, ry) for r in range(n)]
            if all(
                abs(a[0] - b[0]) >= strip + 40 or abs(a[1] - b[1]) >= unit_h + 30
                for i, a in enumerate(places)
                for b in places[i + 1 :]
            ):
                break
            rx += 10
        centres = [_on_ring(r, n, rx, ry) for r in range(n)]
        mids = []
        for r in range(n):
            (x1, y1), (x2, y2) = centres[r], centres[(r + 1) % n]
            # The arc's middle (y points down here, so the bend's sign flips).
            mids.append(
                (
                    (x1 + x2) / 2 - 0.5 * rad * (y2 - y1),
                    (y1 + y2) / 2 + 0.5 * rad * (x2 - x1),
                )
            )
        xs = [x + d for x, _ in centres for d in (-strip / 2, strip / 2)]
        xs += [x + d for x, _ in mids for d in (-label_w / 2, label_w / 2)]
        ys = [y + d for _, y in centres for d in (-26, 34)]
        ys += [y + d for _, y in mids for d in (-label_h / 2, label_h / 2)]
        bounds = (min(xs), min(ys), max(xs), max(ys))
        over = max(
            (bounds[3] - bounds[1]) / (_STEP_H - 52 - 33 - 8),
            (bounds[2] - bounds[0]) / (_MAX_W - 16),
        )
        if not best or over < best[0] or over <= 1:
            best = (over, centres, mids, bounds)
        if over <= 1:
            break
    _, centres, mids, bounds = best
    left, top, right, low = bounds
    return centres, mids, (left - 8, top - 4, right + 8, low + 4)


def _legend_rows(n: int, width: float) -> tuple[int, float, float]:
    """The chunk legend's columns in ``width``, the pixels its rows take under a
    figure, and the width of it on one row."""
    em = _TEXT_PT * DPI / 72
    entries = [f"chunk {c}" for c in range(n)] + ["just received"]
    widths = [text_px(e, _TEXT_PT)[0] + 4.8 * em for e in entries]
    # (no spacing after the last column)
    one_row = sum(widths) - 2 * em
    across = len(entries) if one_row <= width else int(width // max(widths))
    across = max(1, across)
    return across, math.ceil(len(entries) / across) * 27 + 6, one_row


def _chunk_legend(fig: Figure, n: int, across: int) -> None:
    from matplotlib.patches import Patch

    handles = [patch(PALETTE[c % len(PALETTE)], f"chunk {c}") for c in range(n)]
    handles.append(
        Patch(facecolor="white", edgecolor="black", linewidth=3, label="just received")
    )
    bottom_legend(fig, handles, across, _TEXT_PT)


class RingWidget:
    """What :func:`ring_widget` returns: a slider over the steps of a ring
    all-reduce, with the picture of the chosen step under it. Beside the widget a
    notebook stores the first step's PNG (shown where widgets may not run, as in an
    untrusted notebook) and a line of text (what nbval reads).

    Attributes:
        view: the ipywidgets ``VBox`` (a play button and the slider, over the
            picture), to embed in other widgets.
        slider: the ``IntSlider``: 1 to 2(N-1), the step the picture's title names.
    """

    def __init__(self, steps: Sequence[RingStep], view: Any, slider: Any, png: bytes):
        self.steps, self.view, self.slider, self._png = steps, view, slider, png

    def __repr__(self) -> str:
        n = len(self.steps[0].after)
        return (
            f"Ring all-reduce of {n} ranks: {len(self.steps)} steps; run the cell "
            "to move through them"
        )

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        import base64

        bundle = dict(self.view._repr_mimebundle_())
        # A notebook stores a PNG as base64 text.
        png = base64.b64encode(self._png).decode("ascii")
        bundle.update({"text/plain": repr(self), "image/png": png})
        return bundle


def ring_widget(steps: Sequence[RingStep]) -> RingWidget | Figure:
    """An interactive view of a ring all-reduce: a slider (and play button) per
    step; :func:`draw_ring_grid` where ipywidgets cannot be imported.

    Args:
        steps: what :func:`ring_all_reduce_steps` returned.

    Returns:
        A :class:`RingWidget` (slider 1 to 2(N-1), over :func:`draw_ring_step` of
        that step), or the grid's Figure without ipywidgets.

    Example:
        >>> steps = ring_all_reduce_steps([[r] * 4 for r in range(4)])
        >>> ring_widget(steps)  # doctest: +SKIP
    """
    try:
        import ipywidgets as widgets
        from IPython.display import Image, display
    except ImportError:
        return draw_ring_grid(steps)
    cache: dict[int, bytes] = {}

    def png(number: int) -> bytes:
        if number not in cache:  # a PNG shows with or without an inline backend
            cache[number] = _png(draw_ring_step(steps, number - 1))
        return cache[number]

    out = widgets.Output()
    # Numbered as the picture's title numbers them: step 1 of 2(N-1) to its last.
    last = len(steps)
    slider = widgets.IntSlider(
        value=1, min=1, max=last, description="step", continuous_update=False
    )
    play = widgets.Play(value=1, min=1, max=last, interval=1500)
    widgets.jslink((play, "value"), (slider, "value"))

    def show(change: Any = None) -> None:
        out.clear_output(wait=True)
        with out:
            display(Image(png(slider.value)))

    slider.observe(show, names="value")
    show()
    view = widgets.VBox([widgets.HBox([play, slider]), out])
    return RingWidget(steps, view, slider, png(1))


def _png(fig: Figure) -> bytes:
    """The PNG the inline backend would show (100 dpi, tight): the projector's."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return buffer.getvalue()
