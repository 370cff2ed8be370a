"""What Slurm prints, read as Slurm means it: a job's state, from ``scontrol`` and
``sacct``, and its time limit (``--time``, notebook 03, section 6). Plain parsing,
no subprocess (:mod:`workshop.cluster.slurm` runs the commands), so it is tested
without a Slurm.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .arguments import check_count

#: States after which a job does not run again (unless someone requeues it).
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
        "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT",
    }
)  # fmt: skip

# A key of `scontrol show job -o`: "JobState", "AllocNode:Sid", "CPUs/Task".
_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w:/]*)=")


@dataclass(frozen=True)
class JobStatus:
    """Where a Slurm job stands.

    Attributes:
        job_id: the job's id.
        state: Slurm's state (PENDING, RUNNING, ...) or UNKNOWN.
        reason: why it is pending or ended so, or why the state is UNKNOWN.
        nodes: the nodes it runs or ran on ("" while pending).
        exit_code: the batch script's exit code, once it ended.
        signal: the signal that ended it (15 for a cancelled job), else 0.
        elapsed: seconds it ran.
        source: "scontrol", "sacct", "forgotten" (by both) or "error" (scontrol
            failed; asking again may work).
    """

    job_id: str
    state: str
    reason: str = ""
    nodes: str = ""
    exit_code: int | None = None
    signal: int = 0
    elapsed: float | None = None
    source: str = "scontrol"

    @property
    def finished(self) -> bool:
        """True once the job ended, or Slurm cannot say more about it."""
        return self.state in FINAL_STATES or self.source == "forgotten"

    def line(self) -> str:
        """One line for a learner: ``job 12: PENDING (Resources)``, ``job 12:
        RUNNING on vm``, ``job 12: COMPLETED, exit code 0, in 4 s``."""
        text = f"job {self.job_id}: {self.state}"
        if self.reason:
            text += f" ({self.reason})"
        if self.state in FINAL_STATES:
            if self.signal:
                text += f", ended by signal {self.signal}"
            elif self.exit_code is not None:
                text += f", exit code {self.exit_code}"
            if self.elapsed is not None:
                text += f", in {format_seconds(self.elapsed)}"
        elif self.nodes:
            text += f" on {self.nodes}"
        return text


def parse_scontrol(text: str) -> dict[str, str]:
    """The ``Key=Value`` pairs of one line of ``scontrol show job -o``.

    A value runs to the next `` Key=``: spaces and ``=`` inside are kept.

    Example:
        >>> parse_scontrol("JobId=7 JobState=PENDING Reason=Resources TRES=cpu=2")
        {'JobId': '7', 'JobState': 'PENDING', 'Reason': 'Resources', 'TRES': 'cpu=2'}
    """
    text = text.strip()
    matches = list(_KEY.finditer(text))
    ends = [m.start() for m in matches[1:]] + [len(text)]
    return {
        m.group(1): text[m.end() : end].strip()
        for m, end in zip(matches, ends, strict=False)  # no match: no pairs
    }


def parse_seconds(text: str) -> float | None:
    """Seconds in a Slurm duration: ``SS``, ``MM:SS``, ``HH:MM:SS``, ``D-HH:MM:SS``
    (fractions allowed); None for "Unknown", "INVALID" or "".

    Example:
        >>> parse_seconds("1-02:00:05")
        93605.0
    """
    match = re.fullmatch(r"(?:(\d+)-)?(?:(?:(\d+):)?(\d+):)?(\d+(?:\.\d+)?)", text)
    if not match:
        return None
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def format_seconds(seconds: float) -> str:
    """``4 s``, ``2 min 5 s``, ``1 h 3 min``: a duration for a person."""
    seconds = round(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _exit(text: str) -> tuple[int | None, int]:
    """Slurm's ``EXIT:SIGNAL`` (``0:0``, ``1:0``, ``0:15``)."""
    code, _, sig = text.partition(":")
    if not code.isdigit():
        return None, 0
    return int(code), int(sig) if sig.isdigit() else 0


