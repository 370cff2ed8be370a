"""What the class board knows, without a network: each learner's last record (checked
by ``board_record.py``) with when it came and whether the instructor cleared its hand;
the table the instructor reads, its summary counts and its CSV; and the file that keeps
it all across a hub restart.

The service (``board.py``) drives a :class:`ClassBoard` from its event loop only; the
object takes no lock.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from .board_record import HANDS, RECORD_VERSION, Refused, check_record, parse_post

__all__ = [
    "ClassBoard",
    "csv_text",
    "summary",
    "summary_lines",
    "write_atomic",
]

_log = logging.getLogger("workshop.board")


class ClassBoard:
    """The learners' last records, with when each arrived and the hands cleared.

    Example:
        >>> board = ClassBoard()
        >>> board.accept("ada", b'{"version": 1, "seq": 1}')
        (200, {'ok': True, 'hand_cleared': None})
        >>> board.accept("ada", b'{"version": 1, "seq": 0}')[1]["stale"]
        True
    """

    def __init__(self) -> None:
        # name -> {"record": checked record, "seen": unix time, "cleared_hand_seq":
        # the hand's seq when the instructor cleared it, or None}
        self.learners: dict[str, dict[str, Any]] = {}
        # Grows with every change, so the service saves only what changed.
        self.changes = 0

    def accept(
        self, user: str, body: bytes, now: float | None = None
    ) -> tuple[int, dict[str, Any]]:
        """Take ``body``, a record posted by the hub user ``user``, if it is one.

        Args:
            user: the name the post's token belongs to.
            body: the request's body, as bytes.
            now: the time to record as when it was seen (default: now).

        Returns:
            ``(status, answer)``: ``(200, {"ok": True, "hand_cleared": seq or
            None})`` where it was kept or was older than the stored one (then with
            ``"stale": True``, and not kept); ``hand_cleared`` is the cleared seq
            when the posted hand is one the instructor cleared. A refusal is
            ``(400 | 403 | 413, {"error": "<one sentence>"})``.

        Example:
            >>> ClassBoard().accept("ada", b'{"version": 1, "seq": 1, "x": 2}')
            (400, {'error': "unknown key 'x' in the record; the keys allowed there are version, seq, where, exercises, quizzes, error, hand; post a record with the fields docs/portal.md lists"})
        """  # noqa: E501
        try:
            record = parse_post(body, user)
        except Refused as refused:
            return refused.status, {"error": str(refused)}
        entry = self.learners.get(user)
        if entry is not None and record["seq"] < entry["record"]["seq"]:
            # Background posts may arrive out of order: the newer one stays.
            return 200, {"ok": True, "stale": True, "hand_cleared": self._cleared(user)}
        cleared = entry["cleared_hand_seq"] if entry else None
        self.learners[user] = {
            "record": record,
            "seen": time.time() if now is None else now,
            "cleared_hand_seq": cleared,
        }
        self.changes += 1
        return 200, {"ok": True, "hand_cleared": self._cleared(user)}

    def _cleared(self, name: str) -> int | None:
        """The cleared seq, where the stored hand is one the instructor cleared."""
        entry = self.learners[name]
        hand, cleared = entry["record"]["hand"], entry["cleared_hand_seq"]
        if hand is not None and cleared is not None and hand["seq"] <= cleared:
            return cleared
        return None

    def hand(self, name: str) -> str | None:
        """The hand ``name`` shows: "help", "done", or None (none, or cleared)."""
        entry = self.learners.get(name)
        if entry is None or entry["record"]["hand"] is None:
            return None
        return (
            None if self._cleared(name) is not None else entry["record"]["hand"]["kind"]
        )

    def record(self, name: str) -> dict[str, Any] | None:
        """``name``'s stored record (a copy), or None where they never posted."""
        entry = self.learners.get(name)
        return None if entry is None else json.loads(json.dumps(entry["record"]))

    def clear_hand(self, name: str) -> bool:
        """Lower ``name``'s hand for the class: the hand they posted, and any
        re-post of it (the same seq), shows as none until they raise a new one.

        Returns:
            False where the board has no record of ``name``, else True.
        """
        entry = self.learners.get(name)
        if entry is None:
            return False
        hand = entry["record"]["hand"]
        if hand is not None:
            before = entry["cleared_hand_seq"]
            entry["cleared_hand_seq"] = max(hand["seq"], before or 0)
            self.changes += 1
        return True

    def rows(
        self,
        learners: list[str] | None = None,
        jobs: dict[str, dict[str, str]] | None = None,
    ) -> list[dict[str, Any]]:
        """The table: one row per learner of ``learners`` (in that order), also
        those who never posted; every learner with a record where ``learners`` is
        None (the class is not known).

        Args:
            learners: the class's learners, or None.
            jobs: each learner's job, ``{"state": "RUNNING", "left": "1:02:03"}``,
                or None where the jobs are unknown.

        Returns:
            Rows with ``learner``, ``notebook``, ``section``, ``exercises`` (name ->
            ``{"state": "passed" | "failed", "failures", "reason"}``), ``quizzes``,
            ``error`` (type, notebook, section, or None), ``hand``, ``job`` and
            ``seen`` (unix time of the last post kept, or None).
        """
        names = sorted(self.learners) if learners is None else list(learners)
        return [self._row(name, jobs) for name in names]

    def _row(self, name: str, jobs: dict[str, dict[str, str]] | None) -> dict:
        entry = self.learners.get(name)
        record = entry["record"] if entry else check_record({"version": 1, "seq": 0})
        where = record["where"] or {"notebook": "", "section": ""}
        error = record["error"]
        return {
            "learner": name,
            "notebook": where["notebook"],
            "section": where["section"],
            "exercises": {
                ex: {
                    "state": "passed" if v["passed"] else "failed",
                    "failures": v["failures"],
                    "reason": v["reason"],
                }
                for ex, v in sorted(record["exercises"].items())
            },
            "quizzes": dict(sorted(record["quizzes"].items())),
            "error": None
            if error is None
            else {k: error[k] for k in ("type", "notebook", "section")},
            "hand": self.hand(name),
            "job": None if jobs is None else jobs.get(name),
            "seen": entry["seen"] if entry else None,
        }

    def table(
        self,
        learners: list[str] | None = None,
        jobs: dict[str, dict[str, str]] | None = None,
        jobs_unknown: str | None = None,
    ) -> dict[str, Any]:
        """What ``api/table`` answers: ``{"learners": rows, "summary": ...,
        "generated": unix time}`` (see :meth:`rows` and :func:`summary`)."""
        rows = self.rows(learners, jobs)
        return {
            "learners": rows,
            "summary": summary(rows, jobs_unknown),
            "generated": time.time(),
        }

    def snapshot(self) -> str:
        """The board as the text :meth:`save` writes (JSON)."""
        return json.dumps({"version": RECORD_VERSION, "learners": self.learners})

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the board to ``path`` (mode 0600) at once or not at all
        (:func:`write_atomic`)."""
        write_atomic(Path(path), self.snapshot())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ClassBoard:
        """The board saved at ``path``; an empty one where there is no file, or the
        file cannot be read (then it is kept beside as ``<name>.corrupt`` and the
        log says why). Entries that are not valid records are dropped, logged."""
        path = Path(path)
        board = cls()
        try:
            saved = json.loads(path.read_text())
            entries = saved["learners"]
            if not isinstance(entries, dict):
                raise ValueError("'learners' is not an object")
        except FileNotFoundError:
            _log.info("board: no saved state at %s; starting empty", path)
            return board
        except (OSError, ValueError, KeyError, TypeError) as error:
            aside = path.with_name(path.name + ".corrupt")
            try:
                os.replace(path, aside)
            except OSError:
                aside = path
            _log.warning(
                "board: the saved state %s cannot be read (%s: %s); starting empty, "
                "the file kept as %s",
                path,
                type(error).__name__,
                error,
                aside,
            )
            return board
        for name, entry in entries.items():
            try:
                cleared = entry.get("cleared_hand_seq")
                board.learners[name] = {
                    "record": check_record(entry["record"]),
                    "seen": float(entry["seen"]),
                    "cleared_hand_seq": None if cleared is None else int(cleared),
                }
            except (Refused, AttributeError, KeyError, TypeError, ValueError) as error:
                _log.warning("board: dropped %r's saved record: %s", name, error)
        _log.info(
            "board: %d learners' records loaded from %s", len(board.learners), path
        )
        return board


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, mode 0600, whole or not at all: a temporary file
    beside it, synced, then renamed over it, so a crash never leaves half a file.

    Example:
        >>> write_atomic(Path("board.json"), "{}")  # doctest: +SKIP
    """
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)  # one left by a crash may have another mode
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def summary(rows: list[dict[str, Any]], jobs_unknown: str | None = None) -> dict:
    """Counts over ``rows`` (:meth:`ClassBoard.rows`): for each exercise anyone
    tried, how many passed, failed (tried, not passed) and have not yet; hands up;
    learners with an error; and the same as text lines for the page's top.

    Args:
        rows: the table's rows (the class).
        jobs_unknown: why the jobs are unknown (squeue missing or failing), or None.

    Returns:
        ``{"learners": n, "exercises": {name: {"passed", "failed", "not_yet"}},
        "hands": {"help", "done"}, "errors": n, "jobs_unknown": ..., "lines": [...]}``.

    Example:
        >>> rows = ClassBoard().rows(["ada", "bo"])
        >>> rows[0]["exercises"] = {"02.ring": {"state": "passed"}}
        >>> summary(rows)["lines"]
        ['exercise 02.ring: 1 passed, 0 failed, 1 not yet', '0 hands up; 0 with an error']
    """  # noqa: E501
    names = sorted({name for row in rows for name in row["exercises"]})
    exercises = {}
    for name in names:
        states = [row["exercises"].get(name, {}).get("state") for row in rows]
        passed, failed = states.count("passed"), states.count("failed")
        exercises[name] = {
            "passed": passed,
            "failed": failed,
            "not_yet": len(rows) - passed - failed,
        }
    hands = {kind: sum(row["hand"] == kind for row in rows) for kind in HANDS}
    counts = {
        "learners": len(rows),
        "exercises": exercises,
        "hands": hands,
        "errors": sum(row["error"] is not None for row in rows),
        "jobs_unknown": jobs_unknown,
    }
    return {**counts, "lines": summary_lines(counts)}


