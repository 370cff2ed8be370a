"""The ring all-reduce: its 2(N-1) steps computed right, and drawn one by one, as a
grid, and behind a slider."""

from __future__ import annotations

import doctest
import sys

import matplotlib

matplotlib.use("Agg")

import pytest
from figure_helpers import arrows_on, flat, overlaps, texts_on
from matplotlib.patches import Rectangle

import workshop.ring
from workshop.ring import (
    draw_ring_grid,
    draw_ring_step,
    ring_allreduce_steps,
    ring_widget,
)

# --- -----------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_a_ring_takes_2_n_minus_1_steps_and_ends_with_the_sum_everywhere(n):
    values = [[10 * r + i for i in range(n + 1)] for r in range(n)]
    steps = ring_allreduce_steps(values)
    assert len(steps) == 2 * (n - 1)
    assert [s.step for s in steps] == list(range(2 * (n - 1)))
    assert [s.phase for s in steps] == ["reduce-scatter"] * (n - 1) + ["all-gather"] * (
        n - 1
    )
    total = [sum(v[i] for v in values) for i in range(n + 1)]
    for rank in range(n):
        assert flat(steps[-1].after[rank]) == total
        assert steps[-1].counts[rank] == [n] * n
    # Chunks split as evenly as they can: n + 1 values in n chunks.
    assert sorted(len(c) for c in steps[0].before[0]) == [1] * (n - 1) + [2]


def test_each_ring_step_sends_the_right_chunk_and_adds_or_copies_it():
    values = [[4 * r + i for i in range(4)] for r in range(4)]
    steps = ring_allreduce_steps(values)
    # Reduce-scatter step s: rank r sends chunk (r - s) mod 4; all-gather step s:
    # chunk (r + 1 - s) mod 4, the one it finished.
    assert [s.sends for s in steps] == [
        [0, 1, 2, 3],
        [3, 0, 1, 2],
        [2, 3, 0, 1],
        [1, 2, 3, 0],
        [0, 1, 2, 3],
        [3, 0, 1, 2],
    ]
    first = steps[0]
    assert first.before[1] == [[4], [5], [6], [7]]
    assert first.sent[0] == [0]
    assert first.after[1] == [[4], [5], [6], [7]]  # 4 + rank 0's chunk 0, which is 0
    assert first.after[0][3] == [3 + 15]  # rank 3's chunk 3 added to rank 0's
    # After reduce-scatter rank r holds the full sum of chunk r + 1, and only it.
    middle = steps[2]
    for r in range(4):
        c = (r + 1) % 4
        assert middle.after[r][c] == [sum(4 * q + c for q in range(4))]
        assert middle.counts[r][c] == 4
        assert sum(count == 4 for count in middle.counts[r]) == 1
    # All-gather copies: what arrives replaces what was there.
    assert steps[3].after[1][1] == steps[3].sent[0] == [28]


@pytest.mark.parametrize(
    "values", [[[1, 2]], [[1, 2], [1]], [[1], [2], [3, 4]], [[1], [2]][:1]]
)
def test_a_ring_that_cannot_be_computed_is_explained(values):
    with pytest.raises(ValueError, match="a ring needs 2 or more ranks"):
        ring_allreduce_steps(values)


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
    assert doctest.testmod(workshop.ring).failed == 0
