"""Process primitives every start path and wing shares: dying with the parent,
signalling a rank's whole process group, telling whether a process is still there
(and when it started), asking a forked child one question, and the interrupt that
says what was stopped.

This file imports the standard library only: the launch's watchdog
(``workshop/ranks/sweep.py``) and the Slurm watchdog run with it as plain files
(``python -I``), where importing the ``workshop`` package would import torch,
seconds of start-up.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def interrupted(message: str) -> KeyboardInterrupt:
    """The ``KeyboardInterrupt`` to raise once an interrupted call (the kernel's stop
    button, Ctrl-C) has stopped everything it started; ``message`` says what.

    A notebook shows it as one line, ``KeyboardInterrupt: <message>`` (IPython asks
    an exception for ``_render_traceback_``): a page of the package's frames where
    the call was waiting would read as a crash. Elsewhere it is a plain
    ``KeyboardInterrupt``, and an uncaught one ends a script with exit status 130,
    which Python gives ``KeyboardInterrupt`` itself, not a subclass: hence the
    attribute on an instance rather than a class of our own.

    Args:
        message: what was interrupted and stopped, e.g.
            ``"workshop.launch: interrupted; stopped rank(s) 0, 1"``.

    Returns:
        The exception, to ``raise ... from None`` (the interrupt it replaces only
        says where the wait was).

    Example:
        >>> try:                                      # doctest: +SKIP
        ...     wait_for_ranks()
        ... except KeyboardInterrupt:
        ...     stop_ranks()
        ...     raise interrupted("workshop.launch: interrupted; stopped rank(s) 0")
    """
    exc = KeyboardInterrupt(message)
    # In the instance's dict (KeyboardInterrupt has no such attribute to assign);
    # a partial of a module function, not a lambda, so that the exception pickles.
    exc.__dict__["_render_traceback_"] = functools.partial(_one_line, message)
    return exc


def _one_line(message: str) -> list[str]:
    """What IPython shows for :func:`interrupted`'s exception: no frames."""
    return f"KeyboardInterrupt: {message}".splitlines()


def die_with_parent(parent_pid: int) -> None:
    """Make this process end when ``parent_pid`` (its parent) ends, however it ends:
    Linux sends SIGKILL on the parent's death (PR_SET_PDEATHSIG), even a SIGKILLed
    kernel's; elsewhere a daemon thread watches for the re-parenting that follows."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            _watch_parent(parent_pid)
    else:
        _watch_parent(parent_pid)
    # The parent may have died before the request above took effect.
    if os.getppid() != parent_pid:
        os._exit(1)


def name_thread(name: str) -> None:
    """Give the calling thread ``name`` (at most 15 characters) as its Linux name.

    The name of a process's first thread is the process's name (``/proc/PID/comm``,
    what ``ps`` and ``top`` show), and a process forked from a thread starts with
    that thread's name. Quietly does nothing elsewhere.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _watch_parent(parent_pid: int) -> None:
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        signal_group(os.getpid(), signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="workshop-parent-watch", daemon=True).start()


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group led by ``pid`` (a rank and whatever it
    started, such as DataLoader workers); quietly do nothing if it is gone."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def is_alive(pid: int) -> bool:
    """True while ``pid`` exists and is neither a zombie nor inside exit()."""
    if os.path.isdir("/proc/self"):
        facts = proc_stat(str(pid))
        return facts is not None and facts[1] not in (b"Z", b"X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def thread_names(task_dir: str = "/proc/self/task") -> list[str] | None:
    """The Linux names of this process's threads; None where there is no /proc."""
    try:
        tasks = os.listdir(task_dir)
    except OSError:
        return None
    names = []
    for task in tasks:
        try:
            with open(os.path.join(task_dir, task, "comm")) as comm:
                names.append(comm.read().strip())
        except OSError:  # the thread ended while we looked
            continue
    return names


def status_to_exit_code(status: int) -> int:
    """A wait status as the exit code a shell shows: the code, or -signal."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def answer_in_child(
    question: Callable[[], int], timeout: float, failed: int = 2
) -> int | None:
    """Fork, run ``question`` in the child, and return the exit code it answers with.

    For what this process cannot safely find out itself (whether a fork could use
    CUDA; whether gloo runs a collective, without starting gloo's threads here).
    The child runs ``question`` and nothing else, and leaves by ``os._exit`` with
    its answer, or ``failed`` if it raised. None when the child did not answer
    within ``timeout`` seconds; it is killed then, never left behind.
    """
    with warnings.catch_warnings():
        # Python warns that forking a threaded process may deadlock the child; the
        # child only answers one question and leaves.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = failed
        try:
            code = question()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.001)


# The kernel's flag for a process inside exit(): it holds nothing a sweep could stop
# (its memory and files are being released) and is gone a moment later. Seen: the
# middle process of a daemon's double fork, still exiting when a launch ended, was
# reported as left running with no command line ("pid 27963: ?").
PF_EXITING = 0x4


def parse_stat(data: bytes) -> tuple[str, bytes, int]:
    """(name, state, start time in clock ticks) from a ``/proc/PID/stat`` line; a
    process inside exit() has the state ``b"X"``, as one already gone."""
    name = data[data.index(b"(") + 1 : data.rindex(b")")].decode(errors="replace")
    fields = data[data.rindex(b")") + 2 :].split()
    state = b"X" if int(fields[6]) & PF_EXITING else fields[0]
    return name, state, int(fields[19])


def proc_stat(pid: str) -> tuple[str, bytes, int] | None:
    """(name, state, start time in clock ticks) of ``pid``; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return parse_stat(data)


def start_ticks(pid: int | None = None) -> int:
    """When ``pid`` (this process by default) started, in clock ticks since boot."""
    stat = proc_stat(str(os.getpid() if pid is None else pid))
    return stat[2] if stat else 0
