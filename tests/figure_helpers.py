"""Reading what a matplotlib figure shows: its texts, arrows and overlapping labels,
for the diagram tests."""

from __future__ import annotations

from matplotlib.patches import FancyArrowPatch


def texts_on(ax) -> list[str]:
    """Every text drawn on ``ax``."""
    return [t.get_text() for t in ax.texts]


def arrows_on(ax) -> list[FancyArrowPatch]:
    """Every arrow drawn on ``ax``."""
    return [p for p in ax.patches if isinstance(p, FancyArrowPatch)]


def overlaps(drawn_texts) -> list[tuple[str, str]]:
    """Pairs of texts whose drawn boxes overlap (the figure must have been drawn)."""
    boxes = [(t.get_text(), t.get_window_extent()) for t in drawn_texts if t.get_text()]
    return [
        (a, b)
        for i, (a, box_a) in enumerate(boxes)
        for b, box_b in boxes[i + 1 :]
        if box_a.overlaps(box_b)
    ]


def flat(value) -> list:
    """A nested list's leaves, in order."""
    if isinstance(value, list):
        return [x for v in value for x in flat(v)]
    return [value]
