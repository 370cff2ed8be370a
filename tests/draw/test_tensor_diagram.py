"""The tensor-parallel MLP diagram: each weight cut into a coloured slice per rank (W1
by columns, W2 by rows), the all-reduces forward and backward, labelled with the bytes
a trace recorded; whole on a 1280 x 720 screen, readable, nothing on top of another."""

from __future__ import annotations

import doctest

import matplotlib

matplotlib.use("Agg")

import pytest
from figure_helpers import overlaps, texts_on
from matplotlib.colors import to_hex
from matplotlib.patches import Rectangle

import workshop.draw.tensor_diagram
from workshop.comm.tracing import TraceEvent
from workshop.draw.comm_diagrams import PALETTE
from workshop.draw.projector import projector_fit
from workshop.draw.tensor_diagram import draw_tensor_parallel


def _all_reduce(rank: int, seq: int, shape=(8, 16)) -> dict:
    return {
        "rank": rank,
        "op": "all_reduce",
        "seq": seq,
        "reduce_op": "sum",
        "shapes": [shape],
        "dtype": "float32",
        "nbytes": shape[0] * shape[1] * 4,
    }


def _slices(ax) -> list[tuple[float, float, float, float, str]]:
    """Each rank's slice: x, y, width, height and colour, in drawing order."""
    return [
        (p.get_x(), p.get_y(), p.get_width(), p.get_height(), to_hex(p.get_fc()))
        for p in ax.patches
        if type(p) is Rectangle  # not the boxes (FancyBboxPatch) or circles
    ]


@pytest.mark.parametrize("world_size", [1, 2, 4, 6])
def test_w1_is_cut_by_columns_and_w2_by_rows_a_colour_per_rank(world_size):
    fig = draw_tensor_parallel(world_size, 16, 96)
    ax = fig.axes[0]
    slices = _slices(ax)
    assert len(slices) == 2 * world_size
    w1, w2 = slices[:world_size], slices[world_size:]
    colours = [to_hex(PALETTE[r]) for r in range(world_size)]
    assert [s[4] for s in w1] == colours
    assert [s[4] for s in w2] == colours
    # W1: side by side, one height; W2: stacked (rank 0 on top), one width.
    assert len({round(s[1], 6) for s in w1}) == 1
    assert sorted(s[0] for s in w1) == [s[0] for s in w1]
    assert len({round(s[0], 6) for s in w2}) == 1
    assert sorted((s[1] for s in w2), reverse=True) == [s[1] for s in w2]
    texts = texts_on(ax)
    for r in range(world_size):
        assert texts.count(f"rank {r}") == 2
    assert "W1 (16 \u00d7 96)\ncut by columns" in texts
    assert "W2 (96 \u00d7 16)\ncut by rows" in texts
    k = 96 // world_size
    assert f"16 \u00d7 {k} each" in texts
    assert f"{k} \u00d7 16 each" in texts
    assert ax.get_title().startswith(
        f"Tensor parallelism of an MLP on {world_size} ranks"
    )
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [f"rank {r}" for r in range(world_size)] + ["all_reduce"]


@pytest.mark.parametrize(
    ("world_size", "d_model", "d_hidden"), [(2, 16, 64), (6, 64, 96), (3, 64, 12)]
)
def test_it_fits_a_projector_with_large_labels_and_none_on_another(
    world_size, d_model, d_hidden
):
    events = [[_all_reduce(r, 0), _all_reduce(r, 1)] for r in range(world_size)]
    fig = draw_tensor_parallel(world_size, d_model, d_hidden, events, batch=8)
    fit = projector_fit(fig)
    assert fit.fits, fit.problems
    ax = fig.axes[0]
    fig.canvas.draw()
    assert overlaps(ax.texts) == []
    assert min(t.get_fontsize() for t in ax.texts) >= 12
    # Everything drawn lies inside the figure.
    box = fig.bbox
    for t in [*ax.texts, ax.title, ax.get_legend()]:
        extent = t.get_window_extent()
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1, t
        assert box.y0 <= extent.y0 and extent.y1 <= box.y1, t


