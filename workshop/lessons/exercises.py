"""Self-checking exercises: ``check("01.bubble", my_answer)`` says whether an answer is
right and, when it is not, gives a hint without giving the answer away.

Each notebook's exercises live in its own module (:mod:`~workshop.lessons.notebook01`
and on) and are gathered here by name ("01.bubble" is notebook 01's exercise on
pipeline bubbles), so the answers are tested with the package.
"""

from __future__ import annotations

import textwrap
from typing import Any

from . import (
    notebook01,
    notebook02,
    notebook03,
    notebook04,
    notebook04_planner,
    notebook05,
)
from .judges import Exercise
from .learner_record import record_verdict

__all__ = ["EXERCISES", "check", "judge"]

# The recorded reason of a failed check whose judge gives none.
WRONG = "not the expected answer"


# Every notebook's exercises, in the notebooks' order.
EXERCISES: dict[str, Exercise] = {
    **notebook01.EXERCISES,
    **notebook02.EXERCISES,
    **notebook03.EXERCISES,
    **notebook04.EXERCISES,
    **notebook04_planner.EXERCISES,
    **notebook05.EXERCISES,
}


def check(name: str, answer: Any) -> None:
    """Say whether ``answer`` solves exercise ``name``; print a hint if it does not.

    Returns nothing, so a notebook cell shows the verdict alone; :func:`judge` gives
    the same verdict as a bool.

    Args:
        name: the exercise, e.g. "01.bubble".
        answer: your answer (a number, a tuple, or a function, as the exercise asks).

    Raises:
        KeyError: no exercise of that name (the message lists them).

    Example:
        >>> check("01.accumulate", 8)
        Right: 01.accumulate
    """
    judge(name, answer)


def judge(name: str, answer: Any) -> bool:
    """Print the verdict on ``answer`` to exercise ``name`` and return it (True when
    right); see :func:`check`."""
    if not isinstance(name, str) or name not in EXERCISES:  # (a list: unhashable)
        raise KeyError(
            f"no exercise named {name!r}; the exercises are "
            + ", ".join(repr(n) for n in EXERCISES)
        )
    exercise = EXERCISES[name]
    try:
        verdict = exercise.judge(answer)
        # A judge that answers False gives no reason of its own; the board still
        # says why the check failed.
        reason = verdict if isinstance(verdict, str) else "" if verdict else WRONG
    except Exception as exc:  # a learner's function may raise: that is an answer too
        verdict = f"It raised {type(exc).__name__}: {exc}"
        # The record (which a class board shows) gets the type alone: the message
        # of the learner's own code can quote anything it holds.
        reason = f"It raised {type(exc).__name__}"
    # Into the learner's record (and a portal's board); it prints nothing.
    record_verdict(name, verdict is True, reason)
    if verdict is True:
        print(f"Right: {name}")
        return True
    lines = [f"Not yet: {name}."]
    if isinstance(verdict, str):
        lines.append(_sentence(verdict))
    lines += [
        _sentence(f"It wants {exercise.question}"),
        _sentence(f"Hint: {exercise.hint}"),
    ]
    # Wrapped so the verdict reads whole in a narrow notebook column; a message of
    # several lines (a launch's timeout report) keeps its own lines.
    print(
        "\n".join(
            textwrap.fill(part, 88, subsequent_indent="  ") if len(part) > 88 else part
            for line in lines
            for part in line.splitlines()
        )
    )
    return False


def _sentence(text: str) -> str:
    return text if text.rstrip().endswith((".", "?", "!")) else text + "."
