"""The slow tests of test_recording.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: real recordings in a
kernel."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import time
import uuid

import pytest
from conftest import ROOT, clean_env
from test_recording import (
    CELLS,
    _machine,
    _notebook,
    _record,
    record,
    recording_problems,
)


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
