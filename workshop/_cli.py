"""Argument types every command line of the workshop shares (``python -m workshop``,
``python -m workshop.bench``, ``python -m workshop.gallery``, the planner's job): a
bad value is refused while the options are read, as argparse's one-line error that
names the option, the value and an example, before any work starts and without a
traceback."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

# The API's checks and these types say what is allowed in the same words.
from .checks import whole_range, why_not_writable

__all__ = [
    "above_zero",
    "names_from",
    "read_with",
    "whole_number",
    "writable_file",
    "writable_folder",
    "zero_or_more",
]

T = TypeVar("T")


def whole_number(least: int, example: str, why: str = "") -> Callable[[str], int]:
    """An argparse ``type=``: a whole number, ``least`` or more.

    Args:
        least: the smallest value allowed (0 where 0 means "skip it").
        example: a good use of the option, shown in the error, e.g. "--repeats 5".
        why: why the least is what it is, shown in the error where it is not plain
            ("an all-reduce needs 2 ranks").

    Returns:
        A function of the option's text that returns the number or raises
        ``argparse.ArgumentTypeError``, which argparse prints as
        "argument --repeats: 0 is not a whole number, 1 or more; e.g. --repeats 5".

    Example:
        >>> parser.add_argument("--repeats", type=whole_number(1, "--repeats 5"))
        ... # doctest: +SKIP
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            because = f" ({why})" if why else ""
            raise argparse.ArgumentTypeError(
                f"{text} is not {whole_range(least)}{because}; e.g. {example}"
            )
        return value

    parse.__name__ = "whole number"  # what argparse names in its own messages
    return parse


def _number(least: float, above: bool, example: str) -> Callable[[str], float]:
    """A finite number, above ``least`` (``above``) or ``least`` or more."""
    allowed = f"above {least:g}" if above else f"{least:g} or more"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if math.isinf(value):  # above 0, but no count of seconds or bytes
            raise argparse.ArgumentTypeError(
                f"{text} is not a finite number {allowed}; e.g. {example}"
            )
        if not (value > least if above else value >= least):  # nan fails both
            raise argparse.ArgumentTypeError(
                f"{text} is not a number {allowed}; e.g. {example}"
            )
        return value

    parse.__name__ = "number"
    return parse


def above_zero(example: str) -> Callable[[str], float]:
    """An argparse ``type=``: a finite number above 0 (seconds, an interval).

    Args:
        example: a good use of the option, shown in the error, e.g. "--timeout 600".

    Returns:
        A function of the option's text that returns the number or raises
        ``argparse.ArgumentTypeError`` ("0 is not a number above 0; e.g. ...";
        "inf is not a finite number above 0; ...").

    Example:
        >>> parser.add_argument("--timeout", type=above_zero("--timeout 600"))
        ... # doctest: +SKIP
    """
    return _number(0.0, True, example)


def zero_or_more(example: str) -> Callable[[str], float]:
    """An argparse ``type=``: a finite number, 0 or more (0 meaning "none").

    Args:
        example: a good use of the option, shown in the error, e.g. "--min-time 1".

    Returns:
        A function of the option's text that returns the number or raises
        ``argparse.ArgumentTypeError`` ("-1 is not a number 0 or more; e.g. ...").

    Example:
        >>> parser.add_argument("--min-time", type=zero_or_more("--min-time 1"))
        ... # doctest: +SKIP
    """
    return _number(0.0, False, example)


def names_from(allowed: Sequence[str], example: str) -> Callable[[str], list[str]]:
    """An argparse ``type=``: one or more of ``allowed``, separated by commas.

    Args:
        allowed: the names the option knows.
        example: a good use of the option, e.g. "--methods fork,server".

    Returns:
        A function of the option's text that returns the list of names or raises
        ``argparse.ArgumentTypeError`` naming the names allowed.

    Example:
        >>> names_from(("fork", "spawn"), "--methods fork")("spawn, fork")
        ['spawn', 'fork']
    """

    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        if not names or set(names) - set(allowed):
            raise argparse.ArgumentTypeError(
                f"{text} is not a list of names from {', '.join(allowed)}; "
                f"e.g. {example}"
            )
        return names

    parse.__name__ = "list"
    return parse


def _writable(example: str, folder: bool) -> Callable[[str], str]:
    """The parse of :func:`writable_file` and :func:`writable_folder`."""

    def parse(text: str) -> str:
        path = Path(os.path.abspath(text) if folder else text) if text else None
        why = why_not_writable(path, folder) if path else "no path was given"
        if why is None:
            return text
        into = "cannot write into" if folder else "cannot write"
        what = f"{into} {text}: {why}" if text else why
        raise argparse.ArgumentTypeError(f"{what}; e.g. {example}")

    parse.__name__ = "folder" if folder else "file"
    return parse


def writable_file(example: str) -> Callable[[str], str]:
    """An argparse ``type=`` for a file the command will write: its folder must
    exist, be a folder and be writable, and the path must not be a folder, so that
    a place that cannot be written is said before the work, not after it.

    Args:
        example: a good use of the option, shown in the error, e.g. "--json out.json".

    Returns:
        A function of the option's text that returns the text unchanged or raises
        ``argparse.ArgumentTypeError`` naming what is in the way.

    Example:
        >>> parser.add_argument("--json", type=writable_file("--json out.json"))
        ... # doctest: +SKIP
    """
    return _writable(example, folder=False)


def writable_folder(example: str) -> Callable[[str], str]:
    """An argparse ``type=`` for a folder the command will write into, made if it is
    missing: it must be a folder, or be one that can be made where it is.

    Args:
        example: a good use of the option, shown in the error, e.g. "/tmp/diagrams".

    Returns:
        As :func:`writable_file`.

    Example:
        >>> parser.add_argument("outdir", type=writable_folder("/tmp/diagrams"))
        ... # doctest: +SKIP
    """
    return _writable(example, folder=True)


def read_with(load: Callable[[str], T], what: str) -> Callable[[str], T]:
    """An argparse ``type=`` for a file read at once, so that a missing or wrong
    file is said before anything starts, not minutes later.

    Args:
        load: reads the file (its path, as given) and returns what the command
            uses; raises ``OSError`` or ``ValueError`` with what is wrong and how to
            make the right file.
        what: what the file is, for the message, e.g. "a baseline".

    Returns:
        A function of the option's text that returns ``load(text)`` or raises
        ``argparse.ArgumentTypeError``: "cannot use PATH as WHAT: why".

    Example:
        >>> parser.add_argument("--plan", type=read_with(read_plan, "the plan"))
        ... # doctest: +SKIP
    """

    def parse(text: str) -> T:
        try:
            return load(text)
        except (OSError, ValueError) as exc:
            plain = isinstance(exc, OSError) and exc.filename and exc.strerror
            why = exc.strerror if plain else str(exc)
            raise argparse.ArgumentTypeError(
                f"cannot use {text} as {what}: {why}"
            ) from None

    parse.__name__ = what
    return parse
