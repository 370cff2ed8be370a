"""The worker code, the batch script and the benchmarks under the real launchers:
Open MPI's ``mpirun``, and Slurm's ``srun`` and ``sbatch`` on a private two-node
cluster (scripts/local_slurm.sh). ``make setup`` installs both as root; where they
are missing the tests say so and skip."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, free_port

from workshop.bench.allreduce_result import load_allreduce
from workshop.env import choose_backend

PYTHON = sys.executable
FAST_SWEEP = (
    *("allreduce", "--max-size", "16K", "--repeats", "3", "--warmup", "1"),
    *("--min-time", "0", "--reference-size", "1M"),
)

needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None,
    reason="needs Open MPI's mpirun (make setup installs it as root: openmpi-bin)",
)
needs_slurm = pytest.mark.skipif(
    shutil.which("slurmctld") is None or os.geteuid() != 0,
    reason="needs Slurm's daemons and munge, and root to run slurmd "
    "(make setup installs them as root: slurm-wlm munge)",
)


def _run(command: list[str], env: dict[str, str], cwd: Path, timeout: float = 180):
    return subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def _said(done: subprocess.CompletedProcess) -> str:
    """A command's exit code and both its outputs, for an assertion's message."""
    return (
        f"exit code {done.returncode}\n--- stdout\n{done.stdout}\n"
        f"--- stderr\n{done.stderr}"
    )


def _two_ranks_backend() -> str:
    """What "auto" gives 2 ranks on this machine: NCCL with a GPU each, else gloo."""
    return choose_backend("auto", 2)


# --- Open MPI -----------------------------------------------------------------------


def _mpirun(n: int, *command: str) -> tuple[list[str], dict[str, str]]:
    # clean_env drops the test run's own launcher variables (a run started by srun
    # or mpirun has SLURM_, OMPI_, PMIX_ ones that this mpirun would take for its
    # own) and puts the checkout before whatever PYTHONPATH held.
    env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    root = []
    if os.geteuid() == 0:
        # As root (in a container) mpirun must be told that is intended, by the
        # flag workshop.cluster.mpirun_command writes, or these variables.
        root = ["--allow-run-as-root"]
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if not (shutil.which("ssh") or shutil.which("rsh")):
        # Open MPI 4 refuses to start even on one node when its remote-start agent
        # (ssh or rsh) is missing, as in many containers; local starts need none.
        env["OMPI_MCA_plm"] = "^rsh"
    return [
        "mpirun", "-np", str(n), "--oversubscribe", *root,
        *("-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "PYTHONPATH"),
        *command,
    ], env  # fmt: skip


@pytest.fixture(scope="module")
def mpirun_starts(tmp_path_factory):
    """Skip, with mpirun's own words, where mpirun cannot start two processes at all
    (a broken Open MPI installation is not the workshop's failure)."""
    command, env = _mpirun(2, "true")
    done = _run(command, env, tmp_path_factory.mktemp("mpirun"), timeout=60)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        pytest.skip(
            "mpirun cannot start 2 processes of `true` here (exit code "
            f"{done.returncode}): " + " / ".join(said[:6])
        )


@needs_mpirun
def test_hello_ranks_under_mpirun(mpirun_starts, tmp_path):
    command, env = _mpirun(2, PYTHON, str(ROOT / "slurm" / "hello_ranks.py"))
    done = _run(command, env, tmp_path)
    assert done.returncode == 0, _said(done)
    backend = _two_ranks_backend()
    for rank in (0, 1):
        assert (
            f"hello from rank {rank} of 2 (local rank {rank}, node 0, started by "
            f"mpirun, {backend}): sum of ranks = 1"
        ) in done.stdout, _said(done)


@needs_mpirun
def test_the_allreduce_sweep_under_mpirun(mpirun_starts, tmp_path):
    command, env = _mpirun(2, PYTHON, "-m", "workshop.bench", *FAST_SWEEP, "--out", "s")
    done = _run(command, env, tmp_path)
    assert done.returncode == 0, _said(done)
    assert done.stdout.count("wrote ") == 1, _said(done)  # rank 0 alone
    result = load_allreduce(tmp_path / "s.json")
    assert (result.launcher, result.world_size, result.sizes) == (
        "mpirun",
        2,
        [4096, 16384],
    )


# --- Slurm --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm(private_slurm):
    """The environment to run Slurm's commands in, on the run's private cluster
    (tests/conftest.py: stopped at the end of the run, with nothing left)."""
    return clean_env(SLURM_CONF=str(private_slurm.folder / "slurm.conf"))


@needs_slurm
def test_hello_ranks_as_srun_tasks(slurm, tmp_path):
    done = _run(["srun", "-n", "2", PYTHON, str(ROOT / "slurm/hello_ranks.py")],
                slurm, tmp_path)  # fmt: skip
    assert done.returncode == 0, _said(done)
    lines = sorted(line for line in done.stdout.splitlines() if "hello" in line)
    assert lines == [
        f"hello from rank {r} of 2 (local rank {r}, node 0, started by srun, "
        f"{_two_ranks_backend()}): sum of ranks = 1"
        for r in (0, 1)
    ]


@needs_slurm
def test_the_batch_script_runs_on_slurm(slurm, tmp_path):
    # The script as a learner submits it, with the GPU lines overridden for a CPU
    # node; it activates .venv from the submission directory.
    if not (ROOT / ".venv" / "bin" / "activate").exists():
        pytest.skip("the batch script activates .venv, which make setup creates")
    out = tmp_path / "hello-%j.out"
    submit = _run(
        ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2",
         "--gpus-per-node=0", "--cpus-per-task=1", f"--output={out}",
         "slurm/hello_ranks.sbatch"],
        slurm, ROOT,
    )  # fmt: skip
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = _run(["squeue", "-h", "-j", job, "-o", "%T"], slurm, ROOT).stdout
        if not state.strip():
            break
        time.sleep(0.5)
    else:
        _run(["scancel", job], slurm, ROOT)
        pytest.fail(f"job {job} still queued or running after 120 s")
    text = (tmp_path / f"hello-{job}.out").read_text()
    assert f"job {job}: 1 nodes" in text and ", 2 tasks" in text
    # MASTER_ADDR: the job's first node (a one-node job's only one).
    first = _run(["sinfo", "-h", "-N", "-o", "%N"], slurm, ROOT).stdout.split()[0]
    assert f"rendezvous at {first}:" in text
    assert text.count("sum of ranks = 1") == 2, text


