"""How a rank's end is judged and reported by ``workshop.launch``: ``sys.exit(0)``
is a success, as under torchrun; another ``sys.exit`` is a failure naming the rank
and its code; a rank that crashes in C code (a segfault) is reported with
faulthandler's fatal error and the innermost frames of its function, not with the
list of extension modules faulthandler prints last. Ranks are pinned to gloo."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed as dist

import workshop
from workshop import LaunchError
from workshop.ranks.rank import ended_well, exit_status

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def launch(*args, **kwargs):
    """workshop.launch on CPU ranks with gloo, quietly."""
    kwargs.setdefault("backend", "gloo")
    kwargs.setdefault("show", "none")
    return workshop.launch(*args, **kwargs)


def _exits_on_rank_1(how):
    t = torch.ones(1)
    dist.all_reduce(t)  # the ranks meet once first: the group is up everywhere
    if dist.get_rank() == 1:
        if how == "no argument":
            sys.exit()
        sys.exit(how)
    return f"rank {dist.get_rank()} of {int(t.item())}"


@pytest.mark.parametrize("how", [0, None, False, "no argument"])
def test_sys_exit_with_code_0_is_a_success_and_keeps_the_other_returns(how):
    result = launch(_exits_on_rank_1, how, world_size=3)
    assert result.returns == ["rank 0 of 3", None, "rank 2 of 3"]
    assert result.exit_codes == [0, 0, 0]


@pytest.mark.parametrize("method", ["server", "spawn"])
def test_sys_exit_0_is_a_success_on_every_start_method(method):
    result = launch(_exits_on_rank_1, 0, world_size=2, start_method=method)
    assert result.returns == ["rank 0 of 2", None]
    assert result.exit_codes == [0, 0]


def test_a_non_zero_sys_exit_fails_naming_the_rank_and_the_code():
    with pytest.raises(
        LaunchError,
        match=r"rank 1 of 2 failed; rank 1 first, with SystemExit: 3 \(fn called "
        r"sys\.exit\(3\); only sys\.exit\(0\) or sys\.exit\(\) ends a rank "
        r"successfully",
    ) as info:
        launch(_exits_on_rank_1, 3, world_size=2)
    error = info.value
    assert error.failed_ranks == [1]
    assert error.errors[1].type == "SystemExit"
    assert "in _exits_on_rank_1" in str(error)  # its traceback says where
    # The rank's process exits with the code it gave, as Python itself would.
    assert error.result.exit_codes[1] == 3


def test_a_sys_exit_with_a_message_is_a_failure_with_status_1():
    with pytest.raises(
        LaunchError,
        match=r"with SystemExit: bad config \(fn called sys\.exit\('bad config'\)",
    ) as info:
        launch(_exits_on_rank_1, "bad config", world_size=2)
    assert info.value.failed_ranks == [1]
    assert info.value.result.exit_codes[1] == 1


def test_which_exits_count_as_success_and_with_what_status():
    assert [ended_well(SystemExit(c)) for c in (0, None, False)] == [True] * 3
    assert [ended_well(SystemExit(c)) for c in (1, 3, True, "x", 0.0)] == [False] * 5
    assert exit_status(SystemExit(3)) == 3
    assert exit_status(SystemExit(255)) == 255
    # 256 would reach the OS as 0 (success), -1 as 255: both become a plain 1.
    assert exit_status(SystemExit(256)) == 1
    assert exit_status(SystemExit(-1)) == 1
    assert exit_status(SystemExit("message")) == 1
    assert exit_status(KeyboardInterrupt()) == 130
    assert exit_status(ValueError("x")) == 1


def _segv_on_1():
    import ctypes
    import resource

    if dist.get_rank() == 1:
        print("about to crash", flush=True)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file to write
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return dist.get_rank()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_segfault_is_reported_with_the_fatal_error_and_the_frames(method):
    with pytest.raises(
        LaunchError,
        match=r"rank 1 was killed by SIGSEGV without reporting an error: "
        r"'Fatal Python error: Segmentation fault'\. Where its function was",
    ) as info:
        launch(_segv_on_1, world_size=2, start_method=method)
    message = str(info.value)
    lines = message.splitlines()
    at = lines.index(next(line for line in lines if "Where its function was" in line))
    # The lesson's line first, then the library call it made, innermost last.
    assert lines[at + 1].endswith("in _segv_on_1: ctypes.string_at(0)"), message
    assert lines[at + 2].endswith("in string_at"), message
    assert "HINT: the crash was in C code" in lines[at + 3]
    assert "result.stderr[1] has the whole report" in lines[at + 3]
    # faulthandler's last line, its list of extension modules, is left out.
    assert "Extension modules" not in message
    assert "Extension modules" in info.value.result.stderr[1]
    assert info.value.failed_ranks == [1]
    assert info.value.result.exit_codes[1] == -11
    assert info.value.result.stdout[1] == "about to crash\n"


def _killed_on_rank_1():
    import os
    import signal

    if dist.get_rank() == 1:
        print("last words", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # no faulthandler report: none can run
    return dist.get_rank()


def test_a_rank_killed_without_a_report_is_named_by_its_last_line():
    with pytest.raises(
        LaunchError,
        match=r"rank 1 was killed by SIGKILL without reporting an error; its last "
        r"line: 'last words'",
    ):
        launch(_killed_on_rank_1, world_size=2)


def _os_exit_0_on_rank_1():
    import os

    t = torch.ones(1)
    dist.all_reduce(t)  # the group is up everywhere
    if dist.get_rank() == 1:
        os._exit(0)  # leaves without a report, with the code of a success
    dist.all_reduce(t)  # rank 0 waits for rank 1 here, and loses it
    return dist.get_rank()


def test_a_rank_that_leaves_by_os_exit_0_is_named_as_the_cause():
    # Before, the error blamed rank 0 with gloo's "Connection closed by peer" and
    # never named rank 1.
    with pytest.raises(LaunchError) as caught:
        launch(_os_exit_0_on_rank_1, world_size=2, timeout=120)
    message = str(caught.value)
    assert message.startswith(
        "rank(s) 1 of 2 ended their process with exit code 0 without returning "
        "(os._exit(0), or a library that ended the process) while rank(s) 0 still "
        "called a collective with them"
    ), message
    assert "look for a return, sys.exit or os._exit that only some ranks" in message
    assert caught.value.failed_ranks == [0]
    assert caught.value.result.exit_codes[1] == 0
