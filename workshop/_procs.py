"""Process plumbing shared by every start path: dying with the parent, signalling a
rank's whole process group, and telling whether a process is still there."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Make this process end when ``parent_pid`` (its parent) ends, however it ends.

    On Linux the kernel delivers SIGKILL on the parent's death (PR_SET_PDEATHSIG), so
    even a SIGKILLed notebook kernel leaves no rank behind. Elsewhere a daemon thread
    watches for the re-parenting that follows the parent's death.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            _watch_parent(parent_pid)
    else:
        _watch_parent(parent_pid)
    # The parent may have died before the request above took effect.
    if os.getppid() != parent_pid:
        os._exit(1)


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
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def status_to_exit_code(status: int) -> int:
    """A wait status as the exit code a shell shows: the code, or -signal."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)
