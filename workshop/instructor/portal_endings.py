"""Why a learner's server job ended, in the words the hub's pages show the learner:
"Your server's Slurm job 17 ended at 14:05: it reached its time limit of 02:00:00."

``scontrol show job`` still describes a finished job for MinJobAge (300 s), far
longer than the hub's poll interval. Who cancelled it is in ``sacct`` where the site
keeps accounting, else in the controller's log (``REQUEST_KILL_JOB ... uid 1001``).
Only the standard library: the words are tested without JupyterHub.
"""

from __future__ import annotations

import datetime as dt
import pwd
import re
import signal
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

# What is read of the controller's log: its end, where a cancel of a few seconds ago
# is. A site's log may be large; the private cluster's is small.
LOG_TAIL = 1 << 20


@dataclass
class Ending:
    """How one server job ended; ``at`` and ``state`` are "" when Slurm had
    forgotten the job."""

    job_id: str
    at: str
    state: str
    why: str
    log: str = ""

    def sentence(self) -> str:
        """The line a learner reads, e.g. "Your server's Slurm job 17 ended at 14:05:
        it was cancelled (scancel by root: the instructor or an administrator)."."""
        when = f" at {self.at}" if self.at else ""
        return f"Your server's Slurm job {self.job_id} ended{when}: {self.why}."

    def as_state(self) -> dict[str, str]:
        """Plain data, for the hub's database (the spawner's state)."""
        return asdict(self)


def parse_job(text: str) -> dict[str, str]:
    """The ``Key=Value`` fields of ``scontrol show job`` output (a line's last value
    may hold spaces)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        # A key starts a line or follows a space: letters, digits, ':' and '/'.
        starts = list(re.finditer(r"(?:^|(?<= ))([A-Za-z][\w:/]*)=", line))
        for i, match in enumerate(starts):
            end = starts[i + 1].start() - 1 if i + 1 < len(starts) else len(line)
            fields.setdefault(match.group(1), line[match.end() : end])
    return fields


def _when(end_time: str, today: dt.date | None = None) -> str:
    """``2026-11-29T14:05:12`` as ``14:05``, or ``2026-11-28 14:05`` on another day."""
    try:
        moment = dt.datetime.fromisoformat(end_time)
    except ValueError:
        return ""
    if moment.date() == (today or dt.date.today()):
        return moment.strftime("%H:%M")
    return moment.strftime("%Y-%m-%d %H:%M")


def _who(uid: int | None, owner: str, admin: str) -> str:
    """Who ran scancel, seen from the job's owner."""
    if uid is None:
        return ""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid {uid}"
    if name == owner:
        return " by you"
    if uid == 0:
        return " by root: the instructor or an administrator"
    if name == admin:
        return f" by the instructor ({name})"
    return f" by {name}"


def _exit(code: str) -> str:
    """``ExitCode=3:0`` (status:signal) in words."""
    status, _, number = code.partition(":")
    if number not in ("", "0"):
        try:
            name = f" ({signal.Signals(int(number)).name})"
        except ValueError:
            name = ""
        return f"the server was stopped by signal {number}{name}"
    return f"the server exited with code {status or '?'}"


def describe(
    fields: dict[str, str],
    owner: str,
    cancelled_by: int | None = None,
    admin: str = "",
    today: dt.date | None = None,
) -> Ending:
    """The :class:`Ending` of a finished job from its ``scontrol show job`` fields.

    Args:
        fields: :func:`parse_job`'s answer; empty when Slurm no longer knew the job.
        owner: the learner who owns the job ("by you" when they cancelled it).
        cancelled_by: the uid that cancelled it, when known.
        admin: the portal's instructor account.
        today: the day to compare the end with (today by default).

    Returns:
        The ending, its ``why`` in words a learner reads.

    Example:
        >>> fields = {"JobId": "17", "JobState": "TIMEOUT", "TimeLimit": "02:00:00",
        ...           "EndTime": "2026-11-29T14:05:12"}
        >>> describe(fields, "learner01", today=dt.date(2026, 11, 29)).sentence()
        ... # doctest: +NORMALIZE_WHITESPACE
        "Your server's Slurm job 17 ended at 14:05: it reached its time limit of
        02:00:00."
    """
    job_id = fields.get("JobId", "?")
    state = fields.get("JobState", "")
    reason = fields.get("Reason", "None")
    node = fields.get("NodeList") or fields.get("BatchHost") or "?"
    words = {
        "CANCELLED": f"it was cancelled (scancel{_who(cancelled_by, owner, admin)})",
        "TIMEOUT": f"it reached its time limit of {fields.get('TimeLimit', '?')}",
        "NODE_FAIL": f"its node {node} failed (Slurm's reason: {reason})",
        "FAILED": _exit(fields.get("ExitCode", "")),
        "OUT_OF_MEMORY": "it ran out of the memory the job asked for",
        "COMPLETED": "the server shut itself down (File > Shut Down in JupyterLab)",
        "PREEMPTED": "Slurm preempted it for a job of higher priority",
        "BOOT_FAIL": f"its node {node} failed to boot",
        "DEADLINE": "it passed its deadline",
    }
    if not state:
        why = (
            "Slurm no longer remembers how (it forgets a finished job after "
            "MinJobAge, 5 minutes by default)"
        )
    else:
        why = words.get(state, f"Slurm's state {state} (reason: {reason})")
    at = _when(fields.get("EndTime", ""), today)
    return Ending(job_id, at, state, why, fields.get("StdOut", ""))


def _run(cmd: list[str], timeout: float = 15) -> tuple[int, str]:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        return 1, str(error)
    return done.returncode, done.stdout


def _controller_log() -> str:
    """``SlurmctldLogFile`` from ``scontrol show config``, or ""."""
    code, text = _run(["scontrol", "show", "config"])
    found = (
        re.search(r"^SlurmctldLogFile\s*=\s*(\S+)", text, re.M) if not code else None
    )
    return found.group(1) if found and found.group(1) != "(null)" else ""


def cancelled_by(job_id: str, log: str | None = None) -> int | None:
    """The uid that cancelled job ``job_id`` (sacct, else the controller's log), or
    None."""
    code, text = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"])
    found = re.search(r"CANCELLED by (\d+)", text) if code == 0 else None
    if found:
        return int(found.group(1))
    path = Path(log if log is not None else _controller_log())
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - LOG_TAIL))
            tail = f.read().decode(errors="replace")
    except OSError:
        return None
    kills = re.findall(rf"REQUEST_KILL_JOB JobId={job_id} uid (\d+)", tail)
    return int(kills[-1]) if kills else None


def ending_of(job_id: str, owner: str, admin: str = "") -> Ending:
    """Ask Slurm how job ``job_id`` of ``owner`` ended, and who cancelled it.

    Example:
        >>> ending_of("17", "learner01").sentence()   # doctest: +SKIP
        "Your server's Slurm job 17 ended at 14:05: it was cancelled (scancel by you)."
    """
    code, text = _run(["scontrol", "show", "job", job_id])
    fields = parse_job(text) if code == 0 else {}
    if fields.get("JobId") != job_id:
        fields = {"JobId": job_id}
    uid = cancelled_by(job_id) if fields.get("JobState") == "CANCELLED" else None
    return describe(fields, owner, uid, admin)
