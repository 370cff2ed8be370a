"""slurm/stage_data.sbatch: a packed dataset copied to the node's local disk, unpacked,
trained from, the results copied back and the local copy removed, on success and on
failure, run for real on the private Slurm cluster (one node of it, whether it has
one node or two). bash -n and shellcheck check it in test_script_lint.py."""

from __future__ import annotations

import re
import shutil
import tarfile
import time
from pathlib import Path

import pytest
from conftest import ROOT, needs_private_slurm

from workshop.cluster.slurm import submit

SCRIPT = ROOT / "slurm" / "stage_data.sbatch"


def test_the_script_follows_the_house_style():
    text = SCRIPT.read_text()
    assert "set -euo pipefail" in text
    assert "trap cleanup EXIT" in text
    assert 'LOCAL_ROOT="${SLURM_TMPDIR:-${TMPDIR:-/tmp}}"' in text
    assert "# EDIT:" in text and "sbatch slurm/stage_data.sbatch" in text


@pytest.fixture(scope="module")
def cluster(private_slurm):
    """The run's private cluster, lent to this module with its nodes idle."""
    return private_slurm


def _submit(cluster, tmp_path: Path, *args: str):
    """stage_data.sbatch on one node with 2 CPUs (1 loader worker) where a node has
    them, its dataset archive in ``tmp_path``."""
    cpus = 2 if cluster.cpus // max(len(cluster.hosts), 1) >= 2 else 1
    archive = tmp_path / "data" / "digits-png.tar"
    job = submit(
        SCRIPT, *args, nodes=1, ntasks_per_node=1, gpus_per_node=0,
        options={"cpus-per-task": cpus, "export": f"ALL,ARCHIVE={archive}"},
        output_dir=tmp_path,
    )  # fmt: skip
    return job, archive, cpus


def _paths(text: str) -> tuple[Path, Path]:
    local = Path(re.search(r"^local copy (\S+)$", text, re.M).group(1))
    return local, ROOT / "runs" / f"stage-data-{local.name.rsplit('-', 1)[1]}"


@needs_private_slurm
def test_the_job_stages_trains_copies_back_and_removes_the_local_copy(
    cluster, tmp_path
):
    job, archive, cpus = _submit(cluster, tmp_path)
    results = ROOT / "runs" / f"stage-data-{job.job_id}"
    try:
        status = job.wait(timeout=300, poll=0.5, show=False)
        text = job.output()
        assert status.state == "COMPLETED", text
        local, copied = _paths(text)
        assert local.name == f"stage-data-{job.job_id}" and copied == results
        # The archive was made once on the "shared" file system: 1,437 + 360 PNGs.
        with tarfile.open(archive) as tar:
            assert sum(m.isfile() for m in tar) == 1797
        assert re.search(r"^packed 1797 PNG files into ", text, re.M), text
        lines = [
            "staged: 1797 files,",
            f"training on 1437 files from {local}\n",
            f"DataLoader workers: {cpus - 1}, torch threads: 1\n",
            "epoch 2/2",
            f"wrote history.txt and model.pt to {local}/results\n",
            f"results copied back to {results}: history.txt model.pt",
            f"removed the local copy {local}",
        ]
        where = [text.find(line) for line in lines]
        assert -1 not in where and where == sorted(where), text
        accuracy = float(re.search(r"epoch 2/2 .*eval accuracy (\S+)", text)[1])
        assert accuracy > 0.3, text  # 10 classes: guessing scores 0.1
        assert not local.exists()
        assert (results / "model.pt").stat().st_size > 10_000
        assert "eval accuracy" in (results / "history.txt").read_text()
    finally:
        shutil.rmtree(results, ignore_errors=True)


@needs_private_slurm
def test_a_failed_training_still_removes_the_local_copy(cluster, tmp_path):
    job, _, _ = _submit(cluster, tmp_path, "--epochs", "0")
    status = job.wait(timeout=300, poll=0.5, show=False)
    text = job.output()
    assert status.state == "FAILED" and status.exit_code == 2, text
    local, results = _paths(text)
    assert "--epochs and --batch must be >= 1, not 0, 64" in text
    assert "staged: 1797 files," in text and "results copied back" not in text
    assert text.rstrip().endswith(f"removed the local copy {local}")
    assert not local.exists() and not results.exists()


@needs_private_slurm
def test_a_cancelled_job_still_removes_the_local_copy(cluster, tmp_path):
    job, _, _ = _submit(cluster, tmp_path, "--epochs", "500")
    try:
        deadline = time.monotonic() + 240
        while "DataLoader workers:" not in (
            job.output() if job.output_path.exists() else ""
        ):
            assert time.monotonic() < deadline, "the job never started training"
            assert not job.status().finished, job.output()
            time.sleep(0.5)
    finally:
        job.cancel()  # Slurm sends TERM; the trap turns it into an exit, then cleans
    status = job._settle(60)
    text = job.output()
    assert status.state == "CANCELLED", text
    local, results = _paths(text)
    deadline = time.monotonic() + 30  # the trap runs as the batch shell ends
    while local.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not local.exists(), text
    assert f"removed the local copy {local}" in job.output()
    assert not results.exists()
