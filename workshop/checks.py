"""Checks of arguments that the API and the command lines share: a whole number in a
range, one of a set, a finite number above 0, a path that can be written.

Each refuses a bad value in one sentence of one shape, before any work starts::

    <name> must be <what is allowed>, not <value!r>; <what to do>

A number of the wrong kind (a bool, a float where a count is asked for, a string) is
refused with ``ValueError``, as ``int("x")`` is, so that a caller catches one
exception for every bad number; a path of the wrong kind with ``TypeError``, as
``open(5.0)`` does, and a place that cannot be written with ``ValueError``.
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

__all__ = [
    "LONGEST_WAIT_S",
    "list_of",
    "message",
    "one_of",
    "positive_number",
    "whole",
    "whole_list",
    "whole_range",
    "why_not_writable",
    "writable_path",
]

T = TypeVar("T")

# The longest wait, in seconds, that every layer under a launch takes: the process
# group and its store turn a timeout into milliseconds, and some keep them in a C
# int (2**31 - 1 ms, 24.8 days); beyond it a rank fails with "Python int too large
# to convert to C int" after it started. No limit at all is asked for with None.
LONGEST_WAIT_S = (2**31 - 1) // 1000


def message(name: str, allowed: str, value: Any, fix: str = "") -> str:
    """The one wording of a refused argument: "<name> must be <allowed>, not
    <value!r>; <fix>" (without "; <fix>" where ``fix`` is empty).

    Example:
        >>> message("steps", "a whole number, 1 or more", 0, "e.g. steps=10")
        'steps must be a whole number, 1 or more, not 0; e.g. steps=10'
    """
    return _sentence(name, allowed, repr(value), fix)


def _sentence(name: str, allowed: str, shown: str, fix: str) -> str:
    text = f"{name} must be {allowed}, not {shown}"
    return f"{text}; {fix}" if fix else text


def _refuse(
    name: str, allowed: str, value: Any, fix: str, error=ValueError
) -> NoReturn:
    raise error(message(name, allowed, value, fix))


def whole_range(least: int, most: int | None = None) -> str:
    """What :func:`whole` allows, in words: "a whole number, 1 or more",
    "a whole number from 1 to 8"."""
    if most is None:
        return f"a whole number, {least} or more"
    return f"a whole number from {least} to {most}"


def whole(
    name: str, value: Any, least: int = 1, most: int | None = None, fix: str = ""
) -> int:
    """``value`` if it is a whole number from ``least`` to ``most`` (no upper end
    when None), as an ``int``.

    A bool (True is 1 to Python, but no one means a count by it), a float (even
    2.0: a count written as 2.0 was usually computed by a division) and a string
    are refused; an integer of another library (numpy's, a 0-d tensor) is taken.

    Args:
        name: the argument's name, as the caller wrote it ("world_size").
        value: what was passed.
        least, most: the smallest and largest values allowed.
        fix: what to do, e.g. "e.g. world_size=2".

    Raises:
        ValueError: "world_size must be a whole number, 1 or more, not 0; e.g. ...".

    Example:
        >>> whole("epochs", 3)
        3
        >>> whole("epochs", 2.0, fix="e.g. epochs=2")
        Traceback (most recent call last):
        ...
        ValueError: epochs must be a whole number, 1 or more, not 2.0; e.g. epochs=2
    """
    allowed = whole_range(least, most)
    if isinstance(value, (bool, float, str, bytes)):
        _refuse(name, allowed, value, fix)
    try:
        number = operator.index(value)
    except TypeError:
        _refuse(name, allowed, value, fix)
    if number < least or (most is not None and number > most):
        _refuse(name, allowed, value, fix)
    return number


def whole_list(
    name: str, values: Any, least: int = 1, most: int | None = None, fix: str = ""
) -> list[int]:
    """``values``, a list, tuple or range of one or more whole numbers from
    ``least`` to ``most``, as a list of ints.

    Raises:
        ValueError: "seeds must be one or more whole numbers, each 0 or more, not
            (0, '1'); ...".
    """
    each = (
        whole_range(least, most)
        .replace("a whole number, ", "")
        .replace("a whole number ", "")
    )
    allowed = f"one or more whole numbers, each {each}"
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        _refuse(name, allowed, values, fix)
    items = list(values)
    if not items:
        _refuse(name, allowed, values, fix)
    try:
        return [whole(name, v, least, most) for v in items]
    except ValueError:
        _refuse(name, allowed, values, fix)


def list_of(
    name: str,
    values: Any,
    kind: type,
    what: str,
    fix: str = "",
    empty: bool = True,
    keys: tuple[str, ...] = (),
) -> list[Any]:
    """``values`` as a list, if it is a list, tuple or other iterable (not a
    string) whose items are all ``kind`` (and, unless ``empty``, not empty).

    Args:
        what: the items in words, "Against rows".
        keys: names every item must hold (items that are dicts read from a file).

    Raises:
        TypeError: "rows must be a list of Against rows, not 5; e.g. ...", or for
            an item of another kind, "... not a list holding 'x' (a str)".
        ValueError: an empty list where ``empty`` is False, or an item without
            one of ``keys`` ("... not a list holding one without 'rank'").
    """
    allowed = f"a list of {what}" + ("" if empty else ", one or more")
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, Iterable):
        _refuse(name, allowed, values, fix, TypeError)
    items = list(values)
    odd = [v for v in items if not isinstance(v, kind)]
    if odd:
        shown = f"a list holding {odd[0]!r} (a {type(odd[0]).__name__})"
        raise TypeError(_sentence(name, allowed, shown, fix))
    if not items and not empty:
        _refuse(name, allowed, values, fix)
    lacking = [k for item in items for k in keys if k not in item][:1]
    if lacking:
        shown = f"a list holding one without {lacking[0]!r}"
        raise ValueError(_sentence(name, allowed, shown, fix))
    return items


def _same(value: Any, known: Any) -> bool:
    # True == 1 to Python; a flag is not a choice of number, nor a number a flag.
    if isinstance(value, bool) != isinstance(known, bool):
        return False
    try:
        return bool(value == known)
    except Exception:  # an array compared element by element, say
        return False


def one_of(name: str, value: T, allowed: Iterable[Any], fix: str = "") -> T:
    """``value`` if it is one of ``allowed``.

    Raises:
        ValueError: "show must be one of 'auto', 'lines' or 'none', not 'x'; ...".

    Example:
        >>> one_of("amp", "bf16", ("fp32", "bf16", "fp16"))
        'bf16'
    """
    choices = list(allowed)
    if any(_same(value, known) for known in choices):
        return value
    names = [repr(c) for c in choices]
    words = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    _refuse(name, f"one of {words}", value, fix)


def positive_number(
    name: str,
    value: Any,
    most: float | None = None,
    what: str = "a number",
    fix: str = "",
) -> float:
    """``value`` as a float if it is a finite number above 0, and at most ``most``.

    Args:
        name: the argument's name.
        value: what was passed; a bool, a string, nan and infinity are refused.
        most: the largest value allowed (None: any finite one), e.g.
            :data:`LONGEST_WAIT_S` for a timeout.
        what: what the number is, "a number of seconds".
        fix: what to do, e.g. "e.g. timeout=60, or None for no limit".

    Raises:
        ValueError: "timeout must be a number of seconds above 0 and at most
            2147483, not 1e15; ...".
    """
    top = "" if most is None else f"{int(most)}" if most == int(most) else f"{most:g}"
    allowed = f"{what} above 0" + (f" and at most {top}" if top else "")
    if isinstance(value, (bool, str, bytes)):
        _refuse(name, allowed, value, fix)
    try:
        number = float(value)
    except (TypeError, ValueError):
        _refuse(name, allowed, value, fix)
    if not (math.isfinite(number) and number > 0):
        _refuse(name, allowed, value, fix)
    if most is not None and number > most:
        _refuse(name, allowed, value, fix)
    return number


def why_not_writable(path: Path, folder: bool = False) -> str | None:
    """Why ``path`` cannot be written (as a file, or as a folder made if missing),
    or None where it can."""
    if not str(path):
        return "no path was given"
    if folder:
        if path.exists():
            if not path.is_dir():
                return "it is a file, not a folder"
            writable = os.access(path, os.W_OK | os.X_OK)
            return None if writable else "it cannot be written by you"
        # The nearest folder above that exists is where the missing ones are made.
        parent = next(p for p in Path(os.path.abspath(path)).parents if p.exists())
    else:
        parent = path.parent
        if path.is_dir():
            return "it is a folder; name a file in it"
        if not parent.exists():
            return f"its folder {parent} does not exist; make it first"
    if not parent.is_dir():
        return f"{parent} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"the folder {parent} cannot be written by you"
    return None


def writable_path(name: str, value: Any, folder: bool = False, fix: str = "") -> Path:
    """``value`` as a Path, if a file (or with ``folder``, a folder, made where
    missing) can be written there: said before the work, not after it.

    Raises:
        TypeError: ``value`` is not a str or path ("path must be a file name, not
            5; ...").
        ValueError: nothing can be written there, with why ("path must be a file
            that can be written, not '/x/y.pt': its folder /x does not exist; ...").
    """
    kind = "a folder" if folder else "a file"
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        _refuse(name, f"{kind} name", value, fix, TypeError)
    path = Path(value)
    why = why_not_writable(path, folder) if str(value) else "no path was given"
    if why is not None:
        reason = f"{why}; {fix}" if fix else why
        raise ValueError(
            f"{name} must be {kind} that can be written, not {str(value)!r}: {reason}"
        )
    return path
