"""Diagrams of communication between ranks: the ranks, values, arrows and steps they
show, drawn from plain events (dicts, or objects with the same fields)."""

from __future__ import annotations

import dataclasses
import doctest
import itertools
from collections import Counter

import matplotlib

matplotlib.use("Agg")

import pytest
from figure_helpers import arrows_on, flat, overlaps, texts_on
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.patches import Rectangle

import workshop.draw.collective_diagram
import workshop.draw.comm_diagrams
import workshop.draw.p2p_diagram
import workshop.draw.timeline_diagram
from workshop.draw.collective_diagram import draw_collective
from workshop.draw.comm_diagrams import OP_COLOURS, draw_rank_layout
from workshop.draw.p2p_diagram import draw_point_to_point
from workshop.draw.projector import projector_fit
from workshop.draw.timeline_diagram import draw_rank_timeline
from workshop.gallery import example_collectives, example_events, example_phases


@dataclasses.dataclass
class Call:
    """A recorded call as the tracer's dataclass would hold it."""

    rank: int
    op: str
    peer: int | None = None
    root: int | None = None
    reduce_op: str | None = None
    world_size: int = 4
    shapes: list = dataclasses.field(default_factory=list)
    dtype: str | None = "float32"
    nbytes: int = 0
    before: list | None = None
    after: list | None = None
    start: float = 0.0
    end: float = 0.0
    blocking: bool = True
    seq: int = 0


# --- rank layout ---------------------------------------------------------------------


@pytest.mark.parametrize(("nodes", "per_node"), [(1, 4), (2, 4), (4, 2), (3, 8)])
def test_each_slot_names_its_rank_local_rank_and_node_rank(nodes, per_node):
    fig = draw_rank_layout(nodes, per_node)
    ax = fig.axes[0]
    texts = ax.texts
    for rank in range(nodes * per_node):
        (label,) = [t for t in texts if t.get_text() == f"rank {rank}"]
        x = label.get_position()[0]
        in_slot = {t.get_text() for t in texts if t.get_position()[0] == x}
        node, local = divmod(rank, per_node)
        assert {f"GPU {local}", f"local_rank {local}", f"node_rank {node}"} <= (in_slot)
    assert texts_on(ax).count("node 0") == 1  # the box
    assert texts_on(ax).count("node_rank 0") == per_node  # and each of its slots
    assert ax.get_title() == (
        f"{nodes} node{'s' * (nodes > 1)} \u00d7 {per_node} GPUs per node = "
        f"world_size {nodes * per_node}\n"
        f"rank = node_rank \u00d7 {per_node} + local_rank"
    )
    fig.canvas.draw()  # readable: no two labels on top of each other
    assert overlaps(ax.texts) == []
    fit = projector_fit(fig)
    if nodes * per_node <= 8:  # 8 slots across, on one row, fit the projector
        assert fit.fits, fit.problems
    assert fit.smallest_label_px >= 12  # and more still read, further down


def test_a_cpu_layout_says_cpu():
    texts = texts_on(draw_rank_layout(1, 2, gpus=False).axes[0])
    assert "CPU 1" in texts
    assert not any(t.startswith("GPU") for t in texts)


@pytest.mark.parametrize("bad", [0, -1, 17, 2.5])
def test_a_layout_that_cannot_be_drawn_is_explained(bad):
    with pytest.raises(
        ValueError, match=rf"nodes must be a whole number from 1 to 16, not {bad}"
    ):
        draw_rank_layout(bad, 4)


# --- point to point ------------------------------------------------------------------


def test_an_arrow_per_message_numbered_and_labelled_with_its_values():
    ax = draw_point_to_point(example_events()).axes[0]
    arrows = arrows_on(ax)
    assert len(arrows) == 2
    # From sender to receiver: rank 0 -> 1 and rank 2 -> 3 (ranks 2.8 apart).
    starts = sorted(round(a._posA_posB[0][0] / 2.8) for a in arrows)
    ends = sorted(round(a._posA_posB[1][0] / 2.8) for a in arrows)
    assert (starts, ends) == ([0, 2], [1, 3])
    texts = texts_on(ax)
    assert "(1) [1, 2]" in texts
    assert "(2) [3, 4]" in texts
    assert [f"rank {r}" for r in range(4)] == [t for t in texts if t.startswith("rank")]
    assert ax.get_title().startswith("Point-to-point: 2 messages between 4 ranks")


