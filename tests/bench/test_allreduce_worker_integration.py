"""The slow tests of test_allreduce_worker.py (they start ranks, subprocesses or jobs):
make test runs them, make test-fast leaves them out: the command line end to end, and
the sweep run unchanged as the tasks of ``srun`` (each task reads its rank from
Slurm's variables, set here as Slurm sets them; rank 0 alone writes the results)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import repo_env
from test_scaling_bench_integration import _run_job

from workshop.bench.allreduce_result import (
    load_allreduce,
)


# ------------------------------------------------------------------ command line
def _run(cwd: Path, *command: str, timeout: float = 120):
    return subprocess.run(
        list(command),
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=repo_env(),
        cwd=cwd,
    )


FAST = [
    "--max-size",
    "64K",
    "--repeats",
    "3",
    "--warmup",
    "1",
    "--min-time",
    "0",
    "--reference-size",
    "1M",
]


def test_cli_starts_ranks_and_writes_json_csv_and_plot(tmp_path):
    run = _run(
        tmp_path,
        sys.executable,
        "-m",
        "workshop.bench",
        "allreduce",
        "--world-size",
        "2",
        "--backend",
        "gloo",  # what the lines below check; "auto" gives NCCL on 2 GPUs
        *FAST,
        "--out",
        "out/ar",
        "--plot",
    )
    assert run.returncode == 0, run.stderr
    text = run.stdout
    assert "all-reduce of float32 tensors, 4 KiB to 64 KiB, on 2 ranks" in text
    assert "backend gloo, 2 ranks (workshop), cpu" in text
    assert "       size       count    type  reps    time us algbw GB/s" in text
    assert "ring model: alpha = " in text and "of the reference: cpu memory" in text
    assert "wrote out/ar.json, out/ar.csv, out/ar.png" in text
    result = load_allreduce(tmp_path / "out" / "ar.json")
    assert result.sizes == [4096, 16384, 65536] and result.launcher == "workshop"
    with open(tmp_path / "out" / "ar.csv") as f:
        assert len(f.readlines()) == 1 + 3 * 3
    assert (tmp_path / "out" / "ar.png").stat().st_size > 10_000


def test_cli_under_torchrun_joins_the_job_and_rank_0_reports(tmp_path):
    run = _run(
        tmp_path,
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--log-dir={tmp_path / 'torchrun-logs'}",  # not a torchelastic_* in /tmp
        "--nproc-per-node",
        "2",
        "-m",
        "workshop.bench",
        "allreduce",
        *("--backend", "gloo"),
        *FAST,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("wrote ") == 1  # only rank 0 reports
    assert "backend gloo, 2 ranks (torchrun), cpu" in run.stdout
    result = load_allreduce(tmp_path / "allreduce-gloo-N2.json")  # default name
    assert result.launcher == "torchrun" and result.world_size == 2
    assert [len(times) for times in result.seconds] == [3, 3, 3]


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
