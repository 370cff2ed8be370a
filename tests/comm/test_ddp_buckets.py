"""workshop.comm.ddp_buckets: DDP's bucket all-reduces recorded from real ranks, what
bucket_cap_mb, no_sync, autocast and compression do to them, and the timeline.

The ranks are pinned to gloo on the CPU, where the figures below hold on any machine;
the GPU test at the end runs the same tools on the rank's GPU under NCCL."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workshop import launch
from workshop.comm.ddp_buckets import (
    DDPSteps,
    ddp_timeline,
    timed_ddp_steps,
    watch_buckets,
)
from workshop.draw.timeline_diagram import draw_rank_timeline
from workshop.env import visible_gpu_count
from workshop.training.models import SmallCNN

GRAD_BYTES = 4 * sum(p.numel() for p in SmallCNN().parameters())


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(16, 1, 8, 8, generator=g), torch.randint(10, (16,), generator=g))
        for _ in range(n)
    ]


def _run(cap: float, compress=None, amp=None, accumulate=1, steps=3):
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    ddp = DistributedDataParallel(SmallCNN(), bucket_cap_mb=cap)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    run = timed_ddp_steps(
        ddp,
        _batches(steps * accumulate),
        opt,
        compress=compress,
        amp=amp,
        accumulate=accumulate,
    )
    return run, [p.detach().clone() for p in ddp.parameters()]


def _plain_ddp(steps=3):
    """The same training with DDP's own all-reduce, no hook."""
    from torch.nn.parallel import DistributedDataParallel

    from workshop.training.steps import train_step

    torch.manual_seed(0)
    ddp = DistributedDataParallel(SmallCNN(), bucket_cap_mb=0.1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for batch in _batches(steps):
        train_step(ddp, [batch], opt)
    return [p.detach().clone() for p in ddp.parameters()]


def _experiments():
    return {
        "one": _run(25),
        "small": _run(0.1),
        "smaller": _run(0.02),
        "bf16 wire": _run(0.1, compress="bf16"),
        "autocast": _run(0.1, amp="bf16"),
        "accumulate": _run(0.1, accumulate=3, steps=2),
        "plain": (None, _plain_ddp()),
    }


@pytest.fixture(scope="module")
def runs():
    result = launch(
        _experiments, world_size=2, backend="gloo", show="none", timeout=300
    )
    return result.returns


def test_buckets_follow_bucket_cap_mb(runs):
    counts = {k: runs[0][k][0].buckets_per_step for k in ("one", "small", "smaller")}
    assert counts["one"] == 1  # SmallCNN's 0.38 MB of gradients fit one 25 MB bucket
    assert 1 < counts["small"] < counts["smaller"]
    for key in ("one", "small", "smaller"):
        assert runs[0][key][0].bytes_per_step == GRAD_BYTES  # every gradient, once
    # Step 1 runs with one bucket: DDP rebuilds them in the order the gradients
    # became ready only after it has seen one backward pass.
    first = [b for b in runs[0]["smaller"][0].buckets if b.step == 1]
    assert len(first) == 1 and first[0].bytes == GRAD_BYTES


def test_bucket_all_reduces_overlap_the_backward_pass(runs):
    for rank in (0, 1):
        run: DDPSteps = runs[rank]["smaller"][0]
        assert run.rank == rank
        last = max(b.step for b in run.buckets)
        backward = [p for p in run.phases if p[1] == "backward"][last - 1]
        buckets = sorted(
            (b for b in run.buckets if b.step == last), key=lambda b: b.start
        )
        assert [b.bucket for b in buckets] == list(range(len(buckets)))
        for b in buckets:
            assert backward[2] <= b.start <= b.end <= backward[3] + 1e-3
        # The first bucket is handed over while backward still has work to do.
        assert buckets[0].start < buckets[-1].start < backward[3]


def test_the_recording_hook_averages_like_ddp_itself(runs):
    ranks = [runs[r]["small"][1] for r in (0, 1)]
    plain = runs[0]["plain"][1]
    for mine, theirs, other_rank in zip(ranks[0], plain, ranks[1], strict=True):
        assert torch.allclose(mine, theirs, atol=1e-6)
        assert torch.equal(mine, other_rank)


def test_bf16_compression_halves_the_bytes_and_autocast_does_not(runs):
    wire = runs[0]["bf16 wire"][0]
    assert wire.bytes_per_step == GRAD_BYTES // 2
    assert {b.dtype for b in wire.buckets} == {"bfloat16"}
    # Autocast computes in bfloat16, but the gradients of float32 weights are float32.
    auto = runs[0]["autocast"][0]
    assert auto.bytes_per_step == GRAD_BYTES
    assert {b.dtype for b in auto.buckets} == {"float32"}
    # Compressed gradients still train to nearly the same weights.
    for a, b in zip(runs[0]["bf16 wire"][1], runs[0]["small"][1], strict=True):
        assert torch.allclose(a, b, atol=1e-2)


def test_no_sync_leaves_out_the_all_reduce_of_accumulated_micro_batches(runs):
    run = runs[0]["accumulate"][0]
    assert len(run.step_seconds) == 2
    assert sorted({b.step for b in run.buckets}) == [1, 2]
    assert len([p for p in run.phases if p[1] == "backward"]) == 6
    # One set of buckets per optimizer step, not one per micro-batch.
    assert len([b for b in run.buckets if b.step == 2]) == run.buckets_per_step


def test_the_timeline_labels_each_bucket(runs):
    events, phases = ddp_timeline([runs[r]["smaller"][0] for r in (0, 1)])
    assert len(events) == 2
    n = runs[0]["smaller"][0].buckets_per_step
    assert [e["label"] for e in events[0]] == [f"bucket {i}" for i in range(n)]
    assert [p[1] for p in phases if p[0] == 1] == ["forward", "backward", "optimizer"]
    fig = draw_rank_timeline(events, phases, title="One DDP step")
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert {"forward", "backward", "bucket 0"} <= texts
    assert fig.axes[0].get_title().startswith("One DDP step")
    with pytest.raises(ValueError, match=r"steps \[9\] were not recorded; recorded: "):
        ddp_timeline([runs[0]["smaller"][0]], steps=[9])
    with pytest.raises(ValueError, match="no runs given"):
        ddp_timeline([])


def test_to_dict_is_plain_data(runs):
    import json

    data = runs[0]["small"][0].to_dict()
    assert json.loads(json.dumps(data))["buckets"][0]["dtype"] == "float32"


def _bad_inputs():
    from torch.nn.parallel import DistributedDataParallel

    errors = []
    for call in (
        lambda: watch_buckets(nn.Linear(2, 2)),
        lambda: watch_buckets(DistributedDataParallel(nn.Linear(2, 2)), "int8"),
        lambda: timed_ddp_steps(
            DistributedDataParallel(nn.Linear(2, 2)), [], None, amp="fp16"
        ),
        lambda: timed_ddp_steps(
            DistributedDataParallel(nn.Linear(2, 2)), [], None, accumulate=0
        ),
        lambda: timed_ddp_steps(
            DistributedDataParallel(nn.Linear(2, 2)), _batches(1), None, accumulate=2
        ),
    ):
        try:
            call()
        except (TypeError, ValueError) as e:
            errors.append(f"{type(e).__name__}: {e}")
    return errors


def test_bad_input_is_named():
    # gloo: the checks are the same everywhere, and the models here are on the CPU.
    errors = launch(_bad_inputs, world_size=1, backend="gloo", show="none").returns[0]
    assert len(errors) == 5
    assert "needs a DistributedDataParallel model, got Linear" in errors[0]
    assert "compress='int8' is not one of None, 'bf16', 'fp16'" in errors[1]
    assert "amp must be one of None or 'bf16', not 'fp16'" in errors[2]
    assert "accumulate must be a whole number, 1 or more, not 0" in errors[3]
    assert "got 1 batches but one step needs accumulate=2" in errors[4]


def _on_the_rank_gpu():
    from torch.nn.parallel import DistributedDataParallel

    from workshop import rank_device

    device = rank_device()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(
        SmallCNN().to(device), device_ids=[device.index], bucket_cap_mb=0.1
    )
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    plain = timed_ddp_steps(ddp, _batches(3), opt)  # batches move to the GPU
    return str(device), plain, str(next(ddp.parameters()).device)


@pytest.mark.gpu
@pytest.mark.skipif(visible_gpu_count() == 0, reason="needs a CUDA GPU; none here")
def test_buckets_are_recorded_on_the_rank_gpu_under_nccl():
    result = launch(_on_the_rank_gpu, world_size=1, backend="nccl", show="none")
    device, run, weights = result.returns[0]
    assert result.backend == "nccl" and device == weights == "cuda:0"
    assert run.bytes_per_step == GRAD_BYTES
    assert {b.dtype for b in run.buckets} == {"float32"}
    assert all(b.start <= b.end for b in run.buckets)
    assert len(run.step_seconds) == 3
