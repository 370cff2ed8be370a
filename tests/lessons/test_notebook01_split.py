"""check_split: the model split across two devices against the same model unsplit;
it must pass for a correct split and fail for a wrong one."""

from __future__ import annotations

import pytest
import torch
from lesson_helpers import CPU2, batch
from torch import nn

from workshop.env import visible_gpu_count
from workshop.lessons.notebook01_pipeline import TwoStageModel
from workshop.lessons.notebook01_split import SplitCheck, check_split
from workshop.training.precision import RELATIVE_TOLERANCE

# Every test trains in this process: see conftest.py.
pytestmark = pytest.mark.backward_in_process

LOSS = nn.CrossEntropyLoss()


def _model(seed: int = 0, devices=CPU2, **stages) -> TwoStageModel:
    torch.manual_seed(seed)
    return TwoStageModel(devices, in_features=12, hidden=16, classes=5, **stages)


class _Doubled(TwoStageModel):
    """A wrong split: the activations are changed on their way between devices."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stages[0](x.to(self.devices[0]))
        return self.stages[1](2 * h.to(self.devices[1]))


def test_one_micro_batch_is_the_unsplit_model_bit_for_bit():
    x, y = batch(16)
    check = check_split(_model(), x, y, 1, LOSS)
    assert isinstance(check, SplitCheck)
    assert check.bitwise_outputs and check.bitwise_gradients and check.ok
    assert check.output_difference == check.gradient_difference == 0.0
    assert check.tolerance >= RELATIVE_TOLERANCE


@pytest.mark.parametrize("micro_batches", [2, 4, 16])
def test_micro_batches_give_the_gradients_within_rounding(micro_batches):
    x, y = batch(16)
    model = _model()
    check = check_split(model, x, y, micro_batches, LOSS)
    assert check.ok and check.bitwise_outputs
    assert check.micro_batches == micro_batches
    assert check.gradient_difference <= check.tolerance
    assert all(p.grad is not None for p in model.parameters())  # left the pipeline's
    line = check.summary()
    assert len(line) <= 88 and f"ok: {check.ok}" in line


def test_gradients_left_from_before_do_not_count():
    x, y = batch(16)
    model = _model()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    assert check_split(model, x, y, 4, LOSS).ok


def test_a_wrong_split_is_caught():
    x, y = batch(16)
    check = check_split(
        _Doubled(CPU2, in_features=12, hidden=16, classes=5), x, y, 4, LOSS
    )
    assert not check.ok and not check.bitwise_outputs
    assert check.output_difference > check.tolerance
    assert "ok: False" in check.summary()


def test_batchnorm_stages_differ_with_micro_batches():
    stage1 = nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU())
    x, y = batch(16)
    check = check_split(_model(stage1=stage1), x, y, 4, LOSS)
    assert not check.ok  # each micro-batch is normalised by its own statistics
    assert check.gradient_difference > check.tolerance


def test_bad_input_is_explained():
    x, y = batch(16)
    with pytest.raises(ValueError, match=r"16 inputs and 15 targets"):
        check_split(_model(), x, y[:15], 4, LOSS)
    with pytest.raises(ValueError, match=r"0 inputs and 0 targets"):
        check_split(_model(), x[:0], y[:0], 1, LOSS)
    with pytest.raises(
        ValueError, match=r"micro_batches must be a whole number from 1 to 16, not 0"
    ):
        check_split(_model(), x, y, 0, LOSS)
    with pytest.raises(TypeError, match=r"no matching 'stages' and 'devices'"):
        check_split(nn.Linear(12, 5), x, y, 1, LOSS)


@pytest.mark.skipif(visible_gpu_count() < 2, reason="needs 2 GPUs")
def test_on_two_gpus_the_split_is_the_unsplit_model():
    x, y = batch(64)
    model = _model(devices=["cuda:0", "cuda:1"])
    check = check_split(model, x, y, 4, LOSS)
    assert check.ok, check
