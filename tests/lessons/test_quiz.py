"""The quiz mechanism: finding a notebook's quiz, plain-text answers and their
errors, the text a cell shows without widgets, and the widgets themselves, clicked
through their own API. Nothing shown before an answer depends on which option is
right."""

from __future__ import annotations

import dataclasses
import html
import sys

import pytest

import workshop
from workshop.lessons.questions import LETTERS
from workshop.lessons.quiz import QUIZZES, Quiz, Verdict, quiz


def walk(widget):
    """The widget and all the widgets inside it, depth first."""
    yield widget
    for child in getattr(widget, "children", ()):
        yield from walk(child)


def parts(box):
    """(radio buttons, Check buttons, verdicts, score) of a quiz's widget."""
    import ipywidgets as widgets

    all_ = list(walk(box))
    radios = [w for w in all_ if isinstance(w, widgets.RadioButtons)]
    buttons = [w for w in all_ if isinstance(w, widgets.Button)]
    # the verdict is the HTML beside each button; the score is the box's last child
    verdicts = [box.children[i].children[2].children[1] for i in range(len(radios))]
    return radios, buttons, verdicts, box.children[-1]


def shown_strings(box) -> list[str]:
    """Every string that the widgets' state holds (what a saved notebook keeps)."""
    found = []
    for w in walk(box):
        for value in w.get_state().values():
            if isinstance(value, str) and not value.startswith("IPY_MODEL_"):
                found.append(value)
            elif isinstance(value, (list, tuple)):
                found += [
                    v
                    for v in value
                    if isinstance(v, str) and not v.startswith("IPY_MODEL_")
                ]
    return found


def with_answers_moved(q: Quiz) -> Quiz:
    """The same quiz with every right option moved to another letter."""
    moved = []
    for question in q.questions:
        letters = LETTERS[: len(question.options)]
        other = letters[(letters.index(question.right) + 1) % len(letters)]
        moved.append(dataclasses.replace(question, right=other))
    return Quiz(q.notebook, q.title, tuple(moved))


def test_a_quiz_is_found_by_its_notebook_number():
    assert workshop.quiz is quiz
    for name in ("02", "2", 2, " 02 "):
        assert quiz(name).notebook == "02"
    assert quiz("04").questions == QUIZZES["04"][1]


def test_an_unknown_notebook_lists_the_quizzes_there_are():
    with pytest.raises(
        KeyError,
        match=r"no quiz for notebook '07'; quizzes exist for 01, 02, 03, 04, 05",
    ):
        quiz("07")
    with pytest.raises(KeyError, match=r"no quiz for notebook 'ddp'; quizzes exist"):
        quiz("ddp")


def test_a_question_that_does_not_exist():
    q = quiz("02")
    n = len(q.questions)
    for number in (0, n + 1, -1, True, "1", 1.0):
        with pytest.raises(
            ValueError,
            match=rf"quiz 02 has no question {number!r}; its questions are "
            rf"numbered 1 to {n}",
        ):
            q.answer(number, "a")


def test_an_option_that_does_not_exist():
    q = quiz("03")
    letters = ", ".join(LETTERS[: len(q.questions[0].options)])
    for option in ("z", "", "ab", 1, None):
        with pytest.raises(
            ValueError,
            match=rf"question 1 of quiz 03 has no option {option!r}; choose one of "
            + letters,
        ):
            q.answer(1, option)


def test_the_answer_in_code_takes_either_case_and_reads_as_one_verdict():
    q = quiz("01")
    question = q.questions[0]
    upper = q.answer(1, f" {question.right.upper()} ")
    assert isinstance(upper, Verdict)
    assert upper.right and upper.option == question.right
    text = repr(upper)
    assert text == str(upper) and text.startswith("Right: ")
    assert all(len(line) <= 88 for line in text.splitlines())
    wrong = next(letter for letter in "abc" if letter != question.right)
    assert repr(q.answer(1, wrong)).startswith("Not quite: ")


@pytest.mark.parametrize("notebook", list(QUIZZES))
def test_the_text_lists_every_question_and_option_and_no_answer(notebook):
    q = quiz(notebook)
    text = q.text()
    flat = " ".join(text.split())  # wrapping moves line breaks; the words stay
    assert f"Quiz {notebook}" in text
    assert f'workshop.quiz("{notebook}").answer(1, "a")' in flat
    for number, question in enumerate(q.questions, 1):
        assert f"{number}. {' '.join(question.text.split())}" in flat
        for letter, option in zip(LETTERS, question.options, strict=False):
            assert f"{letter}) {' '.join(option.text.split())}" in flat
            assert " ".join(option.why.split()) not in flat
    assert "Right:" not in text and "Not quite:" not in text
    assert all(len(line) <= 88 for line in text.splitlines())
    # Nothing in it depends on which option is right, and it is the same every time.
    assert with_answers_moved(q).text() == text == quiz(notebook).text() == repr(q)


def test_a_cell_shows_the_text_in_place_of_the_widgets_repr():
    pytest.importorskip("ipywidgets")
    q = quiz("02")
    bundle = q._repr_mimebundle_()
    assert bundle["text/plain"] == q.text()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"]


def test_without_ipywidgets_a_cell_shows_the_text_alone(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import now fails
    q = quiz("05")
    assert q._repr_mimebundle_() == {"text/plain": q.text()}
    with pytest.raises(ImportError):
        q.widget()
    assert q.answer(1, "a").explanation  # the answers in code still work


@pytest.mark.parametrize("notebook", list(QUIZZES))
def test_the_widget_checks_every_option_and_keeps_score(notebook):
    pytest.importorskip("ipywidgets")
    q = quiz(notebook)
    n = len(q.questions)
    box = q.widget()
    radios, buttons, verdicts, score = parts(box)
    assert len(radios) == len(buttons) == n
    assert all(r.value is None for r in radios)  # nothing chosen for the learner
    assert all(b.description == "Check" for b in buttons)
    assert score.value.endswith(f"0 of {n} right</b> (0 of {n} checked)")

    buttons[0].click()
    assert verdicts[0].value == "Pick an option first."
    for number, question in enumerate(q.questions, 1):
        radio, button = radios[number - 1], buttons[number - 1]
        verdict = verdicts[number - 1]
        for letter, option in zip(LETTERS, question.options, strict=False):
            radio.value = letter
            assert verdict.value == ""  # a new choice clears the last verdict
            button.click()
            head = "Right:" if letter == question.right else "Not quite:"
            assert f"<b>{head}</b>" in verdict.value
            assert html.escape(option.why) in verdict.value
        radio.value = question.right
        button.click()
        assert score.value.endswith(
            f"{number} of {n} right</b> ({number} of {n} checked)"
        )
    wrong = next(x for x in LETTERS if x != q.questions[0].right)
    radios[0].value = wrong
    assert score.value.endswith(f"{n - 1} of {n} right</b> ({n - 1} of {n} checked)")
    buttons[0].click()
    assert score.value.endswith(f"{n - 1} of {n} right</b> ({n} of {n} checked)")


@pytest.mark.parametrize("notebook", list(QUIZZES))
def test_the_widgets_saved_state_gives_no_answer_away(notebook):
    pytest.importorskip("ipywidgets")
    q = quiz(notebook)
    shown = shown_strings(q.widget())
    assert shown == shown_strings(with_answers_moved(q).widget())
    flat = " ".join(shown)
    for question in q.questions:
        assert html.escape(question.text) in flat
        for option in question.options:
            assert option.text in flat
            assert option.why not in flat and html.escape(option.why) not in flat
