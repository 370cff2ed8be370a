"""The node check's compile step: it passes here (gcc is installed) with its warm-up
timed, and a C++ compiler inductor cannot run is named in one line with the fix.
Inductor reads ``$CXX`` (else ``g++`` on the PATH) when it first needs a compiler,
so the failing run points ``CXX`` nowhere, with a cache of its own so that no kernel
compiled before can stand in for the compiler."""

from __future__ import annotations

import pytest

from workshop.instructor.check_compile import explain_compile_error


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
        (
            "InductorError: CppCompileError: C++ compile error\n\nCommand:\ng++ "
            "x.cpp -O3\n\nOutput:\ng++: fatal error: cannot execute 'cc1plus': "
            "execvp: No such file or directory\ncompilation terminated.",
            "g++ cannot compile for inductor: cannot execute 'cc1plus': execvp: No "
            "such file or directory",
        ),
        ("ValueError: something else\nmore", "torch.compile failed: ValueError: "),
    ],
)
def test_compile_errors_read_as_one_line(error, missing):
    said, fix = explain_compile_error(error)
    assert said.startswith(missing) and "\n" not in said and fix
