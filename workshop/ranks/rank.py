"""Inside one rank started by ``workshop.launch``: set up the process, run the lesson's
function in the process group, and report its value or its error to the launcher.
Every start path (fork, server, spawn) ends up in :func:`run_rank`.

**Where each rank is: its Python stack, asked for while it runs.** Every rank
registers Python's ``faulthandler`` on SIGUSR1 with a file of its own
(:func:`register_stack_dump`). When a launch runs past its timeout, the launcher
sends SIGUSR1 to each rank still running, reads the files (:class:`StackDumps`) and
names, per rank, the innermost frames of the lesson's code (:func:`rank_frames`,
:func:`format_frames`) before it stops the ranks. faulthandler writes the stack from
a C signal handler, so a rank blocked in a collective, with the GIL released,
answers at once. The files live in a private folder the launch removes when it ends.
"""

from __future__ import annotations

import faulthandler
import io
import itertools
import linecache
import os
import pickle
import re
import shutil
import signal
import struct
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple, Protocol

import cloudpickle

from .._procs import is_alive, name_thread, start_ticks
from .sweep import TAG_VAR, stacks_prefix

# Every message on a rank's pipe or the fork server's socket: its length, then it.
HEADER = struct.Struct("!Q")


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


class Report(NamedTuple):
    """What a rank tells the launcher once, when its function has ended."""

    value: bytes | None  # the pickled return value; None when it raised
    error: RankError | None  # what it raised; None when it returned
    start: float  # when the function started; 0.0: the rank failed before it
    end: float
    trace: Sequence = ()  # communication events, with ``Job.trace`` (comm.tracing)


def write_message(fd: int, obj: Any) -> None:
    """Write one length-prefixed pickle to ``fd`` (blocking until all is written)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def split_messages(buffer: bytearray) -> list[Any]:
    """Take every complete message off the front of ``buffer``."""
    messages = []
    while len(buffer) >= HEADER.size:
        (size,) = HEADER.unpack_from(buffer)
        if len(buffer) < HEADER.size + size:
            break
        messages.append(pickle.loads(bytes(buffer[HEADER.size : HEADER.size + size])))
        del buffer[: HEADER.size + size]
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
    """``job.fn(*args, **kwargs)``; a ``sys.exit(0)`` in it returns None, since
    torchrun counts exit status 0 a success. Any other ``sys.exit`` is raised."""
    try:
        return job.fn(*job.args, **job.kwargs)
    except SystemExit as exc:
        if ended_well(exc):
            return None
        raise


def run_rank(job: Job, result_fd: int) -> int:
    """Run ``job`` in this rank's process group and report to the launcher.

    Sends a :class:`Report` on ``result_fd``: the pickled value or the error, the
    function's start and end, and the communication events recorded when
    ``job.trace`` is set (see :mod:`workshop.comm.tracing`), else none.
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
                error = Report(None, _error(exc), start, time.time(), list(events))
                write_message(result_fd, error)
                reported = True
                raise
            try:
                payload = dumps_return(value)
            except Exception as exc:
                raise TypeError(
                    f"the function returned a {type(value).__name__} that cannot be "
                    f"serialised back to the notebook ({exc}); return plain data "
                    "instead: numbers, strings, lists, dicts, tensors, or a state_dict"
                ) from exc
            # Said before this rank leaves its group: a rank still in a collective
            # with it then fails, and the launcher must already know that this one
            # had returned, to name it as the cause.
            write_message(
                result_fd, Report(payload, None, start, time.time(), list(events))
            )
        return 0
    except BaseException as exc:
        if not reported:
            try:
                error = Report(None, _error(exc), start, time.time(), list(events))
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
    write_message(result_fd, Report(None, _error(exc), 0.0, 0.0))
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
    """Name this thread after the launch's tag, which a process forked from it
    inherits: the launcher finds it by that name (:func:`.sweep.stop_tagged`)."""
    tag = os.environ.get(TAG_VAR)
    if tag:
        name_thread(tag)


def _in_fresh_thread(body: Callable[..., int], *args: Any) -> int:
    """Run ``body(*args)`` in a new thread and return its exit code.

    GNU OpenMP keeps a pool per thread that starts a parallel region: a rank forked
    from a kernel that computed on several threads inherits the pool's record but not
    its threads, and its main thread's first parallel operation waits for them
    forever. A new thread makes its own pool."""
    outcome = [1]

    def run() -> None:
        _take_launch_name()  # for what fn forks from this thread (see below)
        outcome[0] = body(*args)

    thread = threading.Thread(target=run, name="rank", daemon=True)
    thread.start()
    while thread.is_alive():  # a timed join leaves the main thread able to take signals
        thread.join(0.2)
    return outcome[0]


