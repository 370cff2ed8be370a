"""The sweep that leaves no process of a launch behind, and the watchdog that does it
when the kernel dies.

A rank may start processes of its own: a helper script, a data server, a daemon that
forks twice and leaves its session. Stopping the rank's process group misses those
that left it, and a child that ignores SIGTERM outlives a rank that ended normally.
So every process of a launch carries the launch's *tag*, two ways:

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
carries one of the kernel's tags, and removes the launches' stack-dump folders
(it ignores SIGTERM: see :func:`main`)::

    python -I workshop/ranks/sweep.py KERNEL_PID
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

if __package__:
    from .._procs import is_alive, proc_stat, start_ticks
else:  # run as a file (python -I): the package would import torch; _procs does not
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from _procs import is_alive, proc_stat, start_ticks

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


# The watchdog of this kernel, started with its first launch, and the number of
# launches so far (for their tags).
_WATCHDOG: subprocess.Popen | None = None
_launches = 0


def next_tag() -> str:
    """A tag for the next launch, with the watchdog running for its processes."""
    global _WATCHDOG, _launches
    if _WATCHDOG is None or _WATCHDOG.poll() is not None:
        try:
            _WATCHDOG = start_watchdog()
        except OSError as exc:  # the launch still works; only the kernel's
            print(  # death could then leave a rank's children behind
                f"workshop.launch: the watchdog could not start ({exc})",
                file=sys.stderr,
            )
    _launches += 1
    return launch_tag(_launches)


def stop_all_tags() -> None:
    """At the kernel's exit: stop what any of its launches left, at once."""
    if _launches:
        stop_tagged(kernel_prefix(), exact=False, since=start_ticks(), grace=0.0)


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
        facts = proc_stat(pid)
        if facts is None or facts[1] in (b"Z", b"X") or facts[2] < since:
            continue
        for tag in (facts[0], _tag_in_environment(pid)):
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
            while any(is_alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.02)
            pids = [p for p in pids if is_alive(p)]
            if not pids:
                break
    return list(found.values())


def stop_launch(tag: str) -> None:
    """After launch ``tag``: stop what its ranks started and left running, and say
    so on stderr. A rank's processes end with the launch, however it ended."""
    left = stop_tagged(tag, since=start_ticks())
    if left:
        print(
            f"workshop.launch: the ranks left {len(left)} process"
            f"{'es' if len(left) != 1 else ''} running; stopped "
            f"{'them' if len(left) != 1 else 'it'}:\n  " + "\n  ".join(left),
            file=sys.stderr,
        )


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
        sys.exit("usage: python -I workshop/ranks/sweep.py KERNEL_PID")
    # The kernel's Ctrl-C, or a signal to its process group, is not for us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Nor is SIGTERM, which a Slurm job's end sends to the kernel and this watchdog
    # at once: it must outlive the kernel to stop what its launches left, which Slurm
    # cannot find without cgroups (proctrack/linuxproc follows parents, which a
    # daemon has left). It ends on its own; Slurm's SIGKILL comes only later.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watch_kernel(int(argv[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
