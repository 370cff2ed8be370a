"""A pipeline whose stages are ranks: the GPipe and 1F1B orders and the activations
each holds, every stage's gradients equal to the unsplit model's, 1F1B holding fewer
activations than GPipe, and a measured bubble that shrinks as micro-batches grow,
close to (p-1)/(m+p-1)."""

from __future__ import annotations

import functools
import itertools

import pytest

from workshop import LaunchError, launch
from workshop.parallel.pipeline_ranks import run_pipeline
from workshop.parallel.pipeline_schedules import (
    PIPELINE_SCHEDULES,
    gpipe_order,
    idle_fraction,
    one_f_one_b_order,
    peak_stored,
    schedule_order,
)
from workshop.training.precision import RELATIVE_TOLERANCE

# (stages, micro_batches): fewer, as many and more micro-batches than stages.
SHAPES = [(p, m) for p in (1, 2, 3, 4, 5) for m in (1, 2, 3, 4, 8)]
MICRO_BATCHES = 6  # more than the 2 or 3 stages launched: 1F1B then holds fewer


def _short(order):
    """[("forward", 0), ("backward", 0)] -> "F0 B0"."""
    return " ".join(f"{phase[0].upper()}{k}" for phase, k in order)


# --- the orders, without ranks --------------------------------------------------


@pytest.mark.parametrize("order_of", [gpipe_order, one_f_one_b_order])
def test_every_micro_batch_runs_forward_once_then_backward_once(order_of):
    for stages, m in SHAPES:
        for stage in range(stages):
            order = order_of(stage, stages, m)
            expected = [(ph, k) for ph in ("forward", "backward") for k in range(m)]
            assert sorted(order) == sorted(expected)
            for k in range(m):
                assert order.index(("forward", k)) < order.index(("backward", k))


def test_gpipe_runs_every_forward_before_any_backward():
    assert _short(gpipe_order(1, 3, 3)) == "F0 F1 F2 B0 B1 B2"


def test_one_f_one_b_warms_up_alternates_then_cools_down():
    assert _short(one_f_one_b_order(0, 4, 6)) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"
    assert _short(one_f_one_b_order(3, 4, 3)) == "F0 B0 F1 B1 F2 B2"  # the last
    assert _short(one_f_one_b_order(0, 4, 2)) == "F0 F1 B0 B1"  # too few to warm up


def test_one_f_one_b_warm_up_is_stages_minus_one_minus_stage_forwards():
    for stages, m in SHAPES:
        for stage in range(stages):
            order = one_f_one_b_order(stage, stages, m)
            warm_up = min(stages - 1 - stage, m)
            assert [ph for ph, _ in order[:warm_up]] == ["forward"] * warm_up
            # After the warm-up: forward, backward, forward, ... while forwards last.
            steady = [ph for ph, _ in order[warm_up : warm_up + 2 * (m - warm_up)]]
            assert steady == ["forward", "backward"] * (m - warm_up)


def test_gpipe_holds_every_micro_batch_and_1f1b_at_most_stages_minus_stage():
    for stages, m in SHAPES:
        for stage in range(stages):
            assert peak_stored(gpipe_order(stage, stages, m)) == m
            assert peak_stored(one_f_one_b_order(stage, stages, m)) == min(
                m, stages - stage
            )


def test_schedule_order_picks_by_name_and_explains_an_unknown_one():
    assert schedule_order("1F1B", 0, 3, 4) == one_f_one_b_order(0, 3, 4)
    assert schedule_order("gpipe", 2, 3, 4) == gpipe_order(2, 3, 4)
    with pytest.raises(
        ValueError, match=r"schedule='zigzag' is not .* pass one of 'gpipe', '1f1b'"
    ):
        schedule_order("zigzag", 0, 2, 2)


def test_orders_explain_a_stage_out_of_range_and_a_count_below_one():
    with pytest.raises(
        ValueError, match=r"stage must be a whole number from 0 to 2, not 3"
    ):
        gpipe_order(3, 3, 4)
    with pytest.raises(
        ValueError, match=r"micro_batches must be a whole number, 1 or more, not 0"
    ):
        one_f_one_b_order(0, 3, 0)


def test_peak_stored_refuses_a_backward_before_its_forward():
    with pytest.raises(
        ValueError, match=r"backward of micro-batch 1 before its forward"
    ):
        peak_stored([("forward", 0), ("backward", 1)])


def test_idle_fraction_counts_the_gaps_over_the_common_span():
    rank0 = [{"start": 0.0, "end": 1.0}]
    rank1 = [{"start": 1.0, "end": 2.0}, {"start": 2.0, "end": 3.0}]
    idle = idle_fraction([rank0, rank1])
    assert idle["span"] == pytest.approx(3.0)
    assert idle["busy"] == pytest.approx([1.0, 2.0])
    assert idle["per_rank"] == pytest.approx([2 / 3, 1 / 3])
    assert idle["overall"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"no events to measure"):
        idle_fraction([[], []])


# --- on real ranks ----------------------------------------------------------------


def _both_schedules(micro_batches, batch, stage_seconds=0.0):
    return {
        s: run_pipeline(s, micro_batches, batch, stage_seconds=stage_seconds)
        for s in PIPELINE_SCHEDULES
    }


