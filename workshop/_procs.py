"""Processes: the plumbing every start path shares, the sweep that leaves no process of
a launch behind, and whether this process may fork ranks at all.

**Plumbing.** Dying with the parent, signalling a rank's whole process group, telling
whether a process is still there, asking a forked child one question, and the
interrupt that says what was stopped.

**The sweep.** A rank may start processes of its own: a helper script, a data server,
a daemon that forks twice and leaves its session. Stopping the rank's process group
misses those that left it, and a child that ignores SIGTERM outlives a rank that
ended normally. So every process of a launch carries the launch's *tag*, two ways:

* in its environment, ``WORKSHOP_LAUNCH=<tag>``: every program a rank (or anything
  below it) starts with ``exec`` inherits it, and Linux shows the environment a
  program was started with in ``/proc/PID/environ``;
* as its process name (``/proc/PID/comm``): the rank names itself after the tag, and
  a process forked without ``exec`` (a Python ``os.fork`` daemon) inherits the name.

A tag is ``w<kernel pid>.<launch number>`` (base 36, at most 15 characters, the
longest name Linux keeps). After a launch the kernel stops what still carries its
tag (:func:`stop_tagged`). If the kernel itself dies, even by SIGKILL, its ranks die
with it (parent-death signal) but their children would not: a small watchdog, this
file run as a script, waits for the kernel's death and then stops every process that
carries one of the kernel's tags, and removes the launches' stack-dump folders. It
ignores SIGTERM, which a Slurm job's end sends to the kernel and the watchdog alike.

    python -I _procs.py KERNEL_PID

This file imports the standard library only (``python -I``): importing the
``workshop`` package would import torch, seconds of start-up.

**May this process fork?** Forking the kernel is the fastest way to start ranks, and
on a CPU machine it is always safe. On a GPU machine two things in the kernel make a
forked child unusable, and neither can be undone without restarting the kernel:

- **CUDA was started** (a CUDA tensor, ``torch.cuda.is_available()``,
  ``get_device_name()``): the child cannot use the GPU ("CUDA error: initialization
  error"). torch marks such children as a "bad fork"; a forked child is asked.
- **A backward pass ran**, even on CPU tensors: with a GPU visible, autograd's engine
  then starts one worker thread per device (named ``pt_autograd_0``, ...) and
  installs a fork handler, and every child forked afterwards fails at its first
  backward ("Unable to handle autograd's threading in combination with fork-based
  multiprocessing") and at its first CUDA call. Neither ``torch.cuda.is_initialized()``
  in the parent nor ``_is_in_bad_fork()`` in the child sees it; the threads do, and
  they appear exactly when children break (measured on an H100 node, torch 2.11;
  ``shared/GPU-NODE.md``). On a CPU-only machine the engine starts no such thread.

Either way ranks then start from the clean fork server (or spawn).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def interrupted(message: str) -> KeyboardInterrupt:
    """The ``KeyboardInterrupt`` to raise once an interrupted call (the kernel's stop
    button, Ctrl-C) has stopped everything it started; ``message`` says what.

    A notebook shows it as one line, ``KeyboardInterrupt: <message>``: IPython asks
    an exception for ``_render_traceback_`` before drawing a traceback, and where
    the call happened to be waiting when the button was pressed is no news to the
    learner, while a page of the package's frames reads as a crash. Elsewhere it
    is a plain ``KeyboardInterrupt``: ``except KeyboardInterrupt`` catches it, and
    a script that does not ends as Ctrl-C ends it, with exit status 130 (Python
    gives that status to an uncaught ``KeyboardInterrupt`` itself, not to a
    subclass; hence the attribute on an instance rather than a class of our own).

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


TAG_VAR = "WORKSHOP_LAUNCH"

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(n: int) -> str:
    text = ""
    while True:
        n, digit = divmod(n, 36)
        text = _DIGITS[digit] + text
        if not n:
            return text


def kernel_prefix(pid: int | None = None) -> str:
    """The start of every tag of the kernel ``pid`` (this process by default)."""
    return f"w{_base36(os.getpid() if pid is None else pid)}."


