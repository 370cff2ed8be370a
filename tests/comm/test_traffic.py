"""workshop.comm.traffic: bytes on the wire per rank, from hand-made events and from
the traces of a real launch (send/recv exact, collectives the ring's figures)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from workshop import launch
from workshop.comm.tracing import TraceEvent
from workshop.comm.traffic import bytes_by_rank, bytes_per_step, wire_bytes


def _ev(op, nbytes, world_size, **fields):
    return {"op": op, "nbytes": nbytes, "world_size": world_size, **fields}


def test_send_counts_as_sent_and_recv_as_received():
    traces = [
        [_ev("send", 400, 2, peer=1), _ev("irecv", 8, 2, peer=1)],
        [_ev("recv", 400, 2, peer=0), _ev("isend", 8, 2, peer=0)],
    ]
    rows = bytes_by_rank(traces)
    assert [(r["sent"], r["received"]) for r in rows] == [(400, 8), (8, 400)]
    assert [r["rank"] for r in rows] == [0, 1]
    assert rows[0]["calls"] == 2
    assert rows[0]["by_op"]["send"] == {"calls": 1, "sent": 400, "received": 0}


@pytest.mark.parametrize(("world_size", "share"), [(2, 4000), (3, 5333.33), (4, 6000)])
def test_all_reduce_counts_the_rings_2_n_minus_1_over_n(world_size, share):
    # 4000 bytes (1000 float32): each rank sends and receives 2(N-1)/N of them.
    traces = [[_ev("all_reduce", 4000, world_size)] for _ in range(world_size)]
    for row in bytes_by_rank(traces):
        assert row["sent"] == pytest.approx(share, abs=0.01)
        assert row["received"] == row["sent"]


def test_broadcast_is_a_chain_from_the_root():
    # root 1 of 4: 1 -> 2 -> 3 -> 0; rank 0 ends the chain and sends nothing.
    traces = [[_ev("broadcast", 100, 4, root=1)] for _ in range(4)]
    got = [(r["sent"], r["received"]) for r in bytes_by_rank(traces)]
    assert got == [(0, 100), (100, 0), (100, 100), (100, 100)]
    # The reduce runs the chain the other way, into the root.
    traces = [[_ev("reduce", 100, 4, root=1)] for _ in range(4)]
    got = [(r["sent"], r["received"]) for r in bytes_by_rank(traces)]
    assert got == [(100, 0), (0, 100), (100, 100), (100, 100)]


def test_gathers_and_scatters_count_one_ranks_chunk():
    # all_gather of 3 ranks, 10 float32 each: shapes of the out list, then the input.
    gather = _ev("all_gather", 160, 3, shapes=[(10,)] * 4, dtype="float32")
    assert wire_bytes(gather, rank=0) == (80.0, 80.0)
    # reduce_scatter_tensor: output of 5 float64 first, input of 15 after it.
    scatter = _ev(
        "reduce_scatter_tensor", 160, 3, shapes=[(5,), (15,)], dtype="float64"
    )
    assert wire_bytes(scatter, rank=2) == (80.0, 80.0)
    rooted = _ev(
        "gather", 48, 3, root=0, shapes=[(4,), (4,), (4,), (4,)], dtype="int32"
    )
    assert wire_bytes(rooted, rank=0) == (0.0, 32.0)
    assert wire_bytes(rooted, rank=2) == (16.0, 0.0)
    assert wire_bytes(_ev("barrier", 0, 3), rank=1) == (0.0, 0.0)


def test_trace_events_count_like_their_dicts():
    event = TraceEvent(
        rank=1, seq=0, op="all_reduce", peer=None, root=None, reduce_op="sum",
        world_size=4, shapes=[(1000,)], dtype="float32", nbytes=4000, blocking=True,
        start=0.0, end=1.0, before=None, after=None,
    )  # fmt: skip
    assert bytes_by_rank([[], [event]])[1]["sent"] == 6000.0
    assert bytes_per_step([[event, event]], steps=2)[0] == {
        "rank": 0,
        "sent": 6000.0,
        "received": 6000.0,
    }


def _mixed():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1000)  # 4000 bytes
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    if rank == 0:
        dist.send(t[:250], dst=world_size - 1)  # 1000 bytes
    elif rank == world_size - 1:
        dist.recv(torch.empty(250), src=0)
    out = [torch.empty(10) for _ in range(world_size)]
    dist.all_gather(out, torch.ones(10))


def test_a_real_traced_launch_counts_to_the_formulas():
    n, size = 4, 4000
    result = launch(_mixed, world_size=n, backend="gloo", trace=True, show="none")
    rows = bytes_by_rank(result.traces)
    ring = 2 * (n - 1) / n * size  # 6000 bytes each way
    gather = (n - 1) * 40
    # broadcast from 0: ranks 0..2 forward the whole tensor, ranks 1..3 receive it.
    assert rows[0]["sent"] == ring + size + 1000 + gather
    assert rows[0]["received"] == ring + gather
    assert rows[1]["sent"] == rows[1]["received"] == ring + size + gather
    assert rows[3]["sent"] == ring + gather
    assert rows[3]["received"] == ring + size + 1000 + gather
    # What is sent somewhere is received somewhere: the totals agree.
    assert sum(r["sent"] for r in rows) == sum(r["received"] for r in rows)
    assert rows[3]["by_op"]["recv"] == {"calls": 1, "sent": 0, "received": 1000}


def test_events_that_cannot_be_counted_are_explained():
    with pytest.raises(ValueError, match=r"op='ping': it is none of send, recv"):
        bytes_by_rank([[_ev("ping", 8, 2)]])
    with pytest.raises(ValueError, match=r"needs 'nbytes' and 'world_size'.*=None"):
        wire_bytes({"op": "send", "nbytes": 8})
    with pytest.raises(ValueError, match=r"needs 'root'.*root=None"):
        wire_bytes(_ev("broadcast", 8, 2), rank=0)
    with pytest.raises(ValueError, match=r"one list of events per rank, got dict"):
        bytes_by_rank({"op": "send"})
    with pytest.raises(
        ValueError, match=r"steps must be a whole number, 1 or more, not 0"
    ):
        bytes_per_step([[]], steps=0)
