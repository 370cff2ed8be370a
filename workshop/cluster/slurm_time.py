"""Slurm's time limits (``--time``), read as Slurm reads them (notebook 03, section 6).

``--time`` takes six forms: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M`` and
``D-H:M:S``. A limit is kept in whole minutes, seconds rounded up, and ``scontrol
show job`` prints it back as ``HH:MM:SS``, or ``D-HH:MM:SS`` from one day on.
"""

from __future__ import annotations

import re

__all__ = ["scontrol_time_limit", "time_limit_minutes"]

_FORMS = "M, M:S, H:M:S, D-H, D-H:M or D-H:M:S (e.g. 30, 0-10:05, 24:00:00)"


def time_limit_minutes(text: str) -> int:
    """The whole minutes that Slurm gives a job for ``--time=text``.

    Args:
        text: a ``--time`` value, e.g. ``"0-10:05"`` (days-hours:minutes).

    Returns:
        Minutes, seconds rounded up as Slurm does (``"5:30"`` gives 6).

    Raises:
        ValueError: not one of Slurm's six forms, or a negative or non-numeric field.

    Example:
        >>> time_limit_minutes("0-10:05"), time_limit_minutes("5:30")
        (605, 6)
    """
    if not isinstance(text, str) or not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", text):
        raise ValueError(
            f"--time={text!r} is not a Slurm time limit; use one of {_FORMS}"
        )
    days_text, _, clock = text.rpartition("-")
    days = int(days_text) if days_text else 0
    parts = [int(p) for p in clock.split(":")]
    if days_text:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = ([*parts, 0, 0])[:3]
    elif len(parts) == 3:  # H:M:S
        hours, minutes, seconds = parts
    else:  # M, M:S
        hours, (minutes, seconds) = 0, ([*parts, 0])[:2]
    total_seconds = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return -(-total_seconds // 60)


def scontrol_time_limit(minutes: int) -> str:
    """A limit of ``minutes`` as ``scontrol show job`` prints its ``TimeLimit``.

    Args:
        minutes: whole minutes, 0 or more.

    Returns:
        ``"HH:MM:SS"`` below a day, ``"D-HH:MM:SS"`` from a day on.

    Raises:
        ValueError: ``minutes`` is not a whole number of 0 or more.

    Example:
        >>> scontrol_time_limit(605), scontrol_time_limit(1440)
        ('10:05:00', '1-00:00:00')
    """
    if isinstance(minutes, bool) or not isinstance(minutes, int) or minutes < 0:
        raise ValueError(
            f"minutes must be a whole number, 0 or more; got {minutes!r} (pass "
            "time_limit_minutes('0-10:05'), for example)"
        )
    days, rest = divmod(minutes, 24 * 60)
    clock = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{clock}" if days else clock
