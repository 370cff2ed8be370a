"""The pipeline lesson: a model split across two devices, micro-batches, the GPipe
schedule and its bubbles. Gradients are checked against one pass over the whole batch;
GPU-only checks are skipped, with the reason, where GPUs are missing."""

from __future__ import annotations

import time

import pytest
import torch
from lesson_helpers import (
    CPU2,
    assert_same_grads,
    batch,
    lane,
    mlp,
    whole_batch_grads,
)
from torch import nn

from workshop.env import visible_gpu_count
from workshop.lessons import notebook01_pipeline as pipeline
from workshop.lessons.notebook01_devices import lesson_devices
from workshop.lessons.notebook01_pipeline import (
    Slot,
    TwoStageModel,
    bubble_fraction,
    pipeline_forward_backward,
    pipeline_schedule,
)

GPUS = visible_gpu_count()


def _two_stage(seed: int = 0) -> TwoStageModel:
    torch.manual_seed(seed)
    return TwoStageModel(CPU2, in_features=12, hidden=16, classes=5)


def test_the_schedule_of_two_stages_and_four_micro_batches():
    F, B = "forward", "backward"
    assert pipeline_schedule(2, 4) == [
        (0, 0, 0, F),
        (1, 0, 1, F),
        (1, 1, 0, F),
        (2, 0, 2, F),
        (2, 1, 1, F),
        (3, 0, 3, F),
        (3, 1, 2, F),
        (4, 1, 3, F),
        (5, 1, 0, B),
        (6, 0, 0, B),
        (6, 1, 1, B),
        (7, 0, 1, B),
        (7, 1, 2, B),
        (8, 0, 2, B),
        (8, 1, 3, B),
        (9, 0, 3, B),
    ]


def test_the_schedule_of_three_stages_and_two_micro_batches():
    F, B = "forward", "backward"
    slots = pipeline_schedule(3, 2)
    assert slots == [
        Slot(0, 0, 0, F),
        Slot(1, 0, 1, F),
        Slot(1, 1, 0, F),
        Slot(2, 1, 1, F),
        Slot(2, 2, 0, F),
        Slot(3, 2, 1, F),
        Slot(4, 2, 0, B),
        Slot(5, 1, 0, B),
        Slot(5, 2, 1, B),
        Slot(6, 0, 0, B),
        Slot(6, 1, 1, B),
        Slot(7, 0, 1, B),
    ]


@pytest.mark.parametrize(
    ("stages", "micro_batches", "expected"),
    [(2, 4, 1 / 5), (4, 8, 3 / 11), (3, 2, 1 / 2), (1, 5, 0.0), (2, 1, 1 / 2)],
)
def test_bubble_fraction(stages, micro_batches, expected):
    assert bubble_fraction(stages, micro_batches) == pytest.approx(expected)
    # The same share of empty cells in the schedule's grid.
    slots = pipeline_schedule(stages, micro_batches)
    cells = stages * (max(s.step for s in slots) + 1)
    assert (cells - len(slots)) / cells == pytest.approx(expected)


def test_counts_below_one_are_explained():
    with pytest.raises(
        ValueError, match=r"stages must be a whole number, 1 or more, not 0"
    ):
        pipeline_schedule(0, 4)
    with pytest.raises(
        ValueError, match=r"micro_batches must be a whole number, 1 or more, not -1"
    ):
        bubble_fraction(2, -1)


def test_two_stage_model_puts_a_stage_on_each_device():
    model = TwoStageModel(CPU2, in_features=12, hidden=16, classes=5)
    assert model.devices == CPU2
    assert len(model.stages) == 2
    assert model(torch.randn(3, 12)).shape == (3, 5)
    with pytest.raises(ValueError, match=r"TwoStageModel needs two devices, got cpu"):
        TwoStageModel(["cpu"])


@pytest.mark.backward_in_process  # trains in this process: see conftest.py
def test_the_pipeline_gives_the_gradients_of_the_wholebatch():
    model, (x, y), loss_fn = _two_stage(), batch(10), nn.CrossEntropyLoss()
    expected, expected_loss = whole_batch_grads(model, x, y, loss_fn)
    timeline = pipeline_forward_backward(model, x, y, 4, loss_fn)
    assert_same_grads(model, expected)
    assert timeline.loss == pytest.approx(expected_loss, rel=1e-6)
    assert timeline.micro_batch_sizes == [3, 3, 2, 2]  # uneven, weighted by size
    assert timeline.devices == ["cpu", "cpu"]
    assert timeline.parallel is False