def stacks_prefix(pid: int | None = None) -> str:
    """How the stack-dump folders of kernel ``pid`` (this one by default) are named:
    its pid and start time, which no later process of the same pid shares."""
    pid = os.getpid() if pid is None else pid
    return f"workshop-stacks-{_base36(pid)}-{_base36(start_ticks(pid))}-"


def launch_tag(number: int, pid: int | None = None) -> str:
    """The tag of launch ``number`` of the kernel ``pid``; at most 15 characters."""
    return kernel_prefix(pid) + _base36(number)


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


def _stat(pid: str) -> tuple[str, bytes, int] | None:
    """(name, state, start time in clock ticks) of ``pid``; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return parse_stat(data)


def start_ticks(pid: int | None = None) -> int:
    """When ``pid`` (this process by default) started, in clock ticks since boot."""
    stat = _stat(str(os.getpid() if pid is None else pid))
    return stat[2] if stat else 0


def _tag_in_environment(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:  # gone, or another user's
        return None
    key = TAG_VAR.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(key):
            return entry[len(key) :].decode(errors="replace")
    return None


def tagged(prefix: str, exact: bool = False, since: int = 0) -> list[int]:
    """Live processes of this user that carry a tag starting with ``prefix`` (or equal
    to it, with ``exact``), started at or after ``since`` (clock ticks since boot).

    The start time guards against a recycled process number. This process is never
    in the list. Empty where there is no ``/proc`` (not Linux).
    """
    me, uid = os.getpid(), os.getuid()
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for pid in names:
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        stat = _stat(pid)
        if stat is None or stat[1] in (b"Z", b"X") or stat[2] < since:
            continue
        for tag in (stat[0], _tag_in_environment(pid)):
            if tag is not None and (tag == prefix if exact else tag.startswith(prefix)):
                found.append(int(pid))
                break
    return found


def describe_process(pid: int) -> str:
    """``pid`` with the start of its command line, the program by its name alone:
    a long path to the interpreter would fill the line before its arguments."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        argv = []
    if argv:
        argv[0] = os.path.basename(argv[0])
    command = " ".join(argv) or "?"
    if len(command) > 60:
        command = command[:57] + "..."
    return f"pid {pid}: {command}"


def _alive(pid: int) -> bool:
    stat = _stat(str(pid))
    return stat is not None and stat[1] not in (b"Z", b"X")


def stop_tagged(
    prefix: str, exact: bool = True, since: int = 0, grace: float = 1.0
) -> list[str]:
    """Stop every process carrying the tag: SIGTERM, up to ``grace`` seconds, SIGKILL.

    Looks again after each round, since a process may fork while it is being
    stopped; gives up after a few rounds (a process in uninterruptible sleep cannot
    be killed at once). Returns a description of each process found, for the
    launcher to report; empty when nothing was left, which is the usual case.
    """
    found: dict[int, str] = {}
    for _ in range(5):
        pids = tagged(prefix, exact, since)
        if not pids:
            break
        for pid in pids:
            found.setdefault(pid, describe_process(pid))
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + wait
            while any(_alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.02)
            pids = [p for p in pids if _alive(p)]
            if not pids:
                break
    return list(found.values())


def watch_kernel(kernel: int, poll: float = 0.25) -> None:
    """Wait for the kernel (this process's parent) to end, stop every process that
    carries one of its tags (no grace: the kernel is gone), remove its dump folders."""
    since = start_ticks(kernel)
    prefix = kernel_prefix(kernel)
    stacks = os.path.join(tempfile.gettempdir(), stacks_prefix(kernel))
    while os.getppid() == kernel:
        time.sleep(poll)
    stop_tagged(prefix, exact=False, since=since, grace=0.0)
    for folder in glob.glob(glob.escape(stacks) + "*"):
        shutil.rmtree(folder, ignore_errors=True)


