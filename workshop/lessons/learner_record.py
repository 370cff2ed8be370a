"""The learner's record: which exercises passed or failed, the quizzes' scores, the
notebook and section they are in, the type of their last error and a raised hand.
It is kept in a file of the learner's own and, on a portal, posted to the
instructor's class board.

The file is ``$WORKSHOP_PROGRESS`` where that is set (a path; the value ``off`` keeps
nothing at all), else ``$XDG_DATA_HOME/scaling-pytorch-hpc/progress.json``
(XDG_DATA_HOME defaulting to ``~/.local/share``). Only the learner can read it
(0600). Each change replaces it whole, so a reader never sees half a file, and is
made under a lock, because two kernels of one learner share it.

The exercises (:func:`record_verdict`), the quizzes (:func:`record_answer`) and the
kernel's hook after each cell (:func:`record_cell`) record. Each of these swallows
every failure and prints nothing: a record never makes a cell fail, show more or
wait. A record holds what the board's schema lists (docs/portal.md) and nothing
else: no code, no outputs, no files. The only text the workshop writes into it is
an exercise check's one-line reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from .._house import ROOT
from .board_client import BoardPoster

__all__ = [
    "apply_board_answer",
    "board_address",
    "board_poster",
    "post_record",
    "progress_file",
    "read_record",
    "record_answer",
    "record_cell",
    "record_verdict",
    "set_hand",
    "watch_hand",
]

F = TypeVar("F", bound=Callable[..., Any])

_FOLDER = "scaling-pytorch-hpc"
_FILE = "progress.json"
_OFF = "off"
# The board's limits (docs/portal.md): text longer than these is cut here, so the
# board never has to refuse a learner's record for it.
_REASON_CHARS, _NOTEBOOK_CHARS, _SECTION_CHARS, _TYPE_CHARS = 200, 80, 120, 80
_MOST = 10**6 - 1
_MOST_EXERCISES, _MOST_QUIZZES = 100, 10
_RECORD_BYTES = 16 * 1024
_EXERCISE = re.compile(r"\d\d\.[a-z0-9_]{1,40}")
_QUIZ = re.compile(r"\d\d")
_HAND_KINDS = ("help", "done")
# What is posted; the file also keeps the quizzes' answers (right or not, per
# question, to score the latest answer to each) and the hand the board cleared.
_POSTED = ("version", "seq", "where", "exercises", "quizzes", "error", "hand")
# How long a record waits for another kernel holding the lock before it gives up
# (that record is lost, the cell is not held up).
_LOCK_WAIT_S = 1.0
# The process that imported this module: a rank forked from the kernel inherits the
# poster's object but not its thread, and must never post the learner's record.
_HOME_PID = os.getpid()
_POSTER: dict[str, Any] = {"poster": None, "key": None}
_POSTER_LOCK = threading.Lock()
_WATCHERS: list[Callable[[], Any]] = []


def progress_file() -> Path | None:
    """Where this learner's record is kept, or None when recording is off.

    Returns:
        ``$WORKSHOP_PROGRESS`` as an absolute path (``~`` expanded; relative to the
        current folder), None when it is ``off``; else
        ``$XDG_DATA_HOME/scaling-pytorch-hpc/progress.json``, XDG_DATA_HOME being
        ``~/.local/share`` when unset or not absolute (as the XDG rules say).

    Example:
        >>> progress_file().name  # doctest: +SKIP
        'progress.json'
    """
    value = os.environ.get("WORKSHOP_PROGRESS", "").strip()
    if value.lower() == _OFF:
        return None
    if value:
        return Path(os.path.abspath(os.path.expanduser(value)))
    data = os.environ.get("XDG_DATA_HOME", "")
    base = Path(data) if os.path.isabs(data) else Path.home() / ".local" / "share"
    return base / _FOLDER / _FILE


def read_record(path: Path | None = None) -> dict[str, Any]:
    """The record kept in ``path``; an empty one where there is none yet, where the
    file cannot be read, or where recording is off.

    Args:
        path: the file; None: :func:`progress_file`.

    Returns:
        The record as the board takes it (``version``, ``seq``, ``where``,
        ``exercises``, ``quizzes``, ``error``, ``hand``), plus ``answers`` (quiz ->
        question -> right) and ``hand_cleared`` (the seq of the hand the instructor
        cleared, or None), which stay in the file.

    Example:
        >>> read_record()["exercises"].get("01.dp")  # doctest: +SKIP
        {'passed': True, 'failures': 0, 'reason': ''}
    """
    path = progress_file() if path is None else path
    if path is None:
        return _clean(None)
    try:
        return _clean(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):  # none yet, unreadable, or not JSON
        return _clean(None)


def _quiet(fn: F) -> F:
    """``fn`` with every failure swallowed: a record never fails a cell."""

    @functools.wraps(fn)
    def quiet(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception:
            return None

    return quiet  # type: ignore[return-value]


@_quiet
def record_verdict(name: str, passed: bool, reason: str = "") -> None:
    """Record a check of exercise ``name``: passed, or failed for ``reason``.

    A pass stays a pass; the failures before and after it are counted, and the last
    failure's reason is kept. Without a notebook session (nbval, a script), the
    exercise's notebook becomes where the learner is.

    Args:
        name: the exercise, e.g. "02.ring".
        passed: the check's verdict.
        reason: the check's reason when it failed; its first line is kept, cut to
            200 characters.

    Example:
        >>> record_verdict("01.dp", False, "dp(4) returned 3")  # doctest: +SKIP
    """
    if not _EXERCISE.fullmatch(name):
        return

    def change(record: dict[str, Any], seq: int) -> None:
        exercises = record["exercises"]
        if name not in exercises and len(exercises) >= _MOST_EXERCISES:
            return
        entry = exercises.setdefault(
            name, {"passed": False, "failures": 0, "reason": ""}
        )
        if passed:
            entry["passed"] = True
        else:
            entry["failures"] = min(entry["failures"] + 1, _MOST)
            entry["reason"] = _line(reason, _REASON_CHARS)
        _where_from_number(record, name[:2])

    _update(change)


@_quiet
def record_answer(quiz: str, question: int, right: bool, questions: int) -> None:
    """Record an answer to question ``question`` of quiz ``quiz``: the score counts
    the right answers among the latest answer to each question.

    Args:
        quiz: the notebook's number, e.g. "02".
        question: the question's number, from 1.
        right: whether the option chosen is the right one.
        questions: how many questions the quiz has.

    Example:
        >>> record_answer("02", 1, True, 6)  # doctest: +SKIP
    """
    if not _QUIZ.fullmatch(quiz):
        return

    def change(record: dict[str, Any], seq: int) -> None:
        if quiz not in record["quizzes"] and len(record["quizzes"]) >= _MOST_QUIZZES:
            return
        answers = record["answers"].setdefault(quiz, {})
        answers[str(question)] = bool(right)
        record["quizzes"][quiz] = {
            "right": sum(answers.values()),
            "checked": len(answers),
            "questions": min(max(questions, len(answers)), _MOST),
        }
        _where_from_number(record, quiz)

    _update(change)


@_quiet
def record_cell(
    notebook: str | None, section: str | None, error: str | None = None
) -> None:
    """Record where the cell that just ran is, and the type of its error if any.

    Args:
        notebook: the notebook's name (its file name without ``.ipynb``), or None
            where no notebook is known (the place then stays as it was).
        section: the nearest heading above the cell; None where the cell was not
            found in the saved notebook (a new cell not saved yet): the section
            then stays as it was in the same notebook.
        error: the class name of the exception the cell raised, or None.

    Example:
        >>> record_cell("02_ddp", "4. Collectives", "ValueError")  # doctest: +SKIP
    """

    def change(record: dict[str, Any], seq: int) -> None:
        where = record["where"]
        if notebook is not None:
            name = _line(notebook, _NOTEBOOK_CHARS)
            if section is not None:
                place = _line(section, _SECTION_CHARS)
            elif where is not None and where["notebook"] == name:
                place = where["section"]
            else:
                place = ""
            record["where"] = where = {"notebook": name, "section": place}
        if error:
            record["error"] = {
                "type": _type_name(error),
                "notebook": where["notebook"] if where else "",
                "section": where["section"] if where else "",
                "seq": seq,
            }

    _update(change)


def set_hand(kind: str | None) -> dict[str, Any] | None:
    """Raise the learner's hand (``kind`` "help" or "done") or lower it (None).

    Args:
        kind: "help", "done", or None to lower the hand.

    Returns:
        The record after the change; None when recording is off.

    Raises:
        ValueError: ``kind`` is none of these.
        OSError, TimeoutError: the file could not be written (the caller says so).

    Example:
        >>> set_hand("help")["hand"]["kind"]  # doctest: +SKIP
        'help'
    """
    if kind is not None and kind not in _HAND_KINDS:
        raise ValueError(f"kind must be one of {_HAND_KINDS} or None, not {kind!r}")

    def change(record: dict[str, Any], seq: int) -> None:
        # Each raise is a new hand with the record's new seq, also when the same
        # hand is up: the board may have cleared that one without this kernel
        # hearing of it yet, and shows a hand only above the seq it cleared.
        record["hand"] = None if kind is None else {"kind": kind, "seq": seq}
        record["hand_cleared"] = None

    return _update(change)[0]


@_quiet
def apply_board_answer(answer: Any) -> None:
    """Take in the board's answer to a post: a hand the instructor cleared
    (``hand_cleared``, a seq) is lowered in the file if it is that hand or older.

    Args:
        answer: the board's JSON answer, ``{"ok": true, "hand_cleared": seq|null}``.

    Example:
        >>> apply_board_answer({"ok": True, "hand_cleared": 7})  # doctest: +SKIP
    """
    cleared = answer.get("hand_cleared") if isinstance(answer, dict) else None
    if type(cleared) is not int:
        return

    def change(record: dict[str, Any], seq: int) -> None:
        hand = record["hand"]
        if hand is not None and hand["seq"] <= cleared:
            record["hand"] = None
            record["hand_cleared"] = hand["seq"]

    if _update(change)[1]:
        for watcher in list(_WATCHERS):
            try:
                callback = watcher() if isinstance(watcher, weakref.ref) else watcher
                if callback is not None:
                    callback()
            except Exception:
                pass


def watch_hand(callback: Callable[[], Any]) -> None:
    """Call ``callback`` (from the poster's thread) when the board clears the hand:
    how the hand widget says "cleared by the instructor" without a click.

    Args:
        callback: called with no arguments; a bound method is held weakly, so a
            widget that is gone is not kept alive.

    Example:
        >>> watch_hand(lambda: print("cleared"))  # doctest: +SKIP
    """
    held: Any = (
        weakref.WeakMethod(callback) if hasattr(callback, "__self__") else callback
    )
    _WATCHERS[:] = [w for w in _WATCHERS if not isinstance(w, weakref.ref) or w()]
    _WATCHERS.append(held)


def board_poster() -> BoardPoster | None:
    """The poster of this kernel's records to the class board; None where there is no
    board (``WORKSHOP_BOARD_URL`` or ``JUPYTERHUB_API_TOKEN`` unset) or in a process
    forked from the kernel. Made, with its thread, at the first record.

    Returns:
        The :class:`~.board_client.BoardPoster`, or None.

    Example:
        >>> board_poster() is None  # doctest: +SKIP
        True
    """
    address = board_address()
    if address is None or os.getpid() != _HOME_PID:
        return None
    with _POSTER_LOCK:
        poster = _POSTER["poster"]
        if _POSTER["key"] != address:
            if poster is not None:
                poster.close(timeout=0)
            poster = BoardPoster(*address, on_answer=apply_board_answer)
            _POSTER.update(poster=poster, key=address)
        return poster


def board_address() -> tuple[str, str] | None:
    """Where records are posted and the token that posts them; None where there is
    no board: ``WORKSHOP_BOARD_URL`` (the board's address, ending in "/") or the
    server's ``JUPYTERHUB_API_TOKEN`` is unset.

    Returns:
        (the URL of the board's ``api/records``, the token), or None.

    Example:
        >>> board_address()  # doctest: +SKIP
        ('http://127.0.0.1:8000/services/board/api/records', '...')
    """
    url = os.environ.get("WORKSHOP_BOARD_URL", "").strip()
    token = os.environ.get("JUPYTERHUB_API_TOKEN", "").strip()
    if not url or not token:
        return None
    return url.rstrip("/") + "/api/records", token


@_quiet
def post_record() -> None:
    """Post the file's record as it is, where there is a board and a record: a
    kernel that starts on a portal does, so the board has the record even when the
    last post before a restart never arrived.

    Example:
        >>> post_record()  # doctest: +SKIP
    """
    poster = board_poster()
    if poster is not None and progress_file() is not None:
        record = read_record()
        if record["seq"] > 0:
            poster.submit(_posted(record))


def _update(
    change: Callable[[dict[str, Any], int], None],
) -> tuple[dict[str, Any] | None, bool]:
    """Apply ``change(record, next_seq)`` to the file's record under the lock; write
    it (with that seq) and post it only if it changed. Returns (record, changed)."""
    path = progress_file()
    if path is None:
        return None, False
    with _locked(path):
        record = read_record(path)
        before = json.dumps(record, sort_keys=True)
        seq = min(record["seq"] + 1, _MOST)
        change(record, seq)
        if json.dumps(record, sort_keys=True) == before:
            return record, False
        record["seq"] = seq
        _write(path, record)
        # Handed over under the lock: the poster's thread records too (a hand the
        # board cleared), and the newer record must be the one left waiting.
        poster = board_poster()
        if poster is not None:
            poster.submit(_posted(record))
    return record, True


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold ``<path>.lock`` (flock: it also keeps out another thread of this
    process, each opening the file anew); give up after :data:`_LOCK_WAIT_S`."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{path}.lock was held for {_LOCK_WAIT_S} s by another "
                        "kernel; this record was not kept"
                    ) from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # and with it the lock


def _write(path: Path, record: dict[str, Any]) -> None:
    """Replace ``path`` with ``record`` at once: a temporary file (0600) in the same
    folder, synced, then renamed over it."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _posted(record: dict[str, Any]) -> dict[str, Any]:
    """The record as posted: the schema's keys alone, within the board's 16 KiB."""
    posted = {key: record[key] for key in _POSTED}
    if len(json.dumps(posted).encode()) > _RECORD_BYTES:
        # Only reasons can make it this large (100 exercises of 200 characters).
        posted["exercises"] = {
            name: {**entry, "reason": ""} for name, entry in posted["exercises"].items()
        }
    return posted


def _where_from_number(record: dict[str, Any], number: str) -> None:
    # In a notebook session the hook after each cell says where the learner is;
    # without one (nbval, a script), the last exercise or quiz says which notebook.
    if not os.environ.get("JPY_SESSION_NAME"):
        record["where"] = {"notebook": _notebook_name(number), "section": ""}


@functools.cache
def _notebook_name(number: str) -> str:
    found = sorted((ROOT / "notebooks").glob(f"{number}_*.ipynb"))
    return found[0].stem[:_NOTEBOOK_CHARS] if found else f"notebook {number}"


def _line(text: Any, most: int) -> str:
    """The first line of ``text``, without control characters, cut to ``most``."""
    lines = str(text).strip().splitlines()
    first = "".join(c for c in (lines[0] if lines else "") if c.isprintable())
    return first.strip()[:most]


def _type_name(name: str) -> str:
    # The board takes letters, digits, "_" and "." (a qualified name) and nothing
    # else: a class name in another alphabet keeps what it can.
    kept = re.sub(r"[^A-Za-z0-9_.]", "", name).lstrip("0123456789.")
    return kept[:_TYPE_CHARS] or "Exception"


def _count(value: Any) -> int:
    return value if type(value) is int and 0 <= value <= _MOST else 0


def _clean(data: Any) -> dict[str, Any]:
    """A record of the right shape from what the file held: what does not fit the
    schema is dropped, so a damaged or older file never stops the recording."""
    record: dict[str, Any] = {
        "version": 1,
        "seq": 0,
        "where": None,
        "exercises": {},
        "quizzes": {},
        "error": None,
        "hand": None,
        "answers": {},
        "hand_cleared": None,
    }
    if not isinstance(data, dict) or data.get("version") != 1:
        return record
    record["seq"] = _count(data.get("seq"))
    where = data.get("where")
    if isinstance(where, dict):
        record["where"] = {
            "notebook": _line(where.get("notebook", ""), _NOTEBOOK_CHARS),
            "section": _line(where.get("section", ""), _SECTION_CHARS),
        }
    for name, entry in _items(data.get("exercises"), _EXERCISE, _MOST_EXERCISES):
        record["exercises"][name] = {
            "passed": entry.get("passed") is True,
            "failures": _count(entry.get("failures")),
            "reason": _line(entry.get("reason", ""), _REASON_CHARS),
        }
    for name, entry in _items(data.get("quizzes"), _QUIZ, _MOST_QUIZZES):
        record["quizzes"][name] = {
            key: _count(entry.get(key)) for key in ("right", "checked", "questions")
        }
    for name, entry in _items(data.get("answers"), _QUIZ, _MOST_QUIZZES):
        record["answers"][name] = {
            q: right
            for q, right in entry.items()
            if q.isdigit() and isinstance(right, bool)
        }
    error = data.get("error")
    if isinstance(error, dict) and isinstance(error.get("type"), str):
        record["error"] = {
            "type": _type_name(error["type"]),
            "notebook": _line(error.get("notebook", ""), _NOTEBOOK_CHARS),
            "section": _line(error.get("section", ""), _SECTION_CHARS),
            "seq": _count(error.get("seq")),
        }
    hand = data.get("hand")
    if isinstance(hand, dict) and hand.get("kind") in _HAND_KINDS:
        record["hand"] = {"kind": hand["kind"], "seq": _count(hand.get("seq"))}
    cleared = data.get("hand_cleared")
    record["hand_cleared"] = cleared if type(cleared) is int else None
    return record


def _items(value: Any, names: re.Pattern[str], most: int) -> list[tuple[str, dict]]:
    if not isinstance(value, dict):
        return []
    found = [
        (name, entry)
        for name, entry in value.items()
        if isinstance(name, str) and names.fullmatch(name) and isinstance(entry, dict)
    ]
    return found[:most]