def _mixed() -> list[list[Call]]:
    """An isend/irecv pair, then two sends 0 -> 1, and a large one 2 -> 0."""
    ms = 1e-3
    return [
        [
            Call(0, "isend", peer=1, before=[1.5, 2.25], blocking=False),
            Call(0, "send", peer=1, before=[7], start=2 * ms),
            Call(0, "recv", peer=2, shapes=[(1024,)], start=5 * ms),
        ],
        [
            Call(1, "irecv", peer=0, after=[1.5, 2.25], blocking=False),
            Call(1, "recv", peer=0, after=[7], start=2 * ms),
        ],
        [Call(2, "send", peer=0, shapes=[(1024,)], start=4 * ms)],
    ]


def test_messages_are_numbered_in_the_order_sent_and_large_ones_show_a_shape():
    fig = draw_point_to_point(_mixed())
    ax = fig.axes[0]
    arrows = arrows_on(ax)
    assert len(arrows) == 3
    labels = [t for t in texts_on(ax) if t.startswith("(")]
    assert labels == ["(1) [1.5, 2.25]", "(2) [7]", "(3) shape (1024,) float32"]
    # The isend's arrow is dashed; the legend says what dashed means.
    assert [a.get_linestyle() for a in arrows].count("--") == 1
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["send / recv (blocking)", "isend / irecv (non-blocking)"]
    # Two messages 0 -> 1: the second arc is drawn wider, so the two stay apart.
    same_pair = [a for a in arrows if a._posA_posB[1][0] == pytest.approx(2.8)]
    assert len({a.get_connectionstyle().rad for a in same_pair}) == 2
    fig.canvas.draw()
    assert overlaps(ax.texts) == []


def test_a_receive_whose_send_was_not_recorded_still_draws_its_message():
    recv = {"rank": 1, "op": "recv", "peer": 3, "after": [5.0], "start": 0.0}
    ax = draw_point_to_point([[], [recv]]).axes[0]
    assert len(arrows_on(ax)) == 1
    assert "(1) [5]" in texts_on(ax)
    assert "rank 3" in texts_on(ax)  # the world reaches the sender


def test_no_point_to_point_calls_is_explained():
    with pytest.raises(ValueError, match="no send/recv"):
        draw_point_to_point([[Call(0, "barrier")]])
    with pytest.raises(ValueError, match="send on rank 0 has no peer"):
        draw_point_to_point([[Call(0, "send")]])
    with pytest.raises(ValueError, match="needs at least rank and op"):
        draw_point_to_point([[{"op": "send"}]])


# --- one collective ------------------------------------------------------------------


def _cells(ax) -> list[str]:
    """The values printed in cells, left to right then top to bottom."""
    cells = [
        t
        for t in ax.texts
        if t.get_text() not in {"before", "after", "→"}
        and not t.get_text().startswith("rank ")
    ]
    cells.sort(key=lambda t: (round(t.get_position()[1], 3), t.get_position()[0]))
    return [t.get_text() for t in cells]


def _rank_labels(ax) -> list[str]:
    return [t for t in texts_on(ax) if t.startswith("rank ")]


def _after(ax) -> list[Rectangle]:
    """The cells right of the arrow: every rank's tensor after the call."""
    (arrow_x, *_) = {t.get_position()[0] for t in ax.texts if t.get_text() == "→"}
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_x() > arrow_x]


def test_an_all_reduce_shows_each_ranks_value_before_and_the_sum_after():
    calls = [lane[-1] for lane in example_events()]
    fig = draw_collective(calls)
    ax = fig.axes[0]
    assert ax.get_title() == (
        "all_reduce (sum) on 4 ranks\nevery rank gets the sum of every rank's tensor"
    )
    assert _rank_labels(ax) == [f"rank {r}" for r in range(4)]
    assert _cells(ax) == ["0", "6", "1", "6", "2", "6", "3", "6"]
    # After: white cells, a reduction over all ranks, as the legend says.
    after = _after(ax)
    assert len(after) == 4
    assert {matplotlib.colors.to_hex(p.get_facecolor()) for p in after} == {"#ffffff"}
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [f"rank {r}'s data" for r in range(4)] + ["sum over all ranks"]
    fig.canvas.draw()
    assert overlaps(ax.texts) == []


