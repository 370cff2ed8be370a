"""The notebooks' stored outputs were recorded whole, on a quiet machine (`make
record`, scripts/record.py), and the recorder does what it says.

1. Each notebook of notebooks/: its code cells' execution counts are exactly 1, 2,
   3, ... (one kernel, top to bottom, no cell re-run alone), its metadata holds the
   recording with every field, not busy, of the code it holds now. A notebook
   recorded with --busy-ok fails here: the issue asks for a quiet machine.
2. The recorder, on a tiny notebook in a temporary folder (seconds, on any
   machine; the quiet check and the monitor are stood in for where a test needs the
   machine busy or quiet): counts 1..N, outputs of one kernel started in
   notebooks/, widget state kept, metadata written; nothing written when the
   machine was busy before or during the run, a cell failed, or the file changed;
   written and marked busy with --busy-ok; its CPU accounting tells the notebook's
   processes from others. nbval accepts a recorded notebook.
3. docs/notebooks.md's table is what `scripts/record.py --table` prints.
4. An unknown notebook is refused in one line that names it and what exists.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import ClassVar

import pytest
from conftest import ROOT, clean_env


def _load_recorder():
    spec = importlib.util.spec_from_file_location(
        "workshop_record", ROOT / "scripts" / "record.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


record = _load_recorder()
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


# --- 1. the notebooks were recorded whole ------------------------------------------


def _source(cell: dict) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def recording_problems(path: Path) -> list[str]:
    """What is wrong with ``path`` as a whole, quiet recording ([] when nothing)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    name = path.name
    fix = f"run make record NOTEBOOK={name[:2]} on a quiet machine"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    run = [c for c in code if _source(c).strip()]
    counts = [c.get("execution_count") for c in run]
    problems = []
    wrong = next((i for i, n in enumerate(counts) if n != i + 1), None)
    if wrong is not None:
        problems.append(
            f"{name}: code cell {wrong + 1} of {len(run)} (id {run[wrong].get('id')}) "
            f"has execution count {counts[wrong]}, not {wrong + 1} (counts from "
            f"there: {counts[wrong : wrong + 8]}): not recorded whole in one kernel; "
            + fix
        )
    stray = [
        c.get("id")
        for c in code
        if not _source(c).strip() and c.get("execution_count") is not None
    ]
    if stray:
        problems.append(f"{name}: empty code cells {stray} have a count; {fix}")
    rec = nb.get("metadata", {}).get("workshop", {}).get("recording")
    if not rec:
        problems.append(
            f"{name}: no recording in its metadata ('workshop' > 'recording'); {fix}"
        )
        return problems
    missing = [f for f in record.REQUIRED_FIELDS if f not in rec]
    missing += [
        f"machine.{f}" for f in record.MACHINE_FIELDS if f not in rec.get("machine", {})
    ]
    if missing:
        problems.append(f"{name}: its recording lacks {missing}; {fix}")
        return problems
    if rec["busy"] is not False:
        reasons = "; ".join(rec.get("busy_reasons", [])) or "no reason kept"
        problems.append(f"{name}: recorded on a busy machine ({reasons}); {fix}")
    if set(rec["cell_seconds"]) != {c.get("id") for c in run}:
        problems.append(
            f"{name}: its code cells are not those recorded on {rec['date']} "
            f"(added or removed: "
            f"{sorted(set(rec['cell_seconds']) ^ {c.get('id') for c in run})}); " + fix
        )
    elif rec["code_sha256"] != record.code_sha256(nb):
        problems.append(
            f"{name}: its code changed since it was recorded on {rec['date']}; " + fix
        )
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_each_notebook_was_recorded_whole_on_a_quiet_machine(path):
    problems = recording_problems(path)
    assert not problems, "\n".join(problems)


def test_there_are_the_five_notebooks_to_check():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05"]


# --- 2. the recorder, on a tiny notebook ------------------------------------------

CELLS = [
    ("markdown", "m0000001", "# A tiny notebook"),
    ("code", "c0000001", "import os\nx = 41"),
    # x from the cell above: the same kernel. Where it runs: notebooks/.
    ("code", "c0000002", "print(x + 1)\nprint(os.getcwd())"),
    ("code", "c0000003", "print(os.environ.get('OMP_WAIT_POLICY'))"),
    ("code", "c0000004", "import ipywidgets\nipywidgets.IntSlider(value=3)"),
    ("code", "c0000005", ""),
]


