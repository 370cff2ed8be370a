"""The planner against published runs, and the terms that make it faithful to them:
sequence parallelism, the interleaved schedule, tensor-parallel overlap, fused
layers, the measured matrix-product rate and the busiest pipeline stage."""

from __future__ import annotations

import dataclasses
import re

import pytest

from workshop.planner.estimator import estimate
from workshop.planner.layout import GPUS, Layout, ModelShape, model_shape
from workshop.planner.memory import layer_activation_bytes
from workshop.planner.operations import stage_layers, stage_record
from workshop.planner.published_runs import (
    PUBLISHED_RUNS,
    WITHIN,
    against_published,
    estimated_figure,
    plot_against_published,
    published_table,
    step_breakdown,
)
from workshop.planner.step_time import (
    DEFAULT_MFU,
    collective_time,
    compute_rate,
    ring_time,
)

B8 = model_shape("transformer-8b")
ROWS = against_published()


# --- the published runs -----------------------------------------------------------
@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.run.name)
def test_every_published_layout_fits_or_names_its_memory_gap(row):
    if row.estimate.fits:
        assert not row.run.memory_gap, f"{row.run.label} fits now: drop memory_gap"
        return
    assert row.run.memory_gap.startswith("memory: "), (
        f"{row.run.label}: the planner says {row.estimate.memory_total / 1e9:.1f} GB "
        f"per GPU, more than the {row.run.gpu}'s {row.estimate.gpu.memory_gb} GB, for "
        "a layout that was trained, and names no memory_gap"
    )


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.run.name)
def test_every_run_is_within_its_tolerance_or_names_its_gap(row):
    run = row.run
    assert row.within == (abs(row.figure / run.published - 1) <= run.within)
    if not run.gap:
        assert row.within, f"{run.label}: estimate / published = {row.ratio:.2f}"
        return
    # A named gap: the ratio stays where it was when the gap was written, so the
    # test notices a change to the estimate; within tolerance the gap must go.
    assert not row.within, f"{run.label}: now within ({row.ratio:.2f}); drop gap"
    low, high = run.band
    assert low <= row.ratio <= high, (run.label, row.ratio, run.band)


def test_the_table_holds_fourteen_runs_from_four_sources_with_their_gpu_counts():
    assert len(PUBLISHED_RUNS) == 14
    gpus = [run.layout.world_size for run in PUBLISHED_RUNS]
    assert gpus == [8, 8, 64, 64, 280, 280, 512, 512, 128, 2048, 1536, 3072, 8192,
                    16384]  # fmt: skip
    assert len({run.name for run in PUBLISHED_RUNS}) == 14
    for run in PUBLISHED_RUNS:
        # The label's GPU count is the layout's: dp x tp x pp.
        assert f"{run.layout.world_size:,}" in run.label
        assert run.source and run.assumed
        assert run.measure in ("seconds", "mfu", "tflops")
        upper = {"seconds": 1000, "mfu": 1, "tflops": 312}[run.measure]
        assert 0 < run.published < upper
        # Iteration times within 10 % (Korthikanti et al.), the rest within 15 %.
        assert run.within == (0.10 if run.measure == "seconds" else WITHIN)
    families = {run.source.split(",")[0] for run in PUBLISHED_RUNS}
    assert len(families) == 4
    korthikanti = [
        run for run in PUBLISHED_RUNS if run.source.startswith("Korthikanti")
    ]
    assert len(korthikanti) == 8 and {r.measure for r in korthikanti} == {"seconds"}
    # Each model twice: full recomputation, and sequence parallelism with selective.
    assert [r.layout.checkpointing for r in korthikanti] == ["full", "selective"] * 4
    assert [r.layout.sequence_parallel for r in korthikanti] == [False, True] * 4


def test_narayanans_count_gives_his_aggregate_figure():
    # Narayanan et al. 2021, Table 1: 1T parameters on 3,072 GPUs at 163 TFLOP/s a
    # GPU is 502.0 PFLOP/s in all; the figure the planner reports uses their count.
    run = next(r for r in PUBLISHED_RUNS if r.name == "megatron-1t")
    assert run.published * run.layout.world_size / 1e3 == pytest.approx(502.0, 0.01)
    row = next(r for r in ROWS if r.run is run)
    assert estimated_figure(run, row.estimate) == pytest.approx(row.figure)


