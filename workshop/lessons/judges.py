"""What every exercise is made of: a question, a judge of the learner's answer and a
hint (:class:`Exercise`), and the judges that several notebooks' exercises share: a
number close enough, a function checked case by case against the right one, and
one run on real ranks."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..ranks.launcher import launch

__all__ = ["Exercise", "close", "first_wrong_case", "passes_on_ranks", "show"]


@dataclass(frozen=True)
class Exercise:
    """An exercise: how to judge an answer, and a hint for a wrong one."""

    question: str
    # True when right; False, or a line saying what was wrong, when not.
    judge: Callable[[Any], bool | str]
    hint: str


def close(expected: float, tolerance: float = 0.01) -> Callable[[Any], bool]:
    def judge(answer: Any) -> bool:
        return isinstance(answer, (int, float)) and math.isclose(
            answer, expected, rel_tol=tolerance, abs_tol=tolerance / 100
        )

    return judge


def first_wrong_case(
    answer: Any,
    name: str,
    cases: list[tuple[Any, ...]],
    expected: Callable[..., Any],
    same: Callable[[Any, Any], bool] | None = None,
) -> bool | str:
    """True when ``answer(*case)`` agrees with ``expected(*case)`` for every case;
    otherwise a line showing the first case that does not, the learner's value beside
    the right one: what a unit test would show, so a wrong function can be debugged."""
    if not callable(answer):
        return (
            f"{name} should be a function, but it is {type(answer).__name__} {answer!r}"
        )
    same = same or (
        lambda got, want: (
            isinstance(got, (int, float))
            and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15)
        )
    )
    for case in cases:
        got, want = answer(*case), expected(*case)
        if not same(got, want):
            args = ", ".join(show(v) for v in case)
            return f"{name}({args}) returned {show(got)}; it should be {show(want)}"
    return True


def show(value: Any) -> str:
    # 4000.0 as 4000 and 5e-06 as 5e-06: whole numbers without ".0", others in %g.
    if isinstance(value, float):
        return (
            str(int(value))
            if value.is_integer() and abs(value) < 1e15
            else f"{value:.6g}"
        )
    return repr(value)


def passes_on_ranks(
    check: Callable[..., bool | str],
    answer: Any,
    cases: tuple[tuple[int, ...], ...],
) -> bool | str:
    """True when ``check(answer, *args)`` is True on every rank, for each case
    ``(world_size, *args)``: the learner's function runs on real ranks. Otherwise
    the first rank's reason."""
    if not callable(answer):
        return f"the answer should be a function, but it is {type(answer).__name__}"
    for world_size, *args in cases:
        result = launch(
            check, answer, *args, world_size=world_size, timeout=30, show="none"
        )
        for verdict in result.returns:
            if verdict is not True:
                return verdict  # the first rank's reason
    return True
