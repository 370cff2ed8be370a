"""The step-cost model behind "more GPUs, faster?": measured timings, the fit, and
the speed-ups it predicts."""

from __future__ import annotations

import pytest
import torch

from workshop.throughput import (
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
