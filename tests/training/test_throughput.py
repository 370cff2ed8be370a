"""The step-cost model behind "more GPUs, faster?": measured timings, the fit, and
the speed-ups it predicts."""

from __future__ import annotations

import math
import re
import statistics

import pytest
import torch

from workshop.training.throughput import (
    StepCost,
    StepTiming,
    fit_step_cost,
    projected_speedup,
    time_steps,
)


def test_the_fit_recovers_a_known_cost():
    true = StepCost(fixed_s=0.004, per_sample_s=0.0002)
    timings = [StepTiming(b, true.seconds(b)) for b in (8, 32, 128, 512)]
    fitted = fit_step_cost(timings)
    assert fitted.fixed_s == pytest.approx(0.004, rel=1e-9)
    assert fitted.per_sample_s == pytest.approx(0.0002, rel=1e-9)
    assert fitted.fixed_share(8) == pytest.approx(0.004 / 0.0056)


def _plain_intercept(timings: list[StepTiming]) -> float:
    """The fixed cost an unweighted least-squares line through every timing gives
    (what fit_step_cost did before, then cut to 0 when negative)."""
    xs = [t.batch_size for t in timings]
    return statistics.linear_regression(xs, [t.seconds_per_step for t in timings])[1]


def test_a_slow_largest_batch_leaves_a_fixed_cost():
    # SmallCNN on two cores (2.8 ms + 0.18 ms per sample), the batch of 64 timed
    # while something else ran: 35 ms instead of 14.3. A plain line through the
    # points crosses zero below batch 0; notebook 01 then divided by a fixed 0.
    timings = [StepTiming(4, 0.0035), StepTiming(16, 0.0057), StepTiming(64, 0.035)]
    assert _plain_intercept(timings) < 0
    cost = fit_step_cost(timings)
    assert 0.001 < cost.fixed_s < 0.0035  # some, and less than the smallest step
    assert cost.per_sample_s > 0
    # Relative errors count: the two undisturbed steps are fitted to within 30%;
    # the plain line, pulled by the slow step, misses the batch of 4 by over half.
    for t in timings[:2]:
        assert cost.seconds(t.batch_size) == pytest.approx(t.seconds_per_step, rel=0.3)
    plain = statistics.linear_regression([4, 16, 64], [0.0035, 0.0057, 0.035])
    assert plain.intercept + plain.slope * 4 < 0.5 * 0.0035
    assert 1 < cost.speedup_limit(64) < math.inf


def test_a_disturbed_repeat_is_outvoted_by_the_others():
    true = StepCost(fixed_s=0.003, per_sample_s=0.0002)
    timings = [
        StepTiming(b, true.seconds(b) * slower)
        for b in (4, 16, 64)
        for slower in (1.0, 1.0, 6.0 if b == 64 else 1.0)
    ]
    assert _plain_intercept(timings) < 0
    fitted = fit_step_cost(timings)  # the medians: the undisturbed timings
    assert fitted.fixed_s == pytest.approx(0.003, rel=1e-9)
    assert fitted.per_sample_s == pytest.approx(0.0002, rel=1e-9)


def test_neither_cost_goes_below_zero():
    # Noise made the larger batches faster: the best line would slope down.
    cost = fit_step_cost([StepTiming(4, 0.010), StepTiming(16, 0.008),
                          StepTiming(64, 0.009)])  # fmt: skip
    assert cost.per_sample_s == 0 and cost.fixed_s == pytest.approx(0.0089, rel=0.01)
    assert cost.speedup_limit(64) == 1.0


def test_timings_in_proportion_to_the_batch_have_no_fixed_cost():
    cost = fit_step_cost([StepTiming(8, 0.008), StepTiming(32, 0.032)])
    assert cost == StepCost(0.0, 0.001)
    # Nothing divides by the missing fixed cost: no limit, and ideal speed-ups.
    assert cost.speedup_limit(64) == math.inf and cost.fixed_share(64) == 0
    assert projected_speedup(cost, 64, [1, 2, 4]) == [1.0, 2.0, 4.0]


@pytest.mark.parametrize("seconds", [0.0, -0.01, math.nan, math.inf])
def test_a_timing_that_is_not_a_positive_time_is_refused(seconds):
    bad = StepTiming(16, seconds)
    with pytest.raises(
        ValueError,
        match=rf"{re.escape(repr(bad))} cannot be fitted: a timing needs a batch size "
        r"above 0 and a positive, finite number of seconds per step",
    ):
        fit_step_cost([StepTiming(4, 0.01), bad])


def test_the_speedup_limit_is_one_over_the_fixed_share():
    cost = StepCost(0.01, 0.001)
    assert cost.speedup_limit(30) == pytest.approx(1 / cost.fixed_share(30)) == 4.0
    # Many devices approach it but never pass it.
    assert projected_speedup(cost, 30, [1000])[0] < cost.speedup_limit(30)


def test_a_fixed_cost_caps_the_speedup():
    # All fixed: more devices never help. All per-sample: ideal. Half and half at
    # one device: Amdahl's law, 1 / (0.5 + 0.5 / n).
    assert projected_speedup(StepCost(0.01, 0.0), 64, [1, 2, 8]) == [1.0, 1.0, 1.0]
    assert projected_speedup(StepCost(0.0, 0.001), 64, [1, 2, 8]) == [1.0, 2.0, 8.0]
    half = projected_speedup(StepCost(0.064, 0.001), 64, [1, 2, 4])
    assert half == pytest.approx([1.0, 1 / 0.75, 1 / 0.625])
    # Communication per step lowers every multi-device speed-up.
    with_comm = projected_speedup(StepCost(0.0, 0.001), 64, [1, 2], comm_s=0.032)
    assert with_comm == pytest.approx([1.0, 1.0])


def test_fit_needs_two_batch_sizes():
    with pytest.raises(
        ValueError,
        match=r"needs timings at two or more batch sizes, "
        r"got \[16\]; time e.g. batch sizes 16, 64 and 256",
    ):
        fit_step_cost([StepTiming(16, 0.1), StepTiming(16, 0.11)])


@pytest.mark.backward_in_process  # trains in this process: see conftest.py
def test_timing_a_real_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    before = [p.detach().clone() for p in model.parameters()]
    small = time_steps(model, 4, (1, 8, 8), 10, torch.device("cpu"), steps=3)
    large = time_steps(model, 512, (1, 8, 8), 10, torch.device("cpu"), steps=3)
    assert small.batch_size == 4 and small.seconds_per_step > 0
    assert large.samples_per_second > small.samples_per_second
    # The steps really trained the model.
    assert any(
        not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)
    )
