"""The slow tests of test_estimator.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: measured models and a
search of every layout."""

from __future__ import annotations

import doctest

import pytest
import torch
from test_estimator import B8, SMALL, _needs_fused_attention
from torch import nn

import workshop.planner.estimator as le
import workshop.planner.layout as ll
import workshop.planner.memory as lm
import workshop.planner.step_time as lt
from workshop.planner.estimator import best_layouts, estimate
from workshop.planner.layout import Layout, ModelShape
from workshop.planner.memory import (
    activation_bytes,
)
from workshop.planner.transformer import build_transformer
from workshop.training.models import saved_tensor_bytes


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_whole_models_saved_tensors_with_its_loss_are_the_formulas_bytes(precision):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    _needs_fused_attention(dtype)
    model = build_transformer(SMALL, device="cpu").to(dtype)
    ids, targets = (torch.randint(0, SMALL.vocab, (2, SMALL.seq)) for _ in range(2))

    def step():
        logits = model(ids)
        return nn.functional.cross_entropy(
            logits.float().flatten(0, 1), targets.flatten()
        )

    measured = saved_tensor_bytes(step, model.parameters())
    formula = activation_bytes(SMALL, Layout(micro_batch=2, precision=precision))
    # The loss also saves a 0-dimensional fp32 scalar (nll_loss's total weight): the
    # formula leaves such scalars out, so allow 16 bytes.
    assert 0 <= measured - formula <= 16


def test_any_module_can_be_estimated_by_measuring_it():
    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))

    mine = ModelShape("my-mlp", kind="module", builder=build, sample=(32,))
    est = estimate(mine, Layout(dp=2, micro_batch=8, precision="fp32"), mfu=0.5)
    psi = 32 * 64 + 64 + 64 * 10 + 10
    assert est.memory["parameters"] + est.memory["gradients"] == 8 * psi
    # Saved for backward: the input (32) and ReLU's output (64: ReLU's backward needs
    # it, and it is the second layer's input), fp32, 8 samples.
    assert est.memory["activations"] == 8 * 4 * (32 + 64)
    # Training FLOPs: 3 x forward (2 per multiply-add).
    flops = 3 * 2 * (32 * 64 + 64 * 10)
    assert est.time["compute"] == pytest.approx(8 * flops / (67e12 * 0.5))
    assert estimate(mine, Layout(dp=1, zero=3)).memory["buffers"] == 0


def test_best_layouts_fit_use_every_gpu_and_are_sorted():
    best = best_layouts(B8, 64, global_batch=256, top=None)
    assert best, "an 8B model fits 64 GPUs of 80 GB"
    for est in best:
        assert (
            est.fits and est.layout.world_size == 64 and est.layout.global_batch == 256
        )
    steps = [e.step for e in best]
    assert steps == sorted(steps)
    # More GPUs for the same global batch: the estimator's best step is not slower.
    wider = best_layouts(B8, 128, global_batch=256, top=1)[0]
    assert wider.step <= best[0].step


def test_the_docstring_examples_run():
    for module in (le, ll, lm, lt):
        assert doctest.testmod(module).failed == 0, module.__name__
