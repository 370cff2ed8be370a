"""The slow tests of test_check_node.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: the check's commands and
notebooks run for real."""

from __future__ import annotations

import json
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from conftest import gone, run_module
from test_check_node import GPUS, context

from workshop.instructor import check_steps
from workshop.instructor.check_steps import _run


def test_a_command_past_its_timeout_is_stopped_with_everything_it_started():
    code = textwrap.dedent("""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 start_new_session=True)
        print(child.pid, flush=True)
        time.sleep(60)
    """)
    ran = _run([sys.executable, "-c", code], timeout=3.0)
    assert ran.code is None
    assert gone([int(ran.stdout.split()[0])]) == []


def test_notebooks_run_into_a_copy_and_their_error_cells_are_counted(
    tmp_path, monkeypatch
):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    folder = tmp_path / "notebooks"
    folder.mkdir()
    temp = tmp_path / "tmp"  # the check's temporary folder (and its probes')
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("x = 6 * 7\nprint(x)"),
        nbformat.v4.new_code_cell("raise ValueError('on purpose')"),
        nbformat.v4.new_code_cell("print(x + 1)"),  # runs on after the error
    ]
    source = folder / "01_lesson.ipynb"
    nbformat.write(notebook, source)
    before = source.read_text()
    result = check_steps.step_notebooks(context(tmp_path))
    assert result.status == "FAILED"
    assert result.summary == (
        "01_lesson.ipynb: 1 error cells (first: ValueError: on purpose)"
    )
    assert source.read_text() == before  # the checked-in notebook is untouched
    run = result.figures["notebooks"][0]
    assert run["errors"] == 1 and run["cells"] == 3 and run["seconds"] > 0
    executed = nbformat.read(run["copy"], as_version=4)
    assert executed.cells[2].outputs[0]["text"] == "43\n"
    # The copies are kept to be read, and nothing else (the kernel's connection file)
    kept = Path(result.figures["folder"])
    assert kept.parent == temp and sorted(kept.iterdir()) == [Path(run["copy"])]
    # Fixed, the notebook passes and its copy is not kept.
    del notebook.cells[1]
    nbformat.write(notebook, source)
    result = check_steps.step_notebooks(context(tmp_path))
    assert result.status == "PASS", result.summary
    assert result.figures["notebooks"][0]["errors"] == 0
    assert sorted(temp.iterdir()) == [kept]


def test_a_quick_check_of_this_machine(tmp_path):
    report_file = tmp_path / "check.json"
    run = run_module(
        "workshop",
        "check-node",
        "--quick",
        "--launch-repeats",
        "1",
        "--timeout",
        "240",
        "--json",
        str(report_file),
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "READY: nothing failed" in run.stdout
    steps = {s["name"]: s for s in json.loads(report_file.read_text())["steps"]}
    assert steps["doctor"]["status"] == "PASS"
    launch = steps["launch"]
    assert launch["status"] == "PASS" and launch["seconds"] > 0
    paths = launch["figures"]["paths"]
    assert [(p["asked"], p["took"]) for p in paths] == [
        ("fork", "fork"),
        ("server", "server"),
        ("spawn", "spawn"),
    ]
    assert all(p["first"] > 0 and p["sum_ok"] for p in paths)
    # A fresh process ran a backward pass, then launched: where torch sees no GPU it
    # can still fork; on a GPU node autograd's threads send it to the fork server.
    after = launch["figures"]["after_backward"]
    assert after["sum_ok"], after
    if GPUS == 0:
        assert (after["took"], after["hazard"]) == ("fork", None)
    else:
        assert (after["took"], after["hazard"]) == ("server", "autograd")
    for name in ("gpu-tests", "nccl"):
        if GPUS == 0:
            assert steps[name]["status"] == "SKIPPED"
            assert steps[name]["summary"].startswith("no GPU visible")
        else:
            assert steps[name]["status"] == "PASS", steps[name]
    # torch.compile works here (gcc is installed), its warm-up timed.
    assert steps["compile"]["status"] == "PASS", steps["compile"]
    assert steps["compile"]["figures"]["first_seconds"] > 0
    assert steps["train"]["summary"] == steps["notebooks"]["summary"] == "--quick"


def test_bench_train_bare_and_workshop_loops_both_report_samples_per_second(tmp_path):
    figures = {}
    for loop, extra in (("workshop", []), ("bare", ["--bare"])):
        out = tmp_path / f"{loop}.json"
        run = run_module(
            "workshop.bench",
            "train",
            "--model",
            "smallcnn",
            "--image-size",
            "16",
            "--batch-size",
            "8",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--channels-last",
            *extra,
            "--json",
            str(out),
            timeout=300,
        )
        assert run.returncode == 0, run.stderr
        assert " samples/s (" in run.stdout
        assert (", plain PyTorch loop: " in run.stdout) == (loop == "bare")
        figures[loop] = json.loads(out.read_text())
    for loop in ("workshop", "bare"):
        assert figures[loop]["loop"] == loop
        assert figures[loop]["samples_per_second"] > 0
        assert figures[loop]["batch_size"] == 8 and figures[loop]["steps"] == 2
