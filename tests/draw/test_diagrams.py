"""Diagrams of one node's devices: the bars, labels, lanes and titles they show, drawn
from plain data (and from what notebook01_devices really measured)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from workshop.draw.diagrams import (
    PHASE_COLOURS,
    draw_data_parallel_step,
    draw_schedule,
    draw_timeline,
)
from workshop.lessons.notebook01_devices import Event, StepRecord
from workshop.lessons.notebook01_pipeline import bubble_fraction, pipeline_schedule

ROOT = Path(__file__).resolve().parents[2]
MS = 1e-3


def _step_record() -> StepRecord:
    """A two-device data-parallel step, times in seconds, as notebook01_devices
    records it."""
    events = [
        Event("scatter", 0, 0.0, 0.1 * MS),
        Event("scatter", 1, 0.1 * MS, 0.2 * MS),
        Event("replicate", 0, 0.2 * MS, 1 * MS),
        Event("replicate", 1, 1 * MS, 2 * MS),
        Event("forward", 0, 2 * MS, 4 * MS),
        Event("forward", 1, 4 * MS, 6 * MS),
        Event("gather", 0, 6 * MS, 6.1 * MS),
        Event("loss", 0, 6.1 * MS, 6.5 * MS),
        Event("backward", 0, 6.5 * MS, 9 * MS),
        Event("backward", 1, 9 * MS, 11.5 * MS),
        Event("reduce", 0, 11.5 * MS, 12 * MS),
    ]
    return StepRecord(
        events=events,
        chunk_sizes=[2, 2],
        devices=["cpu", "cpu"],
        parallel=False,
        loss=1.0,
        note="",
    )


def _pipeline_events() -> list[Event]:
    """Two stages, four micro-batches, one ms each: the ideal GPipe picture."""
    events = []
    for m in range(4):
        events.append(Event("forward", 0, m * MS, (m + 1) * MS, m))
        events.append(Event("forward", 1, (m + 1) * MS, (m + 2) * MS, m))
        events.append(Event("backward", 1, (5 + m) * MS, (6 + m) * MS, m))
        events.append(Event("backward", 0, (6 + m) * MS, (7 + m) * MS, m))
    return events


def _lane_of(patch) -> int:
    return round(patch.get_y() + patch.get_height() / 2)


def _bars_per_lane(ax) -> Counter:
    return Counter(_lane_of(p) for p in ax.patches)


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def _legend(fig) -> list[str]:
    return [t.get_text() for t in fig.legends[0].get_texts()]


def _ticks(ax) -> list[str]:
    return [t.get_text() for t in ax.get_yticklabels()]


# --- data-parallel step --------------------------------------------------------------


def test_a_data_parallel_step_has_a_bar_per_phase_in_each_lane():
    fig = draw_data_parallel_step(_step_record())
    ax = fig.axes[0]
    assert _bars_per_lane(ax) == {0: 7, 1: 4}
    assert _ticks(ax) == ["device 0 (cpu)\n2 samples", "device 1 (cpu)\n2 samples"]
    assert ax.get_xlabel() == "time since the step began (ms)"
    assert ax.get_ylabel() == "device"
    assert ax.get_title() == (
        "One data-parallel step, phase by phase\n2 devices, replicas one after another"
    )
    # Each phase in its colour, with its wall time (first start to last end) in ms.
    assert _legend(fig) == [
        "scatter 0.20 ms",
        "replicate 1.80 ms",
        "forward 4.00 ms",
        "gather 0.10 ms",
        "loss 0.40 ms",
        "backward 5.00 ms",
        "reduce 0.50 ms",
    ]
    forward = [p for p in ax.patches if p.get_x() == pytest.approx(2.0)]
    assert len(forward) == 1
    assert matplotlib.colors.to_hex(forward[0].get_facecolor()) == (
        PHASE_COLOURS["forward"].lower()
    )
    assert forward[0].get_width() == pytest.approx(2.0)


def test_tiny_phases_stay_visible():
    record = _step_record()
    record.events[6] = Event("gather", 0, 6 * MS, 6.01 * MS)
    fig = draw_data_parallel_step(record)
    gather = next(p for p in fig.axes[0].patches if p.get_x() == pytest.approx(6.0))
    # 0.01 ms of a 12 ms step is drawn at 0.4 % of the step so its colour shows...
    assert gather.get_width() == pytest.approx(12 * 0.004)
    # ...and on top of the longer bars, while the legend keeps the true time.
    assert fig.axes[0].patches[-1] is gather
    assert "gather 0.01 ms" in _legend(fig)


def test_a_saved_record_draws_the_same_picture():
    record = _step_record()
    saved = dataclasses.asdict(record)  # what json.dump would keep
    from_dict = draw_data_parallel_step(saved).axes[0]
    from_object = draw_data_parallel_step(record).axes[0]
    assert [p.get_bbox().bounds for p in from_dict.patches] == [
        p.get_bbox().bounds for p in from_object.patches
    ]


def test_replicas_at_the_same_time_are_said_in_the_title():
    record = dataclasses.replace(_step_record(), parallel=True)
    title = draw_data_parallel_step(record, title="On two GPUs").axes[0].get_title()
    assert title == "On two GPUs\n2 devices, replicas at the same time"


def test_an_empty_record_is_explained():
    record = dataclasses.replace(_step_record(), events=[])
    with pytest.raises(ValueError, match="the record has no events"):
        draw_data_parallel_step(record)


# --- timeline ------------------------------------------------------------------------


def test_a_timeline_labels_each_bar_with_its_micro_batch():
    fig = draw_timeline(_pipeline_events(), "GPipe", lanes=["cuda:0", "cuda:1"])
    ax = fig.axes[0]
    assert _bars_per_lane(ax) == {0: 8, 1: 8}
    # Each bar's micro-batch, on the bar: the forward's and the backward's.
    placed = Counter(
        (t.get_text(), round(2 * t.get_position()[0]), round(t.get_position()[1]))
        for t in ax.texts
    )
    expected = Counter(
        (str(e.micro_batch), round((e.start + e.end) / MS), e.device)
        for e in _pipeline_events()
    )
    assert placed == expected
    assert all(t.get_fontsize() == 16 for t in ax.texts)
    assert ax.get_title() == "GPipe"
    assert ax.get_xlabel() == "time (ms)"
    assert _legend(fig) == ["forward", "backward", "idle (waiting)"]


def test_idle_time_is_blank_and_counted_per_lane():
    ax = draw_timeline(_pipeline_events(), "GPipe", lanes=["cuda:0", "cuda:1"]).axes[0]
    # 8 of 10 ms busy on each lane: the pipeline's bubble.
    assert _ticks(ax) == ["device 0 (cuda:0)\nidle 20%", "device 1 (cuda:1)\nidle 20%"]
    # The first stage waits between its last forward (4 ms) and first backward (6 ms).
    for p in ax.patches:
        if _lane_of(p) == 0:
            assert p.get_x() + p.get_width() <= 4 or p.get_x() >= 6


def test_bars_too_narrow_for_a_label_go_unlabelled():
    events = [
        *_pipeline_events(),
        Event("forward", 0, 10 * MS, 10.001 * MS, 9),
    ]
    ax = draw_timeline(events, "with a sliver").axes[0]
    assert len(ax.patches) == 17
    assert "9" not in _texts(ax)
    assert len(ax.texts) == 16
    assert _ticks(ax)[0].startswith("device 0\n")


def test_a_timeline_object_names_its_own_lanes():
    @dataclasses.dataclass
    class Timeline:  # the fields of notebook01_pipeline.Timeline that drawing reads
        events: list
        devices: list

    ax = draw_timeline(Timeline(_pipeline_events(), ["cpu", "cpu"]), "pipeline").axes[0]
    assert _ticks(ax) == ["device 0 (cpu)\nidle 20%", "device 1 (cpu)\nidle 20%"]


def test_timeline_errors_are_explained():
    with pytest.raises(ValueError, match="no events to draw"):
        draw_timeline([], "nothing")
    with pytest.raises(ValueError, match=r"events use 2 lanes but 1 lane names"):
        draw_timeline(_pipeline_events(), "GPipe", lanes=["cuda:0"])
    with pytest.raises(ValueError, match=r"is not an event: it needs phase, device"):
        draw_timeline([{"phase": "forward", "device": 0}], "half an event")


# --- schedule ------------------------------------------------------------------------


def test_the_schedule_grid_has_a_cell_per_piece_of_work():
    fig = draw_schedule(pipeline_schedule(2, 4))
    ax = fig.axes[0]
    assert len(ax.patches) == 16
    cells = {(round(p.get_x()), _lane_of(p)) for p in ax.patches}
    assert len(cells) == 16
    # 2 stages x 10 steps: 4 empty cells, the bubbles.
    assert len({(x, y) for x in range(10) for y in range(2)} - cells) == 4
    placed = {
        (round(t.get_position()[0] - 0.5), round(t.get_position()[1])): t.get_text()
        for t in ax.texts
    }
    assert placed[0, 0] == "F0"
    assert placed[4, 1] == "F3"
    assert placed[5, 1] == "B0"
    assert placed[9, 0] == "B3"
    assert (0, 1) not in placed and (4, 0) not in placed
    assert _ticks(ax) == ["stage 0", "stage 1"]
    assert ax.get_xlabel() == "time step"
    assert ax.get_ylabel() == "pipeline stage"
    assert ax.get_title() == (
        "GPipe schedule: 2 stages, 4 micro-batches\nbubbles: 4 of 20 slots idle = 20%"
    )
    assert _legend(fig) == ["forward", "backward", "bubble (idle)"]


@pytest.mark.parametrize(("stages", "micro_batches"), [(3, 2), (4, 8), (1, 3)])
def test_the_schedule_title_gives_the_bubble_fraction(stages, micro_batches):
    ax = draw_schedule(pipeline_schedule(stages, micro_batches)).axes[0]
    assert ax.get_title().endswith(f"= {bubble_fraction(stages, micro_batches):.0%}")
    assert len(ax.texts) == len(ax.patches) == 2 * stages * micro_batches


def test_schedule_errors_are_explained():
    with pytest.raises(ValueError, match="the schedule is empty"):
        draw_schedule([])
    with pytest.raises(ValueError, match=r"two pieces of work share a \(step, stage\)"):
        draw_schedule([(0, 0, 0, "forward"), (0, 0, 1, "forward")])


# --- how figures behave --------------------------------------------------------------


def test_figures_are_closed_in_pyplot_and_save_as_png(tmp_path):
    fig = draw_schedule(pipeline_schedule(2, 4))
    assert not plt.fignum_exists(fig.number)  # so a cell shows it once
    path = tmp_path / "schedule.png"
    fig.savefig(path, dpi=50)
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_diagrams_import_neither_torch_nor_the_launcher():
    # Loaded as a file, not through workshop/__init__, which imports the launcher.
    path = ROOT / "workshop" / "draw" / "diagrams.py"
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('d', {str(path)!r})\n"
        "diagrams = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(diagrams)\n"
        "import matplotlib; matplotlib.use('Agg')\n"
        "diagrams.draw_schedule([(0, 0, 0, 'forward'), (1, 0, 0, 'backward')])\n"
        "event = dict(phase='forward', device=0, start=0, end=1)\n"
        "diagrams.draw_timeline([event], 'one event')\n"
        "print(sorted(m for m in sys.modules\n"
        "             if m.split('.')[0] in ('torch', 'workshop')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_long_schedule_keeps_its_colours_and_drops_labels_that_do_not_fit():
    ax = draw_schedule(pipeline_schedule(4, 16)).axes[0]
    assert len(ax.patches) == 2 * 4 * 16  # every cell still drawn
    assert len(ax.texts) == 0  # 38 steps: "F15" at 12 points is wider than a cell
    assert ax.get_title().endswith(f"= {bubble_fraction(4, 16):.0%}")


@pytest.mark.parametrize(
    "draw, match",
    [
        (lambda: draw_timeline(None, "t"), "events is None; pass what pipeline_"),
        (lambda: draw_data_parallel_step(None), "record is None; pass what data_"),
    ],
)
def test_nothing_to_draw_says_what_to_pass(draw, match):
    with pytest.raises(TypeError, match=match):
        draw()
