"""The planner's transformer trained on real gloo ranks: what each rank holds, measured
by walking its tensors and autograd's saved tensors, against the planner's estimate of
the same layout; this machine turned into the estimator's GPU and network records; bad
input refused."""

from __future__ import annotations

import pytest

from workshop import launch
from workshop.env import visible_gpu_count
from workshop.features import fsdp2_fully_shard
from workshop.planner.estimator import estimate
from workshop.planner.layout import MODELS, Layout
from workshop.planner.measured import (
    layout_machine,
    measure_layout,
    measured_against_estimate,
)
from workshop.planner.transformer import build_transformer

TINY = MODELS["tiny"]


@pytest.fixture(scope="module")
def ddp_run():
    return launch(measure_layout, "tiny", 1, 0, 2, 2, world_size=2, show="none").returns


def test_ddp_ranks_hold_the_whole_model_its_gradients_and_adams_two_moments(ddp_run):
    psi = TINY.parameters()
    for result in ddp_run:
        held = result["held"]
        assert result["layout"] == Layout(
            dp=2, tp=1, zero=0, micro_batch=2, precision="fp32"
        )
        assert held["params"] == 4 * psi
        assert held["grads"] == 4 * psi
        # Adam: two fp32 moments per value, and one 4-byte step counter per tensor.
        tensors = sum(1 for _ in build_transformer(TINY).parameters())
        assert held["optimizer"] in (
            8 * psi,
            8 * psi + 4 * tensors,
            8 * psi + 8 * tensors,
        )
        assert held["activations"] > 0
        assert result["step_s"] > 0 and result["alone_flops"] > 0


def test_this_machine_becomes_a_gpu_and_network_record(ddp_run):
    gpu, network = layout_machine(ddp_run[0])
    assert gpu.bf16_tflops == gpu.fp32_tflops > 0
    assert network.intra_node_gbs == network.inter_node_gbs > 0
    assert network.alpha_intra > 0
    with pytest.raises(ValueError, match="measure_layout"):
        layout_machine({"world_size": 2})


@pytest.mark.skipif(fsdp2_fully_shard()[0] is None, reason="this torch has no FSDP2")
def test_fsdp_with_tensor_parallelism_holds_what_the_estimate_says():
    results = launch(
        measure_layout, "tiny", 2, 3, 2, 1, world_size=4, show="none"
    ).returns
    for result in results:
        assert "tensor parallelism over 2" in result["how"] and "FSDP2" in result["how"]
        _holds_the_estimate(result)
    table = measured_against_estimate(results)
    assert table.splitlines()[0] == "dp=2 tp=2 pp=1 ZeRO-3 fp32 mb=2x1 on 4 cpu ranks"
    assert all(len(line) <= 88 for line in table.splitlines())


def _holds_the_estimate(result):
    """Parameters and gradients to the byte; Adam's state plus its 4-byte step counter
    per tensor; the activations plus the loss's scalar (16 bytes at most) and, on CUDA,
    the flash attention kernel's random seed and offset (two 8-byte scalars a layer,
    saved even without dropout: an H200 held 68 bytes more for "tiny"'s 4 layers)."""
    gpu, network = layout_machine(result)
    est = estimate("tiny", result["layout"], gpu, network, gpus_per_node=4, mfu=1.0)
    held, tensors = result["held"], sum(1 for _ in build_transformer(TINY).parameters())
    assert held["params"] == est.memory["parameters"]
    assert held["grads"] == est.memory["gradients"]
    assert 0 <= held["optimizer"] - est.memory["optimizer"] <= 4 * tensors
    rng_state = 16 * TINY.layers if result["device"].startswith("cuda") else 0
    assert 0 <= held["activations"] - est.memory["activations"] <= 16 + rng_state


def test_ddp_memory_is_the_estimates(ddp_run):
    for result in ddp_run:
        _holds_the_estimate(result)
    assert "step (ms)" in measured_against_estimate(ddp_run)
    with pytest.raises(ValueError, match="needs the ranks' results"):
        measured_against_estimate([])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("resnet50",), "is a module"),
        (("tiny", 1, 2), "stages 1 and 2"),
        (("tiny", 1, 0, 0), "micro_batch=0"),
        (("nope",), "transformer-8b"),
    ],
)
def test_bad_input_is_refused_before_any_rank_starts(args, match):
    with pytest.raises(ValueError, match=match):
        measure_layout(*args)


def test_a_tensor_parallel_degree_that_does_not_divide_the_world_is_refused():
    with pytest.raises(Exception, match="tp=3 does not divide the world of 2"):
        launch(measure_layout, "tiny", 3, world_size=2, show="none")


@pytest.mark.gpu
@pytest.mark.skipif(
    visible_gpu_count() == 0, reason="needs a CUDA GPU; none is visible"
)
@pytest.mark.parametrize("zero", [0, 3])
def test_on_a_gpu_the_nccl_rank_holds_the_estimates_bytes(zero):
    # One NCCL rank per visible GPU, up to 2: FSDP2 and DDP on CUDA tensors.
    world = min(visible_gpu_count(), 2)
    results = launch(measure_layout, "tiny", 1, zero, 2, 2, world_size=world,
                     show="none").returns  # fmt: skip
    for result in results:
        assert result["device"].startswith("cuda")
        _holds_the_estimate(result)
