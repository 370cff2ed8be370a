"""workshop.parallel.param_server: the synchronous parameter server trains exactly as
all-reduce does, its traffic (counted from traces) grows with the workers while an
all-reduce rank's stays flat, and the asynchronous server applies every gradient once,
stale ones included."""

from __future__ import annotations

import itertools

import pytest
import torch

from workshop import launch
from workshop.comm.costmodel import bus_factor
from workshop.comm.traffic import bytes_per_step
from workshop.parallel.param_server import (
    allreduce_baseline,
    async_parameter_server,
    parameter_server,
)
from workshop.ranks.session import LaunchError

STEPS, WIDTH = 3, 1000
GRADIENT_BYTES = 4 * WIDTH  # float32
# The server adds the W gradients in rank order, a ring all-reduce in another order:
# float32 rounding only, measured at about 1e-8 on parameters of about 0.03.
ATOL = 1e-6


@pytest.fixture(scope="module")
def runs():
    """Both synchronous runs, traced, for W = 2, 3 and 4 workers."""
    found = {}
    for w in (2, 3, 4):
        options = {"backend": "gloo", "trace": True, "show": "none"}
        ps = launch(parameter_server, STEPS, 0.1, WIDTH, world_size=w + 1, **options)
        ar = launch(allreduce_baseline, STEPS, 0.1, WIDTH, world_size=w, **options)
        found[w] = ps, ar
    return found


@pytest.mark.parametrize("workers", [2, 3])
def test_synchronous_server_ends_with_the_all_reduce_parameters(runs, workers):
    ps, ar = runs[workers]
    server = ps.returns[0]
    assert server["role"] == "server" and server["workers"] == workers
    assert [r["role"] for r in ps.returns[1:]] == ["worker"] * workers
    for reference in ar.returns:
        assert torch.allclose(server["params"], reference["params"], atol=ATOL)
        assert reference["losses"] == pytest.approx(server["losses"], rel=1e-5)
    # Every worker received the server's parameters, bit for bit.
    for worker in ps.returns[1:]:
        assert torch.equal(worker["params"], server["params"])
        assert worker["checksum"] == server["checksum"]


def test_synchronous_training_lowers_the_loss(runs):
    for ps, _ in runs.values():
        losses = ps.returns[0]["losses"]
        assert len(losses) == STEPS
        assert all(b < a for a, b in itertools.pairwise(losses))
        # Each worker's own shard loss falls too.
        assert ps.returns[1]["shard_losses"][-1] < ps.returns[1]["shard_losses"][0]


def test_server_traffic_grows_with_workers_and_all_reduce_stays_flat(runs):
    for w, (ps, ar) in runs.items():
        server, *workers = bytes_per_step(ps.traces, STEPS)
        # In: W gradients; out: W copies of the parameters, as large as a gradient.
        assert server["received"] == server["sent"] == w * GRADIENT_BYTES
        for worker in workers:
            assert worker["sent"] == worker["received"] == GRADIENT_BYTES
        for rank in bytes_per_step(ar.traces, STEPS):
            assert rank["sent"] == pytest.approx(bus_factor(w) * GRADIENT_BYTES)
            assert rank["received"] == rank["sent"] < 2 * GRADIENT_BYTES
    # Linear in W: each extra worker adds one gradient in and one copy out.
    per_server = [
        bytes_per_step(runs[w][0].traces, STEPS)[0]["sent"] for w in (2, 3, 4)
    ]
    assert per_server[2] - per_server[1] == per_server[1] - per_server[0]
    assert per_server[1] - per_server[0] == GRADIENT_BYTES


def test_async_server_applies_every_gradient_exactly_once():
    steps, workers = 10, 3
    options = {"world_size": workers + 1, "backend": "gloo", "show": "none"}
    run = launch(async_parameter_server, steps, **options)
    server, *ranks = run.returns
    updates = server["updates"]
    assert len(updates) == steps * workers == server["version"]
    assert [u["applied_at"] for u in updates] == list(range(steps * workers))
    for worker in ranks:
        mine = [u for u in updates if u["worker"] == worker["rank"]]
        # Each of its gradients arrived once, in the order it sent them.
        assert [u["computed_on"] for u in mine] == worker["computed_on"]
        assert len(mine) == steps
        assert worker["version"] <= server["version"]
    assert min(server["staleness"]) >= 0
    assert server["staleness"] == [u["applied_at"] - u["computed_on"] for u in updates]
    assert len(server["losses"]) == steps * workers
    assert server["losses"][-1] < server["initial_loss"] / 2
    assert len(server["sync_losses"]) == len(server["matched_losses"]) == steps
    assert server["sync_losses"][-1] < server["initial_loss"]


def test_a_slow_workers_updates_arrive_stale():
    options = {"world_size": 3, "backend": "gloo", "show": "none"}
    run = launch(async_parameter_server, 5, slow_rank_seconds=0.2, **options)
    server, fast, slow = run.returns
    assert (fast["slow"], slow["slow"]) == (False, True)
    slow_updates = [u["staleness"] for u in server["updates"] if u["worker"] == 2]
    # While it sleeps 0.2 s the other worker pushes updates (about 1 ms each), so
    # its first gradient at least is applied after others: stale by 1 or more.
    assert max(slow_updates) >= 1
    assert server["losses"][-1] < server["initial_loss"]


def test_bad_arguments_are_refused_with_the_fix():
    with pytest.raises(
        ValueError, match=r"steps must be a whole number, 1 or more, not 0"
    ):
        parameter_server(steps=0)
    with pytest.raises(ValueError, match=r"lr must be a number above 0, not 0"):
        allreduce_baseline(lr=0)
    with pytest.raises(ValueError, match=r"not -0.1; pass a learning rate"):
        async_parameter_server(lr=-0.1)
    with pytest.raises(
        ValueError,
        match=r"slow_rank_seconds must be a number of seconds, 0 or more, not -1",
    ):
        async_parameter_server(slow_rank_seconds=-1)
    with pytest.raises(
        RuntimeError,
        match=r"no process group is initialised in this process; start it with "
        r"workshop\.launch\(parameter_server",
    ):
        parameter_server()


def test_a_server_without_workers_is_refused():
    with pytest.raises(LaunchError, match=r"needs world_size >= 2.*got world_size=1"):
        launch(parameter_server, world_size=1, backend="gloo", show="none")
