"""workshop.cluster.env_modules: a modulefile's commands applied to a copy of an
environment, seen by a child process only; and whether `module` exists here."""

from __future__ import annotations

import os
import subprocess

import pytest

from workshop.cluster import env_modules
from workshop.cluster.env_modules import module_load_environment, module_system

CUDA = """#%Module
# a stand-in for cuda/12.4
setenv       CUDA_HOME        /opt/cuda-12.4
prepend-path PATH             /opt/cuda-12.4/bin   # first on PATH
prepend-path LD_LIBRARY_PATH  /opt/cuda-12.4/lib64
append-path  MANPATH          /opt/cuda-12.4/man
unsetenv     CUDA_VISIBLE_DEVICES
"""


def test_the_commands_change_a_copy_only():
    before = {
        "PATH": "/usr/bin:/bin",
        "MANPATH": "/usr/man",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    kept = dict(before)
    after = module_load_environment(CUDA, before)
    assert before == kept  # the caller's environment is not touched
    assert after["PATH"] == "/opt/cuda-12.4/bin:/usr/bin:/bin"
    assert after["LD_LIBRARY_PATH"] == "/opt/cuda-12.4/lib64"  # was unset: no ":"
    assert after["MANPATH"] == "/usr/man:/opt/cuda-12.4/man"
    assert after["CUDA_HOME"] == "/opt/cuda-12.4"
    assert "CUDA_VISIBLE_DEVICES" not in after


def test_a_child_sees_the_change_and_this_process_does_not():
    env = module_load_environment("setenv WORKSHOP_MODULE_TEST loaded")
    said = subprocess.run(
        ["bash", "-c", "echo ${WORKSHOP_MODULE_TEST:-unset}"],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert said.stdout.strip() == "loaded"
    assert "WORKSHOP_MODULE_TEST" not in os.environ


@pytest.mark.parametrize(
    "line", ["module load cuda", "prepend-path PATH", "setenv ONLY", "unsetenv A B"]
)
def test_other_lines_are_refused_with_the_line(line):
    with pytest.raises(ValueError, match=r"modulefile line 2, .*expected one of"):
        module_load_environment(f"#%Module\n{line}\n", {})


def test_a_modulefile_that_is_not_text_is_refused():
    with pytest.raises(ValueError, match=r"the file's text, a str; got None"):
        module_load_environment(None, {})


def test_module_system_says_yes_or_why_not():
    found = module_system()
    if not found.available:
        assert "no `module` command here" in str(found)
    else:
        assert str(found)


def test_module_system_reports_a_shell_that_cannot_start(monkeypatch):
    def no_bash(*args, **kwargs):
        raise FileNotFoundError("bash")

    monkeypatch.setattr(env_modules.subprocess, "run", no_bash)
    assert not module_system().available
    assert "cannot start a login shell" in str(module_system())
