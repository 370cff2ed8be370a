"""What ``launch`` checks before it starts anything: its arguments, that it is not
called from inside a rank, and that the machine can take ``world_size`` ranks.

Every refusal happens here, before a single process exists: an error after the
ranks have started costs the learner a traceback from each of them.
"""

from __future__ import annotations

import inspect
import math
import os
import resource
from typing import Any

from ..allocation import available_memory, usable_cores
from .start import START_METHODS
from .sweep import TAG_VAR

SHOW_MODES = ("auto", "lines", "none")

# The shortest timeout worth asking for: starting ranks and joining their process
# group takes 0.1 to 0.5 s when forked and several seconds in fresh interpreters, so
# a shorter limit can only end in a timeout error that says nothing useful.
MIN_TIMEOUT = 1.0

# Ranks per core beyond which a launch is refused. Ranks on a busy core wait their
# turn; measured here (2 cores, gloo, fork): 16 ranks join in 0.6 s, 32 in 1.4 s,
# and 64 fail in gloo's connection set-up ("Connection closed by peer").
RANKS_PER_CORE = 16

# Memory one rank needs beyond what it shares with the process it came from:
# measured after joining a gloo group, a forked rank had 7 MiB of its own and a
# fresh interpreter 293 MiB; a rank that computes needs more, hence the margins.
RANK_MEMORY = {"fork": 100 << 20, "server": 100 << 20, "spawn": 400 << 20}

# Threads of one rank (measured: 5 for a forked rank, 6 for a fresh interpreter,
# with gloo), with a margin for DataLoader and compute threads.
RANK_THREADS = 12


def validate(
    fn: Any, world_size: Any, timeout: Any, start_method: Any, show: Any, trace: Any
) -> float | None:
    """Check ``launch``'s arguments; return the timeout to use (None: no limit).

    Raises:
        TypeError, ValueError: an argument ``launch`` cannot use, with the fix.
    """
    if not callable(fn):
        raise TypeError(
            f"fn must be a function, got {type(fn).__name__} ({fn!r}); pass the "
            "function itself, launch(train, world_size=2), not its result train()"
        )
    name = getattr(fn, "__name__", repr(fn))
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"fn={name!r} is an async function: a rank would only create its "
            "coroutine and never run it. Pass a plain function (def, not async def); "
            "inside it, run the coroutine with asyncio.run(...)"
        )
    if inspect.isgeneratorfunction(fn):
        raise TypeError(
            f"fn={name!r} is a generator function (it uses yield): a rank would only "
            "create the generator and never run its body. Return a value instead, "
            "for example a list of what it would yield"
        )
    if (
        isinstance(world_size, bool)
        or not isinstance(world_size, int)
        or world_size < 1
    ):
        raise ValueError(
            "world_size must be a whole number of ranks, 1 or more; got "
            f"{world_size!r}. Pass world_size=2, for example"
        )
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise ValueError(
                "timeout must be a number of seconds, or None for no limit; got "
                f"{timeout!r}"
            )
        if math.isnan(timeout):
            raise ValueError(
                "timeout=nan is not a number of seconds; pass timeout=60, for "
                "example, or None for no limit"
            )
        if math.isinf(timeout) and timeout > 0:
            timeout = None  # no limit, as asked
        elif timeout < MIN_TIMEOUT:
            raise ValueError(
                f"timeout={timeout!r} s is too short for ranks even to start (that "
                "takes 0.1 to 0.5 s when forked and seconds for fresh interpreters); "
                f"pass at least timeout={MIN_TIMEOUT:g}, or None for no limit"
            )
    if start_method not in START_METHODS:
        raise ValueError(
            f"unknown start_method={start_method!r}; pass one of "
            + ", ".join(repr(m) for m in START_METHODS)
        )
    if show not in SHOW_MODES:
        raise ValueError(
            f"unknown show={show!r}; pass one of "
            + ", ".join(repr(m) for m in SHOW_MODES)
            + " ('auto': live in the cell, 'lines': plain lines, 'none': only "
            "collect the output into the result)"
        )
    if not isinstance(trace, bool):
        raise TypeError(f"trace must be True or False, got {trace!r}")
    return timeout


