"""A learner's own view of their record, and their raised hand.

``workshop.progress()`` shows, in a cell, the exercises passed, failed (with the
check's reason) and not tried, notebook by notebook, each quiz's score, where the
learner stopped and their hand: read from the file :mod:`.learner_record` keeps, so
it works on a laptop as on a portal, and it posts nothing itself.

``workshop.raise_hand("help")`` (or ``"done"``) and ``workshop.lower_hand()`` set the
hand that a portal's class board shows the instructor: the red "I need help" and
green "done" sticky notes of a room. ``workshop.hand()`` is the same as three
buttons and a line saying where the hand is, "cleared by the instructor" included.
"""

from __future__ import annotations

import html
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._house import WIDTH
from ..checks import one_of
from .exercises import EXERCISES
from .learner_record import (
    board_address,
    progress_file,
    read_record,
    set_hand,
    watch_hand,
)
from .quiz import QUIZZES

__all__ = ["ProgressTable", "hand", "lower_hand", "progress", "raise_hand"]

_KINDS = {"help": "I need help", "done": "done"}
_KIND_FIX = 'raise_hand("help") asks for help; raise_hand("done") says you are done'
# The colours of the quiz's verdicts: green for right, orange for not yet.
_GREEN, _ORANGE, _GREY = "#1a7f37", "#b35900", "#6e7781"


@dataclass(frozen=True)
class ProgressTable:
    """What :func:`progress` shows: a table in HTML in JupyterLab, as text within 88
    columns elsewhere.

    Attributes:
        record: the learner's record (:func:`~.learner_record.read_record`).
        path: the file it is kept in; None when recording is off.
        posting: whether it is also posted to a class board.
    """

    record: dict[str, Any]
    path: Path | None
    posting: bool

    def text(self) -> str:
        """The table as text, every line within 88 columns.

        Returns:
            The text a cell shows where HTML is not shown.
        """
        lines = ["Your progress"]
        lines += [_wrapped(f"  {line}", 4) for line in self._head()]
        notebooks = self._notebooks()
        # One column of names for all notebooks, as wide as the longest name.
        width = max(len(row[0]) for *_, rows, _ in notebooks for row in rows)
        for number, title, rows, quiz in notebooks:
            lines += ["", f"Notebook {number} · {title}"]
            for name, state, detail in rows:
                said = f"{state}: {detail}" if detail else state
                lines.append(_wrapped(f"  {name:<{width}}  {said}", width + 6))
            lines.append(_wrapped(f"  {'quiz':<{width}}  {quiz}", width + 6))
        return "\n".join(lines)

    def html(self) -> str:
        """The table as HTML, every text escaped.

        Returns:
            A ``<div>`` with the head lines and one table of all notebooks.
        """
        esc = html.escape
        head = "<br>".join(esc(line) for line in self._head())
        cells = []
        for number, title, rows, quiz in self._notebooks():
            cells.append(
                f'<tr><th colspan="2" style="text-align:left;padding-top:0.6em">'
                f"Notebook {esc(number)} · {esc(title)}</th></tr>"
            )
            for name, state, detail in rows:
                colour = (
                    _GREEN
                    if state.startswith("passed")
                    else _GREY
                    if state == "not tried"
                    else _ORANGE
                )
                said = f"{esc(state)}: {esc(detail)}" if detail else esc(state)
                cells.append(
                    f'<tr><td style="text-align:left"><code>{esc(name)}</code></td>'
                    f'<td style="text-align:left;color:{colour}">{said}</td></tr>'
                )
            cells.append(
                '<tr><td style="text-align:left">quiz</td>'
                f'<td style="text-align:left">{esc(quiz)}</td></tr>'
            )
        return (
            f"<div><b>Your progress</b><br>{head}<table>{''.join(cells)}</table></div>"
        )

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self) -> str:
        return self.text()

    __str__ = __repr__

    def _head(self) -> list[str]:
        """Where the record is kept, where the learner is, the hand, the last error."""
        record = self.record
        if self.path is None:
            return ["Not kept: recording is off (WORKSHOP_PROGRESS=off)."]
        board = (
            "also posted to the class board, which the instructor reads"
            if self.posting
            else "nothing is posted anywhere (no class board is set)"
        )
        where = record["where"]
        lines = [
            f"Kept in {self.path}; {board}.",
            f"Where you stopped: {_place(where) if where else 'not known yet'}",
            f"Your hand: {_hand_words(record)}",
        ]
        error = record["error"]
        if error is not None:
            lines.append(f"Last error: {error['type']} in {_place(error)}")
        return lines

    def _notebooks(self) -> list[tuple[str, str, list[tuple[str, str, str]], str]]:
        """Per notebook: its number, title, (exercise, state, reason) rows and its
        quiz's score, in the notebooks' order."""
        exercises = self.record["exercises"]
        numbers = sorted({name[:2] for name in EXERCISES} | set(QUIZZES))
        found = []
        for number in numbers:
            title = QUIZZES[number][0] if number in QUIZZES else ""
            rows = [
                (name, *_state(exercises.get(name)))
                for name in EXERCISES
                if name.startswith(f"{number}.")
            ]
            found.append((number, title, rows, self._quiz(number)))
        return found

    def _quiz(self, number: str) -> str:
        questions = len(QUIZZES[number][1]) if number in QUIZZES else 0
        score = self.record["quizzes"].get(number)
        if score is None or not score["checked"]:
            return f"not tried ({questions} questions)"
        return (
            f"{score['right']} of {questions} right "
            f"({score['checked']} of {questions} checked)"
        )


