"""The learner's record of the lessons (workshop/lessons/learner_record.py), its
table and hand (progress.py), the notebook and section of a cell
(notebook_place.py) and the poster to a class board (board_client.py).

Every test keeps its record in tmp_path: the suite itself runs with
WORKSHOP_PROGRESS=off (tests/conftest.py), so nothing reaches the developer's home.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
from conftest import free_port, repo_env
from progress_helpers import BoardStandIn, HoldingBoard, wait_until

import workshop
from workshop.lessons import board_client, learner_record, notebook_place
from workshop.lessons.exercises import EXERCISES, check
from workshop.lessons.learner_record import (
    apply_board_answer,
    board_poster,
    progress_file,
    read_record,
    record_answer,
    record_cell,
    record_verdict,
    set_hand,
    watch_hand,
)
from workshop.lessons.notebook_place import section_of, watch_cells
from workshop.lessons.progress import hand, lower_hand, progress, raise_hand
from workshop.lessons.quiz import QUIZZES, quiz

SCHEMA = {"version", "seq", "where", "exercises", "quizzes", "error", "hand"}
THREAD = "workshop-board-poster"


@pytest.fixture(autouse=True)
def no_board_nor_session(monkeypatch):
    for name in ("WORKSHOP_BOARD_URL", "JUPYTERHUB_API_TOKEN", "JPY_SESSION_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(learner_record, "_WATCHERS", [])
    yield
    # The poster a test made (and its thread) ends with the test.
    poster = learner_record._POSTER["poster"]
    if poster is not None:
        poster.close(timeout=10)
    learner_record._POSTER.update(poster=None, key=None)


@pytest.fixture
def kept(tmp_path, monkeypatch) -> Path:
    """The record's file, in tmp_path."""
    path = tmp_path / "share" / "progress.json"
    monkeypatch.setenv("WORKSHOP_PROGRESS", str(path))
    return path


def _file(path: Path) -> dict:
    return json.loads(path.read_text())


# --- where the record is kept -------------------------------------------------------


def test_the_file_is_where_the_variables_say(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WORKSHOP_PROGRESS")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    share = tmp_path / "home" / ".local" / "share" / "scaling-pytorch-hpc"
    assert progress_file() == share / "progress.json"
    # XDG_DATA_HOME when absolute; a relative one is ignored, as the XDG rules say.
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert progress_file() == tmp_path / "data/scaling-pytorch-hpc/progress.json"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")
    assert progress_file() == share / "progress.json"
    # WORKSHOP_PROGRESS before both: a path (~ expanded), or off.
    monkeypatch.setenv("WORKSHOP_PROGRESS", "~/class/mine.json")
    assert progress_file() == tmp_path / "home" / "class" / "mine.json"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORKSHOP_PROGRESS", "here.json")
    assert progress_file() == tmp_path / "here.json"
    for off in ("off", "OFF", " off "):
        monkeypatch.setenv("WORKSHOP_PROGRESS", off)
        assert progress_file() is None


def test_off_keeps_nothing_anywhere(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("WORKSHOP_PROGRESS", "off")
    check("01.accumulate", 8)
    quiz("02").answer(1, "a")
    raise_hand("help")
    record_cell("02_x", "1. Hello", "ValueError")
    assert list(home.rglob("*")) == []
    said = capsys.readouterr().out
    assert "Recording is off (WORKSHOP_PROGRESS=off): no hand is kept." in said
    assert "Not kept: recording is off (WORKSHOP_PROGRESS=off)." in progress().text()


def test_the_file_and_its_folder_are_the_learner_s_alone(kept):
    record_verdict("01.dp", True)
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    # A file made readable by others (a copy, an editor) is replaced by a 0600 one.
    kept.chmod(0o644)
    record_verdict("01.bubble", False, "no")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    # Replaced whole: no temporary file is left beside it.
    assert sorted(p.name for p in kept.parent.iterdir()) == [
        "progress.json",
        "progress.json.lock",
    ]


WRITER = """
import sys
from workshop.lessons.learner_record import record_answer
quiz, count = sys.argv[1], int(sys.argv[2])
for question in range(1, count + 1):
    record_answer(quiz, question, question % 2 == 0, count)
"""


def test_two_kernels_writing_at_once_lose_nothing(kept):
    # Two processes, each recording 40 answers to its own quiz as fast as it can:
    # every change reads, changes and writes the file under the lock, so none is
    # lost (each bumps seq by one).
    env = repo_env(WORKSHOP_PROGRESS=str(kept))
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, quiz, "40"], env=env)
        for quiz in ("01", "02")
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    record = _file(kept)
    assert record["seq"] == 80
    for quiz_ in ("01", "02"):
        assert record["quizzes"][quiz_] == {"right": 20, "checked": 40, "questions": 40}


