"""The ring all-reduce drawn one step at a time, as a grid, and behind a slider
(workshop.draw.ring_diagram); the steps themselves are tested in tests/comm."""

from __future__ import annotations

import doctest
import sys

import matplotlib

matplotlib.use("Agg")

import pytest
from figure_helpers import arrows_on, flat, overlaps, texts_on
from matplotlib.patches import Rectangle

import workshop.draw.ring_diagram
from workshop.comm.ring import ring_allreduce_steps
from workshop.draw.ring_diagram import draw_ring_grid, draw_ring_step, ring_widget


def test_a_ring_step_draws_an_arrow_per_rank_with_its_chunk():
    steps = ring_allreduce_steps([[4 * r + i for i in range(4)] for r in range(4)])
    fig = draw_ring_step(steps, 2)
    ax = fig.axes[0]
    assert len(arrows_on(ax)) == 4
    chunk_labels = [t for t in texts_on(ax) if t.startswith("chunk")]
    assert chunk_labels == [f"chunk {c}" for c in steps[2].sends]
    assert ax.get_title() == (
        "step 3 of 6: reduce-scatter 3 of 3\neach rank adds what it receives"
    )
    for r in range(4):
        assert f"rank {r}" in texts_on(ax)
    numbers = [t.get_text() for t in ax.texts if t.get_text().isdigit()]
    assert numbers == [str(v) for r in range(4) for v in flat(steps[2].after[r])]
    bold = {t.get_text() for t in ax.texts if t.get_fontweight() == "bold"}
    assert {"28", "32", "36", "24"} <= bold  # the fully summed chunks
    # The chunk each rank just received is framed.
    frames = [p for p in ax.patches if isinstance(p, Rectangle) and not p.get_fill()]
    assert len(frames) == 4
    fig.canvas.draw()
    assert overlaps(ax.texts) == []


def test_a_step_out_of_range_is_explained():
    steps = ring_allreduce_steps([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="step k=2 is not one of the 2 steps; pass 0"):
        draw_ring_step(steps, 2)


def test_the_grid_draws_every_step_reduce_scatter_on_top():
    steps = ring_allreduce_steps([[float(r)] * 3 for r in range(3)])
    fig = draw_ring_grid(steps)
    titles = [ax.get_title().splitlines()[0] for ax in fig.axes]
    assert titles == [
        "step 1 of 4: reduce-scatter 1 of 2",
        "step 2 of 4: reduce-scatter 2 of 2",
        "step 3 of 4: all-gather 1 of 2",
        "step 4 of 4: all-gather 2 of 2",
    ]
    assert all(len(arrows_on(ax)) == 3 for ax in fig.axes)


def test_the_widget_has_a_slider_over_the_steps():
    ipywidgets = pytest.importorskip("ipywidgets")
    steps = ring_allreduce_steps([[r] * 4 for r in range(4)])
    view = ring_widget(steps)
    assert isinstance(view, ipywidgets.VBox)
    controls, out = view.children
    slider = controls.children[1]
    assert isinstance(slider, ipywidgets.IntSlider)
    assert isinstance(out, ipywidgets.Output)
    assert (slider.min, slider.max, slider.value) == (0, 5, 0)
    slider.value = 5  # redraws the last step without error


def test_without_ipywidgets_the_widget_is_the_grid(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import fails
    steps = ring_allreduce_steps([[1, 2], [3, 4]])
    fig = ring_widget(steps)
    assert len(fig.axes) == 2


def test_the_docstring_examples_run():
    assert doctest.testmod(workshop.draw.ring_diagram).failed == 0
