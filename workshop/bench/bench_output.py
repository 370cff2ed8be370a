"""What the benchmarks' command lines share: their options of a whole number or a JSON
file, and where their ``--out PREFIX`` files go: checked before anything is measured,
and kept somewhere else if writing still fails at the end, so that a finished sweep
(minutes of a shared machine, or of an allocation) is never lost to a traceback."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .._cli import whole_number, writable_file

__all__ = [
    "check_writable",
    "count_option",
    "json_option",
    "save_or_keep",
    "write_json",
]


def count_option(
    parser: argparse.ArgumentParser,
    flag: str,
    least: int,
    default: int | None,
    help: str | None = None,
    example: str = "",
    why: str = "",
) -> None:
    """Add ``flag``, a whole number ``least`` or more (example: "FLAG DEFAULT")."""
    parse = whole_number(least, example or f"{flag} {default}", why)
    parser.add_argument(flag, type=parse, default=default, help=help)


def json_option(parser: argparse.ArgumentParser, example: str, help: str) -> None:
    """Add ``--json PATH``, a file that can be written."""
    parser.add_argument(
        "--json", type=writable_file(example), metavar="PATH", help=help
    )


def write_json(path: str, report: dict[str, Any], say: bool = True) -> None:
    """Write ``report`` to ``path`` as JSON; ``say`` prints that it did."""
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    if say:
        print(f"\nwrote {path}")


def _why_not(folder: Path, exc: OSError) -> str:
    """The nearest existing path at or above ``folder`` if a file, else ``exc``."""
    for path in (folder, *folder.parents):
        if path.exists():
            if not path.is_dir():
                return f"{path} is a file, not a folder"
            break
    return str(exc)


def check_writable(prefix: str | os.PathLike[str], option: str = "--out") -> Path:
    """Make the folder of ``PREFIX.json`` if missing and write a scratch file there,
    so that a place that cannot be written is said before measuring.

    Args:
        prefix: the files' path without their suffix (``runs/scale``).
        option: the option that named it, for the message.

    Returns:
        The folder, which now exists.

    Raises:
        ValueError: the folder cannot be made or written to, with why and what to pass.

    Example:
        >>> check_writable("runs/allreduce")                 # doctest: +SKIP
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
    """``save(prefix)``; where that fails, say why and print the JSON the files
    would have held, so the figures are not lost (a batch job's output file keeps them).

    Args:
        save: writes ``PREFIX.json`` and the rest; returns their paths.
        document: the JSON text of ``PREFIX.json``.

    Returns:
        The files written; empty if writing failed.

    Example:
        >>> save_or_keep(result.save, "runs/scale", text)     # doctest: +SKIP
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