def summary_lines(counts: dict[str, Any]) -> list[str]:
    """The summary as the page's top lines: "exercise 02.ring: 14 passed, 6 failed,
    10 not yet", one per exercise, then "3 hands up (2 help, 1 done); 4 with an
    error".

    Example:
        >>> counts = {"exercises": {}, "hands": {"help": 1, "done": 0}, "errors": 0}
        >>> summary_lines(counts)
        ['1 hands up (1 help, 0 done); 0 with an error']
    """
    lines = [
        f"exercise {name}: {c['passed']} passed, {c['failed']} failed, "
        f"{c['not_yet']} not yet"
        for name, c in counts["exercises"].items()
    ]
    hands = counts["hands"]
    up = sum(hands.values())
    detail = f" ({hands['help']} help, {hands['done']} done)" if up else ""
    lines.append(f"{up} hands up{detail}; {counts['errors']} with an error")
    return lines


# Cells a spreadsheet would run as a formula: a learner's section or error type is
# shown as text ("'=1+1"), never evaluated on the instructor's machine.
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA) else text


def csv_text(rows: list[dict[str, Any]]) -> str:
    """The table as CSV, one row per learner: where they are, their hand, last
    error, job, when last seen (UTC), then a column per exercise ("passed",
    "passed after 2 failures", "failed 3: <reason>" or "") and per quiz
    ("3/5 right, 4 checked").

    Example:
        >>> print(csv_text(ClassBoard().rows(["ada"])).splitlines()[1])
        ada,,,,,,,
    """
    exercises = sorted({name for row in rows for name in row["exercises"]})
    quizzes = sorted({key for row in rows for key in row["quizzes"]})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    head = ["learner", "notebook", "section", "hand", "error", "job", "time left"]
    writer.writerow(
        [*head, "last seen (UTC)", *exercises, *(f"quiz {q}" for q in quizzes)]
    )
    for row in rows:
        error, job = row["error"], row["job"] or {}
        seen = row["seen"]
        cells = [
            row["learner"],
            row["notebook"],
            row["section"],
            row["hand"],
            f"{error['type']} in {error['notebook']} / {error['section']}"
            if error
            else "",
            job.get("state"),
            job.get("left"),
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seen)) if seen else "",
        ]
        for name in exercises:
            cells.append(_verdict(row["exercises"].get(name)))
        for key in quizzes:
            quiz = row["quizzes"].get(key)
            cells.append(
                f"{quiz['right']}/{quiz['questions']} right, {quiz['checked']} checked"
                if quiz
                else ""
            )
        writer.writerow([_cell(c) for c in cells])
    return out.getvalue()


def _verdict(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return ""
    if entry["state"] == "passed":
        n = entry["failures"]
        return f"passed after {n} failures" if n else "passed"
    return f"failed {entry['failures']}: {entry['reason']}"
