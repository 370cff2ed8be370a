"""workshop.launch starts the ranks again when their process group failed to connect
(gloo's connectFullMesh, seen on a busy machine with 6 kernels launching at once),
and only then: a function that fails is never run twice."""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from workshop import LaunchError, launch
from workshop.ranks import launcher
from workshop.ranks.rank import RankError

MESH = (
    "Gloo connectFullMesh failed with [gloo/transport/tcp/pair.cc:561] Connection "
    "closed by peer [127.0.0.1]:19658. This is typically caused by a remote worker "
    "crashing."
)
IN_INIT = 'File "distributed_c10d.py", in init_process_group\nRuntimeError: ' + MESH


def _error(errors: dict[int, RankError], failed: list[int]) -> LaunchError:
    # Only the errors are read; no launch ran, so there is no result.
    return LaunchError("x", None, failed_ranks=failed, errors=errors)


def _rank_error(message: str, traceback: str) -> RankError:
    return RankError(type="RuntimeError", message=message, traceback=traceback, time=0)


def test_only_a_failure_to_connect_while_joining_is_retried():
    joining = _rank_error(MESH, IN_INIT)
    assert launcher._failed_while_connecting(_error({0: joining, 1: joining}, [0]))
    # The same words from the function's own collective: its code has run.
    in_fn = _rank_error(MESH, 'File "cell", in train\n  dist.all_reduce(t)')
    assert not launcher._failed_while_connecting(_error({0: joining, 2: in_fn}, [0, 2]))
    other = _rank_error("rank 1 cannot go on", "in init_process_group\nValueError")
    assert not launcher._failed_while_connecting(_error({1: other}, [1]))
    # A rank that crashed (no error reported) is not a set-up failure.
    assert not launcher._failed_while_connecting(_error({0: joining}, [0, 3]))
    assert not launcher._failed_while_connecting(_error({}, [1]))


def _hello():
    return dist.get_rank()


def test_ranks_whose_group_failed_to_connect_are_started_again(
    tmp_path, monkeypatch, capfd
):
    # The first rank to join raises what gloo raised on the busy machine; forked
    # ranks inherit the patch, and a file makes it happen once in the whole launch.
    marker = tmp_path / "failed-once"
    real = dist.init_process_group

    def flaky(*args, **kwargs):
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return real(*args, **kwargs)
        raise RuntimeError(MESH)

    monkeypatch.setattr(dist, "init_process_group", flaky)
    result = launch(_hello, world_size=2, start_method="fork", show="none")
    assert result.returns == [0, 1]
    err = capfd.readouterr().err
    assert "connections failed while being set up" in err
    assert "starting the ranks again (attempt 2 of 3)" in err
    assert "Connection closed by peer [127.0.0.1]:19658" in err


def _fails():
    raise ValueError("bad shard 7")


def test_a_function_that_fails_is_not_run_again(capfd):
    with pytest.raises(LaunchError, match="bad shard 7"):
        launch(_fails, world_size=2, start_method="fork", show="none")
    assert "starting the ranks again" not in capfd.readouterr().err
