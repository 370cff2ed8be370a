"""The planner's formula sheet (operations.stage_record): the FLOPs of a block against
the published count, memory and time reading the same record, the layers of uneven
pipeline stages, the matrix-product rate read off measured points, the collectives
on a bus-bandwidth curve, and each of Korthikanti et al.'s iteration times."""

from __future__ import annotations

import math

import pytest

from workshop.planner.estimator import estimate
from workshop.planner.hardware import GPU, GPUS, Network
from workshop.planner.layout import Layout, ModelShape, model_shape
from workshop.planner.operations import Operation, stage_layers, stage_record
from workshop.planner.published_runs import PUBLISHED_RUNS, against_published
from workshop.planner.step_time import collective_time, matmul_rate, ring_time

# A GPT as Megatron-LM builds it (fused layers, GELU MLP of 4 h), small.
H, A, S, B, T_P = 256, 8, 128, 2, 2
GPT = ModelShape("gpt-small", layers=2, hidden=H, heads=A, vocab=512, seq=S,
                 fused=True, attention="unfused")  # fmt: skip


# --- FLOPs of one block ----------------------------------------------------------
def test_a_blocks_flops_are_the_published_count():
    # Forward, per block and micro-batch, on one of t ranks: 24 T h^2 for the four
    # products (q k v 6, o 2, up 8, down 8) and 4 T s h for QK^T and PV (Narayanan
    # et al. 2021, section 5.1; Korthikanti et al. 2022, section 6); the backward
    # pass twice the forward's.
    tokens = S * B
    forward = (24 * tokens * H**2 + 4 * tokens * S * H) / T_P
    layout = Layout(tp=T_P, micro_batch=B)
    record = stage_record(GPT, layout, 0)
    assert record.flops("block") == pytest.approx(3 * forward)
    forward_only = sum(op.flops * op.count for op in record.of("block", "forward"))
    assert forward_only == pytest.approx(forward)
    # Flash attention skips the masked half of the causal scores.
    flash = stage_record(GPT.with_(attention="flash"), layout, 0)
    assert flash.flops("block") == pytest.approx(
        3 * (24 * tokens * H**2 + 2 * tokens * S * H) / T_P
    )
    # Full recomputation runs the forward again: 4 units; selective the attention.
    full = stage_record(GPT, Layout(tp=T_P, micro_batch=B, checkpointing="full"), 0)
    assert full.flops("block") == pytest.approx(4 * forward)
    selective = Layout(tp=T_P, micro_batch=B, checkpointing="selective")
    assert stage_record(GPT, selective, 0).flops("block") == pytest.approx(
        3 * forward + 4 * tokens * S * H / T_P
    )


def test_the_backward_products_have_the_forwards_flops():
    record = stage_record(GPT, Layout(tp=T_P, micro_batch=B), 0)
    forward = {op.name: op.flops for op in record.of("block", "forward")
               if op.kind == "matmul"}  # fmt: skip
    for op in record.of("block", "backward"):
        if op.kind == "matmul":
            name = op.name.rsplit(" ", 1)[0]
            assert op.name.endswith(("dgrad", "wgrad"))
            assert op.flops == pytest.approx(forward[name])


# --- one record for memory and time --------------------------------------------
@pytest.mark.parametrize(
    ("model", "layout"),
    [
        ("transformer-8b", Layout(tp=2, pp=2, micro_batches=2)),
        ("transformer-8b", Layout(pp=5, micro_batches=5)),
        ("tiny", Layout(dp=2)),
        ("transformer-1b", Layout(precision="fp32")),
    ],
    ids=["tp2-pp2", "pp5-uneven", "tiny-dp2", "fp32"],
)
def test_memory_and_time_read_the_same_record(model, layout):
    est = estimate(model, layout)
    record = est.record
    assert record is not None and record.stage in (0, layout.pp - 1)
    # bf16 with ZeRO 0-2 keeps 2-byte parameters (fp32 masters in the optimizer
    # term), fp32 4 bytes.
    per = 2 if layout.precision == "bf16" else 4
    assert est.memory["parameters"] == pytest.approx(per * record.psi)
    assert record.psi == sum(record.tensor_sizes)
    # The optimizer step reads and writes the same Ψ: 38 bytes each (fused Adam).
    assert est.parts["optimizer"] == pytest.approx(
        record.psi * 38 / (est.gpu.memory_gbs * 1e9)
    )
    assert record == stage_record(model_shape(model), layout, record.stage)


