"""workshop.parallel.param_shards: parameters sharded over S servers train as one
server does (the same sums, slice by slice), and each server's traffic, counted from
traces, is W / S gradients per step."""

from __future__ import annotations

import pytest
import torch

from workshop import launch
from workshop.comm.traffic import bytes_per_step
from workshop.parallel.param_server import parameter_server
from workshop.parallel.param_shards import sharded_parameter_server
from workshop.ranks.session import LaunchError

STEPS, WIDTH, WORKERS = 2, 1001, 2  # 1001: the slices differ in size (501, 500)
OPTIONS = {"backend": "gloo", "show": "none"}


@pytest.fixture(scope="module")
def one_and_two():
    """One server and two servers, W = 2 workers."""
    one = launch(parameter_server, STEPS, 0.1, WIDTH, world_size=1 + WORKERS, **OPTIONS)
    two = launch(
        sharded_parameter_server,
        STEPS,
        0.1,
        WIDTH,
        0,
        2,
        world_size=2 + WORKERS,
        **OPTIONS,
    )
    return one, two


def test_two_servers_train_as_one(one_and_two):
    one, two = one_and_two
    servers, workers = two.returns[:2], two.returns[2:]
    assert [r["role"] for r in two.returns] == ["server"] * 2 + ["worker"] * 2
    assert [s["slice"] for s in servers] == [[0, 501], [501, 1001]]
    whole = torch.cat([s["params"] for s in servers])
    # The same sums in the same order, slice by slice. Bit for bit on a machine whose
    # ranks get one thread each; where the two launches' ranks get different numbers
    # of threads (world sizes 3 and 4 on 16 cores), a worker's matrix product adds in
    # another order, so allow float32 rounding (seen on a 16-core GPU node: 1 failure
    # of torch.equal with every element agreeing to 4 digits).
    torch.testing.assert_close(whole, one.returns[0]["params"], rtol=1e-5, atol=1e-7)
    for worker in workers:
        assert worker["servers"] == 2 and worker["workers"] == WORKERS
        assert torch.equal(worker["params"], whole)  # one run: exactly the same
        assert worker["losses"] == pytest.approx(one.returns[0]["losses"], rel=1e-5)
        assert worker["losses"][-1] < worker["losses"][0]


def test_each_server_carries_w_over_s_gradients_per_step():
    # What notebook 04's cell counts: each rank's bytes per step, from the traces.
    gradient, workers = 4 * WIDTH, 4
    per_server = {}
    for s in (1, 2):
        run = launch(
            sharded_parameter_server, STEPS, 0.1, WIDTH, 0, s,
            world_size=s + workers, trace=True, **OPTIONS,
        )  # fmt: skip
        counts = bytes_per_step(run.traces, STEPS)
        per_server[s] = [(c["received"], c["sent"]) for c in counts[:s]]
        for worker in counts[
            s:
        ]:  # a worker moves a whole gradient and all the parameters
            assert worker["sent"] == worker["received"] == gradient
    assert per_server[1] == [(4 * gradient,) * 2]
    # 1001 floats in slices of 501 and 500: the busier server is the bigger slice.
    assert per_server[2] == [(4 * 4 * 501,) * 2, (4 * 4 * 500,) * 2]


def test_bad_arguments_are_refused_with_the_fix():
    with pytest.raises(
        ValueError, match=r"servers must be a whole number, 1 or more, not 0"
    ):
        sharded_parameter_server(servers=0)
    with pytest.raises(ValueError, match=r"servers=5 for width=4 parameters"):
        sharded_parameter_server(width=4, servers=5)
    with pytest.raises(
        ValueError, match=r"steps must be a whole number, 1 or more, not 0"
    ):
        sharded_parameter_server(steps=0)
    with pytest.raises(RuntimeError, match=r"launch\(sharded_parameter_server"):
        sharded_parameter_server()


def test_servers_without_workers_are_refused():
    with pytest.raises(LaunchError, match=r"needs world_size >= 3.*got world_size=2"):
        launch(sharded_parameter_server, servers=2, world_size=2, **OPTIONS)
