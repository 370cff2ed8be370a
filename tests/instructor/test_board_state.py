"""board_state: what the class board answers a kernel's post (the record's own checks:
test_board_record.py), stale posts, hands, the table, its summary and CSV, and the file
that keeps it."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import random
import stat

import pytest
from test_board_record import record

from workshop.instructor import board_state
from workshop.instructor.board_record import MAX_RECORD_BYTES
from workshop.instructor.board_state import (
    ClassBoard,
    csv_text,
    summary,
    summary_lines,
)


def post(board: ClassBoard, user: str, value, now: float = 100.0):
    body = value if isinstance(value, bytes) else json.dumps(value).encode()
    return board.accept(user, body, now=now)


def test_a_post_is_kept_or_refused_with_its_status_and_sentence():
    board = ClassBoard()
    assert post(board, "ada", {**record(seq=4), "learner": "ada"}) == (
        200,
        {"ok": True, "hand_cleared": None},
    )
    assert board.record("ada") == record(seq=4)
    assert board.changes == 1
    refusals = [
        (b"{", 400, "the record is not JSON in UTF-8"),
        ({**record(), "code": "x"}, 400, "unknown key 'code' in the record"),
        ({**record(), "learner": "bo"}, 403, "the record names another learner"),
        (b" " * (MAX_RECORD_BYTES + 1), 413, "the record is 16385 bytes"),
    ]
    for body, status, start in refusals:
        code, answer = post(board, "ada", body)
        assert code == status and answer["error"].startswith(start), answer
    # Nothing refused was kept, nor counted as a change to save.
    assert board.record("ada") == record(seq=4) and board.changes == 1


def test_an_older_post_arriving_late_is_answered_stale_and_not_kept():
    board = ClassBoard()
    post(board, "ada", record(seq=5, where={"notebook": "new", "section": ""}), 10.0)
    status, answer = post(
        board, "ada", record(seq=4, where={"notebook": "old", "section": ""}), 20.0
    )
    assert (status, answer) == (200, {"ok": True, "stale": True, "hand_cleared": None})
    assert board.record("ada")["where"]["notebook"] == "new"
    assert board.rows()[0]["seen"] == 10.0
    # The same seq again (a re-post) is kept: nothing is older.
    post(board, "ada", record(seq=5, where={"notebook": "again", "section": ""}), 30.0)
    assert board.record("ada")["where"]["notebook"] == "again"
    assert board.rows()[0]["seen"] == 30.0


def test_a_cleared_hand_stays_down_across_re_posts_until_a_new_one_is_raised():
    board = ClassBoard()
    post(board, "ada", record(seq=3, hand={"kind": "help", "seq": 3}))
    assert board.hand("ada") == "help"
    assert board.clear_hand("ada") is True
    assert board.hand("ada") is None
    # The kernel posts again before it heard: the same hand, a newer record.
    status, answer = post(board, "ada", record(seq=4, hand={"kind": "help", "seq": 3}))
    assert (status, answer) == (200, {"ok": True, "hand_cleared": 3})
    assert board.rows()[0]["hand"] is None
    # Lowered on the learner's side, then raised again: a new seq shows.
    assert post(board, "ada", record(seq=5))[1]["hand_cleared"] is None
    post(board, "ada", record(seq=6, hand={"kind": "done", "seq": 6}))
    assert board.hand("ada") == "done"
    assert post(board, "ada", record(seq=7, hand={"kind": "done", "seq": 6}))[1] == {
        "ok": True,
        "hand_cleared": None,
    }


def test_clearing_a_hand_of_nobody_or_of_no_hand():
    board = ClassBoard()
    assert board.clear_hand("zed") is False
    post(board, "ada", record(seq=2))
    changes = board.changes
    assert board.clear_hand("ada") is True
    assert board.changes == changes  # no hand up: nothing changed, nothing to save


def test_rows_list_the_class_also_those_who_never_posted():
    board = ClassBoard()
    post(board, "bo", record(seq=2, hand={"kind": "help", "seq": 2}), now=50.0)
    post(board, "outsider", record(seq=1))
    jobs = {"bo": {"state": "RUNNING", "left": "1:58:12"}}
    ada, bo = board.rows(["ada", "bo"], jobs)
    assert ada == {
        "learner": "ada",
        "notebook": "",
        "section": "",
        "exercises": {},
        "quizzes": {},
        "error": None,
        "hand": None,
        "job": None,
        "seen": None,
    }
    assert bo == {
        "learner": "bo",
        "notebook": "02_ddp.ipynb",
        "section": "The ring",
        "exercises": {
            "02.ring": {"state": "failed", "failures": 2, "reason": "sum is 5, not 6"}
        },
        "quizzes": {"02": {"right": 3, "checked": 4, "questions": 5}},
        "error": {
            "type": "RuntimeError",
            "notebook": "02_ddp.ipynb",
            "section": "The ring",
        },
        "hand": "help",
        "job": {"state": "RUNNING", "left": "1:58:12"},
        "seen": 50.0,
    }
    # The class unknown: whoever posted, by name.
    assert [r["learner"] for r in board.rows()] == ["bo", "outsider"]


def _a_class(learners: int, seed: int):
    """A class where each learner did something drawn at random; the board and
    what each learner did, to count by hand."""
    draw = random.Random(seed)
    board, did = ClassBoard(), {}
    for i in range(learners):
        name = f"learner{i:02d}"
        ring = draw.choice(["passed", "failed", "not tried"])
        hand = draw.choice(["help", "done", None, "cleared"])
        error = draw.random() < 0.3
        exercises = {}
        if ring != "not tried":
            exercises["02.ring"] = {
                "passed": ring == "passed",
                "failures": draw.randrange(3),
                "reason": "" if ring == "passed" else "sum is 5, not 6",
            }
        if draw.random() < 0.5:
            exercises["03.bucket"] = {"passed": True, "failures": 0, "reason": ""}
        posted = draw.random() < 0.9 or ring != "not tried"
        did[name] = {
            "ring": ring,
            "bucket": "03.bucket" in exercises and posted,
            "hand": hand if posted and hand != "cleared" else None,
            "error": error and posted,
        }
        if not posted:
            continue
        kind = "help" if hand == "cleared" else hand
        post(
            board,
            name,
            record(
                seq=3,
                exercises=exercises,
                error=record()["error"] if error else None,
                hand={"kind": kind, "seq": 3} if kind else None,
            ),
        )
        if hand == "cleared":
            board.clear_hand(name)
    return board, did


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_summary_of_a_class_of_thirty_counts_what_each_learner_did(seed):
    board, did = _a_class(30, seed)
    counts = summary(board.rows(sorted(did)))
    ring = [d["ring"] for d in did.values()]
    buckets = sum(d["bucket"] for d in did.values())
    assert counts["learners"] == 30
    assert counts["exercises"] == {
        "02.ring": {
            "passed": ring.count("passed"),
            "failed": ring.count("failed"),
            "not_yet": ring.count("not tried"),
        },
        **(
            {"03.bucket": {"passed": buckets, "failed": 0, "not_yet": 30 - buckets}}
            if buckets
            else {}
        ),
    }
    hands = [d["hand"] for d in did.values()]
    assert counts["hands"] == {"help": hands.count("help"), "done": hands.count("done")}
    assert counts["errors"] == sum(d["error"] for d in did.values())
    assert counts["lines"][0] == (
        f"exercise 02.ring: {ring.count('passed')} passed, {ring.count('failed')} "
        f"failed, {ring.count('not tried')} not yet"
    )
    up = hands.count("help") + hands.count("done")
    assert counts["lines"][-1] == (
        f"{up} hands up ({hands.count('help')} help, {hands.count('done')} done); "
        f"{counts['errors']} with an error"
    )


def test_summary_lines_without_hands_or_exercises():
    counts = {"exercises": {}, "hands": {"help": 0, "done": 0}, "errors": 2}
    assert summary_lines(counts) == ["0 hands up; 2 with an error"]


def test_the_csv_has_a_row_per_learner_and_reads_back():
    board, did = _a_class(12, seed=3)
    jobs = {"learner01": {"state": "PENDING", "left": "2:00:00"}}
    rows = board.rows(sorted(did), jobs)
    read = list(csv.DictReader(io.StringIO(csv_text(rows))))
    assert [r["learner"] for r in read] == sorted(did)
    for line, row in zip(read, rows, strict=True):
        ring = row["exercises"].get("02.ring")
        if ring is None:
            assert line["02.ring"] == ""
        elif ring["state"] == "failed":
            assert line["02.ring"] == f"failed {ring['failures']}: {ring['reason']}"
        else:
            assert line["02.ring"].startswith("passed")
        assert line["hand"] == (row["hand"] or "")
        assert line["error"] == (
            "RuntimeError in 02_ddp.ipynb / The ring" if row["error"] else ""
        )
        assert line["quiz 02"] == ("3/5 right, 4 checked" if row["seen"] else "")
    assert (read[1]["job"], read[1]["time left"]) == ("PENDING", "2:00:00")


def test_the_csv_shows_a_learner_s_formula_as_text():
    board = ClassBoard()
    post(board, "ada", record(where={"notebook": "=1+1", "section": "@SUM(A1)"}))
    line = next(csv.DictReader(io.StringIO(csv_text(board.rows()))))
    assert (line["notebook"], line["section"]) == ("'=1+1", "'@SUM(A1)")


def test_save_and_load_keep_the_board_in_a_private_file(tmp_path):
    board, did = _a_class(8, seed=4)
    path = tmp_path / "board.json"
    board.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["board.json"]  # no partial file left
    again = ClassBoard.load(path)
    assert again.rows(sorted(did)) == board.rows(sorted(did))
    assert again.learners == board.learners


def test_a_save_that_fails_leaves_the_last_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "board.json"
    board = ClassBoard()
    post(board, "ada", record(seq=1))
    board.save(path)
    before = path.read_text()
    post(board, "bo", record(seq=1))

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(board_state.os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        board.save(path)
    assert path.read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["board.json"]


def test_a_missing_file_starts_empty_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="workshop.board"):
        board = ClassBoard.load(tmp_path / "board.json")
    assert board.learners == {}
    assert "no saved state at" in caplog.text and "starting empty" in caplog.text


@pytest.mark.parametrize("text", ["{not json", '{"version": 1}', "[]", ""])
def test_a_corrupt_file_starts_empty_kept_aside_and_says_why(tmp_path, caplog, text):
    path = tmp_path / "board.json"
    path.write_text(text)
    with caplog.at_level(logging.WARNING, logger="workshop.board"):
        board = ClassBoard.load(path)
    assert board.learners == {}
    assert f"the saved state {path} cannot be read" in caplog.text
    assert "starting empty" in caplog.text
    assert (tmp_path / "board.json.corrupt").read_text() == text
    assert not path.exists()


def test_a_saved_entry_that_is_not_a_record_is_dropped_and_logged(tmp_path, caplog):
    board = ClassBoard()
    post(board, "ada", record(seq=1))
    post(board, "bo", record(seq=1))
    path = tmp_path / "board.json"
    saved = json.loads(board.snapshot())
    saved["learners"]["bo"]["record"]["code"] = "print('hi')"
    path.write_text(json.dumps(saved))
    with caplog.at_level(logging.WARNING, logger="workshop.board"):
        again = ClassBoard.load(path)
    assert list(again.learners) == ["ada"]
    assert "dropped 'bo''s saved record: unknown key 'code'" in caplog.text
