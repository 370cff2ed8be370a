"""Mixed precision, measured: bfloat16 keeps about half the bytes for backward."""

from __future__ import annotations

import pytest
import torch

from workshop.training.precision import (
    autocast,
    float_format,
    low_precision_loss,
    saved_activation_bytes,
)

# The scaler tests run backward passes here: see conftest.py.
BACKWARD = pytest.mark.backward_in_process


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


def test_float_formats_split_their_bits_as_ieee_and_bfloat16_say():
    f32, f16, bf16 = (
        float_format(d) for d in (torch.float32, torch.float16, torch.bfloat16)
    )
    assert (f32["exponent_bits"], f32["fraction_bits"]) == (8, 23)
    assert (f16["exponent_bits"], f16["fraction_bits"]) == (5, 10)
    assert (bf16["exponent_bits"], bf16["fraction_bits"]) == (8, 7)
    assert f16["max"] == 65504.0 and f16["smallest_subnormal"] == 2.0**-24
    # bfloat16 keeps float32's exponent, hence its range.
    assert bf16["smallest_normal"] == f32["smallest_normal"]
    assert f16["name"] == "float16"
    # The smallest subnormal really is the smallest value above 0.
    for fmt, dtype in ((f16, torch.float16), (bf16, torch.bfloat16)):
        tiny = torch.tensor(fmt["smallest_subnormal"], dtype=dtype)
        assert tiny > 0 and tiny / 2 == 0


def test_float_format_refuses_what_is_not_a_float_type():
    for bad in (torch.int32, "float16", None):
        with pytest.raises(ValueError, match=r"needs a floating-point torch dtype"):
            float_format(bad)


@BACKWARD
@pytest.mark.parametrize("gradient", [1e-3, 0.5, 3.0])
def test_the_loss_hands_every_weight_the_gradient(gradient):
    for dtype in (torch.float16, torch.bfloat16):
        w = torch.zeros(5, requires_grad=True)
        loss = low_precision_loss(w, gradient, dtype)
        assert loss.dtype == torch.float32
        loss.backward()
        torch.testing.assert_close(
            w.grad, torch.full((5,), gradient), rtol=2e-2, atol=0.0
        )


@BACKWARD
def test_a_small_float16_gradient_vanishes_unless_scaled():
    w = torch.zeros(4, requires_grad=True)
    low_precision_loss(w, 1e-8).backward()
    assert torch.count_nonzero(w.grad) == 0  # below 2**-24: rounded to 0
    w.grad = None
    (low_precision_loss(w, 1e-8) * 2.0**16).backward()
    torch.testing.assert_close(
        w.grad / 2.0**16, torch.full((4,), 1e-8), rtol=1e-2, atol=0.0
    )
    w.grad = None
    low_precision_loss(w, 1e-8, torch.bfloat16).backward()  # no scale needed
    torch.testing.assert_close(w.grad, torch.full((4,), 1e-8), rtol=1e-2, atol=0.0)


@BACKWARD
def test_too_large_a_scale_overflows_to_inf():
    w = torch.zeros(2, requires_grad=True)
    (low_precision_loss(w, 0.5) * 2.0**17).backward()
    assert torch.isinf(w.grad).all()


@BACKWARD
def test_a_grad_scaler_skips_inf_steps_backs_off_and_grows():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=2)
    w = torch.zeros(3, requires_grad=True)
    optimizer = torch.optim.SGD([w], lr=1.0)
    scales, moved = [], []
    for gradient in (1e-8, 1e-8, 0.5, 0.5):
        optimizer.zero_grad()
        before = w.detach().clone()
        scaler.scale(low_precision_loss(w, gradient)).backward()
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
        moved.append(not torch.equal(before, w.detach()))
    # two good steps double the scale; inf at 2**17 halves it and skips the step
    assert scales == [2.0**16, 2.0**17, 2.0**16, 2.0**16]
    assert moved == [True, True, False, True]


def test_bad_low_precision_losses_are_explained():
    w = torch.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match=r"dtype=torch.float64; pass torch.float16"):
        low_precision_loss(w, 1.0, torch.float64)
    with pytest.raises(ValueError, match=r"requires_grad=True, got Tensor"):
        low_precision_loss(torch.zeros(2), 1.0)
    with pytest.raises(ValueError, match=r"requires_grad=True, got list"):
        low_precision_loss([0.0], 1.0)
    with pytest.raises(ValueError, match=r"gradient=1e-12 is out of range for"):
        low_precision_loss(w, 1e-12)
    with pytest.raises(ValueError, match=r"gradient=-1.0 is out of range"):
        low_precision_loss(w, -1.0, torch.bfloat16)
    with pytest.raises(ValueError, match=r"gradient=nan is out of range"):
        low_precision_loss(w, float("nan"))
