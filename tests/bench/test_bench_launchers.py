"""The benchmarks run unchanged as the tasks of ``srun`` and the processes of
``mpirun``: each task reads its rank from the launcher's variables (set here as Slurm
and Open MPI set them), joins the job, and rank 0 alone writes the results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import free_port, task_env

from workshop.bench.allreduce_result import load_allreduce
from workshop.bench.scaling_plots import load_scaling


def _run_job(launcher: str, cwd: Path, *args: str) -> list[str]:
    """Start the two tasks of a job as ``launcher`` would; return their outputs."""
    port = free_port()
    tasks = [
        subprocess.Popen(
            [sys.executable, "-m", "workshop.bench", *args],
            env=task_env(launcher, rank, 2, port),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = []
    try:
        for task in tasks:
            out, _ = task.communicate(timeout=180)
            assert task.returncode == 0, out
            outputs.append(out)
    finally:
        for task in tasks:
            if task.poll() is None:
                task.kill()
                task.wait()
    return outputs


def test_the_allreduce_sweep_as_srun_tasks(tmp_path):
    outputs = _run_job(
        "srun",
        tmp_path,
        *("allreduce", "--max-size", "64K", "--repeats", "3", "--warmup", "1"),
        *("--min-time", "0", "--reference-size", "1M", "--out", "sweep"),
        *("--backend", "gloo"),  # as checked below; "auto" gives NCCL on 2 GPUs
    )
    assert "backend gloo, 2 ranks (srun), cpu" in outputs[0]
    assert "wrote " in outputs[0] and "wrote " not in outputs[1]
    result = load_allreduce(tmp_path / "sweep.json")
    assert (result.launcher, result.world_size) == ("srun", 2)
    assert result.sizes == [4096, 16384, 65536]  # 4 KiB up to 64 KiB, factors of 4
    assert len(result.medians) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.csv", "sweep.json"]


def test_the_scaling_run_as_mpirun_processes(tmp_path):
    outputs = _run_job(
        "mpirun",
        tmp_path,
        *("scaling", "--mode", "strong", "--global-batch", "8", "--steps", "2"),
        *("--warmup", "1", "--image-size", "16", "--out", "scale"),
    )
    assert outputs[0].count("DDP scaling of cnn") == 1
    assert "DDP scaling" not in outputs[1]  # rank 0 alone reports
    result = load_scaling(tmp_path / "scale.json")
    assert result.launcher == "mpirun"
    (row,) = result.rows
    assert (row.mode, row.world_size, row.batch_per_rank) == ("strong", 2, 4)
