"""What launch refuses before it starts a single process: arguments it cannot use, a
call from inside a rank, and more ranks than the machine can take."""

from __future__ import annotations

import asyncio
import math
import os

import pytest
import torch.distributed as dist
from conftest import children_of

import workshop
from workshop import LaunchError
from workshop.allocation import usable_cores
from workshop.ranks import launcher as checks
from workshop.ranks import sweep

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def _refused(*args, **kwargs) -> None:
    """Call launch, which must refuse; check that nothing was started."""
    kwargs.setdefault("backend", "gloo")
    launches, children = sweep._launches, set(children_of(os.getpid()))
    try:
        workshop.launch(*args, **kwargs)
    finally:
        assert sweep._launches == launches, "ranks were started before the refusal"
        assert set(children_of(os.getpid())) <= children


def test_an_unknown_show_is_refused():
    with pytest.raises(
        ValueError,
        match=r"show must be one of 'auto', 'lines' or 'none', not 'foo'; 'auto': "
        r"live in the cell",
    ):
        _refused(dist.get_rank, world_size=2, show="foo")


async def _coroutine():
    return 1


async def _async_generator():
    yield 1


def _generator():
    yield 1


@pytest.mark.parametrize(
    ("fn", "kind", "fix"),
    [
        (_coroutine, "an async function", r"Pass a plain function \(def, not async"),
        (_async_generator, "an async function", r"asyncio\.run"),
        (_generator, "a generator function", "Return a value instead"),
    ],
)
def test_functions_a_rank_could_not_run_are_refused(fn, kind, fix):
    with pytest.raises(TypeError, match=rf"fn='{fn.__name__}' is {kind}.*{fix}"):
        _refused(fn, world_size=2)
    assert asyncio.run(_coroutine()) == 1  # (the coroutine itself is fine)


@pytest.mark.parametrize(
    ("timeout", "message"),
    [
        (
            math.nan,
            r"timeout must be a number of seconds above 0 and at most "
            r"2147483, not nan; e\.g\. timeout=60, or None for no limit",
        ),
        # timedelta overflows beyond about 1e14 s, and the process group's C int
        # of milliseconds beyond 2147483 s: refused before a rank starts.
        (
            1e15,
            r"timeout must be a number of seconds above 0 and at most 2147483, "
            r"not 1000000000000000\.0; e\.g\. timeout=60, or None for no limit",
        ),
        (2147484, r"at most 2147483, not 2147484;"),
        (1e-6, r"timeout=1e-06 s is too short for ranks even to start"),
        (-5, r"timeout=-5 s is too short .*pass at least timeout=1, or None"),
        ("10", r"timeout must be a number of seconds above 0 .*not '10'; e\.g\. "),
    ],
)
def test_timeouts_that_cannot_work_are_refused(timeout, message):
    with pytest.raises(ValueError, match=message):
        _refused(dist.get_rank, world_size=2, timeout=timeout)


@pytest.mark.parametrize("value", [0, -2, math.inf, math.nan, True, "5", 1e15])
def test_collective_timeouts_that_cannot_work_are_refused(value):
    with pytest.raises(
        ValueError,
        match=rf"collective_timeout must be a number of seconds above 0 and at most "
        rf"2147483, not {value!r}; .*None for the default \(timeout \+ 10 s\)",
    ):
        _refused(dist.get_rank, world_size=2, collective_timeout=value)


def test_collectives_wait_longer_than_the_launch_by_default():
    # so that a hung launch reaches its own timeout, which says where ranks were
    assert checks.collective_timeout_for(None, 30.0) > 30.0
    assert checks.collective_timeout_for(None, None) == 3600.0
    assert checks.collective_timeout_for(2, 30.0) == 2.0
    # and by no more than the process group can wait
    longest = checks.LONGEST_WAIT_S
    assert checks.collective_timeout_for(None, longest) == longest


def test_an_infinite_timeout_means_no_limit():
    result = workshop.launch(
        dist.get_rank, world_size=2, backend="gloo", show="none", timeout=math.inf
    )
    assert result.returns == [0, 1]


def _nested():
    return workshop.launch(dist.get_rank, world_size=2, show="none").returns


def test_a_launch_inside_a_rank_is_refused_with_the_reason():
    with pytest.raises(
        LaunchError,
        match=r"RuntimeError: launch\(\) was called inside rank 0 of a running "
        r"launch\. A rank cannot start ranks of its own",
    ):
        workshop.launch(_nested, world_size=1, backend="gloo", show="none")


def test_more_ranks_than_the_cores_can_take_are_refused():
    cores = usable_cores()
    fits = checks.RANKS_PER_CORE * cores
    with pytest.raises(
        ValueError,
        match=rf"world_size=10000 is more ranks than this machine can run: it has "
        rf"{cores} cores? \({checks.RANKS_PER_CORE} ranks per core at most\), which "
        rf"fits {fits}.*Pass world_size=\d+ or fewer",
    ):
        _refused(dist.get_rank, world_size=10000)


def test_memory_and_open_files_limit_the_ranks(monkeypatch):
    monkeypatch.setattr(checks, "available_memory", lambda: 1 << 30)
    with pytest.raises(
        ValueError,
        match=r"1\.0 GiB of available memory \(about 100 MiB per rank\), which fits "
        r"10\. Pass world_size=10 or fewer",
    ):
        _refused(dist.get_rank, world_size=12, start_method="fork")
    with pytest.raises(ValueError, match=r"about 400 MiB per rank\), which fits 2\."):
        _refused(dist.get_rank, world_size=3, start_method="spawn")


def test_the_largest_world_size_that_fits_is_accepted():
    fits = min(fit for fit, _ in checks.capacity("fork"))
    checks.check_capacity(fits, "fork")  # no error
    with pytest.raises(ValueError, match=rf"Pass world_size={fits} or fewer"):
        checks.check_capacity(fits + 1, "fork")
