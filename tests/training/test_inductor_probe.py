"""Whether inductor can compile for this CPU is found by compiling a tiny function,
once a process, not by looking for a compiler's name: a g++ that runs but cannot
compile (its back end, cc1plus, out of its reach: issue 45's offline node) is named
in one line; train(compile=True) raises that line; notebook 01's lesson traces with
aot_eager instead. A compiler that is not there at all is said without compiling.

Inductor reads ``$CXX`` when it is first imported, so a compiler that cannot compile
is put first on the PATH of a fresh Python, with an empty temporary folder (inductor's
caches and precompiled headers are kept under it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import repo_env

import workshop
from workshop.training import compiled

# g++ as a node has it when its back end is missing: --version answers, a compile
# does not. Each call is logged, so that the test sees a compile was tried.
BROKEN_GXX = """#!/bin/sh
echo "$*" >> "{log}"
case "$1" in --version|-v) echo "g++ (broken) 12.2.0"; exit 0;; esac
echo "g++: fatal error: cannot execute 'cc1plus': execvp: No such file or directory" >&2
echo "compilation terminated." >&2
exit 1
"""

PROBE = """
import json, sys
import workshop
from workshop.lessons import compile_backend
from workshop.training.compiled import inductor_unavailable

log = sys.argv[1]
compiles = lambda: sum(".cpp" in line for line in open(log))
found = {"why": inductor_unavailable(), "compiles": compiles()}
loader = workshop.make_loader(workshop.digits(), 100, shuffle=False)
try:
    workshop.train(workshop.SmallCNN(), loader, max_steps=2, progress=False,
                   compile=True, device="cpu")
except RuntimeError as error:
    found["error"] = str(error)
backend, found["lesson_why"] = compile_backend()
history = workshop.train(workshop.SmallCNN(), loader, max_steps=2, progress=False,
                         compile=backend, device="cpu")
found.update(backend=backend, compiled_steps=history.compiled_steps,
             compiles_after=compiles())
print(json.dumps(found))
"""


def test_a_compiler_that_cannot_compile_is_named_and_the_lesson_traces(tmp_path):
    bin_dir, log = tmp_path / "bin", tmp_path / "g++.log"
    bin_dir.mkdir()
    gxx = bin_dir / "g++"
    gxx.write_text(BROKEN_GXX.format(log=log))
    gxx.chmod(0o755)
    log.write_text("")
    env = repo_env(PATH=f"{bin_dir}:{repo_env()['PATH']}", TMPDIR=str(tmp_path))
    env.pop("CXX", None)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    run = subprocess.run(
        [sys.executable, "-c", PROBE, str(log)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.splitlines()[-1])
    why = found["why"]
    assert why.startswith(
        "inductor cannot compile for the CPU here: g++ cannot compile: cannot "
        "execute 'cc1plus': execvp: No such file or directory; module load gcc"
    )
    assert "set CXX to a C++ compiler that works" in why and "\n" not in why
    # The probe compiled (the name alone was found), and only once in the process.
    assert found["compiles"] >= 1
    assert found["compiles_after"] == found["compiles"]
    # train(compile=True): one line, the cause, before any step.
    assert found["error"] == f"compile=True: {why}"
    # The lesson's path: it says why and traces with aot_eager.
    assert found["lesson_why"] == why and found["backend"] == "aot_eager"
    assert found["compiled_steps"] == [1]


def test_a_compiler_that_is_not_there_is_said_without_compiling(monkeypatch):
    from torch._inductor import config

    monkeypatch.setattr(compiled, "_ANSWERS", {})

    def no_probe(compiler):
        raise AssertionError(f"probed {compiler}, which is not there")

    monkeypatch.setattr(compiled, "_probe_inductor", no_probe)
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    # Inductor read $CXX when it was imported: its config is told the same here
    # (config.patch, torch's own way; it restores the value after).
    with config.patch({"cpp.cxx": (None, "/nonexistent/g++")}):
        why = compiled.inductor_unavailable()
        assert why.startswith(
            "inductor cannot compile for the CPU here: CXX=/nonexistent/g++ is not a "
            "program here; module load gcc (on a cluster) or apt-get install g++"
        )
        with pytest.raises(RuntimeError) as raised:
            loader = workshop.make_loader(workshop.digits(), 100, shuffle=False)
            workshop.train(workshop.SmallCNN(), loader, compile=True, device="cpu")
        assert str(raised.value) == f"compile=True: {why}"

    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", "/nowhere")
    with config.patch({"cpp.cxx": (None, "g++")}):
        assert compiled.inductor_unavailable().startswith(
            "inductor cannot compile for the CPU here: g++ is not a program on the "
            "PATH; "
        )


def _compiler_here() -> str | None:
    name = compiled._configured_compiler().split()[0]
    return None if shutil.which(name) else f"no C++ compiler here ({name})"


@pytest.mark.skipif(_compiler_here() is not None, reason=str(_compiler_here()))
def test_this_machines_compiler_compiles(monkeypatch):
    monkeypatch.setattr(compiled, "_ANSWERS", {})
    assert compiled.inductor_unavailable() is None
    # Kept for the process: asked again, it does not compile again.
    monkeypatch.setattr(compiled, "_probe_inductor", lambda c: "probed again")
    assert compiled.inductor_unavailable() is None


@pytest.mark.parametrize(
    ("output", "line"),
    [
        (
            "g++: fatal error: cannot execute \u2018cc1plus\u2019: execvp: No such "
            "file or directory\ncompilation terminated.",
            "cannot execute 'cc1plus': execvp: No such file or directory",
        ),
        (
            "In file included from x.cpp:1:\nx.h:3:10: fatal error: omp.h: No such "
            "file or directory",
            "omp.h: No such file or directory",
        ),
        ("/usr/bin/ld: cannot find -lgomp\ncollect2: error: ld returned 1 exit",
         "cannot find -lgomp"),
        ("all fine\n", None),
    ],
)  # fmt: skip
def test_the_compilers_first_error_is_read_from_its_output(output, line):
    assert compiled.compiler_error_line(output) == line
