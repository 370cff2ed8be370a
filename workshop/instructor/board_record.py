"""The record a learner's kernel posts to the class board, checked field by field:
what the board keeps of a learner, and the one sentence that refuses anything else.

The whole schema (docs/portal.md, "The instructor's board")::

    {"version": 1, "seq": 7,
     "where": {"notebook": "02_ddp.ipynb", "section": "The ring"},
     "exercises": {"02.ring": {"passed": false, "failures": 2, "reason": "..."}},
     "quizzes": {"02": {"right": 3, "checked": 4, "questions": 5}},
     "error": {"type": "RuntimeError", "notebook": "...", "section": "...", "seq": 6},
     "hand": {"kind": "help", "seq": 7}}

Only these fields are kept; an unknown key, a value of another type or size, a name
of another form is refused, so that no code, output or file content reaches the
board. ``board_state.py`` keeps what passes.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "MAX_RECORD_BYTES",
    "RECORD_VERSION",
    "Refused",
    "check_record",
    "parse_post",
]

MAX_RECORD_BYTES = 16 * 1024
RECORD_VERSION = 1
# Integers in a record (seq, failures, scores) stay below this: a count that large is
# a broken client, and it keeps the stored file and the page small.
LIMIT = 10**6
EXERCISE = re.compile(r"\d\d\.[a-z0-9_]{1,40}")
QUIZ = re.compile(r"\d\d")
# An exception's class name, qualified or not ("ValueError", "torch.OutOfMemoryError").
ERROR_TYPE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
MAX_EXERCISES, MAX_QUIZZES = 100, 10

TOP_KEYS = ("version", "seq", "where", "exercises", "quizzes", "error", "hand")
WHERE_KEYS = {"notebook": 80, "section": 120}
EXERCISE_KEYS = ("passed", "failures", "reason")
QUIZ_KEYS = ("right", "checked", "questions")
ERROR_KEYS = ("type", "notebook", "section", "seq")
HAND_KEYS = ("kind", "seq")
HANDS = ("help", "done")
FIX = "post a record with the fields docs/portal.md lists"


class Refused(Exception):
    """A post the board does not take: ``status`` (400, 403 or 413) and one sentence
    (``str(error)``) saying what was wrong and what is allowed."""

    def __init__(self, status: int, sentence: str) -> None:
        super().__init__(sentence)
        self.status = status


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bad(where: str, allowed: str, value: Any) -> Refused:
    return Refused(400, f"{where} must be {allowed}, not {_shown(value)}; {FIX}")


def _keys(where: str, value: Any, keys: tuple[str, ...], required: bool) -> dict:
    if not isinstance(value, dict):
        raise _bad(where, "a JSON object with " + ", ".join(keys), value)
    unknown = [k for k in value if k not in keys]
    if unknown:
        raise Refused(
            400,
            f"unknown key {_shown(unknown[0])} in {where}; the keys allowed there "
            f"are {', '.join(keys)}; {FIX}",
        )
    missing = [k for k in keys if k not in value] if required else []
    if missing:
        raise Refused(
            400, f"{where} lacks {missing[0]!r}; it needs {', '.join(keys)}; {FIX}"
        )
    return value


def _count(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < LIMIT:
        raise _bad(where, f"a whole number from 0 to {LIMIT - 1}", value)
    return value


def _text(where: str, value: Any, most: int, one_line: bool = False) -> str:
    if not isinstance(value, str) or len(value) > most:
        raise _bad(where, f"a string of at most {most} characters", value)
    if one_line and ("\n" in value or "\r" in value):
        raise _bad(where, "one line (no newline)", value)
    return value


def _where(value: Any) -> dict | None:
    if value is None:
        return None
    _keys("where", value, tuple(WHERE_KEYS), required=True)
    return {k: _text(f"where.{k}", value[k], most) for k, most in WHERE_KEYS.items()}


def _exercises(value: Any) -> dict:
    _keys_free("exercises", value, MAX_EXERCISES)
    checked = {}
    for name, entry in value.items():
        if not EXERCISE.fullmatch(name):
            raise _bad(
                "an exercise's name",
                "two digits, a dot and 1 to 40 of a-z, 0-9, _ (e.g. '02.ring')",
                name,
            )
        at = f"exercises[{name!r}]"
        _keys(at, entry, EXERCISE_KEYS, required=True)
        if not isinstance(entry["passed"], bool):
            raise _bad(f"{at}.passed", "true or false", entry["passed"])
        checked[name] = {
            "passed": entry["passed"],
            "failures": _count(f"{at}.failures", entry["failures"]),
            "reason": _text(f"{at}.reason", entry["reason"], 200, one_line=True),
        }
    return checked


def _quizzes(value: Any) -> dict:
    _keys_free("quizzes", value, MAX_QUIZZES)
    checked = {}
    for key, entry in value.items():
        if not QUIZ.fullmatch(key):
            raise _bad("a quiz's key", "its notebook's two digits (e.g. '02')", key)
        at = f"quizzes[{key!r}]"
        _keys(at, entry, QUIZ_KEYS, required=True)
        checked[key] = {k: _count(f"{at}.{k}", entry[k]) for k in QUIZ_KEYS}
    return checked


def _keys_free(where: str, value: Any, most: int) -> None:
    """A JSON object whose keys are names (checked by the caller), at most ``most``."""
    if not isinstance(value, dict):
        raise _bad(where, "a JSON object", value)
    if len(value) > most:
        raise Refused(
            400, f"{where} holds {len(value)} entries; at most {most} are kept; {FIX}"
        )


def _error(value: Any) -> dict | None:
    if value is None:
        return None
    _keys("error", value, ERROR_KEYS, required=True)
    kind = _text("error.type", value["type"], 80)
    if not ERROR_TYPE.fullmatch(kind):
        raise _bad("error.type", "an exception's class name (e.g. 'ValueError')", kind)
    return {
        "type": kind,
        "notebook": _text("error.notebook", value["notebook"], 80),
        "section": _text("error.section", value["section"], 120),
        "seq": _count("error.seq", value["seq"]),
    }


def _hand(value: Any) -> dict | None:
    if value is None:
        return None
    _keys("hand", value, HAND_KEYS, required=True)
    if value["kind"] not in HANDS:
        raise _bad("hand.kind", "'help' or 'done'", value["kind"])
    return {"kind": value["kind"], "seq": _count("hand.seq", value["seq"])}


def check_record(record: Any) -> dict:
    """``record`` as the board keeps it, if it is a record of the board's schema:
    every key known, every value of its type and size; optional parts missing are
    filled in (``where``, ``error`` and ``hand`` as None, no exercises or quizzes).

    Args:
        record: a decoded JSON value, as posted (``learner``, if there, is taken
            off by :func:`parse_post` before this check).

    Returns:
        A new dict holding exactly the schema's keys.

    Raises:
        Refused: status 400, naming the first thing that is wrong and what is
            allowed there.

    Example:
        >>> check_record({"version": 1, "seq": 3})["exercises"]
        {}
        >>> check_record({"version": 1, "seq": -1})
        Traceback (most recent call last):
        ...
        workshop.instructor.board_record.Refused: seq must be a whole number from 0 to 999999, not -1; post a record with the fields docs/portal.md lists
    """  # noqa: E501
    _keys("the record", record, TOP_KEYS, required=False)
    for key in ("version", "seq"):
        if key not in record:
            raise Refused(
                400, f"the record lacks {key!r}; it needs version and seq; {FIX}"
            )
    if isinstance(record["version"], bool) or record["version"] != RECORD_VERSION:
        raise _bad("version", str(RECORD_VERSION), record["version"])
    return {
        "version": RECORD_VERSION,
        "seq": _count("seq", record["seq"]),
        "where": _where(record.get("where")),
        "exercises": _exercises(record.get("exercises", {})),
        "quizzes": _quizzes(record.get("quizzes", {})),
        "error": _error(record.get("error")),
        "hand": _hand(record.get("hand")),
    }


def _decode(body: bytes) -> Any:
    if len(body) > MAX_RECORD_BYTES:
        raise Refused(
            413,
            f"the record is {len(body)} bytes; the board takes at most "
            f"{MAX_RECORD_BYTES} (16 KiB); send fewer exercises or shorter reasons",
        )
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise Refused(
            400, f"the record is not JSON in UTF-8 ({error}); {FIX}"
        ) from None


def parse_post(body: bytes, user: str) -> dict:
    """The record in ``body``, posted with a token of the hub user ``user``.

    Args:
        body: the request's body: JSON in UTF-8, at most 16 KiB.
        user: whose token posted it; a ``"learner"`` key, if there, must name them
            (it is not kept).

    Returns:
        The record, checked (:func:`check_record`).

    Raises:
        Refused: 413 for a body over 16 KiB, 403 for a record naming another
            learner, 400 for anything else that is not a record.

    Example:
        >>> parse_post(b'{"version": 1, "seq": 2, "learner": "ada"}', "ada")["seq"]
        2
        >>> parse_post(b'{"version": 1, "seq": 2, "learner": "ada"}', "bo")
        Traceback (most recent call last):
        ...
        workshop.instructor.board_record.Refused: the record names another learner ('ada'); a kernel posts only its own learner's record, and this token belongs to 'bo'
    """  # noqa: E501
    record = _decode(body)
    if isinstance(record, dict) and "learner" in record:
        record = dict(record)
        named = record.pop("learner")
        if named != user:
            raise Refused(
                403,
                f"the record names another learner ({_shown(named)}); a kernel "
                f"posts only its own learner's record, and this token belongs to "
                f"{user!r}",
            )
    return check_record(record)