def test_llama_counts_the_mfu_with_the_real_126_layers():
    row = next(r for r in ROWS if r.run.name == "llama3-405b-8192")
    model, layout = row.run.model, row.run.layout
    assert (model.layers, layout.pp) == (126, 16)
    # 126 layers on 16 stages: one fewer on the first and the last (Dubey et al.).
    layers = [stage_layers(126, 16, s) for s in range(16)]
    assert layers == [7] + [8] * 14 + [7] and sum(layers) == 126
    assert stage_record(model, layout, 0).layers == 7
    assert stage_record(model, layout, 8).layers == 8
    # The MFU is the model's own FLOPs (126 layers) over the step and the peak.
    assert row.figure == pytest.approx(row.estimate.mfu)
    flops = layout.global_batch * model.seq * model.flops_per_token()
    assert row.figure == pytest.approx(
        flops / row.estimate.step / layout.world_size / 989e12
    )


def test_the_printed_table_fits_88_columns_and_numbers_the_gaps():
    text = published_table(ROWS)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 88, max(lines, key=len)
    fits = sum(r.estimate.fits for r in ROWS)
    within = sum(r.within for r in ROWS)
    assert f"{fits} of {len(ROWS)} layouts fit; {within} of {len(ROWS)} within" in text
    # A row is marked when it is outside its tolerance or does not fit, and each
    # mark's note follows the table, numbered from 1.
    for row in ROWS:
        line = next(x for x in lines if x.startswith(row.run.label))
        marked = re.search(r"\[\d\]$", line) is not None
        assert marked == (not row.within or not row.estimate.fits), line
    marks = set(re.findall(r"\[(\d)\]$", text, re.M))
    assert marks and marks == {str(i + 1) for i in range(len(marks))}
    for mark in marks:
        assert re.search(rf"^\[{mark}\] \w", text, re.M)


def test_the_picture_fits_a_projector():
    fig = plot_against_published(ROWS)
    width, height = fig.get_size_inches() * 100
    assert width <= 1280 and height <= 720
    # One axis of errors: a row a run, labelled with it.
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [row.run.label for row in ROWS]
    xs = sorted(
        x
        for line in ax.get_lines()
        for x in line.get_xdata()
        if len(line.get_xdata()) == 1
    )
    assert xs == pytest.approx(sorted(100 * row.error for row in ROWS))


# --- sequence parallelism ---------------------------------------------------------
def test_sequence_parallelism_splits_the_whole_activations_too():
    whole = layer_activation_bytes(B8, 1, 8)
    split = layer_activation_bytes(B8, 1, 8, sequence_parallel=True)
    one = layer_activation_bytes(B8, 1, 1)
    assert split == one // 8  # every term divided by t
    assert split < whole
    plain = estimate(B8, Layout(tp=8, micro_batches=4), mfu=0.5)
    sp = estimate(B8, Layout(tp=8, micro_batches=4, sequence_parallel=True), mfu=0.5)
    assert sp.memory["activations"] < plain.memory["activations"]
    # Every all-reduce becomes a reduce-scatter; an all-gather goes before each
    # column-parallel pair in the forward pass and after each row-parallel one in
    # the backward pass: 4 a block.
    calls, size = plain.collectives["all_reduce tp"]
    one_size = size / calls
    assert one_size == 2 * B8.seq * B8.hidden
    assert sp.collectives["reduce_scatter tp"] == (calls, size)
    gathers = 4 * 32 * 4
    assert sp.collectives["all_gather tp"] == (gathers, gathers * one_size)
    assert "all_reduce tp" not in sp.collectives
    # A reduce-scatter and an all-gather each move half an all-reduce's bytes.
    rs, ag, ar = (
        collective_time(plain.network, kind, 8, one_size, False)
        for kind in ("reduce_scatter", "all_gather", "all_reduce")
    )
    assert rs + ag == pytest.approx(ar)
    assert plain.time["tp comm"] == pytest.approx(calls * ar)
    assert sp.time["tp comm"] == pytest.approx(calls * rs + gathers * ag)
    # The norms, dropouts and residual adds see T / t tokens: less memory-bound time.
    assert sp.parts["memory-bound"] < plain.parts["memory-bound"]
    assert sp.parts["matrix products"] == pytest.approx(plain.parts["matrix products"])


def test_with_sequence_parallelism_each_tp_rank_sends_its_share_between_stages():
    base = dict(dp=2, tp=4, pp=4, micro_batches=8, zero=1)
    plain = estimate(B8, Layout(**base), mfu=0.5)
    sp = estimate(B8, Layout(**base, sequence_parallel=True), mfu=0.5)
    sends, size = plain.collectives["send_recv pp"]
    assert sp.collectives["send_recv pp"] == (sends, size / 4)


