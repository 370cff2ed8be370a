"""Mixed precision, measured: bfloat16 keeps about half the bytes for backward."""

from __future__ import annotations

import pytest
import torch

from workshop.training.precision import autocast, saved_activation_bytes


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 16 * 16, 10),
    )


def test_bf16_keeps_about_half_the_bytes_of_fp32():
    model, x = _model(), torch.randn(8, 3, 16, 16)
    fp32 = saved_activation_bytes(model, x)
    bf16 = saved_activation_bytes(model, x, amp="bf16")
    # The input (8*3*16*16 floats) and two 16-channel maps, at least, are kept.
    assert fp32 >= 4 * (8 * 3 * 16 * 16 + 2 * 8 * 16 * 16 * 16)
    assert 0.4 < bf16 / fp32 < 0.65
    # The weights are kept once; twice the batch keeps twice the activations.
    weights = sum(4 * p.numel() for p in model.parameters() if p.dim() > 1)
    big = saved_activation_bytes(model, torch.randn(16, 3, 16, 16))
    assert big - fp32 == fp32 - weights


def test_nothing_is_kept_without_gradients():
    model = _model()
    with torch.no_grad():
        assert saved_activation_bytes(model, torch.randn(2, 3, 16, 16)) == 0


def test_autocast_modes():
    with autocast("bf16", "cpu"):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert torch.is_autocast_enabled("cpu")
    with pytest.raises(ValueError, match=r"amp='int8' is not known; pass amp=None"):
        autocast("int8", "cpu")
