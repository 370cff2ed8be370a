"""The planner's estimator (estimator, with its search, its memory terms in memory and
its time terms in step_time): each formula against a value worked out by hand, the
parameter, gradient and optimizer terms against ``memory.zero_bytes``, the
activation formula against the bytes autograd really saves for this package's Block
(``saved_tensors_hooks`` on CPU), the search of layouts, and bad input refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import workshop.planner.step_time as lt
from workshop.comm.bucket_plan import plan_buckets
from workshop.planner import step_time
from workshop.planner.estimator import best_layouts, describe_estimate, estimate, table
from workshop.planner.layout import GPUS, MODELS, NETWORKS, Layout, ModelShape
from workshop.planner.memory import (
    activation_bytes,
    layer_activation_bytes,
    stage_parameters,
    zero_bytes,
)
from workshop.planner.operations import stage_record
from workshop.planner.step_time import ring_time
from workshop.planner.transformer import build_transformer
from workshop.training.models import saved_tensor_bytes

H100, NET = GPUS["H100 80GB"], NETWORKS["NVLink 4 + NDR 400G"]
# Small enough for a CPU, with every feature of the block: GQA (4 heads, 2 kv heads).
SMALL = ModelShape("small", layers=4, hidden=64, heads=4, kv_heads=2, vocab=256, seq=32,
                   ffn=96, mlp="swiglu")  # fmt: skip
B8 = MODELS["transformer-8b"]


# --- the alpha-beta model --------------------------------------------------------
def test_ring_collectives_follow_the_alpha_beta_formulas():
    # 8 GPUs, 1 GB at 450 GB/s, 5 us a message: 2 * 7/8 * 1e9 / 450e9 + 14 * 5e-6.
    assert ring_time("all_reduce", 8, 1e9, 450.0, 5e-6) == pytest.approx(
        2 * 7 / 8 / 450 + 14 * 5e-6
    )
    assert ring_time("all_gather", 8, 1e9, 450.0, 5e-6) == pytest.approx(
        7 / 8 / 450 + 7 * 5e-6
    )
    assert ring_time("reduce_scatter", 4, 2e9, 50.0, 1e-5) == pytest.approx(
        3 / 4 * 2 / 50 + 3e-5
    )
    assert ring_time("send", 2, 1e8, 50.0, 1e-5) == pytest.approx(1e8 / 50e9 + 1e-5)
    assert ring_time("all_reduce", 1, 1e9, 450.0, 5e-6) == 0.0
    with pytest.raises(ValueError, match="kind='broadcast'"):
        ring_time("broadcast", 8, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="n=0"):
        ring_time("all_reduce", 0, 1.0, 1.0, 0.0)


# --- parameters, gradients, optimizer ---------------------------------------------
@pytest.mark.parametrize("shape", [SMALL, SMALL.with_(tied=True), MODELS["tiny"]])
@pytest.mark.parametrize("pp", [1, 2, 4])
def test_stage_parameters_are_what_build_transformer_builds(shape, pp):
    for stage in range(pp):
        built = build_transformer(shape, stage, pp)
        assert stage_parameters(shape, stage, pp) == sum(
            p.numel() for p in built.parameters()
        )
    if pp == 1:
        assert stage_parameters(shape) == shape.parameters()


def test_tensor_parallelism_splits_every_matrix_and_keeps_the_norms_whole():
    h, kv, f, v = 64, 32, 96, 256
    block = 2 * h * h + 2 * h * kv + 3 * h * f  # matrices of one block
    first = 2 * (block // 2 + 2 * h) + v * h // 2  # 2 of 4 layers, half the embedding
    last = 2 * (block // 2 + 2 * h) + h + v * h // 2
    assert stage_parameters(SMALL, 0, 2, tp=2) == first
    assert stage_parameters(SMALL, 1, 2, tp=2) == last


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_parameters_gradients_optimizer_are_zero_bytes(zero, precision):
    layout = Layout(dp=8, tp=2, pp=2, zero=zero, precision=precision)
    est = estimate(B8, layout)
    stage = 0 if "stage 0 of" in est.formulas["stage"] else 1
    psi = stage_parameters(B8, stage, 2, 2)
    # FSDP2 with bf16 compute keeps fp32 shards: 4 + 4 + 8, as fp32 does.
    table = "mixed" if precision == "bf16" and zero < 3 else "fp32"
    want = zero_bytes(psi, 8, zero, table)
    got = est.memory
    assert (got["parameters"], got["gradients"], got["optimizer"]) == (
        want["params"],
        want["grads"],
        want["optimizer"],
    )
    if zero == 3:
        assert got["parameters"] + got["gradients"] + got["optimizer"] == pytest.approx(
            16 * psi / 8, abs=3
        )


def test_fsdp_buffers_hold_two_gathered_blocks_one_of_gradients_and_the_root():
    est = estimate(B8, Layout(dp=8, zero=3, precision="bf16"))
    block = B8.layer_parameters()
    root = B8.parameters() - B8.layers * block
    # Gathered parameters in bf16, the unsharded gradients in fp32 (the reduce dtype).
    assert est.memory["buffers"] == (2 * block + root) * 2 + block * 4
    ddp = estimate(B8, Layout(dp=8, zero=0, precision="fp32", checkpointing="full"))
    assert ddp.memory["buffers"] == ddp.memory["gradients"] == 4 * B8.parameters()


# --- activations against what autograd saves -----------------------------------------
def _tp_rank_block(shape: ModelShape, tp: int) -> nn.Module:
    """What one of ``tp`` tensor-parallel ranks computes of a block: its share of
    q, k, v and the MLP's columns, of o's and down's rows (the all-reduces aside)."""
    block = build_transformer(shape.with_(layers=1), device="cpu").blocks[0]
    h, kv, f = shape.hidden, shape.kv_heads * shape.head_dim, shape.ffn
    attn, mlp = block.attn, block.mlp
    attn.q, attn.o = (
        nn.Linear(h, h // tp, bias=False),
        nn.Linear(h // tp, h, bias=False),
    )
    attn.k, attn.v = (nn.Linear(h, kv // tp, bias=False) for _ in range(2))
    mlp.up, mlp.down = (
        nn.Linear(h, f // tp, bias=False),
        nn.Linear(f // tp, h, bias=False),
    )
    if shape.mlp == "swiglu":
        mlp.gate = nn.Linear(h, f // tp, bias=False)
    return block


def _needs_fused_attention(dtype: torch.dtype) -> None:
    """Skip where this torch runs SDPA's math path on the CPU: it stores the s x s
    scores, which the formula (a fused kernel, as on a GPU) leaves out."""
    q = torch.randn(1, 2, SMALL.seq, 8, dtype=dtype, requires_grad=True)
    shapes: list[tuple[int, ...]] = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t
    ):
        nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    if any(shape[-2:] == (SMALL.seq, SMALL.seq) for shape in shapes):
        pytest.skip(
            f"torch {torch.__version__} runs SDPA's math path on this CPU for "
            f"{dtype}: it stores the s x s scores a fused kernel does not"
        )


@pytest.mark.parametrize("mlp", ["swiglu", "gelu"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("tp", [1, 2])
def test_a_blocks_saved_tensors_are_the_formulas_bytes(mlp, precision, tp):
    # On this CPU, SDPA runs its fused flash kernel (fp32 and bf16): it saves q, k, v,
    # its output and an fp32 log-sum-exp, as the GPU's flash and memory-efficient
    # kernels do; the formula then matches exactly. (The math fallback would add the
    # s x s scores; a GPU's flash kernel also saves a few bytes of random-number state.)
    shape = SMALL.with_(mlp=mlp)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    _needs_fused_attention(dtype)
    block = _tp_rank_block(shape, tp).to(dtype)
    x = torch.randn(3, shape.seq, shape.hidden, dtype=dtype, requires_grad=True)
    measured = saved_tensor_bytes(lambda: block(x), block.parameters())
    assert measured == layer_activation_bytes(shape, 3, tp, precision)


def test_a_module_is_measured_on_the_meta_device_as_on_the_cpu():
    small = MODELS["small-cnn"]
    with torch.random.fork_rng(devices=[]):
        module = small.builder()
    sample = torch.randn(1, *small.sample)
    on_cpu = saved_tensor_bytes(lambda: module(sample), module.parameters())
    assert activation_bytes(small, Layout(micro_batch=1, precision="fp32")) == on_cpu
    assert (
        activation_bytes(small, Layout(micro_batch=5, precision="fp32")) == 5 * on_cpu
    )


def test_pipeline_stages_hold_their_micro_batches_in_flight():
    per_layer = layer_activation_bytes(B8, 1, 1, "bf16")
    sb, h, v = B8.seq, B8.hidden, B8.vocab
    for m, in_flight in ((8, 4), (2, 2)):
        layout = Layout(dp=1, pp=4, micro_batches=m)
        assert activation_bytes(B8, layout, 0) == in_flight * (8 * per_layer + 8 * sb)
        assert activation_bytes(B8, layout, 2) == min(2, m) * 8 * per_layer
        last = 8 * per_layer + 2 * sb * (3 * h + 1) + 4 * sb * v + 8 * sb
        assert activation_bytes(B8, layout, 3) == last


def test_full_checkpointing_keeps_block_inputs_and_one_blocks_set():
    layout = Layout(dp=1, pp=2, micro_batches=4, checkpointing="full")
    per_layer = layer_activation_bytes(B8, 1, 1, "bf16")
    inputs = 16 * 2 * B8.seq * B8.hidden  # 16 layers on a stage, bf16 s x h each
    assert activation_bytes(B8, layout, 0) == 2 * (inputs + 8 * B8.seq) + per_layer
    selective = estimate(B8, Layout(checkpointing="selective"))
    # A fused attention kernel stores no scores: selective recomputation saves nothing.
    assert selective.memory == estimate(B8, Layout()).memory


# --- time ----------------------------------------------------------------------------
def _seconds(record, kind, per, links, mfu=None):
    """Seconds of ``record``'s operations of ``kind`` run ``per`` block or
    micro-batch, each timed at its own shape: the sum the step is made of."""
    return sum(
        op.count * lt.operation_time(op, H100, NET, "bf16", mfu, links)
        for op in record.of(per)
        if op.kind == kind
    )


def _pace(est):
    """One micro-batch on the estimate's stage: its compute and what is exposed of
    its tensor- and pipeline-parallel communication (no data parallelism here)."""
    parts = est.parts
    return (
        parts["matrix products"] + parts["memory-bound"] + parts["exposed comm"]
    ) / est.layout.micro_batches


def test_compute_bubble_and_pipeline_sends_by_hand():
    layout = Layout(tp=2, pp=4, micro_batch=1, micro_batches=8)
    est = estimate(B8, layout, mfu=0.5, stage=3)
    rec = est.record
    assert (rec.stage, rec.layers) == (3, 8)
    # tp groups lie within a node of 8; pp groups (ranks r, r + 2, r + 4, r + 6) too.
    links = {"tp": (2, False), "dp": (1, False), "pp": (4, False)}
    # The step's products and memory-bound operations: the sum of each operation at
    # its own shape, 8 blocks and the edges (the last stage: final norm, head, loss).
    for kind, part in (("matmul", "matrix products"), ("memory", "memory-bound")):
        by_hand = 8 * (8 * _seconds(rec, kind, "block", links, 0.5)
                       + _seconds(rec, kind, "micro-batch", links, 0.5))  # fmt: skip
        assert by_hand > 0
        assert est.parts[part] == pytest.approx(by_hand)
    # The optimizer: 38 bytes a parameter this GPU holds, at the GPU's bandwidth.
    assert est.parts["optimizer"] == pytest.approx(rec.psi * 38 / 2970e9)
    assert est.time["compute"] == pytest.approx(
        est.parts["matrix products"]
        + est.parts["memory-bound"]
        + est.parts["optimizer"]
    )
    assert est.step == pytest.approx(sum(est.parts.values()))
    # Sends: the last stage sends each micro-batch's gradient back, a middle one
    # also an activation on; e s b h each, at the bus bandwidth of that size.
    size = 2 * B8.seq * B8.hidden
    send = lt.collective_time(NET, "send", 4, size, False)
    assert est.collectives["send_recv pp"] == (8, 8 * size)
    assert est.time["pp comm"] == pytest.approx(8 * send)
    middle = estimate(B8, layout, mfu=0.5, stage=1)
    assert middle.collectives["send_recv pp"] == (16, 16 * size)
    assert middle.time["pp comm"] == pytest.approx(2 * est.time["pp comm"])
    # The bubble: (p - 1) x the slowest stage's micro-batch, and each other stage
    # waits for the slowest every micro-batch. The last holds the head: the slowest.
    paces = [_pace(estimate(B8, layout, mfu=0.5, stage=s)) for s in range(4)]
    assert max(paces) == paces[3]
    assert est.time["bubble"] == pytest.approx(3 * paces[3])
    assert middle.time["bubble"] == pytest.approx(
        8 * (paces[3] - paces[1]) + 3 * paces[3]
    )
    # Interleaving with v chunks divides the schedule's bubble by v.
    two = estimate(B8, dataclasses.replace(layout, virtual_stages=2), mfu=0.5, stage=3)
    assert two.time["bubble"] == pytest.approx(3 / 2 * _pace(two))
    assert two.parts["matrix products"] == pytest.approx(est.parts["matrix products"])
    # Twice the micro-batches: twice the products, the same bubble.
    more = estimate(B8, dataclasses.replace(layout, micro_batches=16), mfu=0.5, stage=3)
    assert more.parts["matrix products"] == pytest.approx(
        2 * est.parts["matrix products"]
    )
    assert more.time["bubble"] == pytest.approx(est.time["bubble"])


def test_full_checkpointing_runs_the_blocks_forward_again_but_not_the_head():
    full = estimate(B8, Layout(checkpointing="full"), mfu=0.5)
    plain = estimate(B8, Layout(), mfu=0.5)
    links = {"tp": (1, False), "dp": (1, False), "pp": (1, False)}
    head = _seconds(plain.record, "matmul", "micro-batch", links, 0.5)
    assert head > 0
    # Forward, and backward's two products of each (the same FLOPs): 3 units; the
    # recomputed forward makes 4, at the same shapes.
    assert full.parts["matrix products"] - head == pytest.approx(
        4 / 3 * (plain.parts["matrix products"] - head)
    )
    per_block = full.record.flops("block")
    assert per_block == pytest.approx(4 / 3 * plain.record.flops("block"))


def test_tensor_parallelism_across_nodes_runs_at_the_network_speed():
    layout = Layout(dp=8, tp=8, zero=1, micro_batches=8, checkpointing="full")
    inside = estimate(B8, layout, gpus_per_node=8)
    across = estimate(B8, layout, gpus_per_node=4)
    size = 2 * B8.seq * B8.hidden
    # Per micro-batch: per layer 2 forward + 2 recomputed + 5 backward (q, k, v, up,
    # gate each reduce their input's gradient), + the embedding's and the head's.
    calls = 8 * (32 * (2 + 2 + 5) + 2)
    assert inside.collectives["all_reduce tp"] == (calls, calls * size)
    assert across.collectives == inside.collectives
    for est, crosses in ((inside, False), (across, True)):
        assert est.time["tp comm"] == pytest.approx(
            calls * lt.collective_time(NET, "all_reduce", 8, size, crosses)
        )
    # Between nodes the NIC (47 GB/s at most) is the limit, not NVLink.
    assert across.time["tp comm"] > 5 * inside.time["tp comm"]
    assert across.step > inside.step
    assert across.parts["matrix products"] == inside.parts["matrix products"]
    # A world that is not a whole number of nodes is allowed.
    assert estimate(B8, Layout(dp=12, zero=3), gpus_per_node=8).time["dp comm"] > 0


def test_a_stages_tensors_add_up_to_its_parameters():
    for stage in range(2):
        record = stage_record(B8, Layout(tp=2, pp=2), stage)
        assert sum(record.tensor_sizes) == record.psi
        assert record.psi == stage_parameters(B8, stage, 2, 2)
    # Uneven stages: 32 layers on 5 stages, 6 or 7 a stage, all 32 held once.
    records = [stage_record(B8, Layout(pp=5), s) for s in range(5)]
    assert sorted(r.layers for r in records) == [6, 6, 6, 7, 7]
    assert sum(sum(r.tensor_sizes) for r in records) == B8.parameters()
    tiny = MODELS["tiny"]
    assert sum(stage_record(tiny, Layout(), 0).tensor_sizes) == tiny.parameters()


def test_ddp_overlaps_its_all_reduce_with_the_backward_pass():
    layout = Layout(dp=4, zero=0, micro_batch=2, precision="bf16", checkpointing="full")
    est = estimate("transformer-1b", layout)
    size = 2 * MODELS["transformer-1b"].parameters()
    # DDP's buckets, planned as workshop.comm.bucket_plan plans them: last layer first.
    grads = [2 * v for v in est.record.tensor_sizes]
    count = len(plan_buckets(grads[::-1]))
    assert 1 < count < len(grads)
    assert est.collectives["all_reduce dp"] == (count, size)
    assert est.time["dp comm"] == pytest.approx(
        count * lt.collective_time(NET, "all_reduce", 4, size / count, False)
    )
    # It runs during the last micro-batch's backward pass (2/3 of its compute):
    # only what outlasts it is exposed.
    backward = 2 / 3 * (est.parts["matrix products"] + est.parts["memory-bound"])
    exposed = max(0.0, est.time["dp comm"] - backward)
    assert est.parts["exposed comm"] == pytest.approx(exposed)
    assert est.step == pytest.approx(est.time["compute"] + exposed)
    assert est.step < est.time["compute"] + est.time["dp comm"]  # some is hidden


def test_fsdp_collectives_per_block_and_root():
    layout = Layout(dp=8, zero=3, micro_batches=2)
    est = estimate(B8, layout)
    block, root = B8.layer_parameters(), B8.parameters() - 32 * B8.layer_parameters()
    # Per micro-batch: each block gathered in forward and backward, the root once;
    # gathered in bf16, reduced in fp32.
    assert est.collectives["all_gather dp"] == (2 * 65, 2 * 2 * (64 * block + root))
    reduced = 4
    assert est.collectives["reduce_scatter dp"] == (
        2 * 33,
        2 * reduced * (32 * block + root),
    )


def test_module_models_use_the_measured_throughput():
    est = estimate("resnet50", Layout(dp=8, micro_batch=64, micro_batches=2))
    assert est.time["compute"] == pytest.approx(
        128 / step_time.MEASURED[("resnet50", "H100 80GB", "bf16")][0]
    )
    assert "GPU-NODE.md" in est.formulas["compute"]
    mine = estimate("resnet50", Layout(dp=8, micro_batch=64), samples_per_s=1000.0)
    assert mine.time["compute"] == pytest.approx(0.064)
    # Without a measurement: FLOPs at the efficiency ResNet-50 reached on the node, so
    # the FLOP estimate of the measured case gives the measured throughput back.
    flops = estimate("resnet50", Layout(micro_batch=64), mfu=lt._module_mfu())
    assert flops.time["compute"] == pytest.approx(64 / 3980.0)


# --- reading and searching -----------------------------------------------------------
def test_describe_and_table_fit_88_columns():
    ests = [
        estimate(
            B8,
            Layout(
                dp=8, tp=8, pp=2, zero=3, micro_batches=8, checkpointing="selective"
            ),
        ),
        estimate("resnet50", Layout(dp=4, micro_batch=32)),
    ]
    for text in [describe_estimate(e) for e in ests] + [table(ests)]:
        assert max(len(line) for line in text.splitlines()) <= 88
    assert "stage" in describe_estimate(ests[0]) and "GB" in describe_estimate(ests[0])
    assert len(table(ests).splitlines()) == 3


def test_every_term_has_a_formula_with_a_source():
    est = estimate(B8, Layout(dp=4, tp=2, pp=2, zero=2, micro_batches=4))
    for term in (*est.memory, *est.time, "step"):
        assert term in est.formulas
    assert "Korthikanti" in est.formulas["activations"]
    assert "Rajbhandari" in est.formulas["optimizer"]
    assert "Thakur" in est.formulas["dp comm"]


# --- bad input ---------------------------------------------------------------------
def test_bad_input_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="'gpt5' is not one the planner knows"):
        estimate("gpt5", Layout())
    with pytest.raises(ValueError, match=r"gpu='B200'.*H100 80GB"):
        estimate(B8, Layout(), gpu="B200")
    with pytest.raises(ValueError, match="network='ethernet'"):
        estimate(B8, Layout(), network="ethernet")
    with pytest.raises(ValueError, match="is not a Layout"):
        estimate(B8, {"dp": 8})
    with pytest.raises(ValueError, match="tp=3 does not divide"):
        estimate(B8, Layout(tp=3))
    with pytest.raises(ValueError, match=r"pp=33 x virtual_stages=1 is more than"):
        estimate(B8, Layout(pp=33))
    # Stages that do not divide the layers are allowed: 32 on 5 stages.
    assert estimate(B8, Layout(pp=5)).record.layers in (6, 7)
    with pytest.raises(ValueError, match="only by data"):
        estimate("resnet50", Layout(tp=2))
    with pytest.raises(ValueError, match=r"checkpointing='full'.*module"):
        estimate("resnet50", Layout(checkpointing="full"))
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match=r"mfu must be a fraction of the GPU's"):
            estimate(B8, Layout(), mfu=bad)
    with pytest.raises(ValueError, match="samples_per_s must be a number above 0"):
        estimate("resnet50", Layout(), samples_per_s=-1)
    with pytest.raises(ValueError, match="gpus_per_node=0"):
        estimate(B8, Layout(), gpus_per_node=0)
    with pytest.raises(ValueError, match=r"stage must be a whole number from 0 to 1"):
        estimate(B8, Layout(pp=2), stage=2)
    with pytest.raises(ValueError, match="micro_batch=0"):
        layer_activation_bytes(B8, 0)
    with pytest.raises(
        ValueError, match="precision must be one of 'fp32' or 'bf16', not 'fp16'"
    ):
        layer_activation_bytes(B8, 1, 1, "fp16")
    with pytest.raises(ValueError, match="resnet50 is a module"):
        layer_activation_bytes("resnet50")
    with pytest.raises(ValueError, match=r"stage must be a whole number from 0 to 0"):
        activation_bytes(B8, Layout(), 1)
    with pytest.raises(ValueError, match="needs a transformer"):
        stage_parameters("small-cnn")
    with pytest.raises(ValueError, match="gpus=0"):
        best_layouts(B8, 0)
    with pytest.raises(ValueError, match="global_batch=-4"):
        best_layouts(B8, 8, global_batch=-4)
    for top in (0, -1):  # an empty list, or all but the last, before (issue 35)
        with pytest.raises(ValueError, match=rf"top={top} must be a whole number, 1"):
            best_layouts(B8, 8, top=top)
