"""One process, several devices: the device choice and its notes, and data
parallelism done by hand. Gradients are checked against one pass over the
whole batch; GPU-only checks are skipped, with the reason, where GPUs are missing."""

from __future__ import annotations

import copy

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
from workshop.lessons import notebook01_devices as single_node
from workshop.lessons.notebook01_devices import (
    data_parallel_step,
    lesson_devices,
    torch_data_parallel,
)

GPUS = visible_gpu_count()

# --- lesson_devices ----------------------------------------------------------------


def test_without_a_gpu_the_lesson_uses_cpu_stand_ins_and_says_so():
    lesson = lesson_devices(2, gpus=0)
    assert lesson.devices == CPU2
    assert lesson.gpus == 0
    assert "No GPU visible" in lesson.note
    assert "2 CPU stand-ins" in lesson.note
    assert "nothing runs at the same time" in lesson.note


def test_one_gpu_is_padded_with_the_cpu():
    lesson = lesson_devices(2, gpus=1)
    assert lesson.devices == [torch.device("cuda", 0), torch.device("cpu")]
    assert lesson.note.startswith("1 GPU visible, 2 wanted: using cuda:0, cpu")
    assert "the CPU standing in" in lesson.note


def test_enough_gpus_gives_that_many_gpus():
    lesson = lesson_devices(2, gpus=3)
    assert lesson.devices == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert lesson.note == "2 of the 3 visible GPUs: cuda:0, cuda:1; each is a real GPU."


def test_choosing_devices_does_not_initialise_cuda():
    was = torch.cuda.is_initialized()
    lesson = lesson_devices(2)
    assert torch.cuda.is_initialized() == was
    assert lesson.gpus == GPUS
    if GPUS == 0:
        assert "CPU" in lesson.note


def test_asking_for_no_devices_is_explained():
    with pytest.raises(ValueError, match=r"n must be a whole number, 1 or more, not 0"):
        lesson_devices(0)


# --- data parallel -----------------------------------------------------------------


@pytest.mark.backward_in_process  # trains in this process: see conftest.py
def test_data_parallel_step_gives_the_gradients_of_the_wholebatch():
    model, (x, y), loss_fn = mlp(), batch(10), nn.CrossEntropyLoss()
    expected, expected_loss = whole_batch_grads(model, x, y, loss_fn)
    record = data_parallel_step(model, x, y, ["cpu"] * 3, loss_fn)
    assert_same_grads(model, expected)
    assert record.loss == pytest.approx(expected_loss, rel=1e-6)
    assert record.chunk_sizes == [4, 4, 2]  # torch.chunk, as DataParallel scatters
    assert record.devices == ["cpu", "cpu", "cpu"]
    assert record.parallel is False


@pytest.mark.backward_in_process  # trains in this process: see conftest.py
def test_the_record_holds_every_phase_on_the_right_device():
    model, (x, y) = mlp(), batch(10)
    record = data_parallel_step(model, x, y, ["cpu"] * 3, nn.CrossEntropyLoss())
    per_device = ["scatter", "replicate", "forward", "backward"]
    assert [p for p, _ in lane(record.events, 0)] == [
        *per_device[:3],
        "gather",
        "loss",
        "backward",
        "reduce",
    ]
    for device in (1, 2):
        assert [p for p, _ in lane(record.events, device)] == per_device
    # On CPU stand-ins nothing overlaps: each phase starts after the one before ends.
    for before, after in zip(record.events, record.events[1:], strict=False):
        assert 0 <= before.start <= before.end <= after.start
    assert "CPU stand-ins share the same cores" in record.note
    assert "one after another" in record.note


@pytest.mark.backward_in_process  # trains in this process: see conftest.py
def test_gradients_accumulate_like_backward():
    model, (x, y), loss_fn = mlp(), batch(8), nn.MSELoss()
    y = torch.randn(8, 5)
    expected, _ = whole_batch_grads(model, x, y, loss_fn)
    data_parallel_step(model, x, y, CPU2, loss_fn)
    data_parallel_step(model, x, y, CPU2, loss_fn)
    # Twice the gradient, not three times: replicas do not carry the model's .grad.
    assert_same_grads(model, [2 * g for g in expected])


@pytest.mark.backward_in_process  # trains in this process: see conftest.py
def test_a_batch_smaller_than_the_devices_uses_fewer_devices():
    model, (x, y) = mlp(), batch(2)
    record = data_parallel_step(model, x, y, ["cpu"] * 3, nn.CrossEntropyLoss())
    assert record.chunk_sizes == [1, 1]
    assert lane(record.events, 2) == []


@pytest.mark.backward_in_process  # trains in this process: see conftest.py
def test_replicas_in_threads_give_the_same_gradients(monkeypatch):
    # What runs on distinct GPUs (one thread per replica), exercised on the CPU.
    monkeypatch.setattr(single_node, "distinct_gpus", lambda devices: True)
    model, (x, y), loss_fn = mlp(), batch(9), nn.CrossEntropyLoss()
    expected, _ = whole_batch_grads(model, x, y, loss_fn)
    record = data_parallel_step(model, x, y, ["cpu"] * 3, loss_fn)
    assert_same_grads(model, expected)
    assert record.parallel is True
    assert "at the same time, one thread per GPU" in record.note


def test_a_model_elsewhere_than_the_first_device_is_explained():
    model, (x, y) = mlp().to("meta"), batch(4)
    with pytest.raises(
        ValueError,
        match=r"the model's parameters are on meta but devices\[0\] is cpu; .*"
        r"call model\.to\('cpu'\) first",
    ):
        data_parallel_step(model, x, y, CPU2, nn.CrossEntropyLoss())


def test_no_devices_is_explained():
    with pytest.raises(ValueError, match=r"devices is empty; pass at least one"):
        data_parallel_step(mlp(), *batch(4), [], nn.CrossEntropyLoss())


def test_torch_data_parallel_leaves_the_model_alone_without_two_gpus():
    model = mlp()
    module, note = torch_data_parallel(model, CPU2)
    assert module is model
    assert note.startswith("Not wrapped: nn.DataParallel needs two GPUs or more")
    assert "cpu, cpu (0 GPUs)" in note


# --- pipeline ----------------------------------------------------------------------


# --- GPUs --------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU; none is visible here")
def test_one_gpu_and_the_cpu_give_the_gradients_of_the_wholebatch():
    model, (x, y), loss_fn = mlp().cuda(), batch(10), nn.CrossEntropyLoss()
    expected, _ = whole_batch_grads(model, x.cuda(), y.cuda(), loss_fn)
    record = data_parallel_step(model, x, y, ["cuda:0", "cpu"], loss_fn)
    assert_same_grads(model, expected)
    assert record.parallel is False
    assert "are not 2 distinct GPUs" in record.note


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 2, reason=f"needs two CUDA GPUs; {GPUS} visible here")
def test_on_two_gpus_the_step_matches_torch_data_parallel():
    devices = lesson_devices(2).devices
    model, (x, y), loss_fn = mlp().to(devices[0]), batch(10), nn.CrossEntropyLoss()
    reference = copy.deepcopy(model)
    record = data_parallel_step(model, x, y, devices, loss_fn)
    assert record.parallel is True
    wrapped, note = torch_data_parallel(reference, devices)
    assert isinstance(wrapped, nn.DataParallel)
    assert note.startswith("nn.DataParallel over cuda:0, cuda:1")
    loss_fn(wrapped(x.to(devices[0])), y.to(devices[0])).backward()
    assert_same_grads(model, [p.grad for p in reference.parameters()])