def test_a_broadcast_names_its_root_and_colours_every_copy_as_the_roots():
    calls = [lane[0] for lane in example_events()]
    ax = draw_collective(calls).axes[0]
    assert ax.get_title().splitlines()[0] == "broadcast from root 1 on 4 ranks"
    assert _rank_labels(ax)[1] == "rank 1 (root)"
    assert _cells(ax)[:6] == ["0", "0", "0", "10", "20", "30"]
    assert _cells(ax).count("30") == 5  # the root's before, and every rank's after
    after = _after(ax)
    assert len(after) == 4 * 3
    root_colour = matplotlib.colors.to_hex(after[3].get_facecolor())
    assert {matplotlib.colors.to_hex(p.get_facecolor()) for p in after} == {root_colour}


@pytest.mark.parametrize("op", list(example_collectives()))
def test_every_collective_prints_every_value_it_has(op):
    calls = example_collectives()[op]
    ax = draw_collective(calls).axes[0]
    assert ax.get_title().startswith(op)
    printed = Counter(_cells(ax))
    expected = Counter(
        "None" if v is None else f"{v:.4g}"
        for c in calls
        for side in ("before", "after")
        for v in flat(c[side])
    )
    if op in {"scatter", "gather"}:  # non-roots have no list: said once per rank
        said = [
            t for t in printed if " ".join(t.split()) == "— (only the root has a list)"
        ]
        assert [printed.pop(t) for t in said] == [3]
        expected.pop("None")
    assert printed == expected


def test_rooted_ops_say_where_the_data_goes():
    titles = {
        op: draw_collective(calls).axes[0].get_title().splitlines()[0]
        for op, calls in example_collectives().items()
        if op in {"scatter", "gather", "reduce"}
    }
    assert titles == {
        "scatter": "scatter from root 0 on 4 ranks",
        "gather": "gather to root 0 on 4 ranks",
        "reduce": "reduce (sum) to root 0 on 4 ranks",
    }


def test_values_not_recorded_show_their_shape_and_objects_draw_like_dicts():
    calls = [Call(r, "all_gather", shapes=[(1024,)], world_size=2) for r in range(2)]
    ax = draw_collective(calls).axes[0]
    assert texts_on(ax).count("values not recorded\nshape (1024,) float32") == 4
    as_dicts = [dataclasses.asdict(c) for c in calls]
    assert texts_on(draw_collective(as_dicts).axes[0]) == texts_on(ax)


def test_too_many_values_show_a_count_instead():
    calls = [
        Call(
            r,
            "broadcast",
            root=0,
            before=list(range(40)),
            after=list(range(40)),
            shapes=[(40,)],
        )
        for r in range(2)
    ]
    assert "40 values\nshape (40,) float32" in texts_on(draw_collective(calls).axes[0])


def test_a_collective_needs_one_calls_events():
    with pytest.raises(ValueError, match="no events"):
        draw_collective([])
    with pytest.raises(
        ValueError, match=r"different calls \(\['all_reduce', 'send'\]\)"
    ):
        draw_collective([Call(0, "all_reduce"), Call(1, "send")])


def _calls(op: str, n: int, value=float) -> list[dict]:
    """One call of ``op`` on ``n`` ranks, as the tracer records it (rank r holds
    ``value(10 r + i)`` in its tensor i)."""
    lists = [[[value(10 * r + i)] for i in range(n)] for r in range(n)]
    total = [sum(lists[j][i][0] for j in range(n)) for i in range(n)]
    fields = {
        "broadcast": lambda r: dict(root=0, before=lists[r][0], after=lists[0][0]),
        "scatter": lambda r: dict(
            root=0, before=lists[0] if r == 0 else None, after=lists[0][r]
        ),
        "gather": lambda r: dict(
            root=0, before=lists[r][0], after=[x[0] for x in lists] if r == 0 else None
        ),
        "all_gather": lambda r: dict(before=lists[r][0], after=[x[0] for x in lists]),
        "reduce": lambda r: dict(
            root=0, before=lists[r][0], after=[total[0]] if r == 0 else lists[r][0]
        ),
        "all_reduce": lambda r: dict(before=lists[r][0], after=[total[0]]),
        "reduce_scatter": lambda r: dict(before=lists[r], after=[total[r]]),
        "all_to_all": lambda r: dict(
            before=lists[r], after=[lists[i][r] for i in range(n)]
        ),
    }[op]
    return [
        dict(rank=r, op=op, world_size=n, reduce_op="sum", shapes=[(1,)], **fields(r))
        for r in range(n)
    ]


