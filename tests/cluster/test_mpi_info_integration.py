"""The slow tests of test_mpi_info.py (they start ranks, subprocesses or jobs): make
test runs them, make test-fast leaves them out: real mpirun ranks and their binding."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from conftest import interrupt_when_written

from workshop.cluster.commands import mpirun_command, run_command
from workshop.cluster.mpi_info import (
    binding_lines,
    mpi_installation,
)
from workshop.cluster.run import MPIRUN_SESSION, MPIRUN_SESSION_PREFIX


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI not installed")
def test_doc_004s_binding_options_give_each_rank_its_cores_and_the_variable():
    if mpi_installation().implementation != "Open MPI":
        pytest.skip("--report-bindings and --map-by slot:PE= are Open MPI's")
    cores = len(os.sched_getaffinity(0))
    np = min(2, cores)
    options = ["--bind-to", "core", "--map-by", f"slot:PE={cores // np}",
               "--report-bindings", "-x", "NCCL_DEBUG=INFO",
               "--mca", "pml", "ob1", "--mca", "btl", "^openib"]  # fmt: skip
    command = mpirun_command("slurm/cores_per_rank.py", np=np, options=options)
    result = run_command(command, show=False, timeout=120)
    lines = sorted(result.stdout.splitlines())
    assert len(lines) == np
    for rank, line in enumerate(lines):
        assert line.startswith(f"rank {rank} of {np} ")
        assert f" {cores // np} core(s) " in line, line
        assert line.endswith("NCCL_DEBUG=INFO")
    assert [b.split()[1] for b in binding_lines(result.stderr)] == [
        str(r) for r in range(np)
    ]


# A rank that says where mpirun's session folder is, in a file named by its pid, then
# ends or waits to be stopped.
SESSION_RANK = """
import os, sys, time
from pathlib import Path
folder = [os.environ.get(v) for v in sys.argv[3:] if os.environ.get(v)]
Path(sys.argv[1], f"{os.getpid()}.log").write_text(" ".join(folder))
if sys.argv[2] == "wait":
    time.sleep(120)
"""


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI not installed")
@pytest.mark.parametrize("end", ["done", "interrupt"])
def test_mpirun_leaves_no_session_folder_in_the_temporary_folder(
    tmp_path, monkeypatch, end
):
    # Left alone, mpirun keeps its session folder (ompi.HOST.UID, prte.HOST.UID) in
    # the temporary folder, and a stopped one leaves its job's part there. Here that
    # folder (this process's and, through TMPDIR, mpirun's) is one of the test's own.
    if mpi_installation().implementation != "Open MPI":
        pytest.skip("mpirun is not Open MPI's")
    temp, ranks = tmp_path / "tmp", tmp_path / "ranks"
    temp.mkdir()
    ranks.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    (tmp_path / "s.py").write_text(SESSION_RANK)
    wait = "wait" if end == "interrupt" else "done"
    names = MPIRUN_SESSION.values()
    command = mpirun_command(tmp_path / "s.py", ranks, wait, *names, np=2)

    if end == "interrupt":
        interrupt_when_written(ranks, count=2)
        with pytest.raises(KeyboardInterrupt, match=r"^interrupted; stopped"):
            run_command(command, timeout=60, show=False)
    else:
        run_command(command, timeout=60, show=False)
    # mpirun kept its session in a folder of the workshop's own...
    written = [p.read_text() for p in ranks.glob("*.log")]
    assert len(written) == 2
    for path in written:
        assert path.startswith(str(temp / MPIRUN_SESSION_PREFIX)), path
    # ... which is gone, with nothing else left there.
    assert sorted(temp.iterdir()) == []
