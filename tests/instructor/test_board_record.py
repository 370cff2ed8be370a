"""board_record: the record a kernel posts, what of it the board keeps, and the one
sentence that refuses anything else (the board's answers: test_board_state.py)."""

from __future__ import annotations

import json
import re

import pytest

from workshop.instructor.board_record import (
    MAX_RECORD_BYTES,
    Refused,
    check_record,
    parse_post,
)


def record(seq: int = 1, **parts) -> dict:
    """A full record of the board's schema, ``parts`` replacing its values."""
    full = {
        "version": 1,
        "seq": seq,
        "where": {"notebook": "02_ddp.ipynb", "section": "The ring"},
        "exercises": {
            "02.ring": {"passed": False, "failures": 2, "reason": "sum is 5, not 6"}
        },
        "quizzes": {"02": {"right": 3, "checked": 4, "questions": 5}},
        "error": {
            "type": "RuntimeError",
            "notebook": "02_ddp.ipynb",
            "section": "The ring",
            "seq": 1,
        },
        "hand": None,
    }
    full.update(parts)
    return full


def refusal(user: str, value) -> Refused:
    """What :func:`parse_post` raises for ``value`` posted by ``user``."""
    body = value if isinstance(value, bytes) else json.dumps(value).encode()
    with pytest.raises(Refused) as refused:
        parse_post(body, user)
    return refused.value


def test_a_record_is_kept_with_exactly_the_schema_s_fields():
    assert check_record(record(seq=4)) == record(seq=4)
    assert check_record(record(seq=4)) is not record(seq=4)
    # The optional parts may be left out: they are kept as none.
    assert check_record({"version": 1, "seq": 0}) == {
        "version": 1,
        "seq": 0,
        "where": None,
        "exercises": {},
        "quizzes": {},
        "error": None,
        "hand": None,
    }


def test_a_record_naming_its_own_learner_is_kept_without_the_name():
    body = json.dumps({**record(), "learner": "ada"}).encode()
    assert parse_post(body, "ada") == record()


def test_a_record_naming_another_learner_is_refused_with_403():
    refused = refusal("bo", {**record(), "learner": "ada"})
    assert refused.status == 403
    assert str(refused) == (
        "the record names another learner ('ada'); a kernel posts only its own "
        "learner's record, and this token belongs to 'bo'"
    )


def _with_exercise(**entry):
    return record(exercises={"02.ring": {**record()["exercises"]["02.ring"], **entry}})


