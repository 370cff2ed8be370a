"""The slow tests of test_check_compile.py (they start processes, kernels or ranks, or
take seconds): make test runs them, make test-fast leaves them out: the compile step run
for real."""

from __future__ import annotations

import io
import os

import pytest

from workshop.env import visible_gpu_count
from workshop.instructor.check_results import FAILED, PASS, TrainSettings
from workshop.instructor.check_steps import Context, step_compile


def _context(tmp_path) -> Context:
    return Context(
        timeout=300.0,
        gpus=visible_gpu_count(),
        root=tmp_path,
        cpu_train=False,
        train=TrainSettings(),
        launch_repeats=1,
        out=io.StringIO(),
    )


def test_compile_step_passes_and_times_the_warm_up(tmp_path):
    step = step_compile(_context(tmp_path))
    assert step.status == PASS, (step.summary, step.figures)
    device = "cuda" if visible_gpu_count() else "cpu"
    assert step.summary.startswith(f"inductor on {device}: warm-up ")
    assert step.figures["first_seconds"] > step.figures["second_seconds"] > 0


def test_a_missing_cxx_compiler_is_named_with_the_fix(tmp_path, monkeypatch):
    if visible_gpu_count():
        pytest.skip("on a GPU inductor writes Triton kernels, not C++")
    nowhere = str(tmp_path / "bin" / "g++")
    monkeypatch.setenv("CXX", nowhere)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    step = step_compile(_context(tmp_path))
    assert step.status == FAILED
    assert step.summary == f"no C++ compiler for inductor: CXX={nowhere} does not run"
    assert step.fix == (
        "module load gcc (on a cluster) or apt-get install g++ (on your own), or "
        "set CXX to a C++ compiler that runs"
    )
    assert "InvalidCxxCompiler" in step.figures["error"]


def test_a_compiler_that_cannot_compile_is_named_with_its_error(tmp_path, monkeypatch):
    # g++ runs (--version answers) but cannot compile: its back end is missing.
    if visible_gpu_count():
        pytest.skip("on a GPU inductor writes Triton kernels, not C++")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gxx = bin_dir / "g++"
    gxx.write_text(
        '#!/bin/sh\ncase "$1" in --version|-v) echo "g++ (broken) 12"; exit 0;; esac\n'
        "echo \"g++: fatal error: cannot execute 'cc1plus': execvp: No such file or "
        'directory" >&2\nexit 1\n'
    )
    gxx.chmod(0o755)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # inductor's caches: none yet
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    step = step_compile(_context(tmp_path))
    assert step.status == FAILED
    assert step.summary == (
        "g++ cannot compile for inductor: cannot execute 'cc1plus': execvp: No such "
        "file or directory"
    )
    assert step.fix.endswith("or set CXX to a C++ compiler that works")