def test_a_record_waits_for_the_lock_a_short_while_then_gives_up(kept, monkeypatch):
    import fcntl

    monkeypatch.setattr(learner_record, "_LOCK_WAIT_S", 0.05)
    record_verdict("01.dp", True)
    before = kept.read_text()
    with open(f"{kept}.lock") as held:  # another kernel holding the lock
        fcntl.flock(held, fcntl.LOCK_EX)
        record_verdict("01.bubble", True)  # swallowed: the cell goes on
        with pytest.raises(TimeoutError, match=r"progress.json.lock was held"):
            set_hand("help")
        assert kept.read_text() == before
    record_verdict("01.bubble", True)
    assert _file(kept)["exercises"]["01.bubble"]["passed"] is True


def test_a_damaged_file_is_started_again_rather_than_stopping_the_records(kept):
    kept.parent.mkdir(parents=True)
    kept.write_text("{not json")
    record_verdict("01.dp", True)
    assert _file(kept)["exercises"] == {
        "01.dp": {"passed": True, "failures": 0, "reason": ""}
    }
    # Entries of a wrong shape are dropped, the rest kept.
    bad = _file(kept)
    bad["exercises"]["not a name"] = {"passed": True}
    bad["hand"] = {"kind": "wave", "seq": 3}
    bad["seq"] = "seven"
    kept.write_text(json.dumps(bad))
    record = read_record(kept)
    assert set(record["exercises"]) == {"01.dp"}
    assert record["hand"] is None and record["seq"] == 0


# --- what the exercises and quizzes record ---------------------------------------


def _printed(capsys, fn) -> str:
    fn()
    return capsys.readouterr().out


CHECKS = [
    ("01.accumulate", 8),
    ("01.bubble", lambda stages, micro: 0.5),
    ("01.bubble", lambda stages, micro: 1 / 0),
    ("01.bubble", 3),
]


@pytest.mark.parametrize(
    ("name", "answer"), CHECKS, ids=["right", "wrong", "raises", "not_a_function"]
)
def test_a_check_prints_exactly_what_it_printed_without_a_record(
    name, answer, kept, monkeypatch, capsys
):
    monkeypatch.setenv("WORKSHOP_PROGRESS", "off")
    unrecorded = _printed(capsys, lambda: check(name, answer))
    monkeypatch.setenv("WORKSHOP_PROGRESS", str(kept))
    recorded = _printed(capsys, lambda: check(name, answer))
    assert recorded == unrecorded
    assert unrecorded.startswith(("Right: ", "Not yet: "))
    assert name in _file(kept)["exercises"]