# --- the interleaved schedule -----------------------------------------------------
def test_virtual_stages_shrink_the_bubble_and_multiply_the_sends():
    base = dict(tp=2, pp=4, micro_batches=8)
    last = 3  # holds the head: the slowest stage, which waits for none
    plain = estimate(B8, Layout(**base), mfu=0.5, stage=last)
    two = estimate(B8, Layout(**base, virtual_stages=2), mfu=0.5, stage=last)

    def pace(est):  # one micro-batch of this stage, exposed sends included
        busy = est.parts["matrix products"] + est.parts["memory-bound"]
        return (busy + est.parts["exposed comm"]) / 8

    # The bubble: (p - 1) / v of the slowest stage's micro-batch.
    assert plain.time["bubble"] == pytest.approx(3 * pace(plain))
    assert two.time["bubble"] == pytest.approx(3 / 2 * pace(two))
    assert two.time["bubble"] < 0.55 * plain.time["bubble"]
    assert two.time["compute"] == pytest.approx(plain.time["compute"])
    size = 2 * B8.seq * B8.hidden
    # First and last stage: m (2 v - 1) sends; a middle one 2 m v.
    assert plain.collectives["send_recv pp"] == (8, 8 * size)
    assert two.collectives["send_recv pp"] == (8 * 3, 8 * 3 * size)
    assert two.time["pp comm"] == pytest.approx(3 * plain.time["pp comm"])
    middle = estimate(B8, Layout(**base, virtual_stages=2), mfu=0.5, stage=1)
    assert middle.collectives["send_recv pp"] == (8 * 4, 8 * 4 * size)
    # More micro-batches in flight: x (1 + (p - 1) / (p v)) of the blocks' share.
    plain0 = estimate(B8, Layout(**base), mfu=0.5, stage=0)
    two0 = estimate(B8, Layout(**base, virtual_stages=2), mfu=0.5, stage=0)
    blocks = plain0.memory["activations"] - 4 * 8 * B8.seq  # less the token ids
    more = two0.memory["activations"] - 4 * 8 * B8.seq
    assert more == pytest.approx(blocks * (1 + 3 / 8), abs=4)


# --- overlap, fused layers ----------------------------------------------------------
def test_overlapped_tensor_parallel_communication_leaves_the_step():
    base = dict(tp=8, micro_batches=4)
    plain = estimate(B8, Layout(**base), mfu=0.5)
    over = estimate(B8, Layout(**base, tp_overlap=True), mfu=0.5)
    assert over.time["tp comm"] == plain.time["tp comm"]  # still listed
    assert over.time["tp comm"] < over.time["compute"]
    assert over.step == pytest.approx(plain.step - plain.time["tp comm"])
    assert over.formulas["tp comm"].endswith("; 0.00 ms exposed")


def test_fused_layers_need_two_backward_all_reduces_a_block():
    gelu = ModelShape("g", layers=2, hidden=64, heads=4, vocab=256, seq=32)
    fused = gelu.with_(fused=True)
    assert fused.parameters() == gelu.parameters()
    layout = Layout(tp=2)
    # Per block 2 forward + (4 GELU separate | 2 fused) backward, + 2 edges.
    assert estimate(gelu, layout).collectives["all_reduce tp"][0] == 2 * 6 + 2
    assert estimate(fused, layout).collectives["all_reduce tp"][0] == 2 * 4 + 2


# --- the compute term ----------------------------------------------------------------
def test_the_compute_rate_is_given_measured_or_assumed_and_says_which():
    h100 = GPUS["H100 80GB"]
    rate, why = compute_rate(h100, "bf16", 0.5)
    assert rate == 0.5 * 989e12 and "(given)" in why
    rate, why = compute_rate(h100, "bf16", None)
    assert rate == 794.5e12 and "80.3% of peak" in why and "Bekman" in why
    rate, why = compute_rate(h100, "fp32", None)
    assert rate == pytest.approx(67e12 * DEFAULT_MFU) and "assumed" in why
    rate, why = compute_rate(GPUS["V100 32GB"], "bf16", None)
    assert rate == pytest.approx(125e12 * DEFAULT_MFU) and "assumed" in why


def test_the_busiest_stage_paces_the_pipeline():
    # 32 layers on 5 stages: 7 on stages 1 and 2, 6 on the others. With a small
    # vocabulary the head weighs less than a block: a 7-layer stage is the slowest.
    model = B8.with_(vocab=1024)
    layout = Layout(pp=5, micro_batches=5)
    ests = [estimate(model, layout, mfu=0.5, stage=s) for s in range(5)]
    assert [e.record.layers for e in ests] == [6, 7, 7, 6, 6]

    def pace(est):
        busy = est.parts["matrix products"] + est.parts["memory-bound"]
        return (busy + est.parts["exposed comm"]) / 5

    paces = [pace(e) for e in ests]
    assert max(paces) == paces[1] == pytest.approx(paces[2])
    assert paces[1] > paces[3]
    # The slowest stage leaves (p - 1) micro-batches of bubble; every other stage
    # also waits, each micro-batch, for the difference.
    assert ests[1].time["bubble"] == pytest.approx(4 * paces[1])
    for est, mine in zip(ests, paces, strict=True):
        assert est.time["bubble"] == pytest.approx(5 * (paces[1] - mine) + 4 * paces[1])
        # So every stage's step (less its own optimizer) is (m + p - 1) x the pace.
        assert est.step - est.parts["optimizer"] == pytest.approx(9 * paces[1])