_OPS = [
    "broadcast",
    "scatter",
    "gather",
    "all_gather",
    "reduce",
    "all_reduce",
    "reduce_scatter",
    "all_to_all",
]


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("op", _OPS)
def test_a_collective_fits_the_projector_before_and_after_of_every_rank(op, world_size):
    fig = draw_collective(_calls(op, world_size))
    fit = projector_fit(fig)
    assert fit.fits, fit.problems
    ax = fig.axes[0]
    assert len(_rank_labels(ax)) == world_size
    assert texts_on(ax).count("→") == world_size  # a row per rank, before -> after
    fig.canvas.draw()
    assert overlaps(ax.texts) == []


@pytest.mark.parametrize("op", ["all_to_all", "scatter", "all_gather"])
def test_eight_ranks_still_fit_with_every_value_printed(op):
    calls = _calls(op, 8)
    fig = draw_collective(calls)
    fit = projector_fit(fig)
    assert fit.fits, fit.problems
    printed = Counter(_cells(fig.axes[0]))
    values = Counter(
        f"{v:.4g}"
        for c in calls
        for side in ("before", "after")
        for v in flat(c[side])
        if v is not None
    )
    assert printed >= values
    # The palette has seven colours: rank 7's is rank 0's, and the legend says so.
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[0] == ("rank 0's data" if op == "scatter" else "ranks 0, 7's data")


def test_values_too_wide_for_the_screen_show_their_shape_instead():
    # 8 ranks x 8 long numbers each side: the widest rows give way to their shape.
    calls = _calls("all_to_all", 8, value=lambda v: v / 3 + 1000)
    fig = draw_collective(calls)
    fit = projector_fit(fig)
    assert fit.fits, fit.problems
    shapes = [t for t in texts_on(fig.axes[0]) if t.startswith("8 values")]
    assert shapes and all(t.endswith("shape (1,)") for t in shapes)


def test_point_to_point_fits_the_projector():
    ping_pong = [
        [Call(0, "send", peer=1, before=[1.0]), Call(0, "recv", peer=1, start=2.0)],
        [
            Call(1, "recv", peer=0, after=[1.0]),
            Call(1, "send", peer=0, before=[10.0], start=1.0),
        ],
    ]
    figures = [draw_point_to_point(ping_pong), draw_point_to_point(_mixed())]
    for n in (2, 3, 4):  # pass_right: each rank isends to the next
        lanes = [[] for _ in range(n)]
        for r in range(n):
            lanes[r].append(
                Call(
                    r,
                    "isend",
                    peer=(r + 1) % n,
                    before=[10.0 * r],
                    start=float(r),
                    blocking=False,
                )
            )
            lanes[(r + 1) % n].append(
                Call((r + 1) % n, "irecv", peer=r, start=float(r), blocking=False)
            )
        figures.append(draw_point_to_point(lanes))
    for fig in figures:
        fit = projector_fit(fig)
        assert fit.fits, fit.problems


# --- timeline ------------------------------------------------------------------------