@pytest.mark.backward_in_process  # trains in this process: see conftest.py
def test_the_pipeline_follows_the_schedule_and_says_why_it_did_not_overlap():
    model, (x, y) = _two_stage(), batch(8)
    timeline = pipeline_forward_backward(model, x, y, 4, nn.CrossEntropyLoss())
    assert len(timeline.events) == 16
    ran = [(e.device, e.micro_batch, e.phase) for e in timeline.events]
    planned = [(s.stage, s.micro_batch, s.phase) for s in pipeline_schedule(2, 4)]
    assert ran == planned
    assert timeline.schedule == pipeline_schedule(2, 4)
    for before, after in zip(timeline.events, timeline.events[1:], strict=False):
        assert before.end <= after.start
    assert "CPU stand-ins share the same cores" in timeline.note
    assert "the stages overlap only on 2 GPUs" in timeline.note
    assert "ideal bubble 20%" in timeline.note


@pytest.mark.backward_in_process  # trains in this process: see conftest.py
def test_stages_in_threads_give_the_same_gradients_in_order(monkeypatch):
    # What runs on two GPUs (one thread per stage), exercised on the CPU.
    monkeypatch.setattr(pipeline, "distinct_gpus", lambda devices: True)
    model, (x, y), loss_fn = _two_stage(), batch(10), nn.CrossEntropyLoss()
    expected, _ = whole_batch_grads(model, x, y, loss_fn)
    timeline = pipeline_forward_backward(model, x, y, 5, loss_fn)
    assert_same_grads(model, expected)
    assert timeline.parallel is True
    assert "one thread per stage" in timeline.note
    done = {(e.device, e.micro_batch, e.phase): e for e in timeline.events}
    for m in range(5):
        # A stage's input is its neighbour's output: work waits for it.
        assert done[1, m, "forward"].start >= done[0, m, "forward"].end
        assert done[0, m, "backward"].start >= done[1, m, "backward"].end
    for stage in (0, 1):
        assert lane(timeline.events, stage) == [
            (s.phase, s.micro_batch) for s in timeline.schedule if s.stage == stage
        ]


def test_a_failing_stage_stops_the_other_at_once(monkeypatch):
    monkeypatch.setattr(pipeline, "distinct_gpus", lambda devices: True)

    class Broken(nn.Module):
        def forward(self, h):
            raise RuntimeError("stage two is broken")

    model = TwoStageModel(CPU2, in_features=12, hidden=16, stage2=Broken())
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="stage two is broken"):
        pipeline_forward_backward(model, *batch(8), 4, nn.CrossEntropyLoss())
    assert time.monotonic() - start < 10  # not the 120 s a stage waits at most


def test_bad_micro_batches_and_models_are_explained():
    x, y = batch(10)
    with pytest.raises(
        ValueError, match=r"micro_batches must be a whole number from 1 to 10, not 0"
    ):
        pipeline_forward_backward(_two_stage(), x, y, 0, nn.CrossEntropyLoss())
    with pytest.raises(TypeError, match=r"Sequential has no matching 'stages'"):
        pipeline_forward_backward(mlp(), x, y, 2, nn.CrossEntropyLoss())


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 2, reason=f"needs two CUDA GPUs; {GPUS} visible here")
def test_on_two_gpus_the_stages_overlap():
    devices = lesson_devices(2).devices
    torch.manual_seed(0)
    model = TwoStageModel(devices, hidden=4096)
    x, y = torch.randn(512, 3, 32, 32), torch.randint(10, (512,))
    loss_fn = nn.CrossEntropyLoss()
    pipeline_forward_backward(model, x, y, 8, loss_fn)  # warm-up
    timeline = pipeline_forward_backward(model, x, y, 8, loss_fn)
    assert timeline.parallel is True
    first = [e for e in timeline.events if e.device == 0]
    second = [e for e in timeline.events if e.device == 1]
    overlaps = [
        (a, b) for a in first for b in second if a.start < b.end and b.start < a.end
    ]
    assert overlaps, "no work of the two stages ran at the same time"