def test_the_estimate_reports_its_mfu():
    est = estimate(B8, Layout(dp=8, zero=3, micro_batches=2))
    flops = 8 * 2 * B8.seq * B8.flops_per_token()
    assert est.mfu == pytest.approx(flops / est.step / (8 * 989e12))
    # The products run at most at the best measured rate (794.5 of 989 TFLOP/s), and
    # the memory-bound operations and the optimizer add to the step: below it.
    assert est.parts["memory-bound"] > 0 and est.parts["optimizer"] > 0
    assert est.mfu < 794.5 / 989
    assert estimate("resnet50", Layout(dp=2)).mfu is None


# --- bad input ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(sequence_parallel=True), "sequence_parallel=True needs tensor "
         "parallelism, and tp=1"),
        (dict(tp_overlap=True), "tp_overlap=True needs tensor parallelism"),
        (dict(tp=2, sequence_parallel="yes"), "sequence_parallel='yes'; use True"),
        (dict(virtual_stages=2), "virtual_stages=2 needs a pipeline whose "
         "micro-batches are a multiple of its stages"),
        (dict(pp=4, micro_batches=6, virtual_stages=2), "got pp=4, micro_batches=6"),
        (dict(virtual_stages=0), "virtual_stages"),
    ],
)  # fmt: skip
def test_a_layout_the_new_terms_cannot_take_says_why(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Layout(**changes)


def test_each_virtual_stage_needs_a_layer():
    layout = Layout(pp=4, micro_batches=4, virtual_stages=9)
    with pytest.raises(ValueError, match=r"pp=4 x virtual_stages=9 is more than "
                       r"transformer-8b's layers=32"):  # fmt: skip
        estimate(B8, layout)
    # Chunks of different sizes are allowed: 32 layers in 4 x 3 chunks.
    est = estimate(B8, Layout(pp=4, micro_batches=4, virtual_stages=3))
    assert est.record.layers == 8


def test_ring_time_is_unchanged_by_the_split():
    # A reduce-scatter and an all-gather cost an all-reduce: the SP accounting's basis.
    args = (8, 64e6, 450.0, 5e-6)
    assert ring_time("reduce_scatter", *args) + ring_time(
        "all_gather", *args
    ) == pytest.approx(ring_time("all_reduce", *args))
    assert WITHIN == 0.15


def test_meta_s_layout_fits_only_with_its_blocks_recomputed():
    # Meta kept every activation (no checkpointing); the planner, which keeps each
    # micro-batch's activations until its backward pass, finds no room for that and
    # says so in memory_gap. Recomputing the blocks it fits.
    llama = [row for row in ROWS if row.run.name.startswith("llama3")]
    assert len(llama) == 2
    for row in llama:
        assert row.run.layout.checkpointing == "none"
        assert not row.estimate.fits and row.run.memory_gap
        full = dataclasses.replace(row.run.layout, checkpointing="full")
        est = estimate(row.run.model, full, row.run.gpu, row.run.network)
        assert est.fits


@pytest.mark.parametrize(
    ("call", "match"),
    [
        # "'int' object is not iterable", "'str' object has no attribute 'model'"
        # and the like before.
        (lambda: against_published(5),
         r"runs must be a list of PublishedRun records, not 5; e\.g\. "),
        (lambda: against_published(("x",)),
         r"runs must be a list of PublishedRun records, not a list holding 'x'"),
        (lambda: published_table(5),
         r"rows must be a list of Against rows, not 5; e\.g\. rows = "
         r"against_published\(\)"),
        (lambda: published_table(["x"]), r"not a list holding 'x' \(a str\)"),
        (lambda: plot_against_published(5), r"rows must be a list of Against rows"),
        (lambda: estimated_figure("x", None),
         r"run must be a PublishedRun, not 'x' \(a str\); e\.g\. PUBLISHED_RUNS"),
        (lambda: step_breakdown(None),
         r"row must be an Against, not None .*step_breakdown\(against_published"),
    ],
)  # fmt: skip
def test_wrong_kinds_are_refused_naming_what_to_pass(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def test_an_empty_plot_is_refused():
    with pytest.raises(ValueError, match=r"rows must be .* one or more, not \[\]"):
        plot_against_published([])  # max() of an empty sequence before