@functools.cache
def _launched(stages):
    """Each rank's results under both schedules (one launch per world size)."""
    batch = 4 * MICRO_BATCHES
    result = launch(
        _both_schedules,
        MICRO_BATCHES,
        batch,
        world_size=stages,
        backend="gloo",
        show="none",
    )
    return result.returns


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("schedule", PIPELINE_SCHEDULES)
def test_each_stage_gets_the_unsplit_models_gradients_and_loss(stages, schedule):
    runs = [r[schedule] for r in _launched(stages)]
    for rank, run in enumerate(runs):
        # Gradients big enough for the comparison to mean something, and equal to
        # the whole model's on the whole batch within float32 rounding.
        assert run["max_abs_grad"] > 1e-3
        assert run["tolerance"] == pytest.approx(
            RELATIVE_TOLERANCE * max(1, run["max_abs_grad"])
        )
        assert run["max_abs_grad_diff"] <= run["tolerance"], f"rank {rank}"
        assert (run["world_size"], run["schedule"], run["rank"]) == (
            stages,
            schedule,
            rank,
        )
    # The micro-batches' losses add up to the full batch's; only the last has it.
    assert runs[-1]["loss"] == pytest.approx(runs[-1]["reference_loss"], rel=1e-5)
    assert [r["loss"] for r in runs[:-1]] == [None] * (stages - 1)


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("schedule", PIPELINE_SCHEDULES)
def test_events_follow_the_order_one_piece_of_work_at_a_time(stages, schedule):
    for rank, returned in enumerate(_launched(stages)):
        run = returned[schedule]
        events = run["events"]
        expected = schedule_order(schedule, rank, stages, MICRO_BATCHES)
        assert [(e["phase"], e["micro_batch"]) for e in events] == expected
        assert run["order"] == [list(w) for w in expected]
        assert {e["device"] for e in events} == {rank}
        for before, after in itertools.pairwise(events):
            assert before["start"] <= before["end"] <= after["start"]


@pytest.mark.parametrize("stages", [2, 3])
def test_1f1b_holds_fewer_activations_than_gpipe_when_micro_batches_exceed_stages(
    stages,
):
    returns = _launched(stages)
    gpipe = [r["gpipe"]["peak_stored"] for r in returns]
    one_f_one_b = [r["1f1b"]["peak_stored"] for r in returns]
    assert gpipe == [MICRO_BATCHES] * stages
    assert one_f_one_b == [stages - rank for rank in range(stages)]
    assert all(f < g for f, g in zip(one_f_one_b, gpipe, strict=True))


def _idle_by_micro_batches(schedule, stage_seconds):
    return {
        m: run_pipeline(schedule, m, 16, stage_seconds=stage_seconds)["events"]
        for m in (1, 8)
    }


@pytest.mark.parametrize("schedule", PIPELINE_SCHEDULES)
def test_measured_bubble_shrinks_with_more_micro_batches_near_the_formula(schedule):
    stages = 3
    # Sleeps of 30 ms (60 ms per backward) stand in for compute, so the ranks need
    # no cores of their own; on a loaded machine messages arrive late, which only
    # adds idle time, hence a band wider above the formula than below it.
    result = launch(
        _idle_by_micro_batches,
        schedule,
        0.03,
        world_size=stages,
        backend="gloo",
        show="none",
    )
    idle = {}
    for m in (1, 8):
        idle[m] = idle_fraction([r[m] for r in result.returns])["overall"]
        formula = (stages - 1) / (m + stages - 1)  # 2/3 for m=1, 1/5 for m=8
        assert formula - 0.1 <= idle[m] <= formula + 0.2, (m, idle[m], formula)
    assert idle[1] > idle[8] + 0.2, idle


def test_bad_settings_are_explained_before_any_message():
    with pytest.raises(
        ValueError, match=r"schedule='zigzag' is not .* pass one of 'gpipe', '1f1b'"
    ):
        run_pipeline("zigzag")
    with pytest.raises(
        ValueError, match=r"micro_batches must be a whole number, 1 or more, not 0"
    ):
        run_pipeline("gpipe", micro_batches=0)
    with pytest.raises(
        ValueError,
        match=r"batch=32 does not divide into micro_batches=5 equal pieces; pass a "
        r"batch that is a multiple of 5 \(e\.g\. 30\)",
    ):
        run_pipeline("gpipe", micro_batches=5, batch=32)
    with pytest.raises(
        ValueError,
        match=r"stage_seconds must be a number of seconds, 0 or more, not -1",
    ):
        run_pipeline("gpipe", stage_seconds=-1)
    # Good settings but no process group: this is not a rank.
    with pytest.raises(RuntimeError, match=r"launch\(run_pipeline, world_size=2\)"):
        run_pipeline("gpipe")


def test_a_world_of_one_rank_is_refused():
    with pytest.raises(
        LaunchError,
        match=r"a pipeline needs 2 or more stages, one per rank, but world_size=1; "
        r"launch it with world_size=2 or more",
    ):
        launch(run_pipeline, world_size=1, backend="gloo", show="none")