def progress() -> ProgressTable:
    """Your exercises, quizzes, where you stopped and your hand, as a table.

    Read from your record file (``~/.local/share/scaling-pytorch-hpc/progress.json``,
    or ``$WORKSHOP_PROGRESS``); it works without a portal and posts nothing.

    Returns:
        A :class:`ProgressTable`: a cell shows it as a table (as text outside
        JupyterLab).

    Example:
        >>> print(progress())  # doctest: +SKIP
        Your progress
          Kept in /home/ada/.local/share/scaling-pytorch-hpc/progress.json; ...
    """
    path = progress_file()
    return ProgressTable(read_record(path), path, _posting(path))


def raise_hand(kind: str = "help") -> None:
    """Raise your hand: "help" (red, "I need help") or "done" (green) on the class
    board the instructor watches; prints where your hand is.

    Args:
        kind: "help" or "done".

    Raises:
        ValueError: ``kind`` is neither (the message names the two).

    Example:
        >>> raise_hand("wave")
        Traceback (most recent call last):
        ...
        ValueError: kind must be one of 'help' or 'done', not 'wave'; ...
    """
    one_of("kind", kind, tuple(_KINDS), fix=_KIND_FIX)
    print(_wrapped(_set(kind), 2))


def lower_hand() -> None:
    """Lower your hand (the instructor can also clear it from the board); prints
    where your hand is.

    Example:
        >>> lower_hand()  # doctest: +SKIP
        Your hand is down.
    """
    print(_wrapped(_set(None), 2))


def hand() -> Any:
    """Three buttons for your hand: "I need help" (red), "Done" (green) and "Hand
    down", and a line saying where your hand is ("cleared by the instructor" when
    the board cleared it).

    Returns:
        An ipywidgets ``VBox``; where ipywidgets is not installed, a note that a
        cell shows, saying to use :func:`raise_hand` and :func:`lower_hand`.

    Example:
        >>> hand()  # doctest: +SKIP
    """
    try:
        import ipywidgets as widgets
    except ImportError:
        return _HandNote()
    return _HandButtons(widgets).box


class _HandButtons:
    """The hand's widgets; the status line is refreshed after each click and when
    the board clears the hand (from the poster's thread)."""

    def __init__(self, widgets: Any) -> None:
        layout = widgets.Layout(width="auto")
        buttons = [
            widgets.Button(description="I need help", button_style="danger"),
            widgets.Button(description="Done", button_style="success"),
            widgets.Button(description="Hand down", layout=layout),
        ]
        for button, kind in zip(buttons, ("help", "done", None), strict=True):
            button.on_click(lambda _, kind=kind: self._click(kind))
        self.status = widgets.HTML(html.escape(_status()))
        self.box = widgets.VBox([widgets.HBox(buttons), self.status])
        watch_hand(self.refresh)

    def _click(self, kind: str | None) -> None:
        self.status.value = html.escape(_set(kind))

    def refresh(self) -> None:
        """Say where the hand is now."""
        self.status.value = html.escape(_status())


class _HandNote:
    """What :func:`hand` shows where ipywidgets is missing."""

    def __repr__(self) -> str:
        return textwrap.fill(
            "No buttons here: ipywidgets is not installed (pip install ipywidgets). "
            'Raise your hand with workshop.raise_hand("help") or '
            'workshop.raise_hand("done"), and lower it with workshop.lower_hand(). '
            + _status(),
            WIDTH,
        )


def _set(kind: str | None) -> str:
    """Set the hand; what to tell the learner (also why it could not be kept)."""
    try:
        set_hand(kind)
    except (OSError, TimeoutError) as exc:
        return f"Your hand could not be kept: {exc}"
    return _status()


def _status() -> str:
    """One line: where the hand is, and who sees it."""
    path = progress_file()
    if path is None:
        return "Recording is off (WORKSHOP_PROGRESS=off): no hand is kept."
    words = _hand_words(read_record(path))
    if not words.startswith("up"):
        return f"Your hand is {words}."
    seen = (
        "the instructor's board shows it"
        if _posting(path)
        else "no class board is set here, so only workshop.progress() shows it"
    )
    return f"Your hand is {words}; {seen}."


def _posting(path: Path | None) -> bool:
    return path is not None and board_address() is not None


def _hand_words(record: dict[str, Any]) -> str:
    hand_up = record["hand"]
    if hand_up is not None:
        return f'up, "{_KINDS[hand_up["kind"]]}"'
    if record["hand_cleared"] is not None:
        return "down, cleared by the instructor"
    return "down"


def _place(where: dict[str, Any]) -> str:
    return " · ".join(p for p in (where["notebook"], where["section"]) if p) or "?"


def _state(entry: dict[str, Any] | None) -> tuple[str, str]:
    """An exercise's state and the reason shown beside it."""
    if entry is None:
        return "not tried", ""
    failures = entry["failures"]
    times = "once" if failures == 1 else f"{failures} times"
    if entry["passed"]:
        return (
            ("passed", "") if not failures else (f"passed, after failing {times}", "")
        )
    return f"failed {times}", entry["reason"]


def _wrapped(line: str, indent: int) -> str:
    # Not at hyphens: a path (pytest-of-ada) or a name (all-reduce) stays whole
    # where it fits on a line.
    return textwrap.fill(
        line, WIDTH, subsequent_indent=" " * indent, break_on_hyphens=False
    )
