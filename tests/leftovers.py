"""What a test run left in the machine's temporary folders (issue 47: "nothing left
behind"): the entries of /tmp, /var/tmp and /dev/shm are listed when the run starts
and again when it ends (tests/conftest.py); a new one this user owns whose name is one
the suite's programs give (``MADE_BY``: torchrun, torch.compile, Open MPI, Python's
tempfile, Jupyter, the workshop) fails the run, named with what makes such entries and
the tests that ran when it was made. pytest's own ``pytest-of-<user>`` folders are
not counted: pytest keeps the last few runs' tmp_path folders there on purpose.

Only entries the run can have made count. Another user's are not; nor are names no
program of the suite gives (an editor's, a desktop's: listed, not failed on). And
where another run of this user was going on at the same time (another pytest, a
notebook kernel, a torchrun or an mpirun: ``other_runs``), the run cannot tell its
entries from the other's, so it lists them and says why it did not fail.
"""

from __future__ import annotations

import fnmatch
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pytest

TEMP_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm")
# Folders to compare instead, separated by os.pathsep: folders private to the run
# (a test of this check), which no other process writes in, so other runs do not
# matter there.
FOLDERS_VARIABLE = "WORKSHOP_TEMP_FOLDERS"
PYTEST_BASETEMP = "pytest-of-"  # pytest's basetemp root: /tmp/pytest-of-<user>

# Names the suite's programs give what they put in a temporary folder, and who.
MADE_BY = (
    ("torchelastic_*", "torchrun's log folder (a torchrun without --log-dir)"),
    ("torchinductor_*", "torch.compile's cache (TORCHINDUCTOR_CACHE_DIR unset)"),
    ("ompi.*", "Open MPI 4's session folder (mpirun; OMPI_MCA_orte_tmpdir_base)"),
    ("openmpi-sessions-*", "Open MPI's session folder (mpirun)"),
    ("prte.*", "Open MPI 5's session folder (mpirun; PRTE_MCA_prte_top_session_dir)"),
    ("pmix*", "PMIx's folder (mpirun, srun --mpi=pmix)"),
    ("*_segment.*", "Open MPI's shared memory (vader, sm)"),
    ("workshop*", "the workshop's own temporary folders"),
    ("record-*", "scripts/record.py's folders"),
    ("pymp-*", "multiprocessing's folder"),
    ("sem.mp-*", "a multiprocessing semaphore"),
    ("torch_*", "torch's shared memory (a tensor shared between processes)"),
    ("nccl-*", "NCCL's shared memory"),
    ("kernel-*.json", "a Jupyter kernel's connection file"),
    ("jupyter*", "Jupyter's files"),
    ("tmp*", "Python's tempfile (mkstemp, mkdtemp, NamedTemporaryFile)"),
    ("*.pt.trace.json*", "a profiler trace"),
)
# What a program keeps in the temporary folder on purpose, whatever the suite sets:
# torch.compile's precompiled C++ headers go to <tmp>/torchinductor_<user>/
# precompiled_headers even where TORCHINDUCTOR_CACHE_DIR points elsewhere (torch's
# _inductor/codecache.py: the headers are global, one set per compiler and flags).
# Such an entry, holding that alone, is listed with the reason and not failed on.
KEPT_ON_PURPOSE = (
    ("torchinductor_*", {"precompiled_headers"}, "torch.compile's precompiled headers"),
)
# What may start processes that make such entries, besides this run (other_runs).
_RUNS = re.compile(
    r"pytest|py\.test|ipykernel|nbconvert|nbclient|torchrun|torch\.distributed\."
    r"(?:run|launch)|\bmpirun\b|\bmpiexec\b|\bprterun\b|-m workshop"
)


