"""Where in the lessons a learner is: after every cell, the kernel records the
notebook and section of the cell that ran, and the type of its error if it failed.

The notebook is the one the Jupyter server started this kernel for
(``$JPY_SESSION_NAME``); the section is the nearest markdown heading above the cell
in the notebook as last saved, the cell found by its id (IPython's
``ExecutionInfo.cell_id``) or else by its source. :func:`watch_cells`, called once
when ``workshop`` is imported, registers the hook in an IPython kernel and nowhere
else. The hook prints nothing, changes no output and swallows every failure; the
cell's source is compared, never kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .learner_record import post_record, progress_file, record_cell

__all__ = ["section_of", "session_notebook", "watch_cells"]

# An ATX heading ("## 2. Ranks"), and the explicit anchors beside headings
# (<a id="ddp"></a>) that are no part of its title.
_HEADING = re.compile(r"^ {0,3}#{1,6}(?:\s+(.*?))?\s*#*\s*$")
_ANCHOR = re.compile(r"<a\b[^>]*>\s*(?:</a>)?", re.IGNORECASE)
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


@dataclass(frozen=True)
class _Outline:
    """A saved notebook's code cells and their sections: by cell id, and by a hash of
    the source (the source itself is not kept)."""

    stamp: tuple[str, int, int]
    by_id: dict[str, str]
    by_source: dict[str, str]


_OUTLINE: dict[str, _Outline] = {}


def session_notebook() -> Path | None:
    """The notebook this kernel was started for, from ``$JPY_SESSION_NAME``.

    Returns:
        Its path: the variable as it is when absolute (what jupyter_server sets),
        else found from the kernel's folder; None where it is unset or not a
        notebook (a console, nbval, a script).

    Example:
        >>> session_notebook()  # doctest: +SKIP
        PosixPath('/home/ada/scaling/notebooks/02_distributed_data_parallel.ipynb')
    """
    name = os.environ.get("JPY_SESSION_NAME", "").strip()
    if not name.endswith(".ipynb"):
        return None
    path = Path(name)
    if path.is_absolute():
        return path
    # An older server gives the path from its own root: the kernel runs in the
    # notebook's folder, so the file name alone is found there.
    for candidate in (Path.cwd() / path, Path.cwd() / path.name):
        if candidate.is_file():
            return candidate
    return Path.cwd() / path.name


def section_of(notebook: Path, cell_id: str | None, source: str) -> str | None:
    """The nearest markdown heading above a code cell in the saved ``notebook``.

    Args:
        notebook: the ``.ipynb`` file.
        cell_id: the cell's id (JupyterLab sends it with each execution), or None.
        source: the cell's source, used where the id is not found.

    Returns:
        The heading's text without its ``#`` marks and ``<a id=...>`` anchors; ""
        for a cell with no heading above it; None where the cell is not in the
        saved file (not saved since it was written) or the file cannot be read.

    Example:
        >>> section_of(Path("notebooks/02_distributed_data_parallel.ipynb"),
        ...            "no-such-id", "print('not in it')") is None
        True
    """
    outline = _outline(notebook)
    if outline is None:
        return None
    if cell_id and cell_id in outline.by_id:
        return outline.by_id[cell_id]
    return outline.by_source.get(_digest(source))


def watch_cells() -> bool:
    """Register the hook that records where each cell ran, once, in an IPython
    kernel; elsewhere (a script, a rank, a terminal IPython) do nothing.

    Returns:
        True when the hook is registered (now or before) in this kernel.

    Example:
        >>> watch_cells()  # in a script, not a kernel
        False
    """
    ipython = sys.modules.get("IPython")  # not imported: then no kernel either
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    hooks = shell.events.callbacks.get("post_run_cell", [])
    if not any(_is_ours(hook) for hook in hooks):
        shell.events.register("post_run_cell", _after_cell)
        # A kernel (re)started on a portal sends the record it finds, so the board
        # has it even when the last post before the restart never arrived.
        post_record()
    return True


def _is_ours(hook: Any) -> bool:
    # By name, so that a reloaded module's hook is not registered a second time.
    return (
        getattr(hook, "__module__", None) == __name__
        and getattr(hook, "__name__", None) == _after_cell.__name__
    )


def _after_cell(result: Any) -> None:
    """IPython's post_run_cell: record the cell's place and its error's type."""
    try:
        if progress_file() is None:
            return
        error = result.error_in_exec or result.error_before_exec
        error_type = type(error).__name__ if error is not None else None
        notebook = session_notebook()
        if notebook is None:
            if error_type is not None:
                record_cell(None, None, error_type)
            return
        info = result.info
        section = section_of(
            notebook, getattr(info, "cell_id", None), getattr(info, "raw_cell", "")
        )
        record_cell(notebook.stem, section, error_type)
    except Exception:
        pass  # a cell never fails, nor shows more, for its record


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8", "replace")).hexdigest()


def _outline(notebook: Path) -> _Outline | None:
    """The notebook's outline, read again only when the file changed (a save)."""
    try:
        stat = notebook.stat()
        stamp = (str(notebook), stat.st_mtime_ns, stat.st_size)
        known = _OUTLINE.get("last")
        if known is not None and known.stamp == stamp:
            return known
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    by_id: dict[str, str] = {}
    by_source: dict[str, str] = {}
    section = ""
    for cell in cells:
        source = cell.get("source", "")
        source = source if isinstance(source, str) else "".join(source)
        if cell.get("cell_type") == "markdown":
            section = _last_heading(source, section)
        elif cell.get("cell_type") == "code":
            if isinstance(cell.get("id"), str):
                by_id[cell["id"]] = section
            by_source.setdefault(_digest(source), section)
    _OUTLINE["last"] = outline = _Outline(stamp, by_id, by_source)
    return outline


def _last_heading(markdown: str, before: str) -> str:
    """The last heading in ``markdown`` (outside code fences), cleaned; ``before``
    where it has none."""
    fenced = False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        found = None if fenced else _HEADING.match(line)
        if found is not None:
            title = " ".join(_ANCHOR.sub("", found.group(1) or "").split())
            before = title or before
    return before