def test_checks_record_passes_failures_and_the_one_line_reason(kept, capsys):
    check("01.bubble", lambda stages, micro: 0.5)
    check("01.bubble", lambda stages, micro: 1 / 0)
    entry = _file(kept)["exercises"]["01.bubble"]
    # The exception's type, not its message (which can quote the learner's values).
    assert entry == {
        "passed": False,
        "failures": 2,
        "reason": "It raised ZeroDivisionError",
    }
    check("01.bubble", lambda stages, micro: 0.5)
    reason = "bubble(1, 1) returned 0.5; it should be 0"
    assert _file(kept)["exercises"]["01.bubble"]["reason"] == reason
    check("01.bubble", workshop.lessons.bubble_fraction)
    check("01.accumulate", 8)
    exercises = _file(kept)["exercises"]
    # A pass keeps the failures before it.
    assert exercises["01.bubble"] == {"passed": True, "failures": 3, "reason": reason}
    assert exercises["01.accumulate"] == {"passed": True, "failures": 0, "reason": ""}
    check("01.accumulate", 7)  # a judge that answers False alone
    assert _file(kept)["exercises"]["01.accumulate"]["reason"] == (
        "not the expected answer"
    )
    # Without a notebook session, the exercise's notebook is where the learner is.
    assert _file(kept)["where"]["notebook"].startswith("01")
    capsys.readouterr()


def test_every_exercise_has_a_name_the_board_takes():
    # The board takes "NN.name" (lower case, digits, "_"; docs/portal.md): an
    # exercise named otherwise would never be recorded.
    assert all(re.fullmatch(r"\d\d\.[a-z0-9_]{1,40}", name) for name in EXERCISES)
    assert all(re.fullmatch(r"\d\d", number) for number in QUIZZES)


def test_a_posted_record_stays_within_the_board_s_16_kib(kept):
    record = read_record(kept)
    record["exercises"] = {
        f"01.exercise_{n}": {"passed": False, "failures": 9, "reason": "r" * 200}
        for n in range(100)
    }
    posted = learner_record._posted(record)
    assert set(posted) == SCHEMA
    assert len(json.dumps(posted).encode()) <= 16 * 1024
    assert len(posted["exercises"]) == 100


def test_a_reason_is_one_line_of_at_most_200_characters(kept):
    record_verdict("01.dp", False, "x" * 300 + "\nsecond line")
    assert _file(kept)["exercises"]["01.dp"]["reason"] == "x" * 200


def test_a_quiz_scores_the_latest_answer_to_each_question(kept, monkeypatch):
    questions = QUIZZES["02"][1]
    right = [q.right for q in questions]
    wrong = ["abcd".replace(r, "")[0] for r in right]
    the_quiz = quiz("02")
    first = the_quiz.answer(1, wrong[0])
    with monkeypatch.context() as off:  # the verdict is the same with the record off
        off.setenv("WORKSHOP_PROGRESS", "off")
        assert repr(the_quiz.answer(1, wrong[0])) == repr(first)
    assert _file(kept)["quizzes"]["02"] == {"right": 0, "checked": 1, "questions": 6}
    the_quiz.answer(1, right[0])
    the_quiz.answer(2, right[1])
    the_quiz.answer(3, wrong[2])
    assert _file(kept)["quizzes"]["02"] == {"right": 2, "checked": 3, "questions": 6}
    the_quiz.answer(2, wrong[1])  # changed their mind: the latest answer counts
    assert _file(kept)["quizzes"]["02"] == {"right": 1, "checked": 3, "questions": 6}
    # The file keeps right or not per question, never the letter chosen.
    assert _file(kept)["answers"]["02"] == {"1": True, "2": False, "3": False}


def test_nothing_is_written_when_nothing_changed(kept):
    record_cell("02_ddp", "1. Hello", None)
    seq, when = _file(kept)["seq"], kept.stat().st_mtime_ns
    record_cell("02_ddp", "1. Hello", None)
    assert set_hand(None)["seq"] == seq  # the hand was down already
    assert kept.stat().st_mtime_ns == when


# --- the table -------------------------------------------------------------------

MADE_UP = {
    "version": 1,
    "seq": 12,
    "where": {"notebook": "02_distributed_data_parallel", "section": "4. Collectives"},
    "exercises": {
        "01.dp": {"passed": True, "failures": 0, "reason": ""},
        "01.bubble": {
            "passed": False,
            "failures": 2,
            "reason": "bubble(2, 1) returned 1; it should be 0.5 <b>"
            + " and more" * 19,
        },
        "02.ring": {"passed": True, "failures": 1, "reason": "an old reason"},
    },
    "quizzes": {"01": {"right": 5, "checked": 6, "questions": 8}},
    "error": {
        "type": "ValueError",
        "notebook": "02_distributed_data_parallel",
        "section": "4. Collectives",
        "seq": 11,
    },
    "hand": {"kind": "help", "seq": 12},
    "answers": {},
    "hand_cleared": None,
}


