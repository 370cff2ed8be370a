"""A launch whose process group fails while being set up is not started again: it
fails with an error that says so and gives the next step. The function never runs
twice, and never before every rank has joined."""

from __future__ import annotations

import os
import re

import pytest
import torch.distributed as dist

from workshop import LaunchError, launch
from workshop.ranks.rank import RankError
from workshop.ranks.setup_failure import failed_while_connecting, setup_failure

MESH = (
    "Gloo connectFullMesh failed with [gloo/transport/tcp/pair.cc:561] Connection "
    "closed by peer [127.0.0.1]:19658. This is typically caused by a remote worker "
    "crashing."
)
IN_INIT = 'File "distributed_c10d.py", in init_process_group\nRuntimeError: ' + MESH


def _error(errors: dict[int, RankError], failed: list[int]) -> LaunchError:
    # Only the errors are read; no launch ran, so there is no result.
    return LaunchError("x", None, failed_ranks=failed, errors=errors)


def _rank_error(message: str, traceback: str, at: float = 0.0) -> RankError:
    return RankError(type="RuntimeError", message=message, traceback=traceback, time=at)


def test_only_a_failure_to_connect_while_joining_is_a_setup_failure():
    joining = _rank_error(MESH, IN_INIT)
    assert failed_while_connecting(_error({0: joining, 1: joining}, [0]))
    # The same words from the function's own collective: its code has run.
    in_fn = _rank_error(MESH, 'File "cell", in train\n  dist.all_reduce(t)')
    assert not failed_while_connecting(_error({0: joining, 2: in_fn}, [0, 2]))
    other = _rank_error("rank 1 cannot go on", "in init_process_group\nValueError")
    assert not failed_while_connecting(_error({1: other}, [1]))
    # A rank that crashed (no error reported) is not a set-up failure.
    assert not failed_while_connecting(_error({0: joining}, [0, 3]))
    assert not failed_while_connecting(_error({}, [1]))


def test_the_error_names_the_ranks_that_failed_and_what_to_do():
    errors = {2: _rank_error(MESH, IN_INIT, at=2.0), 1: _rank_error(MESH, IN_INIT, 1.0)}
    error = setup_failure(_error(errors, [1, 2]), [0, 3], world_size=4)
    text = str(error)
    assert text.startswith(
        "ranks 1, 2 of 4 failed while joining the process group, before the function "
        "ran on any rank; rank 1 first, with RuntimeError: Gloo connectFullMesh "
        "failed with [gloo/transport/tcp/pair.cc:561] Connection closed by peer "
        "[127.0.0.1]:19658.\n"
        "HINT: no rank starts the function before every rank has joined, so no rank "
        "of this launch left early: a rank died or a connection broke while the "
        "group was being made. Nothing of the function ran: run the launch again, "
        "and if it fails again, report it with what `python -m workshop.bench "
        "concurrent` prints.\n"
        "The launcher stopped ranks 0, 3.\n"
    )
    assert "Traceback of rank 1:\n" + IN_INIT in text
    assert "typically caused" not in text.split("\n\n")[0]
    assert error.failed_ranks == [1, 2] and error.errors is errors


def _count_call(path: str) -> int:
    with open(path, "a") as f:
        f.write("ran\n")
    return dist.get_rank()


def test_a_setup_failure_is_an_error_and_not_a_restart(tmp_path, monkeypatch, capfd):
    # The first rank to join raises what gloo raised on the busy machine; forked
    # ranks inherit the patch, and a file makes it happen once in the whole launch,
    # so a restart would succeed: the launch must fail instead.
    marker = tmp_path / "failed-once"
    calls = tmp_path / "calls"
    real = dist.init_process_group

    def flaky(*args, **kwargs):
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return real(*args, **kwargs)
        raise RuntimeError(MESH)

    monkeypatch.setattr(dist, "init_process_group", flaky)
    with pytest.raises(LaunchError) as info:
        launch(
            _count_call,
            str(calls),
            world_size=2,
            start_method="fork",
            show="none",
            timeout=60,
        )
    text = str(info.value)
    assert re.match(
        r"rank [01] of 2 failed while joining the process group, before the function "
        r"ran on any rank, with RuntimeError: Gloo connectFullMesh failed with "
        r"\[gloo/transport/tcp/pair.cc:561\] Connection closed by peer "
        r"\[127.0.0.1\]:19658.\nHINT: no rank starts the function before every "
        r"rank has joined, .* Nothing of the function ran: run the launch again, .*\n"
        r"The launcher stopped rank [01].\n",
        text,
    )
    assert not calls.exists()  # on no rank, and not twice on any
    assert "again" not in capfd.readouterr().err  # no restart notice


def _fails():
    raise ValueError("bad shard 7")


def test_a_function_that_fails_is_not_called_a_setup_failure():
    with pytest.raises(LaunchError, match="bad shard 7") as info:
        launch(_fails, world_size=2, start_method="fork", show="none")
    assert "joining the process group" not in str(info.value)