def test_a_timeline_has_a_bar_per_call_and_phase_in_ms_from_the_first():
    events, phases = example_events(), example_phases()
    fig = draw_rank_timeline(events, phases)
    ax = fig.axes[0]
    assert len(ax.patches) == sum(len(lane) for lane in events) + len(phases)
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        f"rank {r}" for r in range(4)
    ]
    # Rank 0's all-reduce: 9 ms to 14 ms after rank 0's broadcast began.
    reduce_colour = matplotlib.colors.to_rgba(OP_COLOURS["all_reduce"])
    bars = [p for p in ax.patches if p.get_facecolor() == reduce_colour]
    first = min(bars, key=lambda p: p.get_y())
    # (time.time() values hold about 0.2 us at today's dates)
    assert first.get_x() == pytest.approx(9, abs=1e-3)
    assert first.get_width() == pytest.approx(5, abs=1e-3)
    texts = texts_on(ax)
    assert texts.count("all_reduce") == 4
    assert texts.count("backward") == 4
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [
        "forward",
        "backward",
        "optimizer",
        "broadcast",
        "send",
        "all_reduce",
        "recv",
    ]
    assert ax.get_xlabel() == "time since the first call (ms)"


def test_non_blocking_calls_are_hatched_and_events_need_times():
    call = Call(0, "isend", peer=1, start=0.0, end=0.001, blocking=False)
    fig = draw_rank_timeline([[call]])
    assert fig.axes[0].patches[0].get_hatch() == "//"
    assert "non-blocking call" in [t.get_text() for t in fig.legends[0].get_texts()]
    with pytest.raises(ValueError, match="all_reduce on rank 0 has no start and end"):
        draw_rank_timeline([[{"rank": 0, "op": "all_reduce"}]])
    with pytest.raises(ValueError, match="nothing to draw"):
        draw_rank_timeline([[]])


def test_the_docstring_examples_run():
    for module in (
        workshop.draw.comm_diagrams,
        workshop.draw.p2p_diagram,
        workshop.draw.collective_diagram,
        workshop.draw.timeline_diagram,
    ):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_a_last_bar_too_narrow_for_its_label_is_labelled_beside_it():
    t = 1000.0
    events = [
        [
            {
                "rank": 0,
                "op": "all_reduce",
                "label": "bucket 0",
                "start": t + 0.002,
                "end": t + 0.020,
            },
            {
                "rank": 0,
                "op": "all_reduce",
                "label": "bucket 1",
                "start": t + 0.0295,
                "end": t + 0.030,
            },
            {
                "rank": 0,
                "op": "all_reduce",
                "label": "tiny",
                "start": t + 0.021,
                "end": t + 0.0212,
            },
        ]
    ]
    fig = draw_rank_timeline(events)
    ax = fig.axes[0]
    texts = {x.get_text(): x for x in ax.texts}
    assert set(texts) == {"bucket 0", "bucket 1", "tiny"}
    outside = texts["bucket 1"]
    assert outside.get_ha() == "left" and outside.get_position()[0] > 28.0
    assert texts["bucket 0"].get_ha() == "center"
    assert ax.get_xlim()[1] > 28.0 + 0.5  # room for the label was made


def test_narrow_bars_with_neighbours_are_labelled_under_them_without_overlap():
    # Short DDP buckets back to back: each label goes in the strip under the
    # communication row, in bar order, none on top of another.
    t = 50.0
    events = [
        [
            {
                "rank": r,
                "op": "all_reduce",
                "label": f"bucket {i}",
                "start": t + 0.010 + i * 0.0003,
                "end": t + 0.0102 + i * 0.0003,
            }
            for i in range(4)
        ]
        + [{"rank": r, "op": "all_reduce", "start": t + 0.05, "end": t + 0.0502}]
        for r in range(2)
    ]
    phases = [(r, "backward", t, t + 0.012) for r in range(2)]
    fig = draw_rank_timeline(events, phases)
    ax = fig.axes[0]
    canvas = FigureCanvasAgg(fig)  # the figure comes back closed, without one
    canvas.draw()
    renderer = canvas.get_renderer()
    for rank in (0, 1):
        under = [
            x
            for x in ax.texts
            if x.get_position()[1] > rank + 0.38 - 0.001
            and x.get_position()[1] < rank + 0.5
        ]
        assert [x.get_text() for x in under] == [f"bucket {i}" for i in range(4)]
        boxes = [x.get_window_extent(renderer) for x in under]
        for a, b in itertools.pairwise(boxes):
            assert a.x1 <= b.x0, "labels overlap"
        # In the strip under the bars, not on them; the first starts at its bar.
        assert all(x.get_va() == "top" for x in under)
        assert under[0].get_position()[0] < 10.3
