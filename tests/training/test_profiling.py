"""workshop.training.profile_steps: the costliest operators and a trace Perfetto can
open; a step on the CPU is profiled on the CPU (and leaves CUDA alone) on any machine,
a step on a GPU records the GPU's work too."""

from __future__ import annotations

import json

import pytest
import torch

from workshop.env import visible_gpu_count
from workshop.training.profiling import profile_steps

GPUS = visible_gpu_count()


def _one_step(device="cpu"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 14 * 14, 10),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 1, 16, 16), torch.randint(0, 10, (32,))
    x, y = x.to(device), y.to(device)
    calls = []

    def step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        calls.append(1)

    return step, calls


@pytest.mark.backward_in_process  # trains in this process: see conftest.py
def test_profile_names_the_costly_operators_and_writes_a_trace(tmp_path):
    step, calls = _one_step()
    report = profile_steps(step, steps=2, warmup=1, trace_dir=tmp_path, row_limit=8)
    assert len(calls) == 3  # one warm-up, two recorded
    # A CPU step, on a GPU node too: the GPU is neither recorded nor started.
    assert report.activities == ["CPU"] and report.steps == 2
    assert not torch.cuda.is_initialized()
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


def test_asking_for_cuda_without_a_gpu_is_explained(monkeypatch):
    import workshop.env

    monkeypatch.setattr(workshop.env, "visible_gpu_count", lambda: 0)
    with pytest.raises(
        ValueError, match=r"cuda=True but no CUDA GPU is visible here; pass cuda=None"
    ):
        profile_steps(lambda: None, cuda=True)
    with pytest.raises(ValueError, match=r"cuda='yes': pass True, False or None"):
        profile_steps(lambda: None, cuda="yes")


def _profile_on_the_rank_gpu():
    from workshop import rank_device

    step, _ = _one_step(rank_device())
    report = profile_steps(step, steps=2, warmup=1, row_limit=8)
    return report.activities, report.top


@pytest.mark.gpu
@pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU; none is visible here")
def test_a_step_on_the_gpu_records_the_gpu_work():
    from workshop import launch

    # In a rank: CUDA used in this process would keep later launches from forking.
    result = launch(_profile_on_the_rank_gpu, world_size=1, backend="nccl", show="none")
    activities, top = result.returns[0]
    assert activities == ["CPU", "CUDA"]
    device_ms = [op.self_device_ms for op in top]
    assert device_ms == sorted(device_ms, reverse=True) and device_ms[0] > 0
