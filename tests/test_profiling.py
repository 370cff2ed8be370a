"""workshop.profile_steps: the costliest operators and a trace Perfetto can open."""

from __future__ import annotations

import json

import pytest
import torch

from workshop.profiling import profile_steps


def _one_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 14 * 14, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 1, 16, 16), torch.randint(0, 10, (32,))
    calls = []

    def step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        calls.append(1)

    return step, calls


def test_profile_names_the_costly_operators_and_writes_a_trace(tmp_path):
    step, calls = _one_step()
    report = profile_steps(step, steps=2, warmup=1, trace_dir=tmp_path, row_limit=8)
    assert len(calls) == 3  # one warm-up, two recorded
    assert report.activities == ["CPU"] and report.steps == 2
    names = [op.name for op in report.top]
    assert len(names) == 8
    assert any("conv" in n for n in names), names
    costs = [op.self_cpu_ms for op in report.top]
    assert costs == sorted(costs, reverse=True)
    assert "Self CPU" in report.table and names[0] in report.table
    trace = json.loads(report.trace.read_text())
    events = {e.get("name") for e in trace["traceEvents"]}
    assert any("conv" in str(n) for n in events)
    assert report.trace.name.endswith(".pt.trace.json")


def test_bad_step_counts_are_explained():
    with pytest.raises(
        ValueError,
        match=r"profile_steps needs steps >= 1 and warmup "
        r">= 0, got steps=0 and warmup=1",
    ):
        profile_steps(lambda: None, steps=0)
