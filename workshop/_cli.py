"""Argument types every command line of the workshop shares (``python -m workshop``
and ``python -m workshop.bench``): a bad value is refused while the options are read,
as argparse's one-line error that names the option, the value and an example, before
any work starts and without a traceback."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["above_zero", "whole_number", "writable_file"]


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
                f"{text} is not a whole number, {least} or more{because}; e.g. "
                f"{example}"
            )
        return value

    parse.__name__ = "whole number"  # what argparse names in its own messages
    return parse


def above_zero(example: str) -> Callable[[str], float]:
    """An argparse ``type=``: a finite number above 0 (seconds, an interval).

    Args:
        example: a good use of the option, shown in the error, e.g. "--timeout 600".

    Returns:
        A function of the option's text that returns the number or raises
        ``argparse.ArgumentTypeError`` ("0 is not a number above 0; e.g. ...").

    Example:
        >>> parser.add_argument("--timeout", type=above_zero("--timeout 600"))
        ... # doctest: +SKIP
    """

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(
                f"{text} is not a number above 0; e.g. {example}"
            )
        return value

    parse.__name__ = "number"
    return parse


def writable_file(example: str) -> Callable[[str], str]:
    """An argparse ``type=`` for a file the command will write: its folder must
    exist, be a folder and be writable, and the path must not be a folder, so that
    a place that cannot be written is said before the work, not after it.

    Args:
        example: a good use of the option, shown in the error, e.g.
            "--json check.json".

    Returns:
        A function of the option's text that returns the text unchanged or raises
        ``argparse.ArgumentTypeError`` naming what is in the way.

    Example:
        >>> parser.add_argument("--json", type=writable_file("--json out.json"))
        ... # doctest: +SKIP
    """

    def parse(text: str) -> str:
        path = Path(text)
        folder = path.parent
        if path.is_dir():
            why = "it is a folder; name a file in it"
        elif not folder.exists():
            why = f"its folder {folder} does not exist; make it first"
        elif not folder.is_dir():
            why = f"{folder} is a file, not a folder"
        elif not os.access(folder, os.W_OK | os.X_OK):
            why = f"the folder {folder} cannot be written by you"
        else:
            return text
        raise argparse.ArgumentTypeError(f"cannot write {text}: {why}; e.g. {example}")

    parse.__name__ = "file"
    return parse