# The rank's file for its stack, in the rank's environment.
STACK_FILE_VAR = "WORKSHOP_STACK_FILE"
# Written after faulthandler is registered: a rank whose file holds it can be asked.
READY = b"workshop: stack dumps on SIGUSR1\n"
_SIGNAL = getattr(signal, "SIGUSR1", None)
_registered: IO[bytes] | None = None

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)", re.MULTILINE)
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>\S+)')
_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = os.path.dirname(_HERE)
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"])


class Frame(NamedTuple):
    """One frame of a rank's stack."""

    filename: str
    line: int
    name: str


def register_stack_dump() -> None:
    """In a rank: dump every thread's Python stack to the rank's file on SIGUSR1.

    Does nothing outside a rank of ``workshop.launch`` (no file named in the
    environment) or where there is no SIGUSR1.
    """
    global _registered
    path = os.environ.get(STACK_FILE_VAR)
    if not path or _SIGNAL is None:
        return
    try:
        stream = open(path, "wb", buffering=0)  # noqa: SIM115 (kept for the handler)
        faulthandler.register(_SIGNAL, file=stream, all_threads=True, chain=False)
        stream.write(READY)
    except (OSError, RuntimeError, ValueError):
        return  # the launch still runs; only its timeout report says less
    _registered = stream


def parse_dump(text: str) -> list[list[Frame]]:
    """The threads of one faulthandler dump, each a list of frames, outermost first."""
    threads = []
    starts = [m.start() for m in _THREAD.finditer(text)] + [len(text)]
    for begin, end in itertools.pairwise(starts):
        frames = [
            Frame(m["file"], int(m["line"]), m["name"])
            for m in map(_FRAME.match, text[begin:end].splitlines())
            if m
        ]
        threads.append(frames[::-1])  # faulthandler writes most recent call first
    return threads


def _own(frame: Frame) -> bool:
    """A frame of the launch's own machinery (this wing)."""
    return os.path.abspath(frame.filename).startswith(_HERE + os.sep)


def _library(filename: str) -> str | None:
    """Which library ``filename`` belongs to (None: the lesson's own code)."""
    path = os.path.abspath(filename)
    for marker in ("site-packages", "dist-packages"):
        parts = path.split(os.sep)
        if marker in parts:
            rest = parts[parts.index(marker) + 1 :]
            return rest[0] if rest else marker
    if path.startswith(_PACKAGE + os.sep):
        return "workshop"
    if path.startswith(_STDLIB + os.sep):
        return "python"
    return None


def rank_frames(dump: str, limit: int = 6) -> list[Frame]:
    """The innermost frames of the lesson's function in one rank's dump.

    Takes the thread that runs the function (the one under ``run_rank``), drops the
    launch's own frames, keeps of each run of frames in one library (torch, the
    standard library, the workshop) only the innermost, the call the code above made
    into it, and returns the last ``limit``, outermost first. Empty when no thread is
    running the function (the rank had not started it).
    """
    for frames in parse_dump(dump):
        names = [f.name for f in frames]
        if "run_rank" not in names:
            continue
        start = len(names) - names[::-1].index("run_rank")
        kept: list[Frame] = []
        for frame in frames[start:]:
            if _own(frame):
                continue
            lib = _library(frame.filename)
            if kept and lib is not None and _library(kept[-1].filename) == lib:
                kept[-1] = frame
            else:
                kept.append(frame)
        return kept[-limit:]
    return []


# The line faulthandler writes first when a rank crashes (a segfault, an abort).
_FATAL = re.compile(r"^Fatal Python error: .*$", re.MULTILINE)


def fatal_error(stderr: str, limit: int = 6) -> tuple[str, list[Frame]] | None:
    """What faulthandler wrote on ``stderr`` when the rank crashed: its "Fatal
    Python error: ..." line and the innermost frames of the lesson's function
    (:func:`rank_frames` of the dump after that line). None without such a line.

    A crashed rank's last line is faulthandler's list of extension modules, which
    says nothing of the crash; the first line and the stack do.
    """
    found = list(_FATAL.finditer(stderr))
    if not found:
        return None
    last = found[-1]  # the crash's own report is the last thing a rank writes
    return last.group(0).strip(), rank_frames(stderr[last.end() :], limit)


def _cell_names() -> dict[str, int]:
    """File name of each notebook cell run so far -> its number, in IPython."""
    if "IPython" not in sys.modules:
        return {}
    try:
        from IPython import get_ipython

        shell = get_ipython()
        return dict(getattr(shell.compile, "_filename_map", {}) or {})
    except Exception:  # not in IPython, or an IPython without that map
        return {}