def test_the_table_shows_every_exercise_by_notebook_within_88_columns(kept):
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps(MADE_UP))
    table = progress()
    text = table.text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 88
    assert repr(table) == str(table) == text
    # (the path as long as tmp_path makes it: cut where it passes 88 columns)
    assert f"Keptin{kept};nothingispostedanywhere" in "".join(text.split())
    assert "  Where you stopped: 02_distributed_data_parallel · 4. Collectives" in lines
    assert '  Your hand: up, "I need help"' in lines
    assert (
        "  Last error: ValueError in 02_distributed_data_parallel · 4. Collectives"
        in lines
    )
    # Every exercise once, in its notebook's group, passed / failed / not tried.
    for name in EXERCISES:
        assert sum(line.lstrip().startswith(f"{name} ") for line in lines) == 1, name
    headings = [line for line in lines if line.startswith("Notebook ")]
    assert headings == [f"Notebook {n} · {QUIZZES[n][0]}" for n in QUIZZES]
    row = {line.split()[0]: line for line in lines if line.startswith("  0")}
    assert row["01.dp"].split()[1:] == ["passed"]
    assert (
        "failed 2 times: bubble(2, 1) returned 1; it should be 0.5 <b>"
        in row["01.bubble"]
    )
    assert row["02.ring"].endswith("passed, after failing once")
    assert row["01.speedup"].endswith("not tried")
    # The long reason goes on over indented lines, whole.
    at = lines.index(row["01.bubble"])
    assert lines[at + 1].startswith(" " * 20) and "and more" in lines[at + 1]
    quizzes = [line.split(None, 1)[1] for line in lines if line.startswith("  quiz ")]
    assert quizzes == [
        "5 of 8 right (6 of 8 checked)",
        *(
            f"not tried ({len(QUIZZES[n][1])} questions)"
            for n in ("02", "03", "04", "05")
        ),
    ]
    # The HTML says the same, escaped.
    page = table._repr_html_()
    assert "bubble(2, 1) returned 1; it should be 0.5 &lt;b&gt;" in page
    assert "<b>" not in page.replace("<b>Your progress</b>", "")
    assert page.count("<tr>") == len(EXERCISES) + 2 * len(QUIZZES)


def test_the_table_of_a_learner_who_has_done_nothing(kept):
    text = progress().text()
    assert "Where you stopped: not known yet" in text
    assert "Your hand: down" in text and "Last error" not in text
    assert text.count("not tried") == len(EXERCISES) + len(QUIZZES)
    assert not kept.exists()  # reading writes nothing


# --- the hand --------------------------------------------------------------------


def test_raise_and_lower_the_hand(kept, capsys):
    raise_hand("done")
    record = _file(kept)
    assert record["hand"] == {"kind": "done", "seq": record["seq"]}
    said = capsys.readouterr().out
    assert " ".join(said.split()) == (
        'Your hand is up, "done"; no class board is set here, so only '
        "workshop.progress() shows it."
    )
    assert max(len(line) for line in said.splitlines()) <= 88
    raise_hand()  # help, the default
    assert _file(kept)["hand"]["kind"] == "help"
    lower_hand()
    assert _file(kept)["hand"] is None
    assert capsys.readouterr().out.endswith("Your hand is down.\n")


def test_a_hand_of_another_kind_is_refused_naming_the_two(kept):
    with pytest.raises(
        ValueError,
        match=r"kind must be one of 'help' or 'done', not 'wave'; "
        r'raise_hand\("help"\) asks for help; raise_hand\("done"\) says you are done',
    ):
        raise_hand("wave")
    assert not kept.exists()