def status_from_scontrol(job_id: str, text: str) -> JobStatus | None:
    """The status in ``scontrol show job -o JOB`` output, or None if it has no line
    for ``job_id``."""
    for line in text.splitlines():
        pairs = parse_scontrol(line)
        if pairs.get("JobId") != str(job_id):
            continue
        reason, nodes = pairs.get("Reason", ""), pairs.get("NodeList", "")
        return _status(
            job_id,
            pairs.get("JobState", "UNKNOWN"),
            pairs.get("ExitCode", ""),
            "scontrol",
            reason="" if reason in ("None", "(null)") else reason,
            nodes="" if nodes == "(null)" else nodes,
            elapsed=parse_seconds(pairs.get("RunTime", "")),
        )
    return None


def _status(job_id: str, state: str, exit: str, source: str, **more) -> JobStatus:
    """A status whose exit code and signal count once the job is final."""
    code, sig = _exit(exit)
    code, sig = (code, sig) if state in FINAL_STATES else (None, 0)
    return JobStatus(
        str(job_id), state, exit_code=code, signal=sig, source=source, **more
    )


def status_from_sacct(job_id: str, text: str) -> JobStatus | None:
    """The status in ``sacct -j JOB -n -P -X -o JobID,State,ExitCode,Elapsed,
    NodeList`` output, or None if it has no line for ``job_id``."""
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 5 or parts[0] != str(job_id):
            continue
        state = parts[1].split()[0] if parts[1].strip() else "UNKNOWN"  # "... by 0"
        nodes = "" if parts[4] in ("None assigned", "(null)") else parts[4]
        return _status(
            job_id,
            state,
            parts[2],
            "sacct",
            nodes=nodes,
            elapsed=parse_seconds(parts[3]),
        )
    return None


_FORMS = "M, M:S, H:M:S, D-H, D-H:M or D-H:M:S (e.g. 30, 0-10:05, 24:00:00)"


def time_limit_minutes(text: str) -> int:
    """The whole minutes that Slurm gives a job for ``--time=text``.

    Args:
        text: a ``--time`` value, e.g. ``"0-10:05"`` (days-hours:minutes).

    Returns:
        Minutes, seconds rounded up as Slurm does (``"5:30"`` gives 6).

    Raises:
        ValueError: not one of Slurm's six forms (M, M:S, H:M:S, D-H, D-H:M,
            D-H:M:S).

    Example:
        >>> time_limit_minutes("0-10:05"), time_limit_minutes("5:30")
        (605, 6)
    """
    if not isinstance(text, str) or not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", text):
        raise ValueError(
            f"--time={text!r} is not a Slurm time limit; use one of {_FORMS}"
        )
    days_text, _, clock = text.rpartition("-")
    days = int(days_text) if days_text else 0
    parts = [int(p) for p in clock.split(":")]
    if days_text:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = ([*parts, 0, 0])[:3]
    elif len(parts) == 3:  # H:M:S
        hours, minutes, seconds = parts
    else:  # M, M:S
        hours, (minutes, seconds) = 0, ([*parts, 0])[:2]
    total_seconds = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return -(-total_seconds // 60)


def scontrol_time_limit(minutes: int) -> str:
    """A limit of ``minutes`` as ``scontrol show job`` prints its ``TimeLimit``.

    Args:
        minutes: whole minutes, 0 or more.

    Returns:
        ``"HH:MM:SS"`` below a day, ``"D-HH:MM:SS"`` from a day on.

    Raises:
        ValueError: ``minutes`` is not a whole number of 0 or more.

    Example:
        >>> scontrol_time_limit(605), scontrol_time_limit(1440)
        ('10:05:00', '1-00:00:00')
    """
    check_count("minutes", minutes, 0, "time_limit_minutes('0-10:05')")
    days, rest = divmod(minutes, 24 * 60)
    clock = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{clock}" if days else clock
