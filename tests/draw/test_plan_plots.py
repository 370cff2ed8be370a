"""Plan pictures: memory per GPU against the GPU's capacity, step time by term, the
framework's bytes beside the estimate, several layouts side by side; every picture
fits the projector, and bad estimates are refused.

The estimates are written by hand (the estimator is tested on its own): their
figures are made up for the pictures, not anyone's measurement."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from types import SimpleNamespace

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_hex
from matplotlib.patches import Rectangle

from workshop.draw.plan_plots import (
    MAX_LAYOUTS,
    MEMORY_TERMS,
    TIME_TERMS,
    layout_label,
    plot_layouts,
    plot_plan,
)
from workshop.draw.plots import COLOURS
from workshop.draw.projector import MIN_LABEL_PX, projector_fit
from workshop.planner.estimator import Estimate
from workshop.planner.layout import GPUS, NETWORKS, Layout, model_shape

GB = 1e9


def estimate(
    layout: Layout, memory_gb: tuple, time_s: tuple, step: float, gpu: str = "H100 80GB"
) -> Estimate:
    return Estimate(
        model=model_shape("transformer-8b"),
        layout=layout,
        gpu=GPUS[gpu],
        network=NETWORKS["NVLink 4 + NDR 400G"],
        gpus_per_node=8,
        memory={t: v * GB for t, v in zip(MEMORY_TERMS, memory_gb, strict=True)},
        time=dict(zip(TIME_TERMS, time_s, strict=True)),
        collectives={},
        formulas={},
        step=step,
    )


FSDP = estimate(
    Layout(dp=64, zero=3), (0.25, 0.25, 1.5, 30.0, 4.0), (2.0, 0.4, 0.0, 0.0, 0.0), 2.1
)
DDP_TP = estimate(
    Layout(dp=8, tp=8), (2.0, 2.0, 12.0, 20.0, 1.0), (2.0, 0.6, 0.5, 0.0, 0.0), 2.9
)
OVER = estimate(
    Layout(dp=4, tp=8, pp=2, zero=1),
    (1.0, 1.0, 1.5, 90.0, 1.0),
    (2.0, 0.1, 0.5, 0.05, 0.3),
    2.95,
)


def _bars(ax) -> list[Rectangle]:
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height() > 0]


def _fits(fig) -> None:
    try:
        fit = projector_fit(fig)
        assert fit.fits, fit.problems
        assert fit.smallest_label_px >= MIN_LABEL_PX
        assert not plt.fignum_exists(fig.number)  # closed: a cell shows it once
    finally:
        plt.close(fig)


def test_memory_bar_stacks_the_terms_up_to_the_total_under_the_capacity():
    fig = plot_plan(FSDP)
    left = fig.axes[0]
    bars = _bars(left)
    assert [round(b.get_height(), 6) for b in bars] == [0.25, 0.25, 1.5, 30.0, 4.0]
    assert bars[-1].get_y() + bars[-1].get_height() == pytest.approx(36.0)
    (capacity,) = left.get_lines()
    assert capacity.get_ydata()[0] == pytest.approx(80.0)
    assert to_hex(capacity.get_color()) != to_hex(COLOURS[3])  # fits: not red
    assert "45% used" in left.get_title()
    labels = [t.get_text() for t in left.get_legend().get_texts()]
    assert "H100 80GB: 80 GB" in labels and "framework (fake backend)" not in labels
    _fits(fig)


def test_over_capacity_turns_the_line_and_title_red():
    fig = plot_plan(OVER)
    left = fig.axes[0]
    (capacity,) = left.get_lines()
    assert to_hex(capacity.get_color()) == to_hex(COLOURS[3])
    assert "over by 14.5 GB" in left.get_title()
    _fits(fig)


def test_time_bar_splits_compute_communication_and_bubble_with_the_step_line():
    fig = plot_plan(OVER)
    right = fig.axes[1]
    heights = [round(b.get_height(), 6) for b in _bars(right)]
    assert heights == [2.0, 0.1, 0.5, 0.05, 0.3]  # in seconds: the step is over 1 s
    labels = [t.get_text() for t in right.get_legend().get_texts()]
    assert set(TIME_TERMS) <= set(labels) and "step: 2.95 s" in labels
    assert right.get_ylabel() == "time per step (s)"
    fast = estimate(Layout(dp=8), (1, 1, 1, 1, 1), (0.02, 0.004, 0, 0, 0), 0.021)
    fig_ms = plot_plan(fast)
    assert fig_ms.axes[1].get_ylabel() == "time per step (ms)"
    assert [round(b.get_height(), 6) for b in _bars(fig_ms.axes[1])] == [20.0, 4.0]
    _fits(fig)
    _fits(fig_ms)


def test_the_frameworks_bytes_sit_beside_each_term_at_its_top_when_they_agree():
    fake = {"parameters": 0.25 * GB, "gradients": 0.25 * GB, "optimizer": 1.2 * GB}
    fig = plot_plan(FSDP, fake=fake)
    left = fig.axes[0]
    markers = [line for line in left.get_lines() if line.get_marker() == "D"]
    tops = [m.get_ydata()[0] for m in markers]
    # bottom of each segment + the framework's bytes: 0 + 0.25, 0.25 + 0.25,
    # 0.5 + 1.2 (the optimizer state is 0.3 GB under the estimate's top of 2.0).
    assert tops == pytest.approx([0.25, 0.5, 1.7])
    labels = [t.get_text() for t in left.get_legend().get_texts()]
    assert "framework (fake backend)" in labels
    _fits(fig)
    # A framework that holds far more than estimated still shows on the axes.
    high = plot_plan(FSDP, fake={"activations": 70 * GB})
    (mark,) = [m for m in high.axes[0].get_lines() if m.get_marker() == "D"]
    assert mark.get_ydata()[0] == pytest.approx(72.0)
    assert high.axes[0].get_ylim()[1] > 72.0
    _fits(high)


def test_layouts_side_by_side_mark_each_capacity_and_step():
    fig = plot_layouts([FSDP, DDP_TP, OVER])
    left, right = fig.axes
    assert [t.get_text() for t in left.get_xticklabels()] == [
        "64x1x1\nZeRO-3",
        "8x8x1\nDDP",
        "4x8x2\nZeRO-1",
    ]
    capacity = [c for c in left.collections]
    colours = [to_hex(c.get_colors()[0]) for c in capacity]
    assert colours.count(to_hex(COLOURS[3])) == 1  # only the third is over
    steps = [c.get_segments()[0][0][1] for c in right.collections]
    assert steps == pytest.approx([2.1, 2.9, 2.95])
    _fits(fig)
    _fits(plot_layouts([FSDP] * MAX_LAYOUTS, title="Six at once"))
    named = plot_layouts([FSDP, OVER], labels=["FSDP", "3-D"])
    assert [t.get_text() for t in named.axes[0].get_xticklabels()] == ["FSDP", "3-D"]
    _fits(named)


def test_layout_label_is_short_and_names_the_stage():
    assert layout_label(Layout(dp=128, tp=8, pp=1, zero=3)) == "128x8x1\nZeRO-3"
    assert layout_label(SimpleNamespace(dp=2, tp=1, pp=1, zero=0)) == "2x1x1\nDDP"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: plot_plan({"memory": {}}), "draws a planner estimate"),
        (lambda: plot_plan(FSDP, fake={"weights": 1.0}), r"\['weights'\] that are not"),
        (lambda: plot_plan(FSDP, fake={"parameters": -1.0}), "0 or more"),
        (lambda: plot_plan(FSDP, fake=[1.0]), "must be a dict"),
        (
            lambda: plot_plan(
                estimate(Layout(), (1, 1, 1, 1, float("nan")), (1, 0, 0, 0, 0), 1.0)
            ),
            "finite",
        ),
        (
            lambda: plot_plan(
                estimate(Layout(), (1, 1, 1, 1, 1), (1, 0, 0, 0, 0), 0.0)
            ),
            "step = 0.0 must be above 0",
        ),
        (lambda: plot_layouts([]), "1 to 6 layouts"),
        (lambda: plot_layouts([FSDP] * (MAX_LAYOUTS + 1)), "compare fewer"),
        (lambda: plot_layouts(FSDP), "list of estimates"),
        (lambda: plot_layouts([FSDP, OVER], labels=["one"]), "one per layout"),
    ],
)
def test_bad_input_is_refused_with_what_was_wrong(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_bad_term_in_the_estimate_itself_is_named():
    bad = estimate(Layout(), (1, 1, 1, 1, 1), (1, 0, 0, 0, 0), 1.0)
    object.__setattr__(bad, "time", {**bad.time, "ep comm": 0.1})
    with pytest.raises(ValueError, match=r"estimate.time has terms \['ep comm'\]"):
        plot_plan(bad)
