"""The slow tests of test_kernelspec.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: kernels and wrappers run
for real."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import ROOT, gone
from test_kernelspec import TIMEOUT

from workshop.__main__ import main
from workshop.instructor.kernelspec import check_kernel
from workshop.instructor.kernelspec_plan import (
    KernelSpecError,
    _shell_pythonpath,
    kernels_dir,
    plan_kernel_spec,
    write_kernel_spec,
)

FAKE_INIT = """\
# A stand-in for a site's modules init script: it defines the shell function
# `module`, whose `load` records the name as Lmod and Environment Modules do.
module() {
    [ "$1" = load ] || { echo "stand-in module: only 'load'" >&2; return 1; }
    case "$2" in missing/*) echo "stand-in module: no module $2" >&2; return 1;; esac
    export LOADEDMODULES="${LOADEDMODULES:+$LOADEDMODULES:}$2"
}
"""


@pytest.fixture
def fake_init(tmp_path) -> Path:
    path = tmp_path / "modules-init.sh"
    path.write_text(FAKE_INIT)
    return path


def _venv(folder: Path, *sees: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(folder)],
        check=True,
        timeout=60,
    )
    if sees:
        version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        site = folder / "lib" / version / "site-packages"
        (site / "sees.pth").write_text("".join(f"{path}\n" for path in sees))
    return folder / "bin" / "python"


def _shell_folders() -> list[Path]:
    """This shell's PYTHONPATH, less the checkout: on a node with a --target install
    (make test-site) ipykernel is found there, and not in this Python."""
    return [
        Path(folder).resolve()
        for folder in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if folder and Path(folder).is_dir() and Path(folder).resolve() != ROOT
    ]


@pytest.fixture(scope="module")
def carried() -> dict[str, str]:
    """What a spec of this Python carries besides --env: nothing where it imports
    ipykernel by itself; this shell's PYTHONPATH where that is how it finds it."""
    done = subprocess.run(
        [sys.executable, "-c", "import ipykernel"],
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        timeout=60,
    )
    if done.returncode == 0:
        return {}
    return {"PYTHONPATH": _shell_pythonpath()}


@pytest.fixture(scope="module")
def pythons(tmp_path_factory) -> dict[str, Path]:
    """ "torch": torch and ipykernel, no workshop; "stub": an empty ipykernel only;
    "stubs": empty ipykernel and torch packages; "bare": nothing at all."""
    root = tmp_path_factory.mktemp("pythons")
    for folder, packages in (
        ("stub", ["ipykernel"]),
        ("stubs", ["ipykernel", "torch"]),
    ):
        for package in packages:
            (root / "packages" / folder / package).mkdir(parents=True)
            (root / "packages" / folder / package / "__init__.py").write_text("")
    return {
        "torch": _venv(
            root / "torch", Path(sysconfig.get_paths()["purelib"]), *_shell_folders()
        ),
        "stub": _venv(root / "stub", root / "packages" / "stub"),
        "stubs": _venv(root / "stubs", root / "packages" / "stubs"),
        "bare": _venv(root / "bare"),
    }


def _spec(folder: Path) -> dict:
    return json.loads((folder / "kernel.json").read_text())


# ------------------------------------------------------------------ real kernels
def test_a_kernel_of_this_python_starts_and_imports_the_workshop(
    tmp_path, carried, no_leftover_children
):
    plan = plan_kernel_spec(
        env={"OMP_NUM_THREADS": "3"}, where=kernels_dir(prefix=tmp_path)
    )
    folder = write_kernel_spec(plan)
    assert folder == tmp_path / "share/jupyter/kernels/scaling-pytorch-hpc"
    spec = _spec(folder)
    # The workshop is installed in this Python (or comes with the shell's
    # PYTHONPATH, on a node's --target install): nothing else goes on PYTHONPATH.
    assert spec["argv"] == [
        sys.executable,
        "-m",
        "ipykernel_launcher",
        "-f",
        "{connection_file}",
    ]
    assert spec["env"] == {"OMP_NUM_THREADS": "3", **carried}
    assert spec["display_name"] == "Scaling PyTorch on HPC"
    assert not (folder / "kernel-wrapper.sh").exists()

    check = check_kernel(folder, timeout=TIMEOUT)
    assert check.python == sys.executable
    assert check.torch_version.startswith(plan.torch_version)
    assert Path(check.workshop_file) == ROOT / "workshop" / "__init__.py"
    assert check.env == {"OMP_NUM_THREADS": "3", **carried}
    assert check.cuda_available == bool(check.gpus)
    assert check.loaded_modules is None
    assert 1 <= check.cpus <= check.node_cpus
    assert check.pid and not gone([check.pid], within=5)


def test_the_command_loads_modules_and_puts_the_checkout_on_pythonpath(
    tmp_path, fake_init, pythons, capsys, monkeypatch, no_leftover_children
):
    python = pythons["torch"]
    # The server's own PYTHONPATH (a module's packages, say) stays, after the checkout.
    monkeypatch.setenv("PYTHONPATH", "/opt/site-packages-of-a-module")
    status = main(
        [
            "kernel-spec",
            "--name",
            "class-gpu",
            "--module",
            "pytorch/2.4",
            "--module",
            "cuda/12",
            "--modules-init",
            str(fake_init),
            "--python",
            str(python),
            "--env",
            "OMP_NUM_THREADS=3",
            "--prefix",
            str(tmp_path),
            "--check",
            "--timeout",
            str(TIMEOUT),
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    folder = tmp_path / "share/jupyter/kernels/class-gpu"
    wrapper = folder / "kernel-wrapper.sh"
    spec = _spec(folder)
    launch = ["-m", "ipykernel_launcher", "-f", "{connection_file}"]
    assert spec["argv"] == [str(wrapper), *launch]
    assert spec["display_name"] == "Scaling PyTorch on HPC (pytorch/2.4, cuda/12)"
    # That Python has no workshop: this checkout first, then the server's own.
    assert spec["env"] == {
        "OMP_NUM_THREADS": "3",
        "PYTHONPATH": f"{ROOT}{os.pathsep}${{PYTHONPATH}}",
    }
    assert os.access(wrapper, os.X_OK)
    text = wrapper.read_text()
    assert text.index("module load pytorch/2.4") < text.index("module load cuda/12")
    assert text.rstrip().endswith(f'exec {python} "$@"')
    # What the kernel reported: it ran after both loads, with that Python.
    assert f"python     {python} (" in out
    assert "modules    pytorch/2.4:cuda/12" in out
    assert f"workshop   {ROOT / 'workshop' / '__init__.py'}" in out
    assert "env        OMP_NUM_THREADS=3" in out
    assert f"env        PYTHONPATH={ROOT}:/opt/site-packages-of-a-module\n" in out
    assert "OK: the kernel started and imported workshop and torch" in out
    assert f"export JUPYTER_PATH={tmp_path / 'share/jupyter'}" in out


def test_a_target_install_found_through_pythonpath_goes_into_the_spec(
    tmp_path, pythons, monkeypatch, no_leftover_children
):
    # As on a node without internet (README, form (b)): the packages were installed
    # with pip --target, and the shell that writes the spec finds them through
    # PYTHONPATH only. The server that starts the kernel has no such PYTHONPATH.
    bare = pythons["bare"]
    target = [Path(sysconfig.get_paths()["purelib"]).resolve(), *_shell_folders()]
    shell_path = os.pathsep.join(map(str, dict.fromkeys(target)))
    monkeypatch.setenv("PYTHONPATH", shell_path + os.pathsep + "/no/such/folder")
    plan = plan_kernel_spec(python=str(bare), where=tmp_path)
    carried = plan.kernel_json["env"]["PYTHONPATH"]
    assert carried in (shell_path, f"{ROOT}{os.pathsep}{shell_path}")
    assert any(
        note.startswith(f"{bare} finds ipykernel and torch through this shell's ")
        and note.endswith(f"the spec sets PYTHONPATH={shell_path}")
        for note in plan.notes
    ), plan.notes
    folder = write_kernel_spec(plan)
    monkeypatch.delenv("PYTHONPATH")
    check = check_kernel(folder, timeout=TIMEOUT)
    assert check.python == str(bare)
    assert check.torch_version.startswith(plan.torch_version)
    assert check.env["PYTHONPATH"] == carried


def test_check_says_why_a_kernel_cannot_import_the_workshop(
    tmp_path, pythons, monkeypatch, no_leftover_children
):
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the server's has no checkout
    plan = plan_kernel_spec(python=str(pythons["torch"]), where=tmp_path)
    env = {k: v for k, v in plan.kernel_json["env"].items() if k != "PYTHONPATH"}
    folder = write_kernel_spec(
        dataclasses.replace(plan, kernel_json={**plan.kernel_json, "env": env})
    )
    with pytest.raises(
        KernelSpecError,
        match=r"started, but 'import workshop, torch' failed: ModuleNotFoundError: "
        r"No module named 'workshop'\. HINT",
    ):
        check_kernel(folder, timeout=TIMEOUT)


def test_check_shows_the_output_of_a_kernel_that_dies(
    tmp_path, pythons, monkeypatch, no_leftover_children
):
    # Stubs of ipykernel and torch pass the probe; the kernel cannot run (where the
    # server's PYTHONPATH gives it no real ipykernel either).
    monkeypatch.delenv("PYTHONPATH", raising=False)
    plan = plan_kernel_spec(python=str(pythons["stubs"]), where=tmp_path)
    folder = write_kernel_spec(plan)
    with pytest.raises(
        KernelSpecError,
        match=r"(?s)kernel scaling-pytorch-hpc did not start .*No module named "
        r"ipykernel_launcher.*HINT: run its command by hand, "
        + re.escape(str(pythons["stubs"]))
        + r" -c 'import workshop, torch'",
    ):
        check_kernel(folder, timeout=TIMEOUT)


# ------------------------------------------------------------------ without a kernel
def test_dry_run_prints_the_spec_and_the_wrapper_and_writes_nothing(
    tmp_path, fake_init, carried, capsys
):
    status = main(
        [
            "kernel-spec",
            "--dry-run",
            "--prefix",
            str(tmp_path),
            "--module",
            "pytorch/2.4",
            "--modules-init",
            str(fake_init),
            "--env",
            "OMP_NUM_THREADS=4",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    folder = tmp_path / "share/jupyter/kernels/scaling-pytorch-hpc"
    assert f"Would write into {folder}:" in out
    block = out.split("--- kernel.json\n")[1].split("--- kernel-wrapper.sh")[0]
    spec = json.loads(block)
    assert spec["argv"][0] == str(folder / "kernel-wrapper.sh")
    assert spec["env"] == {"OMP_NUM_THREADS": "4", **carried}  # it has the workshop
    assert "--- kernel-wrapper.sh (executable)\n#!/bin/bash\n" in out
    assert "module load pytorch/2.4 || fail" in out
    assert not (tmp_path / "share").exists()


def test_the_wrapper_fails_readably_where_module_is_not_defined(
    tmp_path, fake_init, pythons
):
    plan = plan_kernel_spec(
        modules=["pytorch/2.4"],
        modules_init=fake_init,
        python=str(pythons["torch"]),
        where=tmp_path,
    )
    folder = write_kernel_spec(plan)
    fake_init.unlink()  # the site's init script is gone: `module` is not defined
    done = subprocess.run(
        [str(folder / "kernel-wrapper.sh"), "-c", "print('ran')"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(
        "kernel scaling-pytorch-hpc: 'module' is not defined in this shell (its init "
        f"script was looked for in: {fake_init}). HINT: --modules-init"
    )


def test_a_pythonpath_of_ones_own_comes_after_the_checkout(tmp_path, pythons):
    plan = plan_kernel_spec(
        python=str(pythons["torch"]), env={"PYTHONPATH": "/opt/extra"}, where=tmp_path
    )
    assert plan.kernel_json["env"]["PYTHONPATH"] == f"{ROOT}{os.pathsep}/opt/extra"
    assert any("has no workshop installed" in note for note in plan.notes)


def test_a_python_without_ipykernel_or_torch_is_refused(tmp_path, pythons):
    bare, stub = pythons["bare"], pythons["stub"]
    with pytest.raises(
        KernelSpecError,
        match=rf"{bare} has no ipykernel, so it cannot run a Jupyter kernel\. HINT: "
        rf"{bare} -m pip install ipykernel",
    ):
        plan_kernel_spec(python=str(bare), where=tmp_path)
    with pytest.raises(
        KernelSpecError,
        match=rf"{stub} has no torch\. HINT: --module with the site's PyTorch module",
    ):
        plan_kernel_spec(python=str(stub), where=tmp_path)


def test_module_problems_are_refused_with_the_wrappers_words(tmp_path, fake_init):
    empty = tmp_path / "empty-init.sh"
    empty.write_text("# defines nothing\n")
    with pytest.raises(
        KernelSpecError,
        match=r"(?s)failed \(exit status 1\); it said:\nkernel scaling-pytorch-hpc: "
        r"'module' is not defined in this shell",
    ):
        plan_kernel_spec(modules=["pytorch"], modules_init=empty, where=tmp_path)
    with pytest.raises(
        KernelSpecError,
        match=r"(?s)stand-in module: no module missing/1\.0\n.*'module load "
        r"missing/1\.0' failed \(its message is above\)\. HINT: 'module avail "
        r"missing' lists",
    ):
        plan_kernel_spec(
            modules=["pytorch", "missing/1.0"], modules_init=fake_init, where=tmp_path
        )
    with pytest.raises(
        KernelSpecError,
        match=r"no-such-python-9 is not there after loading the modules\. HINT",
    ):
        plan_kernel_spec(
            modules=["pytorch"],
            modules_init=fake_init,
            python="no-such-python-9",
            where=tmp_path,
        )
