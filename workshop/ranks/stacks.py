"""Where each rank is: its Python stack, asked for while it runs.

Every rank of ``workshop.launch`` registers Python's ``faulthandler`` on SIGUSR1 with a
file of its own (:func:`register_stack_dump`). When a launch runs past its timeout,
the launcher sends SIGUSR1 to each rank still running, reads the files
(:class:`StackDumps`) and names, per rank, the innermost frames of the lesson's code
(:func:`rank_frames`, :func:`format_frames`) before it stops the ranks. faulthandler
writes the stack from a C signal handler, so a rank blocked in a collective, with
the GIL released, answers at once. The files live in a private folder the launch
removes when it ends.
"""

from __future__ import annotations

import faulthandler
import itertools
import linecache
import os
import re
import shutil
import signal
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable
from typing import IO, NamedTuple, Protocol

__all__ = [
    "STACK_FILE_VAR",
    "Frame",
    "StackDumps",
    "fatal_error",
    "format_frames",
    "parse_dump",
    "rank_frames",
    "register_stack_dump",
]

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


class StackDumps:
    """The launcher's side: a private folder with one stack file per rank, the
    signal that fills them, and their removal."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="workshop-stacks-")
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
