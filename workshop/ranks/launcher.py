"""Start real distributed ranks from a notebook cell and bring everything back.

``launch(fn, world_size=4)`` runs ``fn`` on 4 ranks, each a real OS process with its
own process group membership, shows every rank's output live, and returns a
:class:`RunResult`. If a rank fails, hangs past ``timeout`` or the user presses the
kernel's stop button, every rank is stopped and nothing is left behind.

Before it starts anything, ``launch`` makes one call, :func:`preflight`: it checks
the arguments, that it is not called from inside a rank, the backend, how the ranks
start and that the machine can take ``world_size`` of them. Every refusal happens
then, before a single process exists: an error after the ranks have started costs
the learner a traceback from each of them. Then one :class:`LaunchSession` owns
everything the launch opens, and closes it all when the launch ends.
"""

from __future__ import annotations

import inspect
import math
import os
import resource
import sys
from collections.abc import Callable
from typing import Any

import cloudpickle

from ..allocation import available_memory, cpu_limit, usable_cores
from ..checks import LONGEST_WAIT_S, one_of, positive_number, whole
from ..env import choose_backend, visible_gpu_count
from . import forkable
from .rank import Job
from .session import LaunchSession, Plan, RunResult
from .setup_failure import failed_while_connecting, setup_failure
from .start import SERVER, preload
from .sweep import TAG_VAR

__all__ = ["launch"]

# The hazards (forkable.HAZARDS) whose explanation this kernel has been shown.
_told: set[str] = set()


def _serialise_job(job: Job) -> bytes:
    """Pickle the job up front; on failure, say which part could not be pickled."""
    try:
        cloudpickle.dumps(job.fn)
    except Exception as exc:
        raise TypeError(
            f"fn={getattr(job.fn, '__name__', job.fn)!r} cannot be sent to the ranks: "
            f"{exc}. It (or a global it uses) holds something that cannot be "
            "serialised, such as an open file, a lock or a generator; create that "
            "thing inside fn instead"
        ) from exc
    named = [(f"argument {i}", a) for i, a in enumerate(job.args)]
    named += [(f"keyword argument {k}", v) for k, v in job.kwargs.items()]
    for label, value in named:
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            raise TypeError(
                f"{label} (a {type(value).__name__}) cannot be sent to the ranks: "
                f"{exc}. Pass plain data (numbers, strings, lists, dicts, tensors, a "
                "state_dict) and build the object inside fn"
            ) from exc
    return cloudpickle.dumps(job)


