"""The quiz that closes each notebook: ``quiz("02")`` in a cell shows notebook 02's
multiple-choice questions.

In JupyterLab each question gets radio buttons (none chosen) and a Check button that
says "Right:" or "Not quite:" with a one-line explanation of the option chosen, and a
score line counts the right answers. Without widgets, and in tests, the same verdicts
come from ``quiz("02").answer(1, "a")``, and the cell shows the questions as plain text.

Like the exercises' answers, the right options live in the package
(:mod:`~workshop.lessons.questions` and its siblings); nothing here shows them before
the learner answers: not the text, not the widgets' state saved in the notebook.
"""

from __future__ import annotations

import html
import textwrap
from dataclasses import dataclass
from typing import Any

from .._house import WIDTH
from . import notebook01, notebook02, notebook03, notebook04, notebook05
from .learner_record import record_answer
from .questions import LETTERS, Question

__all__ = ["QUIZZES", "Quiz", "Verdict", "quiz"]

# notebook -> (title, questions), for every notebook that ends with a quiz
QUIZZES: dict[str, tuple[str, tuple[Question, ...]]] = {
    "01": notebook01.QUIZ,
    "02": notebook02.QUIZ,
    "03": notebook03.QUIZ,
    "04": notebook04.QUIZ,
    "05": notebook05.QUIZ,
}
RIGHT, WRONG = "Right:", "Not quite:"


@dataclass(frozen=True, repr=False)
class Verdict:
    """What :meth:`Quiz.answer` says about one option: shown as "Right: why" or
    "Not quite: why"; ``right`` holds the verdict as a bool."""

    question: int
    option: str
    right: bool
    explanation: str

    def __repr__(self) -> str:
        head = RIGHT if self.right else WRONG
        return textwrap.fill(
            f"{head} {self.explanation}", WIDTH, subsequent_indent="  "
        )

    __str__ = __repr__


