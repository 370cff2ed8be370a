"""The ring all-reduce behind an ipywidgets slider: a step per position, each drawn by
:func:`workshop.draw.ring_diagram.draw_ring_step`.

What :func:`ring_widget` returns shows as the live widget where Jupyter can run it,
and stores two stand-ins beside it in the notebook: the first step's picture (what
JupyterLab shows in a notebook it does not trust, where it may not run widgets) and
a line of text (what text-only viewers, and nbval, read).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..comm.ring import RingStep, ring_all_reduce_steps  # noqa: F401  (the doctests')
from .comm_diagrams import DPI
from .ring_diagram import draw_ring_grid, draw_ring_step

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["RingWidget", "ring_widget"]


class RingWidget:
    """What :func:`ring_widget` returns: a slider over the steps of a ring
    all-reduce, with the picture of the chosen step under it.

    Shown by Jupyter as the widget, with two stand-ins stored beside it in the
    notebook: the first step's PNG (what JupyterLab shows where it may not run the
    widget, as in a notebook it does not trust) and a line of text.

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
    """An interactive view of a ring all-reduce: a slider (and play button) per step.

    Falls back to :func:`draw_ring_grid` where ipywidgets cannot be imported.

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
