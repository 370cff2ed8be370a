"""The ring all-reduce behind a slider (workshop.draw.ring_diagram): its steps numbered
as the pictures number them, and what a notebook stores of it."""

from __future__ import annotations

import base64
import doctest
import sys

import matplotlib

matplotlib.use("Agg")

import pytest

import workshop.draw.ring_diagram
from workshop.comm.ring import ring_all_reduce_steps
from workshop.draw.projector import png_size
from workshop.draw.ring_diagram import RingWidget, draw_ring_step, ring_widget

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


def test_the_docstring_examples_run():
    assert doctest.testmod(workshop.draw.ring_diagram).failed == 0