def test_a_hand_the_board_cleared_is_lowered_unless_raised_again_since(kept):
    seen = []
    watch_hand(lambda: seen.append("cleared"))
    first = set_hand("help")["hand"]["seq"]
    again = set_hand("help")["hand"]["seq"]  # raised again: a new hand
    assert again > first
    apply_board_answer({"ok": True, "hand_cleared": first})  # the older hand
    assert _file(kept)["hand"] == {"kind": "help", "seq": again}
    assert seen == []
    apply_board_answer({"ok": True, "hand_cleared": again})
    record = _file(kept)
    assert record["hand"] is None and record["hand_cleared"] == again
    assert seen == ["cleared"]
    assert "Your hand: down, cleared by the instructor" in progress().text()
    apply_board_answer({"ok": True, "hand_cleared": None})  # nothing to do
    apply_board_answer("not an answer")
    assert _file(kept) == record


def test_the_hand_widget_sets_the_hand_and_says_when_it_is_cleared(kept):
    box = hand()
    buttons = box.children[0].children
    assert [(b.description, b.button_style) for b in buttons] == [
        ("I need help", "danger"),
        ("Done", "success"),
        ("Hand down", ""),
    ]
    status = box.children[1]
    assert status.value == "Your hand is down."
    buttons[0].click()
    seq = _file(kept)["hand"]["seq"]
    assert _file(kept)["hand"] == {"kind": "help", "seq": seq}
    assert status.value.startswith("Your hand is up, &quot;I need help&quot;")
    apply_board_answer({"ok": True, "hand_cleared": seq})  # the instructor cleared it
    assert status.value == "Your hand is down, cleared by the instructor."
    buttons[1].click()
    assert _file(kept)["hand"]["kind"] == "done"
    buttons[2].click()
    assert _file(kept)["hand"] is None and status.value == "Your hand is down."


