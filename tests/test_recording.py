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
import subprocess
import sys
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


def test_the_kernel_keeps_no_record_of_the_lessons(monkeypatch):
    # A recording's checks and cells are not the progress of whoever records: the
    # kernel writes nothing to their ~/.local/share/scaling-pytorch-hpc/, whatever
    # the caller's WORKSHOP_PROGRESS says.
    monkeypatch.setenv("WORKSHOP_PROGRESS", "/home/someone/progress.json")
    assert record.kernel_env("m")["WORKSHOP_PROGRESS"] == "off"
