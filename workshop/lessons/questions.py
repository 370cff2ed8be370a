"""The form of a question of the notebooks' closing quizzes, shown by
:func:`workshop.lessons.quiz.quiz`; each notebook's questions are in its own module
(:mod:`~workshop.lessons.notebook01` to :mod:`~workshop.lessons.notebook05`).

Every option carries a one-line explanation that the learner sees after choosing it:
why it is right, or why it is not. Which option is right is stored here, with the
package, as the exercises' answers are, and never printed before the learner answers.
Each question names a ``keyword`` of its notebook's text, so the tests can check that
the notebook teaches what the question asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["LETTERS", "Option", "Question", "question"]

LETTERS = "abcd"


@dataclass(frozen=True)
class Option:
    """One answer to a question, and why it is right or wrong."""

    text: str
    why: str


@dataclass(frozen=True)
class Question:
    """A multiple-choice question with one right option.

    Attributes:
        text: the question.
        keyword: a word the notebook's text contains where it teaches this.
        options: 3 or 4 options, shown as a), b), c), d).
        right: the letter of the right option (kept out of the repr).
    """

    text: str
    keyword: str
    options: tuple[Option, ...]
    right: str = field(repr=False)

    def __post_init__(self) -> None:
        # The data checks itself on import: a typo in a quiz fails at once.
        if not 3 <= len(self.options) <= len(LETTERS):
            raise ValueError(
                f"question {self.text!r} has {len(self.options)} options; give it "
                f"3 to {len(LETTERS)}"
            )
        if self.right not in LETTERS[: len(self.options)]:
            raise ValueError(
                f"question {self.text!r} marks option {self.right!r} right; it has "
                f"options {', '.join(LETTERS[: len(self.options)])}"
            )


def question(
    text: str, keyword: str, right: str, *options: tuple[str, str]
) -> Question:
    """A :class:`Question` from (option, why) pairs: the quizzes' compact form."""
    return Question(text, keyword, tuple(Option(t, why) for t, why in options), right)