class Quiz:
    """A notebook's quiz: shown as widgets in JupyterLab, as text elsewhere.

    Args:
        notebook: the notebook's number, e.g. "02".
        title: what the notebook is about.
        questions: its questions, numbered from 1 in this order.

    Example:
        >>> q = quiz("03")  # what workshop.quiz returns; a cell displays it
        >>> q.answer(2, "b").right
        False
    """

    def __init__(
        self, notebook: str, title: str, questions: tuple[Question, ...]
    ) -> None:
        self.notebook = notebook
        self.title = title
        self.questions = questions

    def answer(self, question: int, option: str) -> Verdict:
        """The verdict on ``option`` of question ``question``, with why.

        Args:
            question: the question's number, from 1.
            option: the option's letter, "a" to "d" (either case).

        Returns:
            A :class:`Verdict`: a cell shows it as "Right: ..." or "Not quite: ...".

        Raises:
            ValueError: the quiz has no such question, or the question no such option
                (the message gives the numbers or letters there are).

        Example:
            >>> quiz("02").answer(1, "a")  # doctest: +ELLIPSIS
            Not quite: ...
        """
        q = self._question(question)
        letters = LETTERS[: len(q.options)]
        chosen = option.strip().lower() if isinstance(option, str) else option
        if chosen not in tuple(letters):
            raise ValueError(
                f"question {question} of quiz {self.notebook} has no option "
                f"{option!r}; choose one of {', '.join(letters)}"
            )
        why = q.options[letters.index(chosen)].why
        # Into the learner's record (and a portal's board); it prints nothing.
        record_answer(self.notebook, question, chosen == q.right, len(self.questions))
        return Verdict(question, chosen, chosen == q.right, why)

    def text(self) -> str:
        """The questions and their options as plain text, without the answers: what
        a cell shows where widgets do not, wrapped to 88 columns.

        Returns:
            The text, the same at every call.
        """
        head = (
            f"Quiz {self.notebook} · {self.title}: {len(self.questions)} questions, "
            "one right option each. Pick an option and press Check; without widgets, "
            f'workshop.quiz("{self.notebook}").answer(1, "a") checks option a of '
            "question 1."
        )
        lines = [textwrap.fill(head, WIDTH)]
        for number, q in enumerate(self.questions, 1):
            lines.append("")
            lines.append(
                textwrap.fill(f"{number}. {q.text}", WIDTH, subsequent_indent="   ")
            )
            for letter, option in zip(LETTERS, q.options, strict=False):
                lines.append(
                    textwrap.fill(
                        option.text,
                        WIDTH,
                        initial_indent=f"   {letter}) ",
                        subsequent_indent="      ",
                    )
                )
        return "\n".join(lines)

    def widget(self) -> Any:
        """The quiz as ipywidgets: per question, radio buttons with nothing chosen, a
        Check button and its verdict; a score line at the end.

        Returns:
            An ipywidgets ``VBox``.

        Raises:
            ImportError: ipywidgets is not installed (``pip install ipywidgets``);
                :meth:`answer` works without it.
        """
        import ipywidgets as widgets

        results: dict[int, bool] = {}  # question -> its last check, while unchanged
        # Two layouts shared by all the widgets: a notebook saves one model per
        # layout, so the saved state stays small.
        layouts = (widgets.Layout(), widgets.Layout(width="auto"))
        score = widgets.HTML(layout=layouts[0])

        def show_score() -> None:
            n = len(self.questions)
            score.value = (
                f"<b>Score: {sum(results.values())} of {n} right</b> "
                f"({len(results)} of {n} checked)"
            )

        boxes = [
            self._question_box(widgets, number, results, show_score, layouts)
            for number in range(1, len(self.questions) + 1)
        ]
        show_score()
        return widgets.VBox([*boxes, score], layout=layouts[0])

    def _question_box(
        self,
        widgets: Any,
        number: int,
        results: dict[int, bool],
        on_change: Any,
        layouts: tuple[Any, Any],
    ) -> Any:
        """One question's widgets; a check records its result in ``results``."""
        q = self.questions[number - 1]
        radio = widgets.RadioButtons(
            options=[
                (f"{letter}) {o.text}", letter)
                for letter, o in zip(LETTERS, q.options, strict=False)
            ],
            index=None,  # nothing chosen until the learner chooses
            layout=layouts[1],  # as wide as the longest option
        )
        button = widgets.Button(description="Check", layout=layouts[0])
        # the verdict stays empty (in the saved state too) until the learner checks
        verdict = widgets.HTML(layout=layouts[0])

        def check(_: Any) -> None:
            if radio.value is None:
                verdict.value = "Pick an option first."
                return
            said = self.answer(number, radio.value)
            colour = "#1a7f37" if said.right else "#b35900"
            head = RIGHT if said.right else WRONG
            verdict.value = (
                f'<span style="color:{colour}"><b>{head}</b></span> '
                f"{html.escape(said.explanation)}"
            )
            results[number] = said.right
            on_change()

        def forget(_: Any) -> None:  # a new choice makes the last verdict stale
            verdict.value = ""
            results.pop(number, None)
            on_change()

        button.on_click(check)
        radio.observe(forget, names="value")
        title = widgets.HTML(
            f"<b>{number}. {html.escape(q.text)}</b>", layout=layouts[0]
        )
        row = widgets.HBox([button, verdict], layout=layouts[0])
        return widgets.VBox([title, radio, row], layout=layouts[0])

    def _question(self, number: int) -> Question:
        n = len(self.questions)
        # bool is an int to Python, and 1.0 == 1: neither numbers a question
        if type(number) is not int or not 1 <= number <= n:
            raise ValueError(
                f"quiz {self.notebook} has no question {number!r}; its questions are "
                f"numbered 1 to {n}"
            )
        return self.questions[number - 1]

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None
    ) -> dict[str, Any]:
        # JupyterLab draws the widgets; every other frontend, and nbval, gets the
        # questions as text in place of the widget's own "VBox(children=..." repr.
        try:
            bundle = dict(self.widget()._repr_mimebundle_() or {})
        except ImportError:
            bundle = {}
        bundle["text/plain"] = self.text()
        return bundle

    def __repr__(self) -> str:
        return self.text()


def quiz(notebook: str | int) -> Quiz:
    """The quiz that closes a notebook; a cell shows it as widgets or as text.

    Args:
        notebook: the notebook's number: "02", "2" or 2.

    Returns:
        A :class:`Quiz`: display it, or call its ``answer(question, "letter")``.

    Raises:
        KeyError: no quiz for that notebook (the message lists those there are).

    Example:
        >>> quiz("01").answer(3, "d")  # doctest: +ELLIPSIS
        Not quite: ...
    """
    name = str(notebook).strip()
    if name.isdigit():
        name = f"{int(name):02d}"
    if name not in QUIZZES:
        raise KeyError(
            f"no quiz for notebook {name!r}; quizzes exist for " + ", ".join(QUIZZES)
        )
    title, questions = QUIZZES[name]
    return Quiz(name, title, questions)
