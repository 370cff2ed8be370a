"""workshop.comm.bucket_plan: DDP's buckets planned from byte counts, checked against
torch's own bucket assignment and against the buckets a real DDP all-reduces.

The real DDP runs on one gloo rank on the CPU, where the counts hold on any machine;
the GPU test at the end counts the same buckets on the rank's GPU under NCCL."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.distributed as dist
from torch import nn

from workshop import launch
from workshop.comm.bucket_plan import (
    DEFAULT_BUCKET_CAP_MB,
    first_bucket_mb,
    gradient_bytes,
    plan_buckets,
)
from workshop.comm.ddp_buckets import count_ddp_buckets
from workshop.env import visible_gpu_count
from workshop.training.models import resnet

MIB = 2**20


@functools.cache
def _sizes(name: str) -> list[int]:
    return gradient_bytes(resnet(name))


def test_the_first_bucket_closes_at_its_own_smaller_cap():
    sizes = [3 * MIB, MIB, 20 * MIB, 10 * MIB]
    assert plan_buckets(sizes) == [3 * MIB, 31 * MIB]
    assert plan_buckets(sizes, first_cap_mb=25) == [34 * MIB]
    # A bucket closes once it holds at least its cap: exactly the cap is enough.
    assert plan_buckets([MIB, MIB, MIB], bucket_cap_mb=1) == [MIB, MIB, MIB]
    assert plan_buckets([100]) == [100]  # a last bucket below its cap is kept
    assert first_bucket_mb() == dist._DEFAULT_FIRST_BUCKET_BYTES / MIB
    assert DEFAULT_BUCKET_CAP_MB == 25


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
@pytest.mark.parametrize("cap_mb,first_mb", [(25, None), (25, 25), (4, 0.5), (0.3, 2)])
def test_the_plan_agrees_with_torchs_own_bucket_assignment(name, cap_mb, first_mb):
    sizes = _sizes(name)
    first = first_bucket_mb() if first_mb is None else first_mb
    tensors = [torch.empty(size // 4) for size in sizes]  # float32: 4 bytes each
    limits = [int(first * MIB), int(cap_mb * MIB)]
    indices, _ = dist._compute_bucket_assignment_by_size(tensors, limits)
    torch_buckets = [sum(sizes[i] for i in bucket) for bucket in indices]
    assert plan_buckets(sizes, cap_mb, first_mb) == torch_buckets
    assert sum(torch_buckets) == sum(sizes)


def test_gradient_bytes_last_layer_first_trainable_once():
    assert gradient_bytes(nn.Linear(4, 2)) == [2 * 4, 8 * 4]  # bias, then weight
    shared = nn.Linear(3, 3, bias=False)
    model = nn.Sequential(nn.Linear(3, 5), shared, shared)
    model[0].bias.requires_grad_(False)
    assert gradient_bytes(model) == [9 * 4, 15 * 4]
    assert gradient_bytes(nn.Linear(4, 2).half()) == [2 * 2, 8 * 2]


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: plan_buckets([]), "no gradient sizes given"),
        (
            lambda: plan_buckets([4, 0]),
            r"sizes\[1\] must be a whole number, 1 or more, not 0",
        ),
        (
            lambda: plan_buckets([4.0]),
            r"sizes\[0\] must be a whole number, 1 or more, not 4\.0",
        ),
        (
            lambda: plan_buckets([True]),
            r"sizes\[0\] must be a whole number, 1 or more, not True",
        ),
        (
            lambda: plan_buckets([4], bucket_cap_mb=0),
            "bucket_cap_mb must be a number of MiB above 0, not 0",
        ),
        (
            lambda: plan_buckets([4], bucket_cap_mb=-1),
            "bucket_cap_mb must be a number of MiB above 0, not -1",
        ),
        (
            lambda: plan_buckets([4], bucket_cap_mb=math.nan),
            "bucket_cap_mb must be a number of MiB above 0, not nan",
        ),
        (
            lambda: plan_buckets([4], bucket_cap_mb="25"),
            "bucket_cap_mb must be a number of MiB above 0, not '25'",
        ),
        (
            lambda: plan_buckets([4], first_cap_mb=0),
            "first_cap_mb must be a number of MiB above 0, not 0",
        ),
        (lambda: gradient_bytes(nn.ReLU()), "ReLU has no trainable parameter"),
        (
            lambda: count_ddp_buckets(nn.Linear(2, 2), torch.ones(1, 2), steps=1),
            "steps must be a whole number, 2 or more, not 1; DDP settles its buckets",
        ),
        (
            lambda: count_ddp_buckets(nn.Linear(2, 2), torch.ones(1, 2), steps=True),
            "steps must be a whole number, 2 or more, not True",
        ),
        (
            lambda: count_ddp_buckets(nn.Linear(2, 2), torch.ones(1, 2), 0),
            "bucket_cap_mb must be a number of MiB above 0, not 0",
        ),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_counting_needs_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="needs a process group; run it inside"):
        count_ddp_buckets(nn.Linear(2, 2), torch.ones(1, 2))


def _count(name, bucket_cap_mb=None, device_of_rank=False):
    from workshop import rank_device

    device = rank_device() if device_of_rank else torch.device("cpu")
    torch.manual_seed(0)
    model = resnet(name).to(device)
    sizes = gradient_bytes(model)
    return sizes, count_ddp_buckets(model, torch.randn(2, 3, 32, 32), bucket_cap_mb)


def _counts():
    return {
        "resnet50": _count("resnet50"),
        "resnet18": _count("resnet18"),
        "resnet18 cap 10": _count("resnet18", 10),
    }


@pytest.fixture(scope="module")
def counts():
    result = launch(_counts, world_size=1, backend="gloo", show="none", timeout=300)
    return result.returns[0]


def test_ddp_makes_the_buckets_the_plan_says(counts):
    for name in ("resnet50", "resnet18"):
        sizes, counted = counts[name]
        assert counted == plan_buckets(sizes)  # DDP's defaults: 1 MiB, then 25 MiB
    # ResNet-50's 97 MiB of gradients: a small first bucket (its classifier),
    # then four of about 25 MiB. Without the first-bucket cap it would be four.
    sizes, counted = counts["resnet50"]
    assert len(counted) == 5
    assert len(plan_buckets(sizes, first_cap_mb=DEFAULT_BUCKET_CAP_MB)) == 4
    assert counted[0] == sizes[0] + sizes[1]  # the fc layer's bias and weight


def test_a_cap_you_set_yourself_is_planned_too(counts):
    # Recent torch releases cap the first bucket at a bucket_cap_mb given explicitly
    # too; older ones kept 1 MiB for it. Either way one of the two plans matches.
    sizes, counted = counts["resnet18 cap 10"]
    plans = [plan_buckets(sizes, 10, first) for first in (None, 10)]
    assert counted in plans
    assert len(counted) > len(plan_buckets(sizes))  # smaller cap, more buckets


@pytest.mark.gpu
@pytest.mark.skipif(visible_gpu_count() == 0, reason="needs a CUDA GPU; none here")
def test_ddp_buckets_on_the_rank_gpu_match_the_plan():
    result = launch(
        _count,
        "resnet50",
        None,
        True,
        world_size=1,
        backend="nccl",
        show="none",
        timeout=300,
    )
    sizes, counted = result.returns[0]
    assert counted == plan_buckets(sizes)