@needs_slurm
def test_the_allreduce_sweep_as_srun_tasks(slurm, tmp_path):
    done = _run(
        ["srun", "-n", "2", PYTHON, "-m", "workshop.bench", *FAST_SWEEP, "--out", "s"],
        slurm,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    result = load_allreduce(tmp_path / "s.json")
    assert (result.launcher, result.world_size) == ("srun", 2)


# --- The plain DDP script, without the workshop package -------------------------------

DDP_MINIMAL = ROOT / "slurm" / "ddp_minimal.py"


def _trained_in_step(done: subprocess.CompletedProcess, folder: Path) -> None:
    """Two ranks trained the same weights, the loss fell, rank 0 alone saved them."""
    assert done.returncode == 0, _said(done)
    losses = [float(line.split()[-1]) for line in done.stdout.splitlines()
              if line.startswith("epoch ")]  # fmt: skip
    assert len(losses) == 3 and losses[-1] < losses[0], _said(done)
    sums = {line.split()[-1] for line in done.stdout.splitlines()
            if line.startswith("rank ") and "weights sum to" in line}  # fmt: skip
    assert len(sums) == 1, _said(done)  # DDP kept every rank's copy identical
    assert done.stdout.count("weights sum to") == 2, _said(done)
    assert (folder / "ddp_minimal.pt").stat().st_size > 0


def test_the_plain_ddp_script_imports_nothing_of_the_workshop():
    for script in (DDP_MINIMAL, ROOT / "slurm" / "ddp_spawn.py"):
        text = script.read_text()
        imported = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add((node.module or "").split(".")[0])
        assert "workshop" not in imported and "torch" in imported
        assert 'init_method="env://"' in text and "destroy_process_group" in text


def test_the_plain_ddp_script_refuses_to_start_without_a_launcher(tmp_path):
    done = _run([PYTHON, str(DDP_MINIMAL)], clean_env(), tmp_path, timeout=120)
    assert done.returncode == 1
    assert "start me with torchrun, srun or mpirun" in done.stderr


def test_the_plain_ddp_script_under_torchrun(tmp_path):
    torchrun = str(Path(PYTHON).parent / "torchrun")
    logs = f"--log-dir={tmp_path / 'torchrun-logs'}"  # not a torchelastic_* in /tmp
    command = [torchrun, "--standalone", logs, "--nproc_per_node=2", str(DDP_MINIMAL)]
    _trained_in_step(_run(command, clean_env(), tmp_path), tmp_path)


def test_the_plain_ddp_script_under_torch_multiprocessing_spawn(tmp_path):
    command = [PYTHON, str(ROOT / "slurm" / "ddp_spawn.py"), "2"]
    _trained_in_step(_run(command, clean_env(), tmp_path), tmp_path)


@needs_mpirun
def test_the_plain_ddp_script_under_mpirun(mpirun_starts, tmp_path):
    command, env = _mpirun(2, PYTHON, str(DDP_MINIMAL))
    _trained_in_step(_run(command, env, tmp_path), tmp_path)


@needs_slurm
def test_the_plain_ddp_script_as_srun_tasks(slurm, tmp_path):
    env = {**slurm, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    done = _run(["srun", "-n", "2", PYTHON, str(DDP_MINIMAL)], env, tmp_path)
    _trained_in_step(done, tmp_path)


def _code_blocks(markdown: str) -> list[list[str]]:
    blocks, inside = [], None
    for line in markdown.splitlines():
        if line.startswith("```"):
            if inside is None:
                inside = []
            else:
                blocks.append(inside)
                inside = None
        elif inside is not None:
            inside.append(line)
    return blocks


def test_notebook_02_quotes_the_plain_scripts_as_they_are():
    """The lines notebook 02 shows of ddp_minimal.py and ddp_spawn.py are in the
    scripts (comments and indentation aside), so the text cannot drift from them."""
    import nbformat

    notebook = nbformat.read(
        ROOT / "notebooks" / "02_distributed_data_parallel.ipynb", 4
    )
    scripts = {name: (ROOT / "slurm" / name).read_text()
               for name in ("ddp_minimal.py", "ddp_spawn.py")}  # fmt: skip

    def code(line: str) -> str:
        return line.split("  #")[0].strip()

    lines = {name: {code(line) for line in text.splitlines()}
             for name, text in scripts.items()}  # fmt: skip
    quoted = [
        (name, block)
        for cell in notebook.cells
        if cell.cell_type == "markdown"
        for name in scripts
        if f"slurm/{name}" in cell.source
        for block in _code_blocks(cell.source)
    ]
    assert {name for name, _ in quoted} == set(scripts)
    for name, block in quoted:
        for line in block:
            if code(line) and code(line) != "...":
                assert any(code(line) in lines[n] for n in scripts), (name, line)
    cell = next(c for c in notebook.cells if "ddp_minimal.py" in c.source
                and c.cell_type == "code")  # fmt: skip
    assert "torchrun_command" in cell.source and "run_command" in cell.source
