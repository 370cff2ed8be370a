"""workshop.comm.trace_data: traces recorded on real ranks saved and read back, merged
in time order, and each collective grouped across ranks, with the order check."""

from __future__ import annotations

import json

import pytest
from test_tracing import W
from test_tracing import coll as coll  # the fixtures: one traced launch each
from test_tracing import p2p as p2p

from workshop.comm.trace_data import (
    FORMAT,
    collectives,
    from_dicts,
    load,
    merge,
    save,
    to_dicts,
)
from workshop.comm.tracing import TraceEvent


# ------------------------------------------------------------------ plain data
def test_json_round_trip(coll, tmp_path):
    back = from_dicts(json.loads(json.dumps(to_dicts(coll[0]))))
    assert back == coll[0]
    path = tmp_path / "trace.json"
    save(path, coll)
    assert json.loads(path.read_text())["format"] == FORMAT
    assert load(path) == coll


def _event(rank, seq, op):
    return TraceEvent(
        rank=rank,
        seq=seq,
        op=op,
        peer=None,
        root=None,
        reduce_op=None,
        world_size=3,
        shapes=[],
        dtype=None,
        nbytes=0,
        blocking=True,
        start=float(seq),
        end=float(seq),
        before=None,
        after=None,
    )


def test_load_rejects_other_files(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match=r"not a workshop trace.*something-else"):
        load(path)
    with pytest.raises(ValueError, match="event 0 is not a trace event"):
        from_dicts([{"rank": 0}])


def test_merge_sorts_all_ranks_by_start(coll):
    merged = merge(coll)
    assert len(merged) == sum(len(events) for events in coll)
    assert [e.start for e in merged] == sorted(e.start for e in merged)


def test_collectives_group_the_same_call_across_ranks(coll, p2p):
    groups = collectives(coll)
    assert len(groups) == len(coll[0])
    for k, group in enumerate(groups):
        assert [e.rank for e in group] == list(range(W))
        assert {e.op for e in group} == {coll[0][k].op}
    # point-to-point calls are not collectives
    assert [g[0].op for g in collectives([r["events"] for r in p2p])] == [
        "all_reduce",
        "all_reduce",
    ]


def test_collectives_in_different_orders_are_named():
    by_rank = [
        [_event(r, 0, "barrier"), _event(r, 1, op)]
        for r, op in enumerate(["all_reduce", "broadcast", "all_reduce"])
    ]
    with pytest.raises(
        ValueError,
        match=r"collective call #1 differs between ranks: ranks 0, 2 called "
        r"all_reduce; rank 1 called broadcast\. Every rank must call the same "
        r"collectives in the same order.*HINT",
    ):
        collectives(by_rank)
    short = [[_event(0, 0, "barrier")], []]
    with pytest.raises(ValueError, match=r"rank 1 called nothing \(it had stopped\)"):
        collectives(short)
