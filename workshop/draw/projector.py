"""What a classroom projector shows, and whether a figure fits it.

A projector shows 1280x720. JupyterLab's page at that size (measured by the browser
test in Chromium 156 with JupyterLab 4.6: tests/browser) leaves a cell's output area
1,085 px wide with the side panels closed, and 599 px of height for the notebook;
a real browser window also draws its tabs and address bar, which leaves about 456 px.
JupyterLab shrinks an image wider than the output area to fit, so every label shrinks
with it; it never shrinks a tall image, which then cannot be seen whole. A figure fits
the projector when its PNG, as the inline backend renders it, is at most 1,085 px wide
and 456 px tall, and its smallest text, after any shrinking, is at least 12 px high.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import matplotlib.text

# The screen, and the part of it JupyterLab leaves for a cell's output at 1280x720 in
# a browser window (side panels closed).
PROJECTOR_PX = (1280, 720)
NOTEBOOK_AREA_PX = (1085, 456)
MIN_LABEL_PX = 12.0
# The inline backend draws at matplotlib's default 100 dpi with a tight bounding box.
INLINE_DPI = 100


@dataclass(frozen=True)
class FigureFit:
    """How a figure would look in a 1280x720 JupyterLab.

    Attributes:
        width_px, height_px: the PNG the inline backend would show.
        scale: how much JupyterLab shrinks it to fit the output area (1.0: none).
        smallest_label_px: the smallest text on screen, in pixels, after shrinking.
        smallest_label: that text (to say which label is too small).
    """

    width_px: int
    height_px: int
    scale: float
    smallest_label_px: float
    smallest_label: str

    @property
    def problems(self) -> list[str]:
        """What keeps the figure from fitting; empty when it fits."""
        area_w, area_h = NOTEBOOK_AREA_PX
        found = []
        if self.height_px > area_h:
            found.append(
                f"{self.height_px} px tall but the notebook area at 1280x720 is "
                f"{area_h} px: it cannot be seen whole"
            )
        if self.width_px > area_w:
            found.append(
                f"{self.width_px} px wide, shrunk to {area_w} px (x{self.scale:.2f}) "
                "by JupyterLab"
            )
        if self.smallest_label_px < MIN_LABEL_PX:
            found.append(
                f"its smallest label {self.smallest_label!r} is "
                f"{self.smallest_label_px:.1f} px on screen, under {MIN_LABEL_PX:g} px"
            )
        return found

    @property
    def fits(self) -> bool:
        return not self.problems


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels of a PNG image, read from its header."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG image (its first 8 bytes are not PNG's signature)")
    return struct.unpack(">II", png[16:24])


def projector_fit(fig) -> FigureFit:
    """Render ``fig`` as the inline backend does and measure it against the projector.

    Args:
        fig: a matplotlib Figure.

    Returns:
        A :class:`FigureFit`; ``fit.problems`` says in words what does not fit.
    """
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=INLINE_DPI, bbox_inches="tight")
    width, height = png_size(buffer.getvalue())
    scale = min(1.0, NOTEBOOK_AREA_PX[0] / width)
    smallest, label = float("inf"), ""
    for text in fig.findobj(matplotlib.text.Text):
        shown = text.get_text().strip()
        if not shown or not text.get_visible():
            continue
        px = text.get_fontsize() * INLINE_DPI / 72 * scale
        if px < smallest:
            smallest, label = px, shown
    return FigureFit(width, height, scale, smallest, label)
