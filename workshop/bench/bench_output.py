"""Where a benchmark's ``--out PREFIX`` files go: checked before anything is measured,
and kept somewhere else if writing still fails at the end, so that a finished sweep
(minutes of a shared machine, or of an allocation) is never lost to a traceback."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["check_writable", "save_or_keep"]


def _why_not(folder: Path, exc: OSError) -> str:
    """Why files cannot go into ``folder``: the nearest existing path at or above it
    when that is a file, else what the system said."""
    for path in (folder, *folder.parents):
        if path.exists():
            if not path.is_dir():
                return f"{path} is a file, not a folder"
            break
    return str(exc)


def check_writable(prefix: str | os.PathLike[str], option: str = "--out") -> Path:
    """Make the folder of ``PREFIX.json`` if it is missing and write a scratch file
    there, so that a place that cannot be written is said before measuring.

    Args:
        prefix: the files' path without their suffix (``runs/scale``).
        option: the option that named it, for the message.

    Returns:
        The folder, which now exists.

    Raises:
        ValueError: the folder cannot be made or written to; the message says why
            (a file in the way, no permission) and what to pass instead.

    Example:
        >>> check_writable("runs/allreduce")                 # doctest: +SKIP
        PosixPath('runs')
    """
    folder = Path(prefix).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise ValueError(
            f"{option} {os.fspath(prefix)}: cannot write files there "
            f"({_why_not(folder, exc)}); "
            f"checked before measuring. Pass a PREFIX in a folder you can write, "
            f"e.g. {option} runs/{Path(prefix).name or 'result'}"
        ) from exc
    return folder


def save_or_keep(
    save: Callable[[Path], Iterable[Path]],
    prefix: str | os.PathLike[str],
    document: Callable[[], str],
) -> list[Path]:
    """``save(prefix)``; if that fails, say where the files could not go and why,
    and print the JSON they would have held, so that the figures are not lost (in a
    batch job they land in the job's output file).

    Args:
        save: writes ``PREFIX.json`` and the rest; returns their paths.
        prefix: where they should go.
        document: the JSON text of ``PREFIX.json``.

    Returns:
        The files written; empty if writing failed.

    Example:
        >>> save_or_keep(result.save, "runs/scale", text)     # doctest: +SKIP
        [PosixPath('runs/scale.json'), PosixPath('runs/scale.csv')]
    """
    try:
        return list(save(Path(prefix)))
    except OSError as exc:
        where = os.fspath(prefix)
        why = _why_not(Path(where).parent, exc)
        print(
            f"could not write the results to {where}.json ({why}). They follow as "
            f"that file would have held them: copy the lines between the markers to "
            f"{Path(where).name}.json in a folder you can write",
            file=sys.stderr,
            flush=True,
        )
    print(f"----- {Path(prefix).name}.json -----")
    print(document())
    print(f"----- end of {Path(prefix).name}.json -----", flush=True)
    return []
