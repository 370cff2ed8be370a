"""workshop.training.batches: a global batch split among ranks, and what
DistributedSampler does with a dataset that does not divide by world_size (the
figures notebook 02 prints: 10 samples on 4 ranks)."""

from __future__ import annotations

import pytest
from torch.utils.data.distributed import DistributedSampler

from workshop.training.batches import per_rank_batch


@pytest.mark.parametrize("world_size", [1, 2, 4, 8, 256])
def test_a_batch_that_divides_is_shared_out_exactly(world_size):
    per_rank = per_rank_batch(256, world_size)
    assert per_rank * world_size == 256
    assert per_rank_batch(256, world_size, exact=False) == per_rank


def test_rounding_down_trains_on_fewer_samples():
    assert per_rank_batch(256, 6, exact=False) == 42  # 6 x 42 = 252 per step
    assert per_rank_batch(10, 4, exact=False) == 2


@pytest.mark.parametrize(
    "args,kwargs,message",
    [
        (
            (256, 6),
            {},
            r"global_batch=256 does not divide by world_size=6 \(4 left "
            r"over\); use a global batch of 252 or 258, or pass exact=False to train "
            r"on 252 samples per step",
        ),
        ((3, 4), {}, "global_batch=3 is smaller than world_size=4"),
        ((3, 4), {"exact": False}, "global_batch=3 is smaller than world_size=4"),
        ((0, 4), {}, r"global_batch must be a whole number, 1 or more, not 0; e\.g"),
        ((256.0, 4), {}, r"global_batch must be a whole number, 1 or more, not 256\.0"),
        ((True, 1), {}, "global_batch must be a whole number, 1 or more, not True"),
        ((256, 0), {}, "world_size must be a whole number, 1 or more, not 0"),
        ((256, -2), {}, "world_size must be a whole number, 1 or more, not -2"),
        ((256, "4"), {}, "world_size must be a whole number, 1 or more, not '4'"),
    ],
)
def test_bad_input_is_named(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        per_rank_batch(*args, **kwargs)


def _shares(n, world_size, drop_last):
    return [
        list(
            DistributedSampler(
                range(n),
                num_replicas=world_size,
                rank=rank,
                shuffle=False,
                drop_last=drop_last,
            )
        )
        for rank in range(world_size)
    ]


def test_the_sampler_pads_by_repeating_the_first_samples():
    # What notebook 02 teaches, held to the installed torch.
    shares = _shares(10, 4, drop_last=False)
    assert shares == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
    assert {len(s) for s in shares} == {3}  # every rank the same count: 12 in all


def test_drop_last_drops_the_tail_instead():
    shares = _shares(10, 4, drop_last=True)
    assert shares == [[0, 4], [1, 5], [2, 6], [3, 7]]
    read = sorted(i for share in shares for i in share)
    assert read == list(range(8))  # 8 and 9 are never read