def launch(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int,
    backend: str = "auto",
    timeout: float | None = 600.0,
    start_method: str = "auto",
    show: str = "auto",
    trace: bool = False,
    collective_timeout: float | None = None,
    **kwargs: Any,
) -> RunResult:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks, each a real process.

    Before ``fn`` runs, each rank has ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` set and the default process group initialised
    (NCCL with one GPU per rank when there are enough GPUs, else gloo on the CPU); the
    group is destroyed afterwards. ``fn`` may be defined in the notebook itself:
    closures, lambdas and notebook globals work. Processes a rank starts end with the
    launch, however it ends: whatever is still running then is stopped (SIGTERM, 1 s,
    SIGKILL) and named on stderr, and if this process dies, a watchdog stops them.

    Args:
        fn: the function every rank runs.
        *args: positional arguments for ``fn``.
        world_size: number of ranks; refused before anything starts when the
            machine cannot take them (cores, memory, open-file and process limits).
        backend: "auto", "gloo", "nccl" or "mpi".
        timeout: seconds before every rank is stopped, at least 1; None (or
            ``math.inf``) for no limit.
        start_method: "auto" (fork the kernel when that is safe, else a clean fork
            server), "fork", "server" or "spawn" (a fresh interpreter per rank).
            Forking is unsafe once the kernel started CUDA, or ran a backward pass
            on a machine with a GPU (see :func:`workshop.ranks.forkable.fork_hazard`).
        show: "auto" (live in the cell), "lines" (plain lines) or "none". A cell
            shows each rank's last 200 lines; the result keeps the last 10,000
            of each rank and stream.
        trace: record every point-to-point and collective call of each rank
            (operation, peers, tensor values or shapes, times) into
            ``RunResult.traces``, for the communication diagrams.
        collective_timeout: seconds a collective waits for the other ranks before
            it fails on the rank that waits (the process group's timeout). None:
            10 s more than ``timeout``, so that a hung launch reaches its own
            timeout first and says where each rank was (its Python stack).
        **kwargs: keyword arguments for ``fn``. (To pass one that shares a name with
            the options above, wrap ``fn`` with ``functools.partial``.)

    Returns:
        A :class:`RunResult` with each rank's return value, output, exit code and
        wall time, in rank order. A rank whose ``fn`` calls ``sys.exit(0)`` or
        ``sys.exit()`` has ended successfully, as under torchrun: its return value
        is None and the other ranks' values are kept.

    Raises:
        LaunchError: a rank raised (``sys.exit`` with a non-zero code or a message
            included) or crashed (the other ranks are stopped), or ``timeout``
            passed. The message names the ranks, the exception and the traceback; a
            crash (a segfault, an abort) with faulthandler's fatal error and the
            innermost frames of the rank's function (``.result.stderr`` keeps the
            whole report); at the timeout, per rank still running, its last line
            and where its function was (the innermost frames of its Python stack).
            ``.result`` holds what the ranks printed.
        ValueError, TypeError: bad arguments (an ``async def`` or generator ``fn``
            too), with the fix in the message.
        RuntimeError: called inside a rank, whose process group exists already.
        KeyboardInterrupt: the kernel was interrupted; every rank was stopped first.
            A notebook shows it as one line that names the ranks stopped.

    Example:
        >>> def hello():
        ...     import torch.distributed as dist
        ...     print(f"rank {dist.get_rank()} of {dist.get_world_size()}")
        ...     return dist.get_rank()
        >>> launch(hello, world_size=2, show="none").returns
        [0, 1]

    Warning:
        A kernel that has initialised CUDA, or run a backward pass on a GPU machine,
        cannot fork; ranks then start from a fork server, whose first start takes a
        few seconds while it imports torch. On a GPU machine a forked launch starts
        that server in the background, so it is usually ready by then.
    """
    plan = preflight(
        fn, args, kwargs, world_size, backend, timeout, start_method, show, trace,
        collective_timeout,
    )  # fmt: skip
    with LaunchSession(plan) as run:
        run.run()
    if plan.method == "fork" and visible_gpu_count() > 0:
        _warm_up_server()
    if run.running:
        raise run.timeout_error(run.running)
    if run.stopped is not None:
        error = run.failure(run.stopped)
        if failed_while_connecting(error):  # never started again: see that module
            raise setup_failure(error, run.stopped, world_size)
        raise error
    return run.result()


def preflight(
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    world_size: Any,
    backend: Any,
    timeout: Any,
    start_method: Any,
    show: Any,
    trace: Any,
    collective_timeout: Any,
) -> Plan:
    """Everything ``launch`` checks and decides before a process exists: the
    arguments, not inside a rank, the backend, that the job can be sent to the
    ranks, the start method (the one place it is decided), and the machine's
    capacity for that many ranks started that way.

    Raises:
        ValueError, TypeError, RuntimeError: what ``launch`` documents.
    """
    timeout = validate(fn, world_size, timeout, start_method, show, trace)
    collective_timeout = collective_timeout_for(collective_timeout, timeout)
    refuse_inside_a_rank()
    gpus = visible_gpu_count()
    chosen = choose_backend(backend, world_size, gpus)
    job = Job(fn, args, kwargs, chosen, collective_timeout, trace=trace)
    job_bytes = _serialise_job(job)
    hazard = forkable.fork_hazard()
    method, reason = forkable.choose_start_method(start_method, hazard)
    check_capacity(world_size, method)
    if method == "server" and hazard is not None and hazard not in _told:
        _told.add(hazard)
        print(forkable.EXPLANATIONS[hazard], file=sys.stderr)
    if method == "server":
        try:
            SERVER.start()
        except (RuntimeError, TimeoutError, OSError) as exc:
            print(
                f"workshop.launch: {exc}; starting ranks with spawn instead",
                file=sys.stderr,
            )
            method, reason = "spawn", "the fork server could not start"
    elif method == "fork":
        # Once per kernel, before its first fork: what every rank would otherwise
        # import by itself (torch._dynamo, on its first optimizer; see start.preload).
        preload()
    header = f"launch: world_size={world_size}, backend={chosen}, start_method={method}"
    if reason not in ("asked for", "fastest: ranks are forked from this kernel"):
        header += f" ({reason})"
    if chosen == "gloo" and backend == "auto" and 0 < gpus < world_size:
        # Say why a GPU node's ranks compute on the CPU: NCCL needs a GPU per rank.
        header += (
            f"\nlaunch: {world_size} ranks but {gpus} GPU"
            f"{'s' if gpus != 1 else ''}: the ranks run on the CPU with gloo "
            f"(world_size={gpus} would give each rank its own GPU, with NCCL)"
        )
    narrow = cpu_limit().narrow_binding()
    if narrow:
        # Inside a Slurm job whose step bound this kernel to fewer cores than the job
        # has: every rank inherits that binding, so they all share those cores.
        header += f"\nlaunch: {narrow}"
    return Plan(job, job_bytes, world_size, chosen, method, timeout, header, show)


def _warm_up_server() -> None:
    """Have the fork server import torch now, in the background: on a GPU machine
    one backward pass or CUDA call soon makes the kernel unforkable
    (forkable.fork_hazard), and the launch after it then need not wait for torch."""
    try:
        SERVER.begin()
    except OSError as exc:  # only a head start is lost; SERVER.start() will say why
        del exc


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
    whole("world_size", world_size, 1, fix="the number of ranks, e.g. world_size=2")
    if timeout is not None:
        number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
        if number and math.isinf(timeout) and timeout > 0:
            timeout = None  # no limit, as asked
        elif number and timeout < MIN_TIMEOUT:
            raise ValueError(
                f"timeout={timeout!r} s is too short for ranks even to start (that "
                "takes 0.1 to 0.5 s when forked and seconds for fresh interpreters); "
                f"pass at least timeout={MIN_TIMEOUT:g}, or None for no limit"
            )
        else:  # nan, a string, or more than the process group can wait
            timeout = positive_number(
                "timeout",
                timeout,
                most=LONGEST_WAIT_S,
                what="a number of seconds",
                fix="e.g. timeout=60, or None for no limit",
            )
    one_of("start_method", start_method, forkable.START_METHODS)
    one_of(
        "show",
        show,
        SHOW_MODES,
        fix="'auto': live in the cell, 'lines': plain lines, 'none': only collect "
        "the output into the result",
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
        if timeout is None:
            return 3600.0
        return min(timeout + COLLECTIVE_MARGIN, float(LONGEST_WAIT_S))
    return positive_number(
        "collective_timeout",
        value,
        most=LONGEST_WAIT_S,
        what="a number of seconds",
        fix="how long a collective may wait for the other ranks, e.g. "
        "collective_timeout=5, or None for the default "
        f"(timeout + {COLLECTIVE_MARGIN:g} s)",
    )


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
