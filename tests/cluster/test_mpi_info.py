"""workshop.cluster.mpi_info: which MPI is installed, and the --report-bindings
lines; mpirun_command's extra options, and slurm/cores_per_rank.py started by a real
mpirun with notebook 03's binding options (skipped without Open MPI)."""

from __future__ import annotations

import re
import shutil

import pytest

from workshop.cluster import mpi_info
from workshop.cluster.commands import mpirun_command
from workshop.cluster.mpi_info import (
    MpiInstallation,
    binding_lines,
    mpi_installation,
    parse_mpi_version,
)

OPEN_MPI = "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/\n"
MPICH = "HYDRA build details:\n    Version:                                 4.1.2\n"
INTEL = (
    "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: x)\n"
    "Copyright 2003-2023, Intel Corporation.\n"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [(OPEN_MPI, ("Open MPI", "4.1.4")), (MPICH, ("MPICH", "4.1.2")),
     (INTEL, ("Intel MPI", "2021.10"))],
)  # fmt: skip
def test_the_version_line_of_each_implementation_is_read(text, expected):
    assert parse_mpi_version(text) == expected


def test_an_unknown_version_text_is_refused_with_what_was_expected():
    with pytest.raises(ValueError, match=r"cannot tell which MPI printed 'hello'.*"):
        parse_mpi_version("hello\nworld")
    with pytest.raises(ValueError, match=r"cannot tell which MPI printed ''"):
        parse_mpi_version("")
    with pytest.raises(ValueError, match=r"must be the str .* got 3"):
        parse_mpi_version(3)


def test_bindings_are_sorted_by_rank_without_host_and_pid():
    text = (
        "[vm:02966] MCW rank 1 bound to socket 0[core 1[hwt 0]]: [./B]\n"
        "some other line\n"
        "[node-7:123] MCW rank 0 bound to socket 0[core 0[hwt 0]]: [B/.]\n"
        "[vm:9] MCW rank 2 is not bound (or bound to all available processors)\n"
    )
    assert binding_lines(text) == [
        "rank 0 bound to socket 0[core 0[hwt 0]]: [B/.]",
        "rank 1 bound to socket 0[core 1[hwt 0]]: [./B]",
        "rank 2 is not bound (or bound to all available processors)",
    ]
    assert binding_lines("no bindings here\n") == []
    with pytest.raises(ValueError, match=r"mpirun's stderr as a str, got None"):
        binding_lines(None)


def test_no_mpirun_says_what_to_install(monkeypatch):
    monkeypatch.setattr(mpi_info.shutil, "which", lambda name: None)
    found = mpi_installation()
    assert not found.available
    assert "no mpirun on PATH" in str(found) and "openmpi-bin" in str(found)


def test_an_installation_prints_one_line_per_fact():
    text = str(MpiInstallation(True, "MPICH", "4.1.2", "/usr/bin/mpirun"))
    assert text == "MPICH 4.1.2, mpirun at /usr/bin/mpirun"
    text = str(MpiInstallation(True, "Open MPI", "5.0.3", "/x", btl=("tcp", "self")))
    assert text.splitlines()[1] == "  byte transfer layers (btl): tcp, self"


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI not installed")
def test_the_installed_mpirun_is_recognised():
    found = mpi_installation()
    assert found.available, found.reason
    assert re.fullmatch(r"\d+(\.\d+)+\S*", found.version), found.version
    if found.implementation == "Open MPI" and shutil.which("ompi_info"):
        assert "self" in found.btl and "ob1" in found.pml
        assert re.fullmatch(r"\d+\.\d+(\.\d+)?", found.standard), found.standard
        assert f"(MPI standard {found.standard})" in str(found)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI not installed")
def test_options_go_before_the_program_and_a_string_is_refused():
    command = mpirun_command(
        "slurm/cores_per_rank.py", "--x", np=1, options=["--bind-to", "none"]
    )
    at = command.index("--bind-to")
    assert command[at + 1] == "none"
    assert command.index("slurm/cores_per_rank.py") == at + 3  # python, then script
    assert command[-1] == "--x"
    with pytest.raises(ValueError, match=r"list of words, got the string"):
        mpirun_command("slurm/cores_per_rank.py", np=1, options="--bind-to none")
