"""Inside one rank started by ``workshop.launch``: set up the process, run the lesson's
function in the process group, and report its value or its error to the launcher.

Every start path (fork, server, spawn) ends up in :func:`run_rank`.
"""

from __future__ import annotations

import faulthandler
import io
import os
import pickle
import signal
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from .stacks import register_stack_dump

_HEADER = struct.Struct("!Q")


@dataclass
class Job:
    """What every rank of one launch runs."""

    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    backend: str = "gloo"
    collective_timeout: float = 600.0
    trace: bool = False


@dataclass
class RankError:
    """An exception raised on a rank, as plain text the launcher can show."""

    type: str
    message: str
    traceback: str
    time: float


def write_message(fd: int, obj: Any) -> None:
    """Write one length-prefixed pickle to ``fd`` (blocking until all is written)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def split_messages(buffer: bytearray) -> list[Any]:
    """Take every complete message off the front of ``buffer``."""
    messages = []
    while len(buffer) >= _HEADER.size:
        (size,) = _HEADER.unpack_from(buffer)
        if len(buffer) < _HEADER.size + size:
            break
        messages.append(pickle.loads(bytes(buffer[_HEADER.size : _HEADER.size + size])))
        del buffer[: _HEADER.size + size]
    return messages


class _ReturnPickler(cloudpickle.Pickler):
    # GPU tensors come back on the CPU: unpickling a CUDA tensor in the notebook kernel
    # would initialise CUDA there, and a kernel with CUDA initialised can no longer fork
    # ranks quickly.
    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if (
            torch is not None
            and isinstance(obj, torch.Tensor)
            and obj.device.type != "cpu"
        ):
            return obj.detach().cpu().__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        return super().reducer_override(obj)


def dumps_return(value: Any) -> bytes:
    """Serialise a rank's return value for the launcher (GPU tensors moved to CPU)."""
    buffer = io.BytesIO()
    _ReturnPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def prepare_stdio(stdout_fd: int, stderr_fd: int) -> None:
    """Point this process's stdout and stderr (Python's and C's) at the launcher's
    pipes, line-buffered, so each line reaches the cell as soon as it is printed."""
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    if stdout_fd > 2:
        os.close(stdout_fd)
    if stderr_fd > 2 and stderr_fd != stdout_fd:
        os.close(stderr_fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)

    def stream(fd: int) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w", closefd=False)
        return io.TextIOWrapper(
            raw, encoding="utf-8", errors="backslashreplace", line_buffering=True
        )

    # A forked notebook kernel's sys.stdout sends to Jupyter's sockets, which belong to
    # the kernel; the rank gets plain files on its own pipes instead.
    sys.stdout = sys.__stdout__ = stream(1)
    sys.stderr = sys.__stderr__ = stream(2)
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    # A rank that crashes (segfault, abort) prints its Python stack to its own stderr,
    # which the launcher shows, rather than to wherever the parent's handler pointed.
    faulthandler.enable(file=sys.stderr)


