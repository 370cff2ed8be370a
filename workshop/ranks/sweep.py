"""Find and stop every process a launch's ranks started, wherever it went.

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
carries one of the kernel's tags. It ignores SIGTERM, which a Slurm job's end sends
to the kernel and the watchdog alike, so that it outlives the kernel to do that.

    python -I sweep.py KERNEL_PID

It uses the standard library only (``python -I``): importing the ``workshop``
package would import torch, seconds of start-up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

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
    """Wait for the kernel (this process's parent) to end, then stop every process
    that carries one of its tags. The kernel is gone: no grace period."""
    since = start_ticks(kernel)
    prefix = kernel_prefix(kernel)
    while os.getppid() == kernel:
        time.sleep(poll)
    stop_tagged(prefix, exact=False, since=since, grace=0.0)


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
        sys.exit("usage: python -I sweep.py KERNEL_PID")
    # The kernel's Ctrl-C, or a signal to its process group, is not for us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Nor is SIGTERM: when a Slurm job ends (scancel, its time limit), Slurm sends it
    # to every process of the job step at once, the kernel's and this one's. The
    # kernel dies of it; this watchdog must live on for the moment it takes to stop
    # what the kernel's launches left, which Slurm cannot find without cgroups
    # (proctrack/linuxproc follows parents, and a daemon has left its parent). It
    # ends on its own once that is done; Slurm's SIGKILL comes only later.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watch_kernel(int(argv[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
