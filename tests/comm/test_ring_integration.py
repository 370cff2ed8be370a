"""The ring all-reduce from sends and receives: the same result as dist.all_reduce,
and exactly the messages the cost model counts."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from workshop import launch
from workshop.comm.ring import ring_all_reduce


def _compare(n_elements):
    g = torch.Generator().manual_seed(dist.get_rank())
    mine = torch.randn(n_elements, generator=g)
    expected = mine.clone()
    dist.all_reduce(expected)
    return torch.allclose(ring_all_reduce(mine), expected, atol=1e-5)


@pytest.mark.parametrize(("world_size", "n_elements"), [(2, 4), (3, 7), (4, 64)])
def test_ring_all_reduce_matches_all_reduce(world_size, n_elements):
    result = launch(_compare, n_elements, world_size=world_size, show="none")
    assert result.returns == [True] * world_size


def _traced_ring():
    ring_all_reduce(torch.ones(12))


def test_each_rank_sends_2_n_minus_1_chunks_of_a_nth():
    n = 4
    result = launch(_traced_ring, world_size=n, trace=True, show="none")
    for rank, events in enumerate(result.traces):
        sends = [e for e in events if e.op == "isend"]
        assert len(sends) == 2 * (n - 1)
        assert all(e.peer == (rank + 1) % n for e in sends)
        # 12 floats of 4 bytes cut in 4: 12 bytes a chunk, 2(N-1)/N of 48 in all.
        assert sum(e.nbytes for e in sends) == 2 * (n - 1) * 48 // n


def test_too_small_a_tensor_is_explained():
    with pytest.raises(
        Exception,
        match=r"cuts the tensor into 3 chunks, but it has 2 "
        r"elements; pass one with 3 or more",
    ):
        launch(lambda: ring_all_reduce(torch.ones(2)), world_size=3, show="none")
