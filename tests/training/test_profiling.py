"""workshop.training.profiling: the costliest operators and a trace Perfetto can
open; a step on the CPU is profiled on the CPU (and leaves CUDA alone) on any machine,
a step on a GPU records the GPU's work too. torch.profiler's schedule, predicted
and recorded: recorded_steps agrees with torch's own schedule function and with the
steps a real run's traces hold; trace names are shown without host, PID or time."""

from __future__ import annotations

import gzip
import json
import os

import pytest
import torch
from torch.profiler import ProfilerAction, profile, schedule, tensorboard_trace_handler

from workshop.env import visible_gpu_count
from workshop.training.profiling import (
    profile_steps,
    recorded_steps,
    stable_trace_name,
    trace_files,
    trace_steps,
)

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


SCHEDULES = [
    (12, dict(wait=1, warmup=1, active=3, repeat=2)),
    (12, dict(wait=1, warmup=1, active=3)),
    (20, dict(wait=2, warmup=1, active=2, repeat=3)),
    (9, dict(wait=0, warmup=1, active=1)),
    (15, dict(wait=1, warmup=1, active=2, repeat=1, skip_first=5)),
    (3, dict(wait=1, warmup=1, active=3)),
]


@pytest.mark.parametrize(("steps", "kwargs"), SCHEDULES)
def test_the_prediction_is_torchs_own_schedule(steps, kwargs):
    decide = schedule(**kwargs)
    recording = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
    expected = [s for s in range(steps) if decide(s) in recording]
    assert recorded_steps(steps, **kwargs) == expected


def test_the_documents_schedule_records_steps_2_to_4_of_each_cycle():
    assert recorded_steps(12, wait=1, warmup=1, active=3, repeat=2) == [
        2,
        3,
        4,
        7,
        8,
        9,
    ]
    assert recorded_steps(0, wait=1, warmup=1, active=3) == []


@pytest.mark.backward_in_process  # trains in this process: see conftest.py
def test_a_real_run_writes_one_trace_per_cycle_holding_the_recorded_steps(tmp_path):
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    log = tmp_path / "log"
    with profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
        on_trace_ready=tensorboard_trace_handler(str(log)),
    ) as prof:
        for _ in range(10):
            optimizer.zero_grad()
            model(torch.randn(8, 16)).sum().backward()
            optimizer.step()
            prof.step()
    traces = trace_files(log)
    assert [trace_steps(t) for t in traces] == [[2, 3], [6, 7]]
    assert recorded_steps(10, wait=1, warmup=1, active=2, repeat=2) == [2, 3, 6, 7]
    assert {stable_trace_name(t) for t in traces} == {"HOST_PID.TIME.pt.trace.json"}


def test_gzipped_traces_are_read_and_other_files_ignored(tmp_path):
    events = {"traceEvents": [{"name": "ProfilerStep#5"}, {"name": "aten::mm"},
                              {"name": "ProfilerStep#4"}, {"ph": "M"}]}  # fmt: skip
    path = tmp_path / "worker.17.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(events, f)
    (tmp_path / "notes.txt").write_text("not a trace")
    later = tmp_path / "worker.18.pt.trace.json"
    later.write_text(json.dumps({"traceEvents": []}))
    assert trace_files(tmp_path) == [path, later]
    assert trace_steps(path) == [4, 5] and trace_steps(later) == []
    assert stable_trace_name(path) == "worker.TIME.pt.trace.json.gz"
    assert stable_trace_name("my_trace.json") == "my_trace.json"
    assert stable_trace_name("node-7_4242.1700000000000.pt.trace.json") == (
        "HOST_PID.TIME.pt.trace.json"
    )


def test_quiet_profiler_silences_kineto_and_the_cycle_warning(monkeypatch):
    import warnings

    from workshop.training.profiling import quiet_profiler

    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_profiler()
        warnings.warn(
            "Warning: Profiler clears events at the end of each cycle.", stacklevel=1
        )
        warnings.warn("another warning", stacklevel=1)
    assert [str(w.message) for w in caught] == ["another warning"]
    assert os.environ["KINETO_LOG_LEVEL"] == "5"
    monkeypatch.setenv("KINETO_LOG_LEVEL", "1")
    quiet_profiler()
    assert os.environ["KINETO_LOG_LEVEL"] == "1"  # the user's choice is kept


def test_bad_input_is_explained(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"active must be a whole number, "
        r"1 or more, not 0",
    ):
        recorded_steps(5, wait=1, warmup=1, active=0)
    with pytest.raises(
        ValueError,
        match=r"wait must be a whole number, "
        r"0 or more, not -1",
    ):
        recorded_steps(5, wait=-1, warmup=1, active=1)
    with pytest.raises(
        ValueError,
        match=r"steps must be a whole number, "
        r"0 or more, not 2\.5",
    ):
        recorded_steps(2.5, wait=0, warmup=0, active=1)
    with pytest.raises(
        ValueError, match=r"repeat must be a whole number, 0 or more, not True"
    ):
        recorded_steps(5, wait=0, warmup=0, active=1, repeat=True)
    with pytest.raises(ValueError, match=r"is not a folder; pass the folder given"):
        trace_files(tmp_path / "missing")
    bad = tmp_path / "x.pt.trace.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"is not a torch.profiler trace"):
        trace_steps(bad)