def short_path(filename: str, cells: dict[str, int] | None = None) -> str:
    """``filename`` as a reader knows it: "cell In[7]" for a notebook cell, the path
    below the import path that holds it, else its base name (no machine paths)."""
    cells = _cell_names() if cells is None else cells
    if filename in cells:
        return f"cell In[{cells[filename]}]"
    path = os.path.abspath(filename)
    roots = sorted({os.path.abspath(p) for p in sys.path if p}, key=len, reverse=True)
    for root in roots:
        if path.startswith(root + os.sep):
            return os.path.relpath(path, root)
    return os.path.basename(path)


def format_frames(
    frames: Iterable[Frame], width: int = 88, indent: int = 4
) -> list[str]:
    """One line per frame, outermost first: where, and for the lesson's own code the
    source line (from ``linecache``, which knows notebook cells too), cut to
    ``width`` columns."""
    cells = _cell_names()
    lines = []
    for frame in frames:
        text = (
            f"{' ' * indent}{short_path(frame.filename, cells)}, line {frame.line}, "
            f"in {frame.name}"
        )
        if _library(frame.filename) is None:
            # The statement, without an inline comment (PEP 8 puts two spaces
            # before one): the code is what tells the call apart.
            source = linecache.getline(frame.filename, frame.line).split("  #")[0]
            source = source.strip()
            if source:
                text += f": {source}"
        if len(text) > width:
            text = text[: width - 3] + "..."
        lines.append(text)
    return lines


class RunningRank(Protocol):
    """What :meth:`StackDumps.collect` needs of a rank: its number, whether it still
    runs, and a way to signal it alone (``start.RankHandle`` has all three)."""

    rank: int

    def poll(self) -> int | None: ...

    def signal_rank(self, sig: int) -> None: ...


def sweep_stale_dumps(folder: str | None = None) -> list[str]:
    """Remove this user's stack-dump folders whose kernel is gone; return them.

    A kernel's watchdog removes its folders when the kernel is killed, but a
    SIGKILL of the whole process group takes the watchdog too. The folder's name
    holds its kernel's pid and start time (``stacks_prefix``): a folder whose pid
    is dead, or now belongs to a later process, is left over, and the next launch
    removes it. Another user's folders are theirs to remove.
    """
    folder = tempfile.gettempdir() if folder is None else folder
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        parts = name.split("-")
        if len(parts) != 5 or parts[:2] != ["workshop", "stacks"]:
            continue
        path = os.path.join(folder, name)
        try:
            pid, started = int(parts[2], 36), int(parts[3], 36)
            if os.lstat(path).st_uid != os.getuid():
                continue
        except (ValueError, OSError):
            continue
        # Without /proc a start time is 0 and only a dead pid says "gone".
        if is_alive(pid) and started in (0, start_ticks(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


class StackDumps:
    """The launcher's side: a private folder with one stack file per rank, the
    signal that fills them, and their removal."""

    def __init__(self) -> None:
        sweep_stale_dumps()
        # Named for this kernel, whose watchdog removes it if the kernel is killed.
        self.folder = tempfile.mkdtemp(prefix=stacks_prefix())
        self.dumps: dict[int, str] = {}

    def path(self, rank: int) -> str:
        """The stack file of ``rank`` (for its environment)."""
        return os.path.join(self.folder, f"rank-{rank}.txt")

    def _size(self, rank: int) -> int:
        try:
            return os.path.getsize(self.path(rank))
        except OSError:
            return -1

    def collect(self, handles: Iterable[RunningRank], wait: float = 2.0) -> dict:
        """Ask every rank of ``handles`` still running for its stack, and wait at most
        ``wait`` seconds for the answers; returns (and keeps) rank -> dump text.

        A rank that has not registered yet (still starting) is not signalled: without
        faulthandler's handler SIGUSR1 would end it.
        """
        asked = []
        for handle in handles:
            if _SIGNAL is None or handle.poll() is not None:
                continue
            try:
                with open(self.path(handle.rank), "rb") as f:
                    ready = f.read(len(READY)) == READY
            except OSError:
                ready = False
            if ready:
                handle.signal_rank(_SIGNAL)
                asked.append(handle.rank)
        # faulthandler writes a dump in many small writes: done once it stops growing.
        sizes = {rank: len(READY) for rank in asked}
        deadline = time.monotonic() + wait
        while asked and time.monotonic() < deadline:
            time.sleep(0.05)
            now = {rank: self._size(rank) for rank in asked}
            if all(now[r] > len(READY) and now[r] == sizes[r] for r in asked):
                break
            sizes = now
        for rank in asked:
            try:
                with open(self.path(rank), "rb") as f:
                    text = f.read()[len(READY) :].decode("utf-8", "backslashreplace")
            except OSError:
                continue
            if text:
                self.dumps[rank] = text
        return self.dumps

    def close(self) -> None:
        """Remove the folder and its files. Safe to call twice."""
        shutil.rmtree(self.folder, ignore_errors=True)
