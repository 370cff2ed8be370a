"""The node check's compile step: it passes here (gcc is installed) with its warm-up
timed, and a C++ compiler inductor cannot run is named in one line with the fix.
Inductor reads ``$CXX`` (else ``g++`` on the PATH) when it first needs a compiler,
so the failing run points ``CXX`` nowhere, with a cache of its own so that no kernel
compiled before can stand in for the compiler."""

from __future__ import annotations

import io

import pytest

from workshop.env import visible_gpu_count
from workshop.instructor.check_compile import explain_compile_error
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


@pytest.mark.parametrize(
    ("error", "missing"),
    [
        (
            "InductorError: InvalidCxxCompiler: No working C++ compiler found",
            "no C++ compiler for inductor: g++ is not on the PATH",
        ),
        (
            "RuntimeError: ptxas fatal: Unsupported .version 8.7",
            "Triton could not run ptxas, the CUDA toolchain's assembler",
        ),
        (
            "RuntimeError: Failed to find C compiler. Please specify via CC",
            "no C compiler for Triton's launcher (cc, gcc)",
        ),
        ("ValueError: something else\nmore", "torch.compile failed: ValueError: "),
    ],
)
def test_compile_errors_read_as_one_line(error, missing):
    said, fix = explain_compile_error(error)
    assert said.startswith(missing) and "\n" not in said and fix