def test_without_ipywidgets_the_hand_says_how_to_use_the_calls(kept, monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import fails
    note = repr(hand())
    assert 'workshop.raise_hand("help")' in note and "workshop.lower_hand()" in note
    assert "ipywidgets is not installed" in note
    assert max(len(line) for line in note.splitlines()) <= 88


# --- the notebook and section of a cell ------------------------------------------

SECRET = "hunter2-do-not-keep"


def _notebook(path: Path) -> Path:
    cells = [
        ("code", "c0", "import workshop"),
        ("markdown", "m1", "# 02 · Title\n\nSome text"),
        (
            "markdown",
            "m2",
            '## <a id="ranks"></a>1. Hello, ranks\n\n```\n# not a heading\n```',
        ),
        ("code", "c1", "x = 1"),
        ("markdown", "m3", "text\n### A first `all_reduce` <a name='ar'></a> ##"),
        ("code", "c2", f"secret = {SECRET!r}\nraise ValueError(secret)"),
    ]
    path.write_text(
        json.dumps(
            {
                "cells": [
                    {
                        "cell_type": kind,
                        "id": cell_id,
                        "metadata": {},
                        "source": source,
                        **(
                            {"outputs": [], "execution_count": None}
                            if kind == "code"
                            else {}
                        ),
                    }
                    for kind, cell_id, source in cells
                ],
                "metadata": {},
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )
    return path


def test_the_section_is_the_nearest_heading_above_found_by_id_or_source(tmp_path):
    nb = _notebook(tmp_path / "02_lesson.ipynb")
    assert section_of(nb, "c1", "") == "1. Hello, ranks"
    assert section_of(nb, "c2", "") == "A first `all_reduce`"
    assert section_of(nb, "c0", "") == ""  # above every heading
    # An id the saved file does not have (another frontend): the same source.
    assert section_of(nb, "unknown", "x = 1") == "1. Hello, ranks"
    assert section_of(nb, None, "x = 1") == "1. Hello, ranks"
    assert section_of(nb, "unknown", "x = 2") is None  # not saved yet
    assert section_of(tmp_path / "missing.ipynb", "c1", "x = 1") is None


def _cell_result(source: str, cell_id: str | None, error: BaseException | None):
    info = types.SimpleNamespace(raw_cell=source, cell_id=cell_id)
    return types.SimpleNamespace(info=info, error_in_exec=error, error_before_exec=None)


def test_after_a_cell_its_place_and_error_type_are_recorded_never_its_code(
    kept, tmp_path, monkeypatch
):
    nb = _notebook(tmp_path / "02_lesson.ipynb")
    monkeypatch.setenv("JPY_SESSION_NAME", str(nb))
    after = notebook_place._after_cell
    after(_cell_result("x = 1", "c1", None))
    assert _file(kept)["where"] == {
        "notebook": "02_lesson",
        "section": "1. Hello, ranks",
    }
    source = f"secret = {SECRET!r}\nraise ValueError(secret)"
    # Found by its source: the id is one the file does not hold.
    after(_cell_result(source, "new-id", ValueError(SECRET)))
    record = _file(kept)
    place = {"notebook": "02_lesson", "section": "A first `all_reduce`"}
    assert record["where"] == place
    assert record["error"] == {"type": "ValueError", **place, "seq": record["seq"]}
    assert SECRET not in kept.read_text()
    # A cell not in the saved file keeps the section it was in.
    after(_cell_result("y = 2", "unsaved", None))
    assert _file(kept)["where"] == place
    # A broken result never reaches the cell.
    after(None)
    after(types.SimpleNamespace())


def test_without_a_session_only_errors_are_recorded(kept):
    notebook_place._after_cell(_cell_result("x = 1", "c1", None))
    assert not kept.exists()
    notebook_place._after_cell(_cell_result("1/0", None, ZeroDivisionError()))
    assert _file(kept)["error"]["type"] == "ZeroDivisionError"


def test_the_session_notebook_is_found_from_an_absolute_or_a_server_path(
    tmp_path, monkeypatch
):
    nb = _notebook(tmp_path / "02_lesson.ipynb")
    monkeypatch.setenv("JPY_SESSION_NAME", str(nb))
    assert notebook_place.session_notebook() == nb
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JPY_SESSION_NAME", "notebooks/02_lesson.ipynb")
    assert notebook_place.session_notebook() == nb
    monkeypatch.setenv("JPY_SESSION_NAME", "a console")
    assert notebook_place.session_notebook() is None


class _Shell:
    """Just enough of an IPython kernel's shell to register a hook."""

    def __init__(self, kernel: object | None):
        from IPython.core.events import EventManager, available_events

        self.kernel = kernel
        self.events = EventManager(self, available_events)


def test_the_hook_is_registered_once_and_only_in_a_kernel(monkeypatch):
    assert watch_cells() is False  # pytest is no kernel
    shell = _Shell(kernel=object())
    fake = types.ModuleType("IPython")
    fake.get_ipython = lambda: shell
    monkeypatch.setitem(sys.modules, "IPython", fake)
    assert watch_cells() is True
    assert watch_cells() is True  # again, as a second `import workshop` would
    ours = [
        h for h in shell.events.callbacks["post_run_cell"] if notebook_place._is_ours(h)
    ]
    assert len(ours) == 1
    terminal = _Shell(kernel=None)  # a terminal IPython: no kernel
    fake.get_ipython = lambda: terminal
    assert watch_cells() is False
    assert terminal.events.callbacks["post_run_cell"] == []


def test_a_kernel_starting_on_a_portal_posts_the_record_it_finds(kept, monkeypatch):
    # The last post before a kernel restart may never have arrived.
    record_verdict("01.dp", True)
    shell = _Shell(kernel=object())
    fake = types.ModuleType("IPython")
    fake.get_ipython = lambda: shell
    monkeypatch.setitem(sys.modules, "IPython", fake)
    with BoardStandIn() as board:
        monkeypatch.setenv("WORKSHOP_BOARD_URL", board.url)
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "tok")
        assert watch_cells() is True
        post = board.wait_for(lambda r: True)
    assert post["record"]["exercises"]["01.dp"]["passed"] is True


# --- posting to a board ---------------------------------------------------------


def _threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == THREAD]


def test_without_a_board_address_no_thread_is_started(kept, monkeypatch):
    check_before = _threads()
    record_verdict("01.dp", True)
    raise_hand("help")
    assert board_poster() is None and _threads() == check_before
    monkeypatch.setenv("WORKSHOP_BOARD_URL", "http://127.0.0.1:1/services/board/")
    assert board_poster() is None  # and without a token, none either


def test_the_post_carries_the_token_and_the_record_s_schema_alone(kept, monkeypatch):
    with BoardStandIn() as board:
        monkeypatch.setenv("WORKSHOP_BOARD_URL", board.url)
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "secret-token-1")
        quiz("01").answer(1, "a")
        post = board.wait_for(lambda r: "01" in r["quizzes"])
    assert post["path"] == "/services/board/api/records"
    assert post["authorization"] == "token secret-token-1"
    assert set(post["record"]) == SCHEMA  # not the answers, not the cleared hand
    assert post["record"] == {k: v for k, v in _file(kept).items() if k in SCHEMA}