def test_without_a_trace_the_all_reduces_are_named_by_their_shape():
    texts = texts_on(draw_tensor_parallel(2, 16, 64, batch=8).axes[0])
    assert (
        "g = reduce_from_ranks: forward\nall_reduce of the partial Y\n"
        "8 \u00d7 16 numbers"
    ) in texts
    assert (
        "f = copy_to_ranks: backward\nall_reduce of the gradient of X\n"
        "8 \u00d7 16 numbers"
    ) in texts
    assert "f" in texts and "g" in texts
    assert "batch \u00d7 16\nsame on\nevery rank" in texts_on(
        draw_tensor_parallel(2, 16, 64).axes[0]
    )


def test_a_trace_labels_each_all_reduce_with_its_recorded_bytes():
    # The first all_reduce is forward, the second backward; sizes differ here so
    # that each label is seen to come from its own call.
    lanes = [[_all_reduce(r, 0, (8, 16)), _all_reduce(r, 1, (4, 16))] for r in range(4)]
    texts = texts_on(draw_tensor_parallel(4, 16, 64, lanes).axes[0])
    # 4 ranks: a ring sends 2(N-1)/N = 1.5 times the tensor from each rank.
    assert (
        "g = reduce_from_ranks: forward\nall_reduce of the partial Y\n"
        "traced: 512 bytes (8 \u00d7 16)\nring: 768 bytes sent per rank"
    ) in texts
    assert (
        "f = copy_to_ranks: backward\nall_reduce of the gradient of X\n"
        "traced: 256 bytes (4 \u00d7 16)\nring: 384 bytes sent per rank"
    ) in texts


def test_the_tracers_own_events_and_a_flat_list_draw_the_same():
    events = [
        TraceEvent(
            rank=r,
            seq=s,
            op="all_reduce",
            peer=None,
            root=None,
            reduce_op="sum",
            world_size=2,
            shapes=[(8, 16)],
            dtype="float32",
            nbytes=512,
            blocking=True,
            start=float(s),
            end=s + 0.5,
            before=None,
            after=None,
        )
        for r in range(2)
        for s in range(2)
    ]
    flat = texts_on(draw_tensor_parallel(2, 16, 64, events).axes[0])
    as_dicts = [[_all_reduce(r, s) for s in range(2)] for r in range(2)]
    assert flat == texts_on(draw_tensor_parallel(2, 16, 64, as_dicts).axes[0])
    one_call = texts_on(draw_tensor_parallel(2, 16, 64, [_all_reduce(0, 0)]).axes[0])
    assert any(t.endswith("not in the trace") for t in one_call)


def test_what_cannot_be_drawn_is_explained():
    with pytest.raises(
        ValueError,
        match=r"world_size must be a whole number from 1 to 6, not 7",
    ):
        draw_tensor_parallel(7, 16, 70)
    with pytest.raises(
        ValueError,
        match=r"d_hidden=10 is not divisible by world_size=4, so the slices would "
        r"differ in size; pass a d_hidden that is a multiple of 4, e.g. 12",
    ):
        draw_tensor_parallel(4, 16, 10)
    with pytest.raises(
        ValueError, match=r"d_model must be a whole number, 1 or more, not 0"
    ):
        draw_tensor_parallel(2, 0, 64)
    with pytest.raises(
        ValueError,
        match=r"the events hold no all_reduce \(ops: \['all_gather'\]\); pass the "
        r"trace of launch\(check_tensor_parallel",
    ):
        draw_tensor_parallel(2, 16, 64, [{"rank": 0, "op": "all_gather"}])


def test_the_docstring_example_runs():
    assert doctest.testmod(workshop.draw.tensor_diagram).failed == 0