# Seconds the collectives of a launch wait beyond its timeout by default, so that a
# launch that runs out of time stops its ranks, and says where each one was, before
# a collective fails on one of them.
COLLECTIVE_MARGIN = 10.0


def collective_timeout_for(value: Any, timeout: float | None) -> float:
    """The process group's timeout for a launch: ``value`` checked, or by default
    ``COLLECTIVE_MARGIN`` seconds more than the launch's ``timeout`` (an hour
    without one).

    Raises:
        ValueError: ``value`` is not a positive, finite number of seconds.
    """
    if value is None:
        return 3600.0 if timeout is None else timeout + COLLECTIVE_MARGIN
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(
            "collective_timeout must be a positive, finite number of seconds a "
            f"collective may wait for the other ranks; got {value!r}. Pass "
            "collective_timeout=5, for example, or None for the default "
            f"(timeout + {COLLECTIVE_MARGIN:g} s)"
        )
    return float(value)


def refuse_inside_a_rank() -> None:
    """Raise if this process is a rank already: of a launch, torchrun, srun, mpirun.

    Raises:
        RuntimeError: with what to do instead.
    """
    tag = os.environ.get(TAG_VAR)
    if tag:
        raise RuntimeError(
            f"launch() was called inside rank {os.environ.get('RANK', '?')} of a "
            "running launch. A rank cannot start ranks of its own; call launch() "
            "from the notebook (or a plain script), and inside a rank use the "
            "process group it already has (torch.distributed)"
        )
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        raise RuntimeError(
            "launch() was called in a process whose default process group is already "
            f"initialised (rank {dist.get_rank()} of {dist.get_world_size()}, "
            "started by torchrun, srun or mpirun, say). Call your function directly "
            "here: this process is already a rank"
        )


def _open_files() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64  # no /proc: a typical count


def _user_threads() -> int:
    """Threads this user runs now (what RLIMIT_NPROC counts)."""
    uid, count = os.getuid(), 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                continue
    return count


def _soft(limit: int) -> int | None:
    soft = resource.getrlimit(limit)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def capacity(method: str) -> list[tuple[int, str]]:
    """How many ranks this machine can take, by each limit: (ranks, reason) pairs."""
    cores = usable_cores()
    limits = [
        (
            RANKS_PER_CORE * cores,
            f"{cores} core{'s' if cores != 1 else ''} ({RANKS_PER_CORE} ranks "
            "per core at most)",
        )
    ]
    memory = available_memory()
    if memory is not None:
        per_rank = RANK_MEMORY.get(method, RANK_MEMORY["spawn"])
        limits.append(
            (
                memory // per_rank,
                f"{memory / 2**30:.1f} GiB of available memory (about "
                f"{per_rank >> 20} MiB per rank)",
            )
        )
    files = _soft(resource.RLIMIT_NOFILE)
    if files is not None:
        # Here: 3 pipes per rank. In each rank: a socket to every other rank.
        fit = min((files - _open_files() - 16) // 3, (files - 32) // 2)
        limits.append(
            (
                fit,
                f"an open-file limit of {files} (ulimit -n; 3 per rank in this "
                "process, and a socket to every other rank in each rank)",
            )
        )
    processes = _soft(resource.RLIMIT_NPROC)
    if processes is not None and os.getuid() != 0 and os.path.isdir("/proc/self"):
        fit = (processes - _user_threads()) // RANK_THREADS
        limits.append(
            (
                fit,
                f"a process limit of {processes} (ulimit -u; about {RANK_THREADS} "
                "threads per rank)",
            )
        )
    return limits


def check_capacity(world_size: int, method: str) -> None:
    """Refuse a ``world_size`` this machine cannot take, before anything starts.

    Raises:
        ValueError: naming each limit that is too small and the largest world size
            that fits.
    """
    limits = capacity(method)
    short = [(fit, why) for fit, why in limits if world_size > fit]
    if not short:
        return
    fits = min(fit for fit, _ in limits)
    advice = (
        f"Pass world_size={fits} or fewer"
        if fits >= 1
        else "Free some of it (end other programs), or raise the limit"
    )
    raise ValueError(
        f"world_size={world_size} is more ranks than this machine can run: it has "
        + "; ".join(f"{why}, which fits {max(0, fit)}" for fit, why in short)
        + f". {advice}"
    )