def start_watchdog() -> subprocess.Popen | None:
    """Start the watchdog of this kernel (see :func:`watch_kernel`); None without /proc.

    It runs in a session of its own, so that a signal to the kernel's process group
    (Jupyter's interrupt and restart send those) does not end it before its work.
    """
    if not os.path.isdir("/proc/self"):
        return None
    return subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def main(argv: list[str]) -> None:
    """``KERNEL_PID``: watch that kernel, then stop what its launches left."""
    if len(argv) != 1 or not argv[0].isdigit():
        sys.exit("usage: python -I _procs.py KERNEL_PID")
    # The kernel's Ctrl-C, or a signal to its process group, is not for us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Nor is SIGTERM, which a Slurm job's end sends to the kernel and this watchdog
    # at once: it must outlive the kernel to stop what its launches left, which Slurm
    # cannot find without cgroups (proctrack/linuxproc follows parents, which a
    # daemon has left). It ends on its own; Slurm's SIGKILL comes only later.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watch_kernel(int(argv[0]))


# What makes forking unsafe, as (the reason in a launch header, what to do instead of
# start_method="fork"). The keys are what fork_hazard() returns.
CUDA = "cuda"
AUTOGRAD = "autograd"
HAZARDS: dict[str, str] = {
    CUDA: "CUDA is initialised in this kernel, so it must not fork",
    AUTOGRAD: "this kernel ran a backward pass on a GPU machine: "
    "ranks start from the fork server",
}
# Printed once per kernel, the first time the fork server is used because of it.
EXPLANATIONS: dict[str, str] = {
    CUDA: "workshop.launch: CUDA is already initialised in this kernel, and a "
    "process that has initialised CUDA cannot be forked safely. Ranks are started "
    "from a clean fork server instead (torch preloaded, CUDA untouched); its first "
    "start takes a few seconds.",
    AUTOGRAD: "workshop.launch: this kernel ran a backward pass on a GPU machine, "
    "which started autograd's GPU threads; a rank forked from it would fail at its "
    "first backward pass or CUDA call. Ranks are started from a clean fork server "
    "instead (torch preloaded, no autograd threads); its first start takes a few "
    "seconds.",
}
_REFUSALS: dict[str, str] = {
    CUDA: "start_method='fork' but CUDA is already initialised in this process, "
    "and a forked child cannot use CUDA; pass start_method='server' (or 'auto'), or "
    "restart the kernel and launch before touching the GPU",
    AUTOGRAD: "start_method='fork' but this kernel ran a backward pass on a GPU "
    "machine: autograd's GPU threads are running, and a forked rank would fail at "
    "its first backward pass (\"Unable to handle autograd's threading in combination "
    "with fork-based multiprocessing\") or CUDA call; pass start_method='server' (or "
    "'auto'), or restart the kernel and launch before the first backward pass",
}

_AUTOGRAD_THREAD = "pt_autograd_"
# Where this process's threads are listed (a test may point it elsewhere).
TASK_DIR = "/proc/self/task"


def autograd_threads(task_dir: str | None = None) -> list[str]:
    """Names of autograd's per-device worker threads running in this process.

    They exist only after a backward pass on a machine where torch sees a GPU (or
    another accelerator), and never go away. Reads each thread's name from
    ``task_dir`` (default ``TASK_DIR``; well under 1 ms); [] where there is no /proc.
    """
    task_dir = TASK_DIR if task_dir is None else task_dir
    try:
        tasks = os.listdir(task_dir)
    except OSError:
        return []
    names = []
    for task in tasks:
        try:
            with open(os.path.join(task_dir, task, "comm")) as comm:
                name = comm.read().strip()
        except OSError:  # the thread ended while we looked
            continue
        if name.startswith(_AUTOGRAD_THREAD):
            names.append(name)
    return sorted(names)


def _driver_loaded(maps_file: str = "/proc/self/maps") -> bool:
    """True when the CUDA driver library (``libcuda.so``) is mapped into this process.

    Without it no CUDA call can have run, so a fork is safe. With it, nothing is
    known yet: on some GPU nodes ``import torch`` alone maps it (measured on one with
    torch 2.11), and a child forked then can still use the GPU.
    """
    try:
        with open(maps_file) as maps:
            return any("libcuda.so" in line for line in maps)
    except OSError:  # no /proc (macOS): assume the driver may be there, and ask
        return True


