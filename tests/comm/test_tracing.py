"""workshop.comm.tracing: every torch.distributed call recorded on real gloo ranks, the
module left exactly as it was, plain-data round trips and the collective-order check."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from workshop import has_collective, launch
from workshop.comm.tracing import OPS, TraceEvent, record

W = 3  # ranks in the collectives run
# gloo learned all_to_all's list form in 2026 (torch 2.11's gloo lacks it); the run
# leaves it out where this torch cannot do it, and the tests then check the rest.
LIST_A2A = has_collective("all_to_all")
# gloo in torch 2.4 has no reduce_scatter (neither form).
REDUCE_SCATTER = has_collective("reduce_scatter")


def _every_collective(list_a2a=True, reduce_scatter=True):
    r, w = dist.get_rank(), dist.get_world_size()

    def mine():
        return torch.tensor([float(r)])

    with record() as events:
        dist.broadcast(mine(), src=1)
        dist.all_reduce(mine())
        dist.reduce(mine(), dst=2, op=dist.ReduceOp.MAX)
        dist.all_gather([torch.zeros(1) for _ in range(w)], mine())
        dist.all_gather_into_tensor(torch.zeros(w), mine())
        gather_list = [torch.zeros(1) for _ in range(w)] if r == 0 else None
        dist.gather(mine(), gather_list, dst=0)
        scatter_list = [torch.tensor([10.0 + i]) for i in range(w)] if r == 1 else None
        dist.scatter(torch.zeros(1), scatter_list, src=1)
        parts = [torch.tensor([10.0 * r + i]) for i in range(w)]
        if reduce_scatter:
            dist.reduce_scatter(torch.zeros(1), parts)
            arange = torch.arange(w, dtype=torch.float32)
            dist.reduce_scatter_tensor(torch.zeros(1), arange)
        if list_a2a:
            dist.all_to_all([torch.zeros(1) for _ in range(w)], parts)
        dist.all_to_all_single(torch.zeros(w), torch.cat(parts))
        dist.barrier()
        work = dist.all_reduce(mine(), op=dist.ReduceOp.MAX, async_op=True)
        work.wait()
    return events


def _point_to_point():
    r = dist.get_rank()
    other = 1 - r
    original = dist.all_reduce
    with record(max_values=8) as events:
        if r == 0:
            dist.send(torch.tensor([1.0, 2.0]), dst=1)
            dist.recv(torch.zeros(2), src=1)
            dist.send(torch.tensor([7.0]), dst=1)
        else:
            dist.recv(torch.zeros(2), src=0)
            dist.send(torch.tensor([3.0, 4.0]), dst=0)
            dist.recv(torch.zeros(1))  # from any source
        sent = dist.isend(torch.tensor([10.0 + r]), dst=other)
        buf = torch.zeros(1)
        got = dist.irecv(buf, src=other)
        got.wait()
        sent.wait()
        dist.all_reduce(torch.ones(3, 4))  # 12 numbers > max_values: shapes only
        with record(max_values=100) as inner:  # nested: no double wrapping
            wrapped = dist.all_reduce
            dist.all_reduce(torch.ones(3, 4))
    restored = dist.all_reduce is original
    try:
        with record():
            raise KeyError("boom")
    except KeyError:
        pass
    return {
        "events": events,
        "inner": inner,
        "wrapped_once": wrapped.__wrapped__ is original,
        "restored": restored,
        "restored_after_error": dist.all_reduce is original,
    }


@pytest.fixture(scope="module")
def coll():
    return launch(
        _every_collective,
        LIST_A2A,
        REDUCE_SCATTER,
        world_size=W,
        backend="gloo",
        show="none",
    ).returns


@pytest.fixture(scope="module")
def p2p():
    return launch(_point_to_point, world_size=2, backend="gloo", show="none").returns


def _op(events, op, nth=0):
    return [e for e in events if e.op == op][nth]


# ------------------------------------------------------------------ collectives
def test_every_rank_records_every_call_in_order(coll):
    expected = [
        "broadcast",
        "all_reduce",
        "reduce",
        "all_gather",
        "all_gather_into_tensor",
        "gather",
        "scatter",
        *(["reduce_scatter", "reduce_scatter_tensor"] if REDUCE_SCATTER else []),
        *(["all_to_all"] if LIST_A2A else []),
        "all_to_all_single",
        "barrier",
        "all_reduce",
    ]
    for r, events in enumerate(coll):
        assert [e.op for e in events] == expected
        assert [e.seq for e in events] == list(range(len(expected)))
        assert all(isinstance(e, TraceEvent) for e in events)
        assert {e.rank for e in events} == {r}
        assert {e.world_size for e in events} == {W}
        assert all(e.peer is None for e in events)
        assert all(e.start <= e.end for e in events)
        assert [e.start for e in events] == sorted(e.start for e in events)


def test_all_reduce_before_is_the_rank_after_is_the_sum(coll):
    for r, events in enumerate(coll):
        e = _op(events, "all_reduce")
        assert (e.before, e.after) == ([float(r)], [float(sum(range(W)))])
        assert (e.reduce_op, e.root, e.blocking) == ("sum", None, True)
        assert (e.shapes, e.dtype, e.nbytes) == ([(1,)], "float32", 4)


def test_async_all_reduce_records_after_at_wait(coll):
    for r, events in enumerate(coll):
        e = _op(events, "all_reduce", 1)
        assert (e.blocking, e.reduce_op) == (False, "max")
        assert (e.before, e.after) == ([float(r)], [float(W - 1)])


def test_rooted_collectives_name_their_root(coll):
    for r, events in enumerate(coll):
        b = _op(events, "broadcast")
        assert (b.root, b.before, b.after) == (1, [float(r)], [1.0])
        red = _op(events, "reduce")
        assert (red.root, red.reduce_op, red.before) == (2, "max", [float(r)])
        if r == 2:
            assert red.after == [float(W - 1)]


def test_gather_and_scatter_record_their_lists(coll):
    # before: what the call reads on this rank; after: what it writes there.
    for r, events in enumerate(coll):
        g = _op(events, "gather")
        assert g.root == 0
        assert g.before == [float(r)]
        if r == 0:
            assert g.after == [[float(i)] for i in range(W)]
            assert g.shapes == [(1,)] * (W + 1)
        else:
            assert g.after is None  # only the root has a gather_list
            assert g.shapes == [(1,)]
        s = _op(events, "scatter")
        assert s.root == 1
        assert s.after == [10.0 + r]
        if r == 1:
            assert s.before == [[10.0 + i] for i in range(W)]
            assert s.nbytes == 4 * (W + 1)
        else:
            assert s.before is None  # only the root has a scatter_list


def test_gathers_reduce_scatters_and_all_to_alls(coll):
    for r, events in enumerate(coll):
        ag = _op(events, "all_gather")
        assert ag.before == [float(r)]
        assert ag.after == [[float(i)] for i in range(W)]
        assert ag.shapes == [(1,)] * (W + 1)
        agt = _op(events, "all_gather_into_tensor")
        assert agt.before == [float(r)]
        assert agt.after == [float(i) for i in range(W)]
        assert agt.shapes == [(W,), (1,)]
        if REDUCE_SCATTER:
            rs = _op(events, "reduce_scatter")
            assert rs.reduce_op == "sum"
            assert rs.before == [[10.0 * r + i] for i in range(W)]
            assert rs.after == [sum(10.0 * q + r for q in range(W))]
            rst = _op(events, "reduce_scatter_tensor")
            assert rst.before == [float(i) for i in range(W)]
            assert rst.after == [float(W * r)]
        if LIST_A2A:
            a2a = _op(events, "all_to_all")
            assert a2a.before == [[10.0 * r + i] for i in range(W)]
            assert a2a.after == [[10.0 * q + r] for q in range(W)]
        a2as = _op(events, "all_to_all_single")
        assert a2as.after == [10.0 * q + r for q in range(W)]
        assert a2as.nbytes == 2 * W * 4


def test_barrier_has_no_tensors(coll):
    e = _op(coll[0], "barrier")
    assert (e.shapes, e.dtype, e.nbytes, e.before, e.after) == ([], None, 0, None, None)


# --------------------------------------------------------------- point to point
def test_send_and_recv_name_their_peer(p2p):
    zero, one = p2p[0]["events"], p2p[1]["events"]
    assert [e.op for e in zero[:3]] == ["send", "recv", "send"]
    assert [e.op for e in one[:3]] == ["recv", "send", "recv"]
    assert all(e.peer == 1 for e in zero[:5]) and all(e.peer == 0 for e in one[:5])
    assert all(e.root is None and e.reduce_op is None for e in zero[:5] + one[:5])
    assert zero[0].before == zero[0].after == [1.0, 2.0]
    assert (one[0].before, one[0].after) == ([0.0, 0.0], [1.0, 2.0])
    assert zero[1].after == [3.0, 4.0]
    # a recv from any source records where the message came from
    assert (one[2].peer, one[2].after) == (0, [7.0])


def test_isend_irecv_are_nonblocking_and_record_at_wait(p2p):
    for r in (0, 1):
        events = p2p[r]["events"]
        isend, irecv = _op(events, "isend"), _op(events, "irecv")
        assert (isend.blocking, irecv.blocking) == (False, False)
        assert isend.before == [10.0 + r]
        assert (irecv.peer, irecv.before, irecv.after) == (1 - r, [0.0], [11.0 - r])


def test_large_tensors_keep_shapes_but_no_values(p2p):
    events = p2p[0]["events"]
    big = _op(events, "all_reduce")
    assert (big.shapes, big.nbytes, big.before, big.after) == ([(3, 4)], 48, None, None)
    # the nested recording allows 100 values; the outer one, 8
    inner = p2p[0]["inner"]
    assert len(inner) == 1 and inner[0].seq == 0
    assert inner[0].after == [[2.0] * 4] * 3
    assert events[-1].after is None and events[-1].shapes == [(3, 4)]


def test_functions_are_restored_after_the_block_and_after_an_error(p2p):
    for rank in p2p:
        assert rank["restored"] and rank["restored_after_error"]
        assert rank["wrapped_once"]


def test_module_is_left_exactly_as_it_was():
    originals = {name: getattr(dist, name) for name in OPS}
    with record():
        assert all(getattr(dist, n) is not originals[n] for n in OPS)
        with record():
            assert all(getattr(dist, n).__wrapped__ is originals[n] for n in OPS)
        assert all(getattr(dist, n).__wrapped__ is originals[n] for n in OPS)
    assert all(getattr(dist, n) is originals[n] for n in OPS)
    with pytest.raises(ZeroDivisionError), record():
        print(1 / 0)
    assert all(getattr(dist, n) is originals[n] for n in OPS)


def test_exceptions_of_the_wrapped_call_are_unchanged():
    # No process group in the test process: the real error comes through untouched.
    assert not dist.is_initialized()
    with pytest.raises(Exception) as plain:
        dist.all_reduce(torch.ones(1))
    with record() as events, pytest.raises(type(plain.value)) as traced:
        dist.all_reduce(torch.ones(1))
    assert str(traced.value) == str(plain.value)
    assert events == []


def test_max_values_must_not_be_negative():
    with (
        pytest.raises(
            ValueError, match="max_values must be a whole number, 0 or more, not -1"
        ),
        record(max_values=-1),
    ):
        pass