# --- uneven pipeline stages -------------------------------------------------------
def test_stage_layers_spread_the_rest_over_the_middle_stages():
    # Llama 3 405B: 126 layers on 16 stages, one fewer on the first and the last.
    assert [stage_layers(126, 16, s) for s in range(16)] == [7] + [8] * 14 + [7]
    assert [stage_layers(32, 4, s) for s in range(4)] == [8] * 4
    assert stage_layers(5, 1, 0) == 5
    for layers in (1, 7, 32, 96, 105, 126, 128):
        for pp in range(1, layers + 1):
            split = [stage_layers(layers, pp, s) for s in range(pp)]
            assert sum(split) == layers, (layers, pp)
            assert max(split) - min(split) <= (1 if layers % pp else 0)
            if layers % pp:  # the middle stages take the rest first
                assert split[0] <= split[pp // 2]


# --- Korthikanti et al.'s iteration times ---------------------------------------
KORTHIKANTI = [run for run in PUBLISHED_RUNS if run.source.startswith("Korthikanti")]


def test_the_table_holds_korthikantis_eight_runs():
    assert len(KORTHIKANTI) == 8
    assert sorted(run.published for run in KORTHIKANTI) == [
        1.10, 1.42, 13.75, 18.13, 37.83, 49.05, 71.49, 94.42
    ]  # fmt: skip


@pytest.mark.parametrize("run", KORTHIKANTI, ids=lambda run: run.name)
def test_korthikantis_iteration_time_within_10_percent(run):
    (row,) = against_published((run,))
    assert run.measure == "seconds" and run.within == 0.10
    assert row.figure == row.estimate.step
    assert row.estimate.fits
    assert abs(row.estimate.step / run.published - 1) <= 0.10, (
        f"{run.label}: estimate {row.estimate.step:.2f} s, published "
        f"{run.published:.2f} s"
    )
    assert row.within


# --- the matrix-product rate ------------------------------------------------------
def _product(m: int) -> Operation:
    return Operation("p", "matmul", "forward", "block", m=m, n=m, k=m)


def test_matmul_rate_reads_measured_points_and_clamps_at_their_ends():
    points = ((1024, 1024, 1024, 80e12), (64, 64, 64, 5e12))
    gpu = GPU("made-up", 80, 100.0, 10.0, "test", sms=100, matmul_points=points)
    small, large = 2.0 * 64**3, 2.0 * 1024**3
    assert matmul_rate(gpu, _product(64), "bf16", None) == pytest.approx(5e12)
    assert matmul_rate(gpu, _product(1024), "bf16", None) == pytest.approx(80e12)
    # Between the points: a straight line in log FLOPs and log rate.
    m = 256
    w = math.log(2.0 * m**3 / small) / math.log(large / small)
    expected = math.exp(math.log(5e12) + w * math.log(80e12 / 5e12))
    assert matmul_rate(gpu, _product(m), "bf16", None) == pytest.approx(expected)
    assert 5e12 < expected < 80e12
    # Outside them: the nearest point's rate, neither extrapolated.
    assert matmul_rate(gpu, _product(16), "bf16", None) == pytest.approx(5e12)
    assert matmul_rate(gpu, _product(8192), "bf16", None) == pytest.approx(80e12)


def test_without_points_a_product_fills_its_last_wave_of_tiles():
    # 100 SMs, 128 x 256 tiles: 128 x 256 x 100 tiles fill one wave; one more tile
    # costs a second wave, half empty overall.
    gpu = GPU("made-up", 80, 100.0, 10.0, "test", 90.0, sms=100)
    full = Operation("p", "matmul", "forward", "block", m=128 * 10, n=256 * 10, k=4096)
    assert matmul_rate(gpu, full, "bf16", None) == pytest.approx(90e12)
    spill = Operation("p", "matmul", "forward", "block", m=128 * 101, n=256, k=4096)
    assert matmul_rate(gpu, spill, "bf16", None) == pytest.approx(90e12 * 101 / 200)


# --- collectives on a bus-bandwidth curve ---------------------------------------
NET = Network("made-up", 100.0, 10.0, 1e-6, 1e-5, "test",
              busbw_intra=((1e6, 10.0), (1e8, 100.0)),
              busbw_inter=((1e6, 1.0), (1e8, 10.0)))  # fmt: skip


def test_collective_time_reads_the_bus_bandwidth_at_the_messages_size():
    # nccl-tests: an all-reduce moves 2 (n-1)/n S a GPU, a gather or scatter
    # (n-1)/n S, a send S, each at the bus bandwidth of that size.
    assert collective_time(NET, "all_reduce", 4, 1e6, False) == pytest.approx(
        2 * 3 / 4 * 1e6 / 10e9
    )
    assert collective_time(NET, "all_gather", 4, 1e8, False) == pytest.approx(
        3 / 4 * 1e8 / 100e9
    )
    # 1e7 bytes lies halfway in log size: sqrt(10 x 100) GB/s.
    assert collective_time(NET, "reduce_scatter", 4, 1e7, False) == pytest.approx(
        3 / 4 * 1e7 / (math.sqrt(10 * 100) * 1e9)
    )
    assert collective_time(NET, "send", 2, 1e9, False) == pytest.approx(1e9 / 100e9)
    # Between nodes: the other curve, ten times slower here.
    assert collective_time(NET, "all_reduce", 4, 1e6, True) == pytest.approx(
        10 * collective_time(NET, "all_reduce", 4, 1e6, False)
    )
    # One GPU needs no all-reduce; a link without a curve: the alpha-beta ring.
    assert collective_time(NET, "all_reduce", 1, 1e6, False) == 0.0
    bare = Network("bare", 100.0, 10.0, 1e-6, 1e-5, "test")
    assert collective_time(bare, "all_reduce", 4, 1e6, True) == pytest.approx(
        ring_time("all_reduce", 4, 1e6, 10.0, 1e-5)
    )


def test_points_of_another_precision_or_a_given_mfu_are_not_read():
    gpu = GPUS["A100 80GB"]  # points measured in fp16/bf16
    op = Operation("up", "matmul", "forward", "block", m=8192, n=8192, k=8192)
    from_points = matmul_rate(gpu, op, "bf16", None)
    assert from_points == pytest.approx(253.7e12)
    assert matmul_rate(gpu, op, "fp32", None) <= gpu.fp32_tflops * 1e12
    # peak x mfu, less the part of the last wave of tiles left empty
    assert matmul_rate(gpu, op, "bf16", 0.5) == pytest.approx(312e12 * 0.5, rel=0.01)


def test_an_unknown_optimizer_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="optimizer must be one of 'fused' or"):
        estimate("tiny", Layout(dp=2), optimizer="sgd")