def test_whatever_a_learner_does_the_board_takes_the_record(kept, monkeypatch):
    # The two wings each write the schema down (lessons/ may not import
    # instructor/): the learner's side cuts what it keeps to the board's limits, so
    # the board never refuses a record, which would drop the learner from its table
    # (a refusal is not sent again). The worst a learner can make: more exercises and
    # quizzes than the board keeps, names at their longest, reasons, a notebook and
    # a section of many lines, control characters and characters that JSON writes
    # in 12 bytes, an error type in another alphabet. The stand-in checks each post
    # as the board does.
    wide = "\U0001f600"  # "\ud83d\ude00" in JSON
    reason = f"\x1b[31m{wide * 300}\nthe second line"
    with BoardStandIn() as board:
        monkeypatch.setenv("WORKSHOP_BOARD_URL", board.url)
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "tok")
        # One exercise: its reason is posted, cut to the board's length.
        record_verdict("01.dp", False, reason)
        record_cell(wide * 200 + "\n.ipynb", "\x00" + wide * 200, "Ошибка" * 40)
        raise_hand("help")
        first = board.wait_for(lambda r: r["hand"] is not None)
        # Then as many of everything as a learner can make.
        for n in range(learner_record._MOST_EXERCISES + 5):
            name = f"{n % 100:02d}.{'x' * 36}{n:04d}"  # 40 characters after the dot
            record_verdict(name, False, reason)
        for number in range(learner_record._MOST_QUIZZES + 2):
            record_answer(f"{number:02d}", 1, True, 10**7)
        record_cell(None, None, "package." + "E" * 200)  # a long class name
        raise_hand("done")
        last = board.wait_for(lambda r: (r["hand"] or {}).get("kind") == "done")
    refused = [post["refused"] for post in board.posts if post["refused"]]
    assert not refused, refused[0]
    assert first["record"]["exercises"]["01.dp"]["reason"].startswith("[31m" + wide)
    assert first["record"]["error"]["type"] == "Exception"  # no letter the board takes
    kept_record = last["record"]
    assert kept_record["error"]["type"] == ("package." + "E" * 200)[:80]
    assert len(kept_record["exercises"]) == learner_record._MOST_EXERCISES
    assert len(kept_record["quizzes"]) == learner_record._MOST_QUIZZES
    # Over 16 KiB with their reasons: the reasons are left out of the post (the
    # learner's own file keeps them).
    assert len(last["body"].encode()) <= 16 * 1024
    assert {e["reason"] for e in kept_record["exercises"].values()} == {""}
    assert all(e["reason"] for e in _file(kept)["exercises"].values())


