"""The slow tests of test_scaling_bench.py (they start ranks, subprocesses or jobs):
make test runs them, make test-fast leaves them out: a real run on ranks, the command
line end to end, and the run unchanged as the processes of ``mpirun`` (each reads its
rank from Open MPI's variables, set here as it sets them; rank 0 alone writes the
results)."""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port, run_module, task_env

from workshop.bench.scaling_measure import (
    measure_scaling,
)
from workshop.bench.scaling_plots import load_scaling
from workshop.comm.costmodel import ring_all_reduce_time

# SmallCNN(in_channels=3, num_classes=10): 94,762 float32 parameters.
CNN_PARAMETERS = 94_762


TINY = {"steps": 3, "warmup": 1, "batch": 8, "image_size": 16}


# ------------------------------------------------------------------ a real run
@pytest.fixture(scope="module")
def run():
    """Both modes at 1 and 2 ranks, tiny: four launches, a few seconds. On gloo, the
    CPU, on every machine: what the tests below check (on a GPU node "auto" gives
    NCCL where there is a GPU per rank)."""
    return measure_scaling((1, 2), "both", backend="gloo", **TINY)


def test_real_run_rows_hold_the_measurements(run):
    assert [(r.mode, r.world_size) for r in run.rows] == [
        ("weak", 1),
        ("weak", 2),
        ("strong", 1),
        ("strong", 2),
    ]
    assert [r.batch_per_rank for r in run.rows] == [8, 8, 8, 4]
    assert [r.global_batch for r in run.rows] == [8, 16, 8, 8]
    assert run.parameters == CNN_PARAMETERS
    assert run.gradient_bytes == 4 * CNN_PARAMETERS
    assert (run.backend, run.device, run.launcher) == ("gloo", "CPU", "workshop")
    assert run.image_size == 16 and run.steps == 3
    for r in run.rows:
        assert len(r.step_times) == len(r.compute_times) == r.world_size
        assert all(len(t) == 3 and min(t) > 0 for t in r.step_times + r.compute_times)
        assert len(r.allreduce_times) == 3
        # The summaries are medians of the slowest rank.
        assert r.step_seconds == max(statistics.median(t) for t in r.step_times)
        assert r.compute_seconds == max(statistics.median(t) for t in r.compute_times)
        assert r.comm_seconds == max(0.0, r.step_seconds - r.compute_seconds)
        assert r.samples_per_second == pytest.approx(r.global_batch / r.step_seconds)


def test_real_run_speedup_and_efficiency_follow_the_formulas(run):
    w1, w2 = run.row("weak", 1), run.row("weak", 2)
    s1, s2 = run.row("strong", 1), run.row("strong", 2)
    assert (w1.speedup, w1.efficiency, s1.speedup, s1.efficiency) == (1, 1, 1, 1)
    assert w2.efficiency == pytest.approx(
        w2.samples_per_second / (2 * w1.samples_per_second)
    )
    assert s2.speedup == pytest.approx(s1.step_seconds / s2.step_seconds)
    assert s2.efficiency == pytest.approx(s2.speedup / 2)
    with pytest.raises(KeyError, match=r"no row for mode='weak', world_size=4; have"):
        run.row("weak", 4)


def test_real_run_predicts_the_allreduce_from_an_in_run_fit(run):
    two = run.row("weak", 2)
    assert two.fit_sizes == [4096, 23_688, 94_760, 379_048]  # 4 KiB, 1/16 .. all
    assert len(two.fit_seconds) == 4 and min(two.fit_seconds) > 0
    assert run.row("strong", 2).fit_sizes == []  # one fit per world size
    assert two.alpha >= 0 and two.beta > 0
    assert two.predicted_allreduce_seconds == pytest.approx(
        ring_all_reduce_time(run.gradient_bytes, 2, two.alpha, two.beta)
    )
    assert run.row("weak", 1).predicted_allreduce_seconds == 0.0
    text = "\n".join(run.explain())
    assert "gradients: 0.38 MB (94,762 parameters); alpha and beta: fitted" in text
    assert "weak, 2 ranks: predicted all-reduce " in text
    assert " ms per step -> communication at most " in text
    assert "on the CPU the ranks share this machine's" in text


def test_json_and_csv_are_complete_and_json_reads_back(run, tmp_path):
    json_path, csv_path = run.save(tmp_path / "sub" / "scale")
    assert (json_path.name, csv_path.name) == ("scale.json", "scale.csv")
    assert load_scaling(json_path) == run
    data = json.loads(json_path.read_text())
    assert data["kind"] == "workshop.scaling"
    assert data["versions"]["torch"] and data["versions"]["python"]
    assert data["machine"]["cpu_count"] and data["machine"]["host"] is not None
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["mode"], r["ranks"]) for r in rows] == [
        ("weak", "1"),
        ("weak", "2"),
        ("strong", "1"),
        ("strong", "2"),
    ]
    for line, row in zip(rows, run.rows, strict=True):
        assert float(line["throughput"]) == row.samples_per_second
        assert float(line["efficiency"]) == row.efficiency
        assert json.loads(line["step_times_s"]) == row.step_times
        assert json.loads(line["compute_times_s"]) == row.compute_times
        assert line["backend"] == "gloo" and line["torch"] == run.versions["torch"]
        assert line["model"] == "cnn" and line["device"] == "CPU"


