"""The keeper that stands between a notebook kernel and a command it runs (torchrun,
mpirun, a script), so that the command's whole process tree ends when it should.

    python -I reaper.py PARENT_PID GRACE [--remove FOLDER] -- COMMAND [ARG ...]

torchrun and mpirun put workers in sessions or groups of their own, which a signal
to the command's group misses, and SIGKILLed they leave them re-parented to init.
This keeper is a child subreaper (Linux), so every process of the tree stays its
descendant; it takes the whole tree down (SIGTERM, ``GRACE`` s, SIGKILL) on SIGTERM,
SIGINT or SIGHUP, when ``PARENT_PID`` dies, and when the command ends but leaves
processes behind, then exits as the command did. Orphans that a command with no
process of its own left waits for (mpirun waits on every inherited output pipe) are
stopped too. Standard library only: importing ``workshop`` would import torch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import signal
import subprocess
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36
_POLL = 0.05  # seconds between looks at the tree: a cheap loop, a prompt reaction
_LOOK = 0.5  # seconds between looks for orphans while the command runs (reads /proc)
_GIVE_UP = 10.0  # seconds after SIGKILL before leaving an unkillable process (state D)


def descendants(*roots: int) -> list[int]:
    """Live (non-zombie) descendants of ``roots``, parents before children."""
    return _below(_children(), roots)


def _children() -> dict[int, list[int]]:
    """The live children of every process that has some, by parent pid."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _processes():
        children.setdefault(ppid, []).append(pid)
    return children


def _below(children: dict[int, list[int]], roots: tuple[int, ...]) -> list[int]:
    found, todo = [], [pid for root in roots for pid in children.get(root, [])]
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _processes() -> list[tuple[int, int]]:
    """(pid, parent pid) of every live process: /proc on Linux, ``ps`` elsewhere."""
    if not os.path.isdir("/proc/self"):
        listing = subprocess.run(
            ["ps", "-A", "-o", "pid=", "-o", "ppid=", "-o", "stat="],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        rows = [line.split() for line in listing.splitlines()]
        return [(int(r[0]), int(r[1])) for r in rows if len(r) == 3 and r[2][0] != "Z"]
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:  # ended while we looked
            continue
        if fields[0] not in (b"Z", b"X"):
            found.append((int(name), int(fields[1])))
    return found


def _become_subreaper() -> None:
    """Ask Linux to re-parent this tree's orphans here; elsewhere do without."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(child: int, status: int | None) -> int | None:
    """Collect every ended child (orphans included); return the command's status."""
    while True:
        try:
            pid, found = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == child:
            status = found


def keep(command: list[str], parent: int, grace: float) -> int | None:
    """Run ``command`` and look after its tree until all of it has ended.

    Returns the command's wait status, or None if it could not be waited for.
    """
    me = os.getpid()
    _become_subreaper()
    asked: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: asked.append(signum))
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127 << 8
    status: int | None = None
    stopping_since: float | None = None
    warned: set[int] = set()
    doomed: dict[int, float] = {}  # orphans stopped while the command runs: since
    next_look = time.monotonic() + _LOOK
    while True:
        status = _reap(child.pid, status)
        # A new parent means the kernel died (even before this line first ran).
        if not (asked or status is not None or os.getppid() != parent):
            if time.monotonic() >= next_look:  # /proc twice a second, not 20 times
                _stop_orphans(me, child.pid, doomed, grace)
                next_look = time.monotonic() + _LOOK
            time.sleep(_POLL)
            continue
        stopping_since = stopping_since or time.monotonic()
        tree = descendants(me)
        if status is not None and not tree:
            return status
        waited = time.monotonic() - stopping_since
        if waited > grace + _GIVE_UP:
            return status
        for pid in tree:
            if waited > grace:
                _signal(pid, signal.SIGKILL)
            elif pid not in warned:  # once each: torchrun starts its clean-up
                warned.add(pid)  # again on every signal it gets
                _signal(pid, signal.SIGTERM)
        time.sleep(_POLL)


def _stop_orphans(
    me: int, command: int, doomed: dict[int, float], grace: float
) -> None:
    """Stop the tree's orphans once the command has no process of its own left;
    ``doomed`` keeps when each got SIGTERM (SIGKILL ``grace`` s later)."""
    children = _children()
    orphans = set(_below(children, (me,))) - {command, *_below(children, (command,))}
    for pid in list(doomed):
        if pid not in orphans:  # ended (or adopted elsewhere): forget it
            del doomed[pid]
    now = time.monotonic()
    if orphans and not children.get(command):  # ranks done, leftovers live on
        for pid in orphans - doomed.keys():
            doomed[pid] = now
            _signal(pid, signal.SIGTERM)
    for pid, since in doomed.items():  # once judged leftovers, they end
        if now - since > grace:
            _signal(pid, signal.SIGKILL)


def main(argv: list[str]) -> None:
    """``PARENT GRACE [--remove FOLDER] -- COMMAND...``: keep the command, remove
    ``FOLDER`` once its whole tree has ended, then end as the command ended."""
    remove = argv[3] if argv[2:3] == ["--remove"] and len(argv) > 3 else None
    rest = argv[4:] if remove is not None else argv[2:]
    if len(argv) < 3 or len(rest) < 2 or rest[0] != "--":
        sys.exit(
            "usage: python -I reaper.py PARENT_PID GRACE [--remove FOLDER] -- "
            "COMMAND [ARG ...]"
        )
    try:
        status = keep(rest[1:], int(argv[0]), float(argv[1]))
    finally:
        # A folder the command's tree wrote in (torchrun's logs): removed here,
        # after the last process that could write in it, even when the kernel that
        # made it died first.
        if remove is not None:
            shutil.rmtree(remove, ignore_errors=True)
    if status is None:
        sys.exit(1)
    if os.WIFSIGNALED(status):  # end the same way, so the kernel sees -signal
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:  # whose disposition cannot be changed
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        sys.exit(128 + sig)
    sys.exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main(sys.argv[1:])
