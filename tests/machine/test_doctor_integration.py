"""The slow tests of test_doctor.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: the doctor in fresh
processes."""

from __future__ import annotations

import subprocess
import sys

import torch
from conftest import repo_env, run_module
from test_doctor import SECTIONS

from workshop.machine.doctor import WIDTH


def test_doctor_leaves_cuda_uninitialised_in_a_fresh_process():
    # A fresh interpreter: another test may have initialised CUDA in this one.
    code = (
        "import io, torch, workshop\n"
        "workshop.doctor(io.StringIO())\n"
        "print('initialised:', torch.cuda.is_initialized())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=repo_env(),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "initialised: False"


def test_python_m_workshop_doctor_prints_the_table_and_exits_0():
    result = run_module("workshop", "doctor", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    for heading in SECTIONS:
        assert f"\n{heading}\n" in result.stdout
    assert torch.__version__ in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= WIDTH


def test_python_m_workshop_without_a_command_exits_2_with_usage():
    result = run_module("workshop", timeout=120)
    assert result.returncode == 2
    assert "usage: python -m workshop" in result.stderr
    assert "doctor" in result.stderr