_POISONED = False


def _fork_is_poisoned() -> bool:
    """Ask a forked child whether torch considers it a "bad fork" for CUDA.

    torch marks every child forked after this process asked the CUDA runtime for
    anything (``torch.cuda.is_available()``, ``get_device_name()``, a CUDA tensor;
    not ``torch.cuda.device_count()``, which asks NVML), because such a child cannot
    use the GPU. That mark, not the driver library being loaded, is what decides
    whether ranks may be forked from here. The answer only ever turns from no to
    yes, so a yes is kept. Costs one fork, about 15 ms.
    """
    global _POISONED
    if _POISONED:
        return True
    import torch

    answer = answer_in_child(lambda: 1 if torch.cuda._is_in_bad_fork() else 0, 10.0)
    if answer is None:  # no answer (never seen): the server is the safe way
        return True
    _POISONED = answer == 1
    return _POISONED


def _cuda_initialized(maps_file: str = "/proc/self/maps") -> bool:
    """True once this process has started CUDA in a way a forked rank cannot survive.

    ``torch.cuda.is_initialized()`` only knows torch's own CUDA context. A call such
    as ``torch.cuda.is_available()`` starts the driver (``cuInit``) without it, and a
    child forked after that cannot use the GPU either; torch then marks such children
    as a "bad fork". So: without the driver library loaded, nothing has started; with
    it, a forked child is asked whether torch marked it.
    """
    import torch

    if torch.cuda.is_initialized():
        return True
    if not hasattr(os, "fork") or not _driver_loaded(maps_file):
        return False
    return _fork_is_poisoned()


def fork_hazard() -> str | None:
    """Why ranks forked from this process would be broken, or None when they would not.

    Returns:
        ``"cuda"`` (CUDA was started here), ``"autograd"`` (a backward pass ran with
        a GPU visible: autograd's device threads and their fork handler), or None.
        ``HAZARDS[key]`` says it in words.

    Example:
        >>> fork_hazard() is None  # a fresh CPU-only process
        True
    """
    import torch

    if torch.cuda.is_initialized():
        return CUDA
    # Before asking a child about CUDA: reading thread names costs no fork.
    if autograd_threads():
        return AUTOGRAD
    return CUDA if _cuda_initialized() else None


def choose_start_method(
    requested: str, hazard: str | None, platform: str = sys.platform
) -> tuple[str, str]:
    """Pick how to start ranks, and say why.

    Args:
        requested: "auto", "fork", "server" or "spawn".
        hazard: what makes forking this process unsafe (a key of ``HAZARDS``, as
            :func:`fork_hazard` returns), or None.
        platform: ``sys.platform``.

    Returns:
        (start method, reason in a few words).

    Raises:
        ValueError: "fork" asked for where it is unsafe or impossible, or an
            unknown ``hazard``.

    Example:
        >>> choose_start_method("auto", "autograd", "linux")[0]
        'server'
    """
    if hazard is not None and hazard not in HAZARDS:
        raise ValueError(
            f"unknown hazard={hazard!r}; pass None or one of {sorted(HAZARDS)}"
        )
    can_fork = hasattr(os, "fork")
    if requested == "fork":
        if not can_fork:
            raise ValueError(
                "start_method='fork' is not possible on this system; "
                "pass start_method='spawn'"
            )
        if hazard is not None:
            raise ValueError(_REFUSALS[hazard])
        return "fork", "asked for"
    if requested in ("server", "spawn"):
        if requested == "server" and not can_fork:
            raise ValueError(
                "start_method='server' needs fork; pass start_method='spawn'"
            )
        return requested, "asked for"
    if not can_fork:
        return "spawn", "this system cannot fork"
    if hazard is not None:
        return "server", HAZARDS[hazard]
    if platform == "darwin":
        return "server", "macOS system libraries are not safe to fork"
    return "fork", "fastest: ranks are forked from this kernel"


if __name__ == "__main__":
    main(sys.argv[1:])
