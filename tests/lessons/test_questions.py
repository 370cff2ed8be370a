"""Every question of every notebook's quiz: one right option, a verdict and an
explanation for each option, answers not guessable from the layout, and a topic that
the notebook really teaches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workshop.lessons.questions import LETTERS, Option, Question
from workshop.lessons.quiz import QUIZZES, quiz

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
QUESTIONS = [
    (notebook, number)
    for notebook, (_, questions) in QUIZZES.items()
    for number in range(1, len(questions) + 1)
]


def notebook_text(notebook: str) -> str | None:
    """What ``notebooks/<notebook>_*.ipynb`` shows a learner, cells and their text
    outputs, lower case; None when that notebook is not there (yet)."""
    found = sorted(NOTEBOOKS.glob(f"{notebook}_*.ipynb"))
    if not found:
        return None
    parts = []
    for cell in json.loads(found[0].read_text())["cells"]:
        parts.append("".join(cell["source"]))
        for output in cell.get("outputs", []):
            text = output.get("text") or output.get("data", {}).get("text/plain", "")
            parts.append("".join(text))
    return "\n".join(parts).lower()


def test_every_notebook_has_a_quiz_of_four_to_eight_questions():
    assert list(QUIZZES) == ["01", "02", "03", "04", "05"]
    for notebook, (title, questions) in QUIZZES.items():
        assert title, notebook
        assert 4 <= len(questions) <= 8, notebook


@pytest.mark.parametrize(("notebook", "number"), QUESTIONS)
def test_exactly_one_option_is_right_and_each_says_why(notebook, number):
    q = quiz(notebook)
    question = q.questions[number - 1]
    letters = LETTERS[: len(question.options)]
    assert 3 <= len(letters) <= 4
    verdicts = [q.answer(number, letter) for letter in letters]
    assert [v.right for v in verdicts].count(True) == 1
    for letter, option, verdict in zip(
        letters, question.options, verdicts, strict=True
    ):
        assert verdict.right == (letter == question.right)
        head = "Right: " if verdict.right else "Not quite: "
        assert str(verdict).startswith(head)
        assert option.text.strip() and option.why.strip()
        assert "\n" not in option.why and len(option.why) <= 140  # one line
        assert verdict.explanation == option.why
    # an explanation per option, not one shared by all
    assert len({o.why for o in question.options}) == len(question.options)
    assert len({o.text for o in question.options}) == len(question.options)


@pytest.mark.parametrize("notebook", list(QUIZZES))
def test_the_answers_cannot_be_read_from_the_layout(notebook):
    _, questions = QUIZZES[notebook]
    rights = [q.right for q in questions]
    assert len(set(rights)) >= 3, f"quiz {notebook}: right options {rights}"
    # The longest option is a classic give-away: at most half the time.
    longest = sum(
        len(q.options[LETTERS.index(q.right)].text)
        > max(len(o.text) for i, o in enumerate(q.options) if LETTERS[i] != q.right)
        for q in questions
    )
    assert longest <= len(questions) // 2, f"quiz {notebook}: right is longest"


@pytest.mark.parametrize("notebook", list(QUIZZES))
def test_each_question_is_about_what_its_notebook_teaches(notebook):
    text = notebook_text(notebook)
    if text is None:
        # Notebook 05 is written after its quiz: its keywords are checked once the
        # notebook exists. The first four are there already, and must be.
        assert notebook == "05", f"notebook {notebook} is missing"
        pytest.skip(f"notebooks/{notebook}_*.ipynb is not written yet")
    missing = [q.keyword for q in QUIZZES[notebook][1] if q.keyword.lower() not in text]
    assert not missing, f"notebook {notebook} never mentions {missing}"


def test_a_question_checks_its_own_shape():
    two = (Option("yes", "because"), Option("no", "because not"))
    with pytest.raises(ValueError, match=r"has 2 options; give it 3 to 4"):
        Question("Is it?", "it", two, "a")
    three = (*two, Option("maybe", "no such thing"))
    with pytest.raises(
        ValueError, match=r"marks option 'd' right; it has options a, b"
    ):
        Question("Is it?", "it", three, "d")
