"""workshop.training.compiled: whether inductor can compile for this CPU is found by
compiling a tiny function, once a process, not by looking for a compiler's name. A
compiler that is not there at all is said without compiling, and a compiler's first
error is read from its output. Compiling and training (slow) are in
test_compiled_integration.py."""

from __future__ import annotations

import pytest

import workshop
from workshop.training import compiled


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


def test_compiled_code_is_kept_in_the_user_s_cache_not_the_temporary_folder(tmp_path):
    home = tmp_path / "cache"
    environ = {"XDG_CACHE_HOME": str(home)}
    folder = compiled.keep_compiled_code_in_cache(environ)
    assert folder == str(home / "scaling-pytorch-hpc" / "inductor")
    assert environ["TORCHINDUCTOR_CACHE_DIR"] == folder
    # A cache the user chose is kept.
    chosen = {"XDG_CACHE_HOME": str(home), "TORCHINDUCTOR_CACHE_DIR": "/scratch/mine"}
    assert compiled.keep_compiled_code_in_cache(chosen) is None
    assert chosen["TORCHINDUCTOR_CACHE_DIR"] == "/scratch/mine"
    # No cache folder to be had: torch's own default holds.
    (tmp_path / "a-file").write_text("")
    nowhere = {"XDG_CACHE_HOME": str(tmp_path / "a-file" / "cache")}
    assert compiled.keep_compiled_code_in_cache(nowhere) is None
    assert "TORCHINDUCTOR_CACHE_DIR" not in nowhere