def reset_signals() -> None:
    """Default signal behaviour in a rank (a forked kernel has its own handlers)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "SIGCHLD"):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # not the main thread
        pass


def _error(exc: BaseException) -> RankError:
    return RankError(
        type=type(exc).__qualname__,
        message=str(exc),
        traceback="".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__)
        ),
        time=time.time(),
    )


def ended_well(exc: SystemExit) -> bool:
    """Whether ``sys.exit`` ended a rank successfully: with code 0 or None (or
    False), the codes for which Python itself exits with status 0."""
    return exc.code is None or (isinstance(exc.code, int) and exc.code == 0)


def exit_status(exc: BaseException) -> int:
    """The exit status of a rank that ``exc`` ended: a ``sys.exit`` code from 1 to
    255 as given (as Python would exit), 130 for an interrupt, else 1."""
    if isinstance(exc, KeyboardInterrupt):
        return 130
    code = getattr(exc, "code", None) if isinstance(exc, SystemExit) else None
    # A code the OS would wrap round (256 reads as 0, success) becomes plain 1.
    return code if isinstance(code, int) and 1 <= code <= 255 else 1


def _call(job: Job) -> Any:
    """``job.fn(*args, **kwargs)``; a ``sys.exit(0)`` in it counts as returning None.

    torchrun counts a worker that exits with status 0 as successful, so a launch
    does too: the rank ends well and the other ranks' values are kept. Any other
    ``sys.exit`` (a non-zero code, a message) is raised, a failure of the rank.
    """
    try:
        return job.fn(*job.args, **job.kwargs)
    except SystemExit as exc:
        if ended_well(exc):
            return None
        raise


def run_rank(job: Job, result_fd: int) -> int:
    """Run ``job`` in this rank's process group and report to the launcher.

    Sends ("ok", pickled value, start, end, trace) or ("error", RankError, start,
    end, trace) on ``result_fd``; the trace is the list of communication events
    recorded when ``job.trace`` is set (see :mod:`workshop.comm.tracing`), else empty.
    A function that calls ``sys.exit(0)`` (or ``sys.exit()``) returned None.
    Returns the exit code: 0 on success, the code of a ``sys.exit(code)``, 130 on
    an interrupt, 1 on any other error.
    """
    from .worker import process_group

    start = time.time()
    reported = False
    events: list = []
    try:
        with process_group(job.backend, timeout=job.collective_timeout):
            try:
                if job.trace:
                    from ..comm.tracing import record

                    with record() as events:
                        value = _call(job)
                else:
                    value = _call(job)
            except BaseException as exc:
                # Report before leaving the group, so the launcher stops the other
                # ranks at once instead of letting them wait in a collective.
                error = ("error", _error(exc), start, time.time(), list(events))
                write_message(result_fd, error)
                reported = True
                raise
        try:
            payload = dumps_return(value)
        except Exception as exc:
            raise TypeError(
                f"the function returned a {type(value).__name__} that cannot be "
                f"serialised back to the notebook ({exc}); return plain data instead: "
                "numbers, strings, lists, dicts, tensors, or a state_dict"
            ) from exc
        write_message(result_fd, ("ok", payload, start, time.time(), list(events)))
        return 0
    except BaseException as exc:
        if not reported:
            try:
                error = ("error", _error(exc), start, time.time(), list(events))
                write_message(result_fd, error)
            except OSError:
                pass
        return exit_status(exc)
    finally:
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except Exception:
                pass


def report_failed_start(result_fd: int, exc: BaseException) -> None:
    """A rank started outside the kernel could not even set itself up (its job did
    not unpickle, say): tell the launcher why, and leave."""
    write_message(result_fd, ("error", _error(exc), 0.0, 0.0))
    os._exit(1)


def child_main(job: Job, result_fd: int) -> None:
    """The end of every start path: run the rank, then leave without running the
    parent's ``atexit`` handlers (a forked kernel has some)."""
    code = 1
    try:
        reset_signals()
        _take_launch_name()
        register_stack_dump()  # the launcher may ask where this rank is (SIGUSR1)
        code = _in_fresh_thread(run_rank, job, result_fd)
    except KeyboardInterrupt:
        code = 130
    finally:
        os._exit(code)


def _take_launch_name() -> None:
    """Name this thread after the launch's tag, which a process forked from it (a
    daemon that never runs a new program) inherits: the launcher finds such a
    process by that name once the rank has gone (see ``sweep``)."""
    from .._procs import name_thread
    from .sweep import TAG_VAR

    tag = os.environ.get(TAG_VAR)
    if tag:
        name_thread(tag)


def _in_fresh_thread(body: Callable[..., int], *args: Any) -> int:
    """Run ``body(*args)`` in a new thread and return its exit code.

    Why a thread: GNU OpenMP keeps its pool of worker threads per thread that starts
    a parallel region. A rank forked from a kernel that has already computed on
    several threads inherits the kernel's pool record, but not its threads, so the
    first parallel operation in the rank's main thread waits for them forever. A new
    thread has no pool yet and makes its own, so the rank computes on as many
    threads as it was given, whatever the kernel did before.
    """
    outcome = [1]

    def run() -> None:
        _take_launch_name()  # for what fn forks from this thread (see below)
        outcome[0] = body(*args)

    thread = threading.Thread(target=run, name="rank", daemon=True)
    thread.start()
    while thread.is_alive():  # a timed join leaves the main thread able to take signals
        thread.join(0.2)
    return outcome[0]
