"""The ring all-reduce drawn one step at a time and as a grid of all steps
(workshop.draw.ring_diagram), and behind a slider: its steps numbered as the pictures
number them, and what a notebook stores of it. The steps themselves are tested in
tests/comm."""

from __future__ import annotations

import base64
import doctest
import sys

import matplotlib

matplotlib.use("Agg")

import pytest
from figure_helpers import arrows_on, flat, overlaps, texts_on
from matplotlib.patches import Rectangle

import workshop.draw.ring_diagram
from workshop.comm.ring import ring_all_reduce_steps
from workshop.draw.projector import png_size, projector_fit
from workshop.draw.ring_diagram import (
    RingWidget,
    draw_ring_grid,
    draw_ring_step,
    ring_widget,
)


def _steps(n: int) -> list:
    """The ring all-reduce of n ranks, rank r holding n r, n r + 1, ..."""
    return ring_all_reduce_steps(
        [[float(n * r + i) for i in range(n)] for r in range(n)]
    )


def _frames(ax) -> list[Rectangle]:
    """The frames round the chunks just received."""
    return [p for p in ax.patches if isinstance(p, Rectangle) and not p.get_fill()]


def test_a_ring_step_draws_an_arrow_per_rank_with_its_chunk():
    steps = ring_all_reduce_steps([[4 * r + i for i in range(4)] for r in range(4)])
    fig = draw_ring_step(steps, 2)
    ax = fig.axes[0]
    assert len(arrows_on(ax)) == 4
    chunk_labels = [t for t in texts_on(ax) if t.startswith("chunk")]
    assert chunk_labels == [f"chunk {c}" for c in steps[2].sends]
    assert ax.get_title() == (
        "step 3 of 6: reduce-scatter 3 of 3\n"
        "each rank adds what it receives; bold: summed over all ranks"
    )
    for r in range(4):
        assert f"rank {r}" in texts_on(ax)
    numbers = [t.get_text() for t in ax.texts if t.get_text().isdigit()]
    assert numbers == [str(v) for r in range(4) for v in flat(steps[2].after[r])]
    bold = {t.get_text() for t in ax.texts if t.get_fontweight() == "bold"}
    assert {"28", "32", "36", "24"} <= bold  # the fully summed chunks
    assert len(_frames(ax)) == 4  # the chunk each rank just received
    fig.canvas.draw()
    assert overlaps(ax.texts) == []


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_step_fits_the_projector_with_room_for_the_widgets_slider(n):
    steps = _steps(n)
    for k in range(len(steps)):
        fig = draw_ring_step(steps, k)
        fit = projector_fit(fig)
        assert fit.fits, fit.problems
        # The widget's slider (about 40 px) goes over it in the 456 px on screen.
        assert fit.height_px <= 400, f"step {k + 1} is {fit.height_px} px tall"
        fig.canvas.draw()
        assert overlaps(fig.axes[0].texts) == []