def test_a_cell_never_waits_for_a_board_that_does_not_answer(
    kept, monkeypatch, record_property
):
    # The board takes the post and holds it. A kernel that waited would return
    # only after giving up (closing its connection): here the call has returned
    # while the post is still open. Its timeout is made long so that waiting
    # could not pass unseen.
    monkeypatch.setattr(board_client, "_POST_TIMEOUT_S", 60.0)
    with HoldingBoard() as board:
        monkeypatch.setenv("WORKSHOP_BOARD_URL", board.url)
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "tok")
        started = time.perf_counter()
        record_verdict("01.dp", True)
        took = time.perf_counter() - started
        assert board.received.wait(30)
        assert board.client_waiting()  # the post is under way, the call returned
        assert json.loads(board.body)["exercises"]["01.dp"]["passed"] is True
        assert _file(kept)["exercises"]["01.dp"]["passed"] is True
        record_property("record_call_s_board_holding", round(took, 4))
        print(f"record call with a board that never answers: {took * 1000:.1f} ms")


def test_a_cell_never_fails_for_a_board_nobody_listens_on(
    kept, monkeypatch, record_property
):
    monkeypatch.setattr(board_client, "_RETRY_FIRST_S", 0.01)
    monkeypatch.setenv("WORKSHOP_BOARD_URL", f"http://127.0.0.1:{free_port()}/")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "tok")
    started = time.perf_counter()
    record_verdict("01.dp", True)
    took = time.perf_counter() - started
    poster = board_poster()
    wait_until(lambda: poster.failed >= 2, what="two failed posts (a retry)")
    assert poster.posted == 0 and poster.alive
    assert _file(kept)["exercises"]["01.dp"]["passed"] is True
    record_property("record_call_s_nobody_listening", round(took, 4))
    print(f"record call with nobody listening: {took * 1000:.1f} ms")


def test_only_the_latest_record_waits_and_a_refused_one_is_not_sent_again(
    kept, monkeypatch
):
    # The board's first answer is 403: that record is dropped at once, not retried
    # (the pause before a retry is made long: a retry would hold the next post).
    monkeypatch.setattr(board_client, "_RETRY_FIRST_S", 60.0)
    with BoardStandIn(status=[403]) as board:
        monkeypatch.setenv("WORKSHOP_BOARD_URL", board.url)
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "tok")
        record_verdict("01.dp", False, "first")
        board.wait_for(lambda r: True)
        poster = board_poster()
        wait_until(lambda: poster.failed == 1, what="the refusal")
        # Many records while the thread is busy or idle: the board sees the last.
        with poster._wake:  # hold the thread off while they come
            for n in range(5):
                record_cell("02_ddp", f"section {n}", None)
        last = board.wait_for(lambda r: r["where"]["section"] == "section 4")
    # The refused record once, then the last of the five: none of the others.
    assert [p["record"]["seq"] for p in board.posts] == [1, 6]
    assert last["record"]["seq"] == 6


def test_a_post_that_fails_for_the_board_s_own_error_is_sent_again(kept, monkeypatch):
    monkeypatch.setattr(board_client, "_RETRY_FIRST_S", 0.01)
    with BoardStandIn(status=[503]) as board:
        monkeypatch.setenv("WORKSHOP_BOARD_URL", board.url)
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "tok")
        record_verdict("01.dp", True)
        wait_until(lambda: len(board.posts) == 2, what="the retry")
    assert [p["code"] for p in board.posts] == [503, 200]
    assert board.posts[0]["body"] == board.posts[1]["body"]


def test_the_board_clearing_a_hand_lowers_it_in_the_file(kept, monkeypatch):
    with BoardStandIn(clear_hands=True) as board:
        monkeypatch.setenv("WORKSHOP_BOARD_URL", board.url)
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "tok")
        raise_hand("help")
        seq = _file(kept)["hand"]["seq"]
        wait_until(lambda: _file(kept)["hand"] is None, what="the hand cleared")
        # The kernel tells the board the hand is down.
        board.wait_for(lambda r: r["hand"] is None and r["seq"] > seq)
    assert _file(kept)["hand_cleared"] == seq


def test_a_forked_process_never_posts(kept, monkeypatch):
    monkeypatch.setenv("WORKSHOP_BOARD_URL", "http://127.0.0.1:1/")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "tok")
    monkeypatch.setattr(learner_record, "_HOME_PID", os.getpid() + 1)
    assert board_poster() is None
