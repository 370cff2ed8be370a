"""workshop.comm.kinds: the three kinds of communication of S. Li's TACC course
(document 003), named for every call the tracer records, and checked on the course's
own example, A = B*C and D = E*F on two ranks, then G = A*D."""

from __future__ import annotations

import pytest
import torch

from workshop import launch
from workshop.comm.kinds import KINDS, communication_kind
from workshop.comm.tracing import OPS, POINT_TO_POINT


def test_every_traced_call_has_one_of_the_three_kinds():
    kinds = {op: communication_kind(op) for op in OPS}
    assert set(kinds.values()) == set(KINDS)
    assert [op for op, kind in kinds.items() if kind == "synchronisation"] == [
        "barrier"
    ]
    for op in (*POINT_TO_POINT, "broadcast", "scatter", "gather", "all_gather"):
        assert kinds[op] == "data movement"
    for op in ("reduce", "all_reduce", "reduce_scatter"):
        assert kinds[op] == "collective computation"


@pytest.mark.parametrize("op", ["allreduce", "All_Reduce", "", None, 3])
def test_an_unknown_call_is_named_with_the_known_ones(op):
    with pytest.raises(
        ValueError,
        match=rf"op={op!r} is not a torch.distributed .*"
        r"pass one of: all_gather, ",
    ):
        communication_kind(op)


def _a_times_d():
    """The notebook's example: two products at once, then G = A*D two ways."""
    import torch.distributed as dist

    rank = dist.get_rank()
    x, y = (
        (torch.tensor([2.0]), torch.tensor([3.0]))
        if rank == 0
        else (torch.tensor([4.0]), torch.tensor([5.0]))
    )
    product = x * y  # A on rank 0, D on rank 1
    moved = None
    if rank == 1:
        dist.send(product, dst=0)
    else:
        other = torch.zeros(1)
        dist.recv(other, src=1)
        moved = (product * other).item()
    dist.barrier()
    together = product.clone()
    dist.all_reduce(together, op=dist.ReduceOp.PRODUCT)
    return moved, together.item()


def test_the_course_example_on_two_ranks():
    result = launch(_a_times_d, world_size=2, backend="gloo", trace=True, show="none")
    assert result.returns == [(120.0, 120.0), (None, 120.0)]  # (2*3) * (4*5)
    kinds = [[communication_kind(e.op) for e in rank] for rank in result.traces]
    assert (
        kinds[0]
        == kinds[1]
        == ["data movement", "synchronisation", "collective computation"]
    )
    assert [e.op for e in result.traces[0]] == ["recv", "barrier", "all_reduce"]