REFUSED = [
    # (what, the body or record, a pattern of the sentence)
    ("bad JSON", b'{"version": 1,', r"^the record is not JSON in UTF-8 \(Expecting"),
    ("not UTF-8", b'{"version": 1, "seq": "\xff"}',
     r"^the record is not JSON in UTF-8"),
    ("a list", [1, 2],
     r"^the record must be a JSON object with version, seq, .*not \[1, 2\]"),
    ("unknown key", {**record(), "code": "print(1)"},
     r"^unknown key 'code' in the record; the keys allowed there are version, seq, "
     r"where, exercises, quizzes, error, hand"),
    ("unknown key in an exercise", _with_exercise(output="x"),
     r"^unknown key 'output' in exercises\['02.ring'\]; the keys allowed there are "
     r"passed, failures, reason"),
    ("unknown key in where", record(where={"notebook": "a", "section": "b", "cell": 3}),
     r"^unknown key 'cell' in where; the keys allowed there are notebook, section"),
    ("unknown key in error", record(error={**record()["error"], "message": "m"}),
     r"^unknown key 'message' in error; .* type, notebook, section, seq"),
    ("unknown key in a quiz", record(quizzes={"02": {"right": 1, "checked": 1,
                                                     "questions": 1, "answers": []}}),
     r"^unknown key 'answers' in quizzes\['02'\]"),
    ("unknown key in hand", record(hand={"kind": "help", "seq": 1, "note": "hi"}),
     r"^unknown key 'note' in hand; the keys allowed there are kind, seq"),
    ("no seq", {"version": 1}, r"^the record lacks 'seq'; it needs version and seq"),
    ("no version", {"seq": 1}, r"^the record lacks 'version'"),
    ("another version", record(version=2), r"^version must be 1, not 2"),
    ("seq a bool", record(seq=True),
     r"^seq must be a whole number from 0 to 999999, not True"),
    ("seq negative", record(seq=-1),
     r"^seq must be a whole number from 0 to 999999, not -1"),
    ("seq too large", record(seq=10**6), r"^seq must be .*, not 1000000"),
    ("seq a float", record(seq=1.5), r"^seq must be a whole number .*, not 1.5"),
    ("passed a string", _with_exercise(passed="yes"),
     r"^exercises\['02.ring'\].passed must be true or false, not 'yes'"),
    ("failures a string", _with_exercise(failures="2"),
     r"^exercises\['02.ring'\].failures must be a whole number from 0 to 999999, "
     r"not '2'"),
    ("an exercise without its reason",
     record(exercises={"02.ring": {"passed": True, "failures": 0}}),
     r"^exercises\['02.ring'\] lacks 'reason'; it needs passed, failures, reason"),
    ("a reason too long", _with_exercise(reason="x" * 201),
     r"^exercises\['02.ring'\].reason must be a string of at most 200 characters"),
    ("a reason of two lines", _with_exercise(reason="one\ntwo"),
     r"^exercises\['02.ring'\].reason must be one line \(no newline\), "
     r"not 'one\\ntwo'"),
    ("an exercise name without digits", record(exercises={"ring": {}}),
     r"^an exercise's name must be two digits, a dot and 1 to 40 of a-z, 0-9, _ "
     r"\(e.g. '02.ring'\), not 'ring'"),
    ("an exercise name in capitals", record(exercises={"02.Ring": {}}),
     r"^an exercise's name must be .*, not '02.Ring'"),
    ("too many exercises",
     record(exercises={f"01.e{i}": {"passed": True, "failures": 0, "reason": ""}
                       for i in range(101)}),
     r"^exercises holds 101 entries; at most 100 are kept"),
    ("a quiz key", record(quizzes={"2": {"right": 1, "checked": 1, "questions": 1}}),
     r"^a quiz's key must be its notebook's two digits \(e.g. '02'\), not '2'"),
    ("too many quizzes",
     record(quizzes={f"{i:02d}": {"right": 0, "checked": 0, "questions": 1}
                     for i in range(11)}),
     r"^quizzes holds 11 entries; at most 10 are kept"),
    ("a notebook name too long", record(where={"notebook": "n" * 81, "section": ""}),
     r"^where.notebook must be a string of at most 80 characters"),
    ("a section too long", record(where={"notebook": "", "section": "s" * 121}),
     r"^where.section must be a string of at most 120 characters"),
    ("where a string", record(where="02"),
     r"^where must be a JSON object with notebook, section"),
    ("an error type with a space", record(error={**record()["error"], "type": "x y"}),
     r"^error.type must be an exception's class name \(e.g. 'ValueError'\), not 'x y'"),
    ("a hand of another kind", record(hand={"kind": "maybe", "seq": 1}),
     r"^hand.kind must be 'help' or 'done', not 'maybe'"),
    ("a hand without seq", record(hand={"kind": "help"}),
     r"^hand lacks 'seq'; it needs kind, seq"),
    ("exercises a list", record(exercises=[]),
     r"^exercises must be a JSON object, not \[\]"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "value", "pattern"), REFUSED, ids=[r[0] for r in REFUSED]
)
def test_a_bad_record_is_refused_with_400_naming_what_and_the_allowed_form(
    what, value, pattern
):
    refused = refusal("ada", value)
    sentence = str(refused)
    assert refused.status == 400, (what, sentence)
    assert "\n" not in sentence
    assert sentence.endswith("post a record with the fields docs/portal.md lists")
    assert re.search(pattern, sentence), sentence


def test_a_record_over_16_kib_is_refused_with_413_and_one_at_16_kib_is_taken():
    def padded(size: int) -> bytes:
        body = json.dumps(_with_exercise(reason=""), separators=(",", ":"))
        return body[:-1].encode() + b" " * (size - len(body)) + b"}"

    assert len(padded(MAX_RECORD_BYTES)) == MAX_RECORD_BYTES
    assert parse_post(padded(MAX_RECORD_BYTES), "ada")["seq"] == 1
    refused = refusal("bo", padded(MAX_RECORD_BYTES + 1))
    assert refused.status == 413
    assert str(refused) == (
        f"the record is {MAX_RECORD_BYTES + 1} bytes; the board takes at most "
        f"{MAX_RECORD_BYTES} (16 KiB); send fewer exercises or shorter reasons"
    )