def test_load_scaling_says_what_is_wrong_with_a_file(tmp_path, run):
    with pytest.raises(FileNotFoundError, match=r"no scaling results at .*nothing"):
        load_scaling(tmp_path / "nothing.json")
    _, csv_path = run.save(tmp_path / "scale")
    with pytest.raises(ValueError, match=r"is not JSON .*pass the \.json file"):
        load_scaling(csv_path)
    other = tmp_path / "other.json"
    other.write_text('{"kind": "allreduce"}')
    with pytest.raises(ValueError, match=r"is not a scaling run \(its 'kind' is"):
        load_scaling(other)


# ------------------------------------------------------------------ command line
def _bench(*args: str):
    return run_module("workshop.bench", "scaling", *args, timeout=120)


def test_cli_runs_end_to_end_with_alpha_and_beta_given(tmp_path):
    prefix = tmp_path / "cli"
    run = _bench(
        *("--world-sizes", "1,2", "--mode", "weak", "--steps", "2", "--warmup", "1"),
        *("--backend", "gloo"),  # what the lines below check, on any machine
        *("--batch", "8", "--image-size", "16", "--alpha", "1e-5", "--beta", "1e9"),
        *("--out", str(prefix), "--plot"),
    )
    assert run.returncode == 0, run.stderr
    assert f"wrote {prefix}.png" in run.stdout
    assert (tmp_path / "cli.png").read_bytes().startswith(b"\x89PNG")
    out = run.stdout
    flat = " ".join(out.split())  # the report's sentences wrap at 88 columns
    assert "measuring cnn at world sizes 1,2, weak scaling, one launch each" in out
    assert "  weak scaling, 2 ranks, 8 per rank: " in out
    assert "DDP scaling of cnn (94,762 parameters, 16px synthetic images), gloo" in out
    assert "mode   ranks batch/rank samples/s speed-up effic." in out
    # 2 ring steps of 10 us, and 379,048 bytes at 1 GB/s: 0.40 ms.
    assert "weak, 2 ranks: predicted all-reduce 0.40 ms vs compute " in flat
    assert "alpha and beta: given (alpha 1e-05 s, beta 1e+09 B/s)" in flat
    assert f"wrote {prefix}.json" in out and f"wrote {prefix}.csv" in out
    assert "finished in " in out
    result = load_scaling(f"{prefix}.json")
    assert [r.world_size for r in result.rows] == [1, 2]
    assert result.row("weak", 2).fit_sizes == []  # nothing to fit


def test_cli_reports_a_bad_global_batch_without_starting_ranks():
    run = _bench("--world-sizes", "1,4", "--mode", "strong", "--global-batch", "6")
    assert run.returncode == 2
    assert "python -m workshop.bench scaling: error: strong scaling splits the " in (
        run.stderr
    )
    assert "6 does not divide by world size 4" in run.stderr
    bad = _bench("--world-sizes", "1,x")
    assert bad.returncode == 2
    assert (
        "argument --world-sizes: 1,x is not a list of rank counts, each 1 or more and "
        "none twice; e.g. --world-sizes 1,2,4" in bad.stderr
    )


def test_cli_under_torchrun_measures_its_world_size_against_a_baseline(tmp_path, run):
    baseline, _ = run.save(tmp_path / "base")
    prefix = tmp_path / "torchrun"
    logs = f"--log-dir={tmp_path / 'torchrun-logs'}"  # not a torchelastic_* in /tmp
    done = run_module(
        "torch.distributed.run",
        logs,
        *("--standalone", "--nproc_per_node=2", "-m", "workshop.bench", "scaling"),
        *("--backend", "gloo"),  # as the baseline was measured
        *("--mode", "weak", "--steps", "2", "--warmup", "1", "--batch", "8"),
        *("--image-size", "16", "--baseline", str(baseline), "--out", str(prefix)),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("DDP scaling of cnn") == 1  # rank 0 alone reports
    assert "Warning" not in done.stderr  # e.g. DDP's renamed broadcast_buffers
    result = load_scaling(f"{prefix}.json")
    assert result.launcher == "torchrun"
    (row,) = result.rows
    assert (row.mode, row.world_size, row.base_world_size) == ("weak", 2, 1)
    one = run.row("weak", 1)
    assert row.efficiency == pytest.approx(
        row.samples_per_second / (2 * one.samples_per_second)
    )
    # A baseline that measured another batch cannot be compared, and says so.
    other = tmp_path / "other"
    done = run_module(
        "torch.distributed.run",
        logs,
        *("--standalone", "--nproc_per_node=1", "-m", "workshop.bench", "scaling"),
        *("--backend", "gloo"),
        *("--mode", "weak", "--steps", "2", "--warmup", "1", "--batch", "4"),
        *("--image-size", "16", "--baseline", str(baseline), "--out", str(other)),
        timeout=120,
    )
    assert done.returncode != 0
    assert (
        "python -m workshop.bench scaling: error: the baseline cannot be compared "
        "with this run: it measured weak scaling with batch_per_rank 8 against 4; "
        "pass a baseline of the same model"
    ) in done.stderr
    assert "DDP scaling" not in done.stdout  # refused before measuring anything


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
