"""What a command run from a notebook cell prints: its pipes read on threads,
torchrun's own log lines made readable and the same from run to run, and paths
shown as a learner would type them."""

from __future__ import annotations

import os
import queue
import re
import shlex
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import IO

# torchrun logs through glog-style prefixes: level, date, time, thread id, file:line.
_GLOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\]\s]+:\d+\] ?(.*)$")
# torchrun prints this banner on every start (once per agent). It is about tuning
# threads, not what a cell teaches, and it would fill each output with four lines
# of stars and prefixes; every other line of torchrun's is kept.
_BANNER = re.compile(r"^(\**|Setting OMP_NUM_THREADS environment variable .*)$")


def python_paths(python: str = sys.executable) -> tuple[str, ...]:
    """The paths by which ``python`` shows up in logs, longest first: itself, its
    real path, and its ``python3`` and ``python3.X`` siblings."""
    folder = os.path.dirname(python)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    names = {python, os.path.realpath(python)}
    for sibling in (f"python{sys.version_info.major}", version):
        names.add(os.path.join(folder, sibling))
    return tuple(sorted(names, key=len, reverse=True))


_PYTHONS = python_paths()
# This checkout of the workshop (None where the package is installed, not cloned):
# from notebooks/, the paths inside it are shown as ../runs/..., not /home/....
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if not os.path.isfile(os.path.join(_CHECKOUT, "pyproject.toml")):
    _CHECKOUT = None


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def display_path(
    path: str | os.PathLike[str],
    start: str | os.PathLike[str] | None = None,
    checkout: str | None = _CHECKOUT,
) -> str:
    """``path`` as printed for a learner: relative to ``start`` where it lies inside
    it or inside the workshop's checkout (with ``start``), else ``~/...`` inside the
    home folder, else unchanged (``/usr/bin/mpirun`` says where a tool comes from).

    Printed paths then mean the same on every learner's machine and in the outputs
    stored with the notebooks, and can be pasted into the next cell.

    Args:
        path: the path; a relative one is returned as it is.
        start: the folder it is shown from; the current folder when omitted.
        checkout: the workshop's clone (found beside this package; None if it
            is installed): its paths are shown relative to ``start`` too.

    Returns:
        The path to print.

    Example:
        >>> display_path("/work/ws/runs/job-12.out", start="/work/ws/notebooks",
        ...              checkout="/work/ws")
        '../runs/job-12.out'
    """
    text = os.fspath(path)
    if not os.path.isabs(text):
        return text
    target = os.path.normpath(text)
    here = os.path.abspath(start if start is not None else os.getcwd())
    for root in (here, checkout):
        if root and _inside(target, root) and _inside(here, root):
            return os.path.relpath(target, here)
    home = os.path.expanduser("~")
    if home not in ("~", os.sep) and _inside(target, home):
        return "~" + target[len(home.rstrip(os.sep)) :]
    return text


def rewrite_line(line: str, pythons: Iterable[str] = _PYTHONS) -> str | None:
    """One output line as a learner should see it, or None to leave it out.

    A torchrun log line loses its prefix (level, time, thread, source line) and
    names the interpreter ``python``; its start-up banner about OMP_NUM_THREADS is
    left out. Every other line is returned unchanged.

    Args:
        line: one line, without its line ending.
        pythons: interpreter paths to write as ``python``, longest first.

    Returns:
        The line to show and keep, or None.

    Example:
        >>> rewrite_line("E1122 17:21:59.420000 10371 torch/x/api.py:1002] failed",
        ...              pythons=())
        '[torchrun] failed'
    """
    match = _GLOG.match(line)
    if match is None:
        return line
    message = match.group(1).rstrip()
    if _BANNER.match(message):
        return None
    for path in pythons:
        message = re.sub(re.escape(path) + r"(?![\w.])", "python", message)
    return f"[torchrun] {message}"


def display_command(
    command: list[str], env: Mapping[str, str], cwd: str | None = None
) -> str:
    """The command as a shell line, with ``env`` in front and long paths shortened:
    this interpreter as ``python``, the programs beside it (torchrun) by name, and
    paths inside ``cwd`` relative to it.

    Example:
        >>> display_command(["mpirun", "-np", "2"], {"A": "1"})
        'A=1 mpirun -np 2'
    """
    here = os.path.abspath(cwd or os.getcwd())
    bin_dir = os.path.dirname(sys.executable)
    words = []
    for word in command:
        if word in _PYTHONS:
            word = "python"
        elif os.path.isabs(word) and os.path.dirname(word) == bin_dir:
            word = os.path.basename(word)
        elif os.path.isabs(word) and word.startswith(here + os.sep):
            word = os.path.relpath(word, here)
        words.append(shlex.quote(word))
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), *words])


class Pipes:
    """Reads the stdout and stderr of several processes on threads, line by line,
    into one queue of ``(index, name, line)``; ``line`` is None at the end of a pipe
    and an exception if reading failed."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()
        self.threads: list[threading.Thread] = []

    def follow(self, index: int, name: str, pipe: IO[bytes]) -> None:
        """Start a thread that reads ``pipe`` of process ``index`` to its end."""

        def read() -> None:
            try:
                for raw in iter(pipe.readline, b""):
                    text = raw.decode(errors="replace").rstrip("\r\n")
                    self.queue.put((index, name, text))
            except Exception as exc:  # handed to the waiting thread, which stops all
                self.queue.put((index, name, exc))
            finally:
                self.queue.put((index, name, None))
                pipe.close()

        thread = threading.Thread(target=read, name=f"{name}-{index}", daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self, timeout: float = 5.0) -> None:
        """Wait (up to ``timeout`` s each) for the reading threads to end."""
        for thread in self.threads:
            thread.join(timeout)