def test_a_step_out_of_range_is_explained():
    steps = ring_all_reduce_steps([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="step k=2 is not one of the 2 steps; pass 0"):
        draw_ring_step(steps, 2)


def test_the_grid_draws_every_step_with_its_phase_over_it():
    steps = _steps(3)
    fig = draw_ring_grid(steps)
    (ax,) = fig.axes
    texts = texts_on(ax)
    assert [t for t in texts if t.startswith("step")] == [
        f"step {k}" for k in range(1, 5)
    ]
    assert [t for t in texts if ": each rank" in t] == [
        "reduce-scatter: each rank adds",
        "all-gather: each rank copies",
    ]
    assert [t for t in texts if t.startswith("rank")] == ["rank 0", "rank 1", "rank 2"]
    # Every value after every step, in a table per step.
    numbers = [t for t in texts if t.replace(".", "").isdigit()]
    assert sorted(numbers) == sorted(
        workshop.draw.comm_diagrams.num(v) for s in steps for v in flat(s.after)
    )
    # An arrow per rank per step, the last rank's in two halves (round the ring).
    assert len(arrows_on(ax)) == 4 * (3 + 1)
    assert len(_frames(ax)) == 4 * 3
    fig.canvas.draw()
    assert overlaps(ax.texts) == []


def test_a_grid_arrow_goes_down_the_column_of_the_chunk_sent():
    steps = _steps(4)
    ax = draw_ring_grid(steps, phase="reduce-scatter").axes[0]
    heads = {t.get_text(): t.get_position()[0] for t in ax.texts}
    in_step_1 = (heads["step 1"] + heads["step 2"]) / 2  # x left of it: step 1
    cells = [
        t.get_position()
        for t in ax.texts
        if t.get_text().replace(".", "").isdigit() and t.get_position()[0] < in_step_1
    ]
    rows = sorted({y for _, y in cells})  # rank 0's row at the top
    column = sorted({x for x, _ in cells})  # chunk c's x
    arrows = [a._posA_posB for a in arrows_on(ax) if a._posA_posB[0][0] < in_step_1]
    assert all(x0 == x1 and y1 > y0 for (x0, y0), (x1, y1) in arrows)  # all down
    down = {(x0, y0, y1) for (x0, y0), (_, y1) in arrows}
    for r, c in enumerate(steps[0].sends[:-1]):  # rank r's chunk c to rank r + 1's
        (arrow,) = [
            a for a in down if a[0] == column[c] and rows[r] < a[1] < rows[r + 1]
        ]
        assert arrow[2] > rows[r + 1] - 20  # it reaches the cell below
    # The last rank's: out under its chunk, in again over rank 0's same chunk.
    last = [a for a in down if a[0] == column[steps[0].sends[-1]]]
    assert [a[1] > rows[-1] for a in sorted(last)] == [False, True]
    assert len(arrows) == 4 + 1


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("phase", ["both", "reduce-scatter", "all-gather"])
def test_the_grid_fits_the_projector(n, phase):
    fig = draw_ring_grid(_steps(n), phase=phase)
    fit = projector_fit(fig)
    assert fit.fits, fit.problems
    shown = [t for t in texts_on(fig.axes[0]) if t.startswith("step")]
    assert len(shown) == (2 * (n - 1) if phase == "both" else n - 1)


@pytest.mark.parametrize("phase", ["reduce-scatter", "all-gather"])
def test_five_ranks_fit_one_phase_at_a_time(phase):
    fit = projector_fit(draw_ring_grid(_steps(5), phase=phase))
    assert fit.fits, fit.problems


def test_an_unknown_phase_is_explained():
    with pytest.raises(ValueError, match="phase='scatter' is not one of 'both', "):
        draw_ring_grid(_steps(2), phase="scatter")


def test_no_steps_is_explained():  # an IndexError before (issue 35)
    with pytest.raises(ValueError, match=r"steps is empty; pass what ring_all_redu"):
        draw_ring_grid([])


def test_the_docstring_examples_run():
    assert doctest.testmod(workshop.draw.ring_diagram).failed == 0


STEPS = ring_all_reduce_steps([[float(4 * r + i) for i in range(4)] for r in range(4)])


def test_the_slider_counts_the_steps_as_the_pictures_titles_do():
    ipywidgets = pytest.importorskip("ipywidgets")
    view = ring_widget(STEPS)
    assert isinstance(view, RingWidget)
    controls, out = view.view.children
    play, slider = controls.children
    assert slider is view.slider
    assert isinstance(slider, ipywidgets.IntSlider)
    assert isinstance(out, ipywidgets.Output)
    assert (slider.min, slider.max, slider.value) == (1, 6, 1)
    assert (play.min, play.max) == (slider.min, slider.max)
    assert slider.description == "step"
    for number in range(slider.min, slider.max + 1):
        title = draw_ring_step(STEPS, number - 1).axes[0].get_title()
        assert title.startswith(f"step {number} of 6:")
    slider.value = 6  # redraws the last step without error


def test_a_notebook_stores_readable_text_and_the_first_steps_picture():
    pytest.importorskip("ipywidgets")
    bundle = ring_widget(STEPS)._repr_mimebundle_()
    text = bundle["text/plain"]
    assert text == (
        "Ring all-reduce of 4 ranks: 6 steps; run the cell to move through them"
    )
    assert "VBox(" not in text
    # The same text every run (nbval compares it), whatever the widget's model id.
    assert ring_widget(STEPS)._repr_mimebundle_()["text/plain"] == text
    # The live widget, and the PNG JupyterLab shows where it does not run widgets.
    view = bundle["application/vnd.jupyter.widget-view+json"]
    assert len(view["model_id"]) == 32
    width, height = png_size(base64.b64decode(bundle["image/png"]))
    assert width <= 1100 and height <= 400


def test_ipython_shows_the_widget_with_its_stand_ins():
    pytest.importorskip("ipywidgets")
    from IPython.core.formatters import DisplayFormatter

    data, _ = DisplayFormatter().format(ring_widget(STEPS))
    assert {"text/plain", "image/png"} <= set(data)
    assert "application/vnd.jupyter.widget-view+json" in data


def test_without_ipywidgets_the_widget_is_the_grid(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import fails
    steps = ring_all_reduce_steps([[1, 2], [3, 4]])
    fig = ring_widget(steps)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert [t for t in texts if t.startswith("step")] == ["step 1", "step 2"]