def _notebook(path: Path, cells=CELLS) -> Path:
    nb = {
        "cells": [
            {
                "cell_type": kind,
                "id": cell_id,
                "metadata": {"tags": ["nbval-ignore-output"]}
                if "getcwd" in src
                else {},
                "source": src,
                **(
                    {"execution_count": 7 - i, "outputs": [_stale()]}
                    if kind == "code" and src
                    else {"execution_count": None, "outputs": []}
                    if kind == "code"
                    else {}
                ),
            }
            for i, (kind, cell_id, src) in enumerate(cells)
        ],
        "metadata": {
            "kernelspec": {
                "display_name": "Python 3",
                "language": "python",
                "name": "python3",
            }
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return path


def _stale() -> dict:
    return {"name": "stdout", "output_type": "stream", "text": ["stale\n"]}


def _quiet(*reasons: str):
    def check():
        return record.Quiet(
            load_1min=0.1,
            cores=2,
            others_cores=0.0,
            busiest=[],
            steal_percent=0.0,
            seconds=2.0,
            reasons=list(reasons),
        )

    return check


class _Monitor:
    """Stands in for the monitor: says busy or quiet, and whether it was started."""

    started: ClassVar[list[str]] = []

    def __init__(self, *reasons: str):
        self.reasons = list(reasons)

    def __call__(self, marker: str):
        _Monitor.started.append(marker)
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def stop(self):
        return record.During(load_mean=1.0, load_max=2.0, reasons=self.reasons)


def _machine(env: dict[str, str]) -> dict:
    return {field: f"stub {field}" for field in record.MACHINE_FIELDS} | {
        "cores": 2,
        "affinity": 2,
        "torch_threads": 2,
        "gpus": [],
        "aten_cpu_capability": "AVX2",
    }


def _record(path: Path, lines: list[str] | None = None, **kwargs):
    kwargs = {
        "check": _quiet(),
        "monitor": _Monitor(),
        "machine": _machine,
        "out": (lines if lines is not None else []).append,
        "timeout": 60,
        **kwargs,
    }
    return record.record_notebook(path, **kwargs)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A tiny notebook named as notebooks/ names them, recorded on a quiet machine;
    and what the recorder printed."""
    path = _notebook(tmp_path_factory.mktemp("recorded") / "01_tiny.ipynb")
    lines: list[str] = []
    _record(path, lines)
    return path, lines


def test_a_recording_runs_every_cell_in_order_in_one_kernel(recorded):
    path, _ = recorded
    nb = json.loads(path.read_text())
    cells = {c["id"]: c for c in nb["cells"]}
    assert [c["id"] for c in nb["cells"]] == [cell_id for _, cell_id, _ in CELLS]
    counts = [c.get("execution_count") for c in nb["cells"] if c["cell_type"] == "code"]
    assert counts == [1, 2, 3, 4, None]
    out = "".join(cells["c0000002"]["outputs"][0]["text"])
    assert out == f"42\n{ROOT / 'notebooks'}\n"  # one kernel, started in notebooks/
    policy = "".join(cells["c0000003"]["outputs"][0]["text"]).strip()
    assert policy == os.environ.get("OMP_WAIT_POLICY", "PASSIVE")  # as make test
    state = nb["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]
    assert any(model["state"].get("value") == 3 for model in state["state"].values()), (
        "the slider's state is kept in the notebook's metadata"
    )
    # Written as nbformat writes a notebook, one the repo's edits keep as it is.
    text = path.read_text()
    assert text == json.dumps(json.loads(text), indent=1, ensure_ascii=False) + "\n"
    assert "stale" not in text


def test_a_recording_says_each_cell_and_what_it_ran_on(recorded):
    path, lines = recorded
    rec = json.loads(path.read_text())["metadata"]["workshop"]["recording"]
    assert set(record.REQUIRED_FIELDS) <= set(rec)
    assert rec["busy"] is False and rec["busy_reasons"] == []
    assert rec["machine"] == _machine({})
    assert list(rec["cell_seconds"]) == [f"c000000{i}" for i in (1, 2, 3, 4)]
    assert rec["seconds"] == pytest.approx(sum(rec["cell_seconds"].values()), abs=0.1)
    assert rec["environment"]["OMP_WAIT_POLICY"]
    assert rec["during"]["load_max"] == 2.0 and rec["before"]["load_1min"] == 0.1
    # One line per code cell as it runs (its count, position, id and time), then a
    # summary with the slowest.
    said = [re.search(r"\[ *(\d+)\] cell +(\d+) +(\S+) +[\d.]+ s", ln) for ln in lines]
    said = [m.groups() for m in said if m]
    assert said == [
        (str(n), str(n), cell_id) for n, cell_id in enumerate(rec["cell_seconds"], 1)
    ]
    (summary,) = [ln for ln in lines if "slowest:" in ln]
    assert "4 code cells" in summary
    assert recording_problems(path) == []


def test_the_check_of_whole_recordings_finds_what_is_wrong(recorded, tmp_path):
    path, _ = recorded
    nb = json.loads(path.read_text())
    # A cell re-run alone: its count repeats.
    nb["cells"][2]["execution_count"] = 1
    broken = tmp_path / "02_broken.ipynb"
    broken.write_text(json.dumps(nb))
    (problem,) = recording_problems(broken)
    assert "code cell 2 of 4 (id c0000002) has execution count 1, not 2" in problem
    assert "run make record NOTEBOOK=02" in problem
    # Code changed since the recording; and a notebook never recorded.
    nb["cells"][2]["execution_count"] = 2
    nb["cells"][1]["source"] = "import os\nx = 40"
    broken.write_text(json.dumps(nb))
    assert "its code changed since" in " ".join(recording_problems(broken))
    never = _notebook(tmp_path / "03_never.ipynb")
    problems = " ".join(recording_problems(never))
    assert "has execution count 6, not 1" in problems
    assert "no recording in its metadata" in problems


def test_a_busy_machine_before_the_run_is_refused_and_nothing_runs(tmp_path):
    path = _notebook(tmp_path / "01_tiny.ipynb")
    before = path.read_bytes()
    _Monitor.started.clear()
    with pytest.raises(record.RecordError, match=r"busy \(other processes used 1\.90"):
        _record(path, check=_quiet("other processes used 1.90 cores, above 0.20"))
    assert path.read_bytes() == before
    assert _Monitor.started == [], "no kernel started on a busy machine"


def test_a_machine_busy_during_the_run_is_refused_and_nothing_written(tmp_path):
    path = _notebook(tmp_path / "01_tiny.ipynb")
    before = path.read_bytes()
    busy = "steal 9.0%, above 5%"
    with pytest.raises(record.RecordError, match=r"busy while it ran.*--busy-ok"):
        _record(path, monitor=_Monitor(busy))
    assert path.read_bytes() == before


def test_busy_ok_writes_and_marks_the_notebook_busy(tmp_path):
    path = _notebook(tmp_path / "01_tiny.ipynb", CELLS[:3])
    reason = "load 3.00 over the last minute, above 1.00 (0.5 per core)"
    rec = _record(path, check=_quiet(reason), busy_ok=True)
    stored = json.loads(path.read_text())["metadata"]["workshop"]["recording"]
    assert rec == stored and stored["busy"] is True
    assert stored["busy_reasons"] == [reason]
    (problem,) = recording_problems(path)
    assert "recorded on a busy machine (load 3.00" in problem


def test_a_cell_that_raises_fails_the_recording_and_leaves_the_notebook(tmp_path):
    cells = [*CELLS[:2], ("code", "c0000009", "1 / 0"), CELLS[2]]
    path = _notebook(tmp_path / "01_tiny.ipynb", cells)
    before = path.read_bytes()
    with pytest.raises(
        record.RecordError, match=r"cell 2 \(c0000009\) failed: ZeroDivisionError"
    ):
        _record(path)
    assert path.read_bytes() == before


def test_a_notebook_edited_while_it_runs_is_not_written(tmp_path):
    path = _notebook(tmp_path / "01_tiny.ipynb", CELLS[:2])
    edit = f"open({str(path)!r}, 'a').write(' ')"  # someone saves it meanwhile
    cells = [*CELLS[:2], ("code", "c0000008", edit)]
    _notebook(path, cells)
    with pytest.raises(record.RecordError, match="changed while it ran"):
        _record(path)


def test_nbval_accepts_a_recorded_notebook(recorded, tmp_path):
    path, _ = recorded
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--nbval",
            "--nbval-current-env",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            str(copy),
        ],
        cwd=tmp_path,
        # As make test runs it; the notebook prints the policy it was recorded with.
        env=clean_env(OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout


def test_the_machine_is_described_as_the_kernel_sees_it():
    env = record.kernel_env("test") | {"OMP_NUM_THREADS": "1"}
    machine = record.describe_machine(env)
    assert set(record.MACHINE_FIELDS) <= set(machine)
    assert machine["torch_threads"] == 1  # the kernel's environment counts
    assert machine["cores"] == os.cpu_count()
    assert 1 <= machine["affinity"] <= machine["cores"]
    assert machine["python"] == platform.python_version()  # the kernel is this Python
    import torch

    assert machine["torch"] == torch.__version__
    assert machine["aten_cpu_capability"] == torch.backends.cpu.get_cpu_capability()


# --- the recorder's CPU accounting ---------------------------------------------------


def _proc(pid, ppid, own, children=0, start=1):
    return record.Proc(pid, ppid, f"p{pid}", own, children, start)


def test_cpu_used_counts_reaped_children_once():
    before = {
        1: _proc(1, 0, 0),
        10: _proc(10, 1, 5),  # a shell
        11: _proc(11, 10, 1),  # its subshell
        12: _proc(12, 11, 300),  # and the subshell's pytest, 3 s in already
        20: _proc(20, 1, 50),
    }
    # The pytest used 0.2 s more and ended, then the subshell: the shell's children
    # time grows by all of their lives. Only what was not seen counts. Process 20
    # was replaced by another with its pid; 30 is new.
    after = {
        1: _proc(1, 0, 0),
        10: _proc(10, 1, 5, children=1 + 320),
        20: _proc(20, 1, 7, start=2),
        30: _proc(30, 1, 4, children=2),
    }
    assert record.cpu_used(before, after) == {1: 0, 10: 20, 20: 7, 30: 6}
    # Init reaped an orphan never seen (a job's task that lived between two samples):
    # whose it was cannot be told, so only init's own time counts.
    after[1] = _proc(1, 0, 3, children=500)
    assert record.cpu_used(before, after)[1] == 3


def _spin(seconds: float, env: dict[str, str], orphan: bool) -> int:
    """The pid of a Python spinning for ``seconds``: a child of this process, or an
    orphan (its parent, a shell, ends at once), as another user's work or a daemon
    the notebook started is."""
    code = f"import time\nt = time.time()\nwhile time.time() - t < {seconds}: pass"
    if not orphan:
        return subprocess.Popen([sys.executable, "-c", code], env=env).pid
    done = subprocess.run(
        ["sh", "-c", '"$0" -c "$1" >/dev/null 2>&1 & echo $!', sys.executable, code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return int(done.stdout)


def test_the_monitor_counts_other_work_and_not_the_notebooks():
    marker = uuid.uuid4().hex
    plain = {k: v for k, v in os.environ.items() if k != record.MARKER}
    # The kernel is a child of the recorder; a daemon the notebook starts (the
    # private cluster's) carries the marker; other work carries neither.
    child = _spin(1.5, plain, orphan=False)
    daemon = _spin(1.5, {**plain, record.MARKER: marker}, orphan=True)
    other = _spin(1.5, plain, orphan=True)
    try:
        with record.Monitor(marker, interval=0.3) as monitor:
            time.sleep(1.0)
            during = monitor.stop()
    finally:
        for pid in (child, daemon, other):
            try:
                os.kill(pid, 9)
            except OSError:
                pass  # ended already
        os.waitpid(child, 0)
    assert child not in monitor.cpu_seconds
    assert daemon not in monitor.cpu_seconds
    assert monitor.cpu_seconds.get(other, 0) > 0.05, monitor.cpu_seconds
    assert during.samples >= 2 and during.load_max > 0
    assert during.others_cores_mean > 0


def test_the_step_daemons_of_the_notebooks_own_cluster_are_the_notebooks(monkeypatch):
    # slurmd leaves each job step's slurmstepd to init, without the marker: where
    # the notebook runs the Slurm daemons, the step daemons and their tasks are its
    # work; where it does not (a real cluster's node), they are other work.
    marker = "m"
    marked = {30}
    monkeypatch.setattr(record, "_marked", lambda pid, m: pid in marked)
    here = os.getpid()
    procs = {
        1: record.Proc(1, 0, "init", 0, 0, 1),
        here: record.Proc(here, 1, "python", 0, 0, 1),
        30: record.Proc(30, 1, "slurmd", 0, 0, 1),
        40: record.Proc(40, 1, "slurmstepd", 0, 0, 1),
        41: record.Proc(41, 40, "python3", 0, 0, 1),
        50: record.Proc(50, 1, "other", 0, 0, 1),
    }
    others = record._Others(marker).pick(procs)
    assert {40, 41, 30} & others == set() and 50 in others
    marked.clear()  # the daemons are not the notebook's
    others = record._Others(marker).pick(procs)
    assert {30, 40, 41, 50} <= others


# --- 3. the table of docs/notebooks.md --------------------------------------------


def test_the_docs_table_is_what_the_recordings_print():
    block = record.docs_block(record.DOCS_PAGE.read_text(encoding="utf-8"))
    assert block is not None, (
        f"docs/notebooks.md has no {record.TABLE_START} ... {record.TABLE_END} block"
    )
    assert block == record.table_markdown(), (
        "docs/notebooks.md's table of recordings is not what the notebooks' metadata "
        "says: run make record-table"
    )


def test_the_table_says_each_recording(recorded, tmp_path):
    path, _ = recorded
    (tmp_path / path.name).write_bytes(path.read_bytes())
    _notebook(tmp_path / "02_never.ipynb")
    table = record.table_markdown(tmp_path).splitlines()
    assert table[0].startswith("| notebook | cells run | slowest cell | machine |")
    rec = json.loads(path.read_text())["metadata"]["workshop"]["recording"]
    slowest = max(rec["cell_seconds"], key=rec["cell_seconds"].get)
    position = [c["id"] for c in json.loads(path.read_text())["cells"]].index(slowest)
    assert table[2].startswith(f"| 01 | {rec['seconds']:.1f} s | cell {position} ")
    assert f"(`{slowest}`)" in table[2]
    assert "stub cpu, AVX2, 2 cores, 2 threads, no GPU | stub torch |" in table[2]
    assert table[2].endswith(f"| {rec['date']} | no |")
    assert table[3] == "| 02 | not recorded with `make record` | | | | | |"
    assert len(table) == 4, "no total while a notebook is not recorded"
    page = "intro\n" + record.TABLE_START + "\nold\n" + record.TABLE_END + "\nrest\n"
    new = record.replace_block(page, "\n".join(table) + "\n")
    assert record.docs_block(new) == "\n".join(table) + "\n"
    assert new.startswith("intro\n") and new.endswith(record.TABLE_END + "\nrest\n")
    with pytest.raises(record.RecordError, match="no block between"):
        record.replace_block("no markers here", "")


# --- 4. bad input ---------------------------------------------------------------------


def test_notebooks_are_found_by_number_name_or_path(tmp_path):
    first = ROOT / "notebooks" / "01_single_node_multi_gpu.ipynb"
    assert record.resolve_notebooks(["01"]) == [first]
    assert record.resolve_notebooks(["1"]) == [first]
    assert record.resolve_notebooks(["01_single_node_multi_gpu"]) == [first]
    copy = _notebook(tmp_path / "anything.ipynb")
    assert record.resolve_notebooks([str(copy)]) == [copy.resolve()]
    assert record.resolve_notebooks([]) == NOTEBOOKS


def _recorder(*args: str) -> subprocess.CompletedProcess:
    """scripts/record.py run as make record runs it, with ``args``."""
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "record.py"), *args],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("name", ["07", "single", "missing.ipynb"])
def test_an_unknown_notebook_is_refused_in_one_line(name):
    done = _recorder(name)
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert f"no notebook '{name}'" in line
    assert "01, 02, 03, 04, 05" in line and ".ipynb" in line


def test_a_timeout_that_is_not_above_zero_is_refused():
    done = _recorder("--timeout", "0", "01")
    assert done.returncode == 2
    assert "argument --timeout: 0 is not a number of seconds above 0" in done.stderr


def test_the_kernel_compiles_into_an_empty_inductor_cache(monkeypatch):
    # Inductor's cache outlives processes: a recording must not show the warm-up of
    # whatever compiled on the machine before it. One the caller set is kept.
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    env = record.kernel_env("m", "/tmp/empty")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/empty"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/scratch/mine")
    assert record.kernel_env("m", "/tmp/empty")["TORCHINDUCTOR_CACHE_DIR"] == (
        "/scratch/mine"
    )