def temp_folders(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The folders the run is checked in: ``$WORKSHOP_TEMP_FOLDERS`` where set,
    else /tmp, /var/tmp and /dev/shm."""
    given = environ.get(FOLDERS_VARIABLE)
    return tuple(p for p in given.split(os.pathsep) if p) if given else TEMP_FOLDERS


def temp_entries(folders: Iterable[str] = TEMP_FOLDERS) -> dict[str, set[str]]:
    """The names in each of ``folders``. A folder that is missing or cannot be read
    (another user's view of it, as in scripts/test_site.sh's namespaces) is left out,
    and so is never compared."""
    found = {}
    for folder in folders:
        try:
            found[folder] = set(os.listdir(folder))
        except OSError:
            continue
    return found


def left_behind(
    before: Mapping[str, set[str]],
    after: Mapping[str, set[str]],
    uid: int | None = None,
) -> list[str]:
    """Paths in ``after`` that ``before`` did not hold, owned by ``uid`` (default: this
    user), apart from pytest's basetemp folders. Another user's entry (another
    process of the machine) is not the run's; one gone by the time it is looked at
    is not left."""
    uid = os.getuid() if uid is None else uid
    left = []
    for folder in sorted(before.keys() & after.keys()):
        for name in sorted(after[folder] - before[folder]):
            if name.startswith(PYTEST_BASETEMP):
                continue
            path = os.path.join(folder, name)
            try:
                owner = os.lstat(path).st_uid
            except OSError:
                continue
            if owner == uid:
                left.append(path)
    return left


def made_by(path: str) -> str | None:
    """What makes an entry of that name, for a name the suite's programs give;
    None for any other (``MADE_BY``)."""
    name = os.path.basename(path)
    return next((who for glob, who in MADE_BY if fnmatch.fnmatchcase(name, glob)), None)


def made_at(path: str, most: int = 200) -> float:
    """About when ``path`` was made: the oldest modification time of the entry and
    of what it holds (a folder's own time moves with every file added to it), from
    at most ``most`` entries."""
    times = []
    try:
        times.append(os.lstat(path).st_mtime)
        for root, folders, files in os.walk(path):
            for name in folders + files:
                if len(times) >= most:
                    return min(times)
                try:
                    times.append(os.lstat(os.path.join(root, name)).st_mtime)
                except OSError:
                    continue
    except OSError:
        pass
    return min(times) if times else time.time()


@dataclass
class Spans:
    """When each test ran (from its reports: setup's start to teardown's end), to
    name the tests that ran when an entry was made."""

    spans: dict[str, list[float]] = field(default_factory=dict)

    def add(self, nodeid: str, start: float, stop: float) -> None:
        span = self.spans.setdefault(nodeid, [start, stop])
        span[0], span[1] = min(span[0], start), max(span[1], stop)

    def around(self, when: float, slack: float = 1.0, most: int = 3) -> list[str]:
        """The tests running at ``when`` (within ``slack`` s), or else the last one
        that started before it; at most ``most``."""
        running = [
            n for n, (a, b) in self.spans.items() if a - slack <= when <= b + slack
        ]
        if running:
            return sorted(running, key=lambda n: self.spans[n][0])[:most]
        earlier = [n for n, (a, _) in self.spans.items() if a <= when]
        return [max(earlier, key=lambda n: self.spans[n][0])] if earlier else []


def other_runs(own: int | None = None, proc: str = "/proc") -> dict[int, str]:
    """Processes of this user, other than ``own`` (default: this process), its
    ancestors and its descendants, that may make the entries ``MADE_BY`` lists
    (another pytest, a notebook kernel, torchrun, mpirun): pid and command line.
    Empty where /proc cannot be read."""
    own = os.getpid() if own is None else own
    uid, parents, lines = os.getuid(), {}, {}
    try:
        pids = [int(p) for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        try:
            if os.stat(f"{proc}/{pid}").st_uid != uid:
                continue
            with open(f"{proc}/{pid}/stat") as f:
                parents[pid] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"{proc}/{pid}/cmdline", "rb") as f:
                lines[pid] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
    ours, pid = {own}, own
    while pid in parents and parents[pid] not in ours:  # ancestors
        pid = parents[pid]
        ours.add(pid)
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    todo = [own]
    while todo:  # descendants
        for child in children.get(todo.pop(), []):
            if child not in ours:
                ours.add(child)
                todo.append(child)
    return {
        p: line.strip()
        for p, line in lines.items()
        if p not in ours and _RUNS.search(line)
    }


@dataclass
class Verdict:
    """What the check found: ``counted`` (path -> why it is the run's), ``listed``
    (new entries no program of the suite names so), ``others`` (other runs seen
    while it ran); ``failed`` when the run left something and ran alone."""

    counted: dict[str, str]
    listed: list[str]
    others: dict[int, str]
    kept: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return bool(self.counted) and not self.others


def kept_on_purpose(path: str) -> str | None:
    """What keeps ``path`` in the temporary folder on purpose (``KEPT_ON_PURPOSE``),
    or None."""
    name = os.path.basename(path)
    for glob, holds, who in KEPT_ON_PURPOSE:
        if fnmatch.fnmatchcase(name, glob):
            try:
                if set(os.listdir(path)) == holds:
                    return who
            except OSError:
                return None
    return None


def judge(
    left: list[str], times: Spans, others: Mapping[int, str] | None = None
) -> Verdict:
    """Split ``left`` into the entries the run's programs make (with what makes
    them and the tests that ran then) and the rest."""
    counted, listed, kept = {}, [], {}
    for path in left:
        why_kept = kept_on_purpose(path)
        if why_kept:
            kept[path] = why_kept
            continue
        who = made_by(path)
        if who is None:
            listed.append(path)
            continue
        tests = times.around(made_at(path))
        counted[path] = who + (f"; made during {', '.join(tests)}" if tests else "")
    return Verdict(counted, listed, dict(others or {}), kept)


def summary(left: list[str], shown: int = 20) -> list[str]:
    """Lines for the end of the run: how many entries were left, the first
    ``shown`` of them, and how many more."""
    if not left:
        return [f"workshop: the run left nothing new in {', '.join(TEMP_FOLDERS)}"]
    lines = [f"workshop: the run left {len(left)} entries in the temporary folders:"]
    lines += [f"    {path}" for path in left[:shown]]
    if len(left) > shown:
        lines.append(f"    ... and {len(left) - shown} more")
    return lines


def report(verdict: Verdict, folders: Iterable[str], shown: int = 20) -> list[str]:
    """Lines for the end of the run: what it left and what made it, whether that
    failed the run and why not where it did not, and the new entries not counted."""
    where = ", ".join(folders)
    counted = list(verdict.counted.items())
    if not counted:
        lines = [f"workshop: the run left nothing in {where}"]
    elif verdict.failed:
        lines = [
            f"workshop: FAILED: the run left {len(counted)} entries in {where} "
            "(tests/leftovers.py); each should have a folder of its own that is "
            "removed, or be removed by what made it:"
        ]
    else:
        lines = [
            f"workshop: {len(counted)} new entries in {where}, not failed on: "
            f"{len(verdict.others)} other runs of this user went on at the same "
            "time and may have made them (run alone to check):"
        ]
        lines += [
            f"    pid {p}: {c[:100]}" for p, c in list(verdict.others.items())[:5]
        ]
    lines += [f"    {path}: {why}" for path, why in counted[:shown]]
    if len(counted) > shown:
        lines.append(f"    ... and {len(counted) - shown} more")
    for path, who in verdict.kept.items():
        lines.append(
            f"workshop: also new, kept there on purpose by its program whatever the "
            f"suite sets (not failed on): {path}: {who}"
        )
    if verdict.listed:
        names = ", ".join(verdict.listed[:5])
        more = f" and {len(verdict.listed) - 5} more" if len(verdict.listed) > 5 else ""
        lines.append(
            f"workshop: also new, under names none of the suite's programs gives "
            f"(not failed on): {names}{more}"
        )
    return lines


# --- the check, as a pytest plugin: tests/conftest.py registers this module; a run of
# its own takes it with `-p leftovers` (tests/ on PYTHONPATH) --------------------------
_SAMPLE_S = 2.0  # how often other_runs is looked at while the run goes on


@dataclass
class _Run:
    folders: tuple[str, ...]
    before: dict[str, set[str]]
    alone: bool  # folders of the run's own: other runs cannot write in them
    times: Spans = field(default_factory=Spans)
    others: dict[int, str] = field(default_factory=dict)
    sampled: float = 0.0
    verdict: Verdict | None = None

    def sample(self) -> None:
        if not self.alone and time.monotonic() - self.sampled >= _SAMPLE_S:
            self.sampled = time.monotonic()
            self.others.update(other_runs())


_RUN: _Run | None = None  # this process's run, where it is the controller


def _controller(config) -> bool:
    """The process that runs the session: pytest alone, or xdist's controller (its
    workers have ended before its pytest_sessionfinish, so what they left is there
    to see)."""
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session) -> None:
    global _RUN
    if _controller(session.config):
        folders = temp_folders()
        _RUN = _Run(folders, temp_entries(folders), FOLDERS_VARIABLE in os.environ)
        _RUN.sample()


def pytest_runtest_logreport(report) -> None:
    """Each test's span (xdist's workers' reports come to the controller too)."""
    if _RUN is not None:
        stop = getattr(report, "stop", 0.0) or time.time()
        start = getattr(report, "start", 0.0) or stop - report.duration
        _RUN.times.add(report.nodeid, start, stop)
        _RUN.sample()


@pytest.hookimpl(trylast=True)  # after xdist's, which waits for its workers to end
def pytest_sessionfinish(session) -> None:
    if _RUN is None:
        return
    _RUN.sampled = 0.0
    _RUN.sample()  # at the end, whatever the last sample's age
    left = left_behind(_RUN.before, temp_entries(_RUN.folders))
    _RUN.verdict = judge(left, _RUN.times, _RUN.others)
    if _RUN.verdict.failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter) -> None:
    if _RUN is not None and _RUN.verdict is not None:
        for line in report(_RUN.verdict, _RUN.folders):
            terminalreporter.write_line(line, red=_RUN.verdict.failed)