def test_the_planners_published_figures_are_read_from_their_one_home():
    from workshop.planner.hardware import NETWORKS
    from workshop.sources.scale_data import (
        QUOTES,
        QuotedFigures,
        published_quote,
        quoted_figures,
        scale_table,
    )

    # Each number a program reads is written in its quote's statement too.
    for quote in (q for q in QUOTES if isinstance(q, QuotedFigures)):
        for name, value in quote.values:
            shown = f"{value * 100:g}%" if quote.unit == "MFU" else f"{value:g}"
            assert shown in quote.statement.replace(",", ""), (quote.name, name)
    a100, h100 = GPUS["A100 80GB"], GPUS["H100 80GB"]
    triad, best = quoted_figures("stream-triad"), quoted_figures("mamf")
    assert a100.memory_gbs == pytest.approx(1000 * triad["A100 80GB"])  # TB/s
    assert h100.memory_gbs == pytest.approx(1000 * triad["H100 80GB"])
    assert a100.matmul_bf16_tflops == best["A100 80GB"]
    gemm = scale_table("gemm-a100-azure")
    assert [(m, rate / 1e12) for m, _, _, rate in a100.matmul_points] == list(
        gemm.points
    )
    azure = scale_table("nccl-allreduce-azure-nd-h100-v5")
    ring = published_quote("nccl-h100-ring").busbw_gbs[1]
    intra = NETWORKS["NVLink 4 + NDR 400G"].busbw_intra
    assert intra == tuple((size, min(gbs, ring)) for size, gbs in azure.points)
    nemo = {r.name: r for r in PUBLISHED_RUNS}["nemo-gpt3-175b-128"]
    table = scale_table("nemo-gpt3-175b-h100-bf16")
    assert nemo.published == table.column("MFU %")[0] / 100
