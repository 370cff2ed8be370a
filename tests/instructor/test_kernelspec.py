"""python -m workshop kernel-spec (workshop/instructor/kernelspec*.py): specs written
into a temporary prefix, real kernels started from them through jupyter_client (each
shut down, none left behind), environment modules through a stand-in ``module``
function, the dry run, and every error message.

Pythons to point the spec at, made here in a fraction of a second each: this one
(the workshop installed), and venvs without pip on the same base that see this one's
packages through a .pth file (torch and ipykernel, not the workshop, whose editable
install is itself a .pth file that such a line does not run), see only a stub
ipykernel, or see nothing.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from workshop.__main__ import main
from workshop.instructor.kernelspec import check_kernel
from workshop.instructor.kernelspec_plan import (
    KernelSpecError,
    kernels_dir,
    parse_env,
    plan_kernel_spec,
    write_kernel_spec,
)

TIMEOUT = 90.0  # a kernel that imports torch started in about 5 s here


@pytest.fixture(autouse=True)
def _no_module_function(monkeypatch):
    """A shell that exported `module` (Lmod does) would hide the stand-in."""
    monkeypatch.delenv("BASH_FUNC_module%%", raising=False)
    monkeypatch.delenv("MODULESHOME", raising=False)


def test_check_says_when_the_kernels_command_is_gone(tmp_path, no_leftover_children):
    plan = plan_kernel_spec(where=tmp_path)
    gone_python = str(tmp_path / "moved-away" / "python")
    argv = [gone_python, *plan.kernel_json["argv"][1:]]
    folder = write_kernel_spec(
        dataclasses.replace(plan, kernel_json={**plan.kernel_json, "argv": argv})
    )
    with pytest.raises(
        KernelSpecError,
        match=rf"kernel scaling-pytorch-hpc could not be started: {gone_python}: No "
        r"such file or directory\. HINT: write the spec again",
    ):
        check_kernel(folder, timeout=TIMEOUT)


def test_a_prefix_on_jupyter_path_is_where_jupyter_finds_the_spec(
    tmp_path, monkeypatch
):
    from jupyter_client.kernelspec import KernelSpecManager

    folder = write_kernel_spec(
        plan_kernel_spec(name="Class-GPU", where=kernels_dir(prefix=tmp_path))
    )
    assert folder.name == "class-gpu"  # Jupyter folds names to lower case
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share" / "jupyter"))
    assert KernelSpecManager().find_kernel_specs()["class-gpu"] == str(folder)


def test_where_a_spec_goes(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    assert kernels_dir() == kernels_dir(user=True) == tmp_path / "data" / "kernels"
    assert kernels_dir(prefix=tmp_path) == tmp_path / "share" / "jupyter" / "kernels"
    assert kernels_dir(sys_prefix=True) == Path(sys.prefix, "share/jupyter/kernels")


# ------------------------------------------------------------------ errors
def test_env_items_are_checked():
    assert parse_env(["OMP_NUM_THREADS=4", "A=x=y", "EMPTY="]) == {
        "OMP_NUM_THREADS": "4",
        "A": "x=y",
        "EMPTY": "",
    }
    with pytest.raises(KernelSpecError, match=r"--env 'OMP_NUM_THREADS' has no '='"):
        parse_env(["OMP_NUM_THREADS"])
    with pytest.raises(KernelSpecError, match=r"'1X' is not a variable name"):
        parse_env(["1X=2"])
    with pytest.raises(
        KernelSpecError, match=r"--env A is given twice \('1' and '2'\)"
    ):
        parse_env(["A=1", "A=2"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"name": "my kernel/1"},
            r"kernel name 'my kernel/1': Jupyter accepts only ASCII letters, digits, "
            r"'\.', '_' and '-'\. HINT: e\.g\. --name my-kernel-1",
        ),
        ({"python": "/no/such/python"}, r"--python /no/such/python: no executable"),
        ({"python": "no-such-python-9"}, r"--python no-such-python-9: not found on"),
        ({"venv": "/no/such/venv"}, r"--venv /no/such/venv: there is no /no/such/"),
        (
            {"python": "/usr/bin/python3", "venv": "/no/such/venv"},
            r"give --python or --venv, not both",
        ),
        (
            {"modules": ["gcc/12 pytorch"]},
            r"--module 'gcc/12 pytorch': one module name, without spaces",
        ),
        (
            {"modules": ["pytorch"], "modules_init": "/no/such/init.sh"},
            r"--modules-init /no/such/init.sh: not a file",
        ),
    ],
    ids=["name", "python", "python-name", "venv", "both", "module", "modules-init"],
)
def test_bad_arguments_are_refused_with_the_fix(tmp_path, kwargs, message):
    with pytest.raises(KernelSpecError, match=message):
        plan_kernel_spec(where=tmp_path, **kwargs)


def test_unwritable_places_and_two_places_are_refused(tmp_path):
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    plan = plan_kernel_spec(where=in_the_way)
    with pytest.raises(
        KernelSpecError, match=r"cannot write the kernel spec into .*a-file/"
    ):
        write_kernel_spec(plan)
    with pytest.raises(KernelSpecError, match=r"give one of --user, --prefix PATH"):
        kernels_dir(user=True, prefix=tmp_path)


def test_the_command_reports_errors_and_refuses_dry_run_with_check(capsys):
    assert main(["kernel-spec", "--dry-run", "--env", "OMP_NUM_THREADS"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kernel-spec: ERROR: --env 'OMP_NUM_THREADS' has no '='")
    with pytest.raises(SystemExit) as stopped:
        main(["kernel-spec", "--dry-run", "--check"])
    assert stopped.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
