"""A plan becomes a job (workshop/planner/job.py, job_train.py): the script and plan
file it writes, its refusals, and the job itself on the private two-node Slurm
cluster (gloo on CPUs, 2 nodes x 2 ranks) for a dp x tp and a dp x pp layout, whose
measured bytes and collectives must be the estimate's; on a GPU, the same training
under torchrun with NCCL."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, clean_env

from workshop.env import visible_gpu_count
from workshop.planner.estimator import estimate
from workshop.planner.job import (
    LOSS_WEIGHT,
    STEP_COUNTER,
    job_against_estimate,
    job_figures,
    job_rows,
    write_job,
)
from workshop.planner.job_train import read_plan, shape_fields
from workshop.planner.layout import Layout, model_shape

FP32 = {"micro_batch": 2, "precision": "fp32"}
DP_TP = Layout(dp=2, tp=2, zero=3, **FP32)
DP_PP = Layout(dp=2, pp=2, zero=0, **FP32)
CPU = {"nodes": 2, "gpus_per_node": 0, "ranks_per_node": 2}


# --- the files, everywhere ------------------------------------------------------------
def test_the_script_asks_slurm_for_the_plans_nodes_and_starts_torchrun(tmp_path):
    job = write_job("tiny", DP_PP, tmp_path, **CPU, time="00:05:00", mem="4G")
    text = job.script.read_text()
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=2",
        "#SBATCH --time=00:05:00",
        "#SBATCH --mem=4G",
        "set -euo pipefail",
        f"JOB_DIR={tmp_path}",
        "NPROC_PER_NODE=2",
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        "# export NCCL_DEBUG=INFO",
        '    torchrun --nnodes="$SLURM_NNODES" --nproc-per-node="$NPROC_PER_NODE" \\',
        '    --rdzv-backend=c10d --rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}" \\',
        # torchrun's logs with the job's files, not in a node's /tmp
        '    --rdzv-id="$SLURM_JOB_ID" --log-dir="${JOB_DIR}/torchrun-logs" \\',
        '    -m workshop.planner.job_train --plan "${JOB_DIR}/plan.json"',
    ):
        assert line in text.splitlines(), line
    assert "--gpus-per-node" not in text  # CPU ranks
    assert all(
        len(line) <= 88 for line in text.splitlines() if str(tmp_path) not in line
    )
    plan = read_plan(job.plan)
    assert (plan["layout"], plan["model"].name, plan["steps"]) == (DP_PP, "tiny", 3)


def test_a_gpu_job_asks_for_one_gpu_per_rank_and_leaves_memory_to_the_site(tmp_path):
    job = write_job("tiny", DP_TP, tmp_path, nodes=1, gpus_per_node=4)
    lines = job.script.read_text().splitlines()
    assert "#SBATCH --gpus-per-node=4" in lines and "NPROC_PER_NODE=4" in lines
    assert "##SBATCH --mem=16G" in lines  # a hint, commented
    assert (job.nodes, job.ranks_per_node) == (1, 4)


def test_the_script_passes_bash_n_and_shellcheck(tmp_path):
    for gpus, ranks, nodes in ((0, 2, 2), (4, 4, 1)):
        job = write_job("tiny", DP_TP, tmp_path / str(gpus), nodes=nodes,
                        gpus_per_node=gpus, ranks_per_node=ranks)  # fmt: skip
        done = subprocess.run(["bash", "-n", str(job.script)], capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        if shutil.which("shellcheck") is None:
            continue
        done = subprocess.run(
            ["shellcheck", "--severity=style", str(job.script)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout


def test_writing_again_removes_an_earlier_runs_figures(tmp_path):
    (tmp_path / "rank-0.json").write_text("{}")
    write_job("tiny", DP_TP, tmp_path, **CPU)
    assert not (tmp_path / "rank-0.json").exists()
    with pytest.raises(FileNotFoundError, match=r"no rank-\*\.json in .*job\.wait"):
        job_figures(tmp_path)


@pytest.mark.parametrize(
    ("model", "layout", "kwargs", "match"),
    [
        ("tiny", Layout(dp=2, tp=2, pp=2), CPU,
         r"nodes=2 x 2 ranks per node = 4 ranks, but the layout needs dp x tp x pp "
         r"= 2 x 2 x 2 = 8"),
        ("tiny", Layout(dp=4, tp=1, zero=1, precision="fp32"), CPU,
         r"layout\.zero=1 is not run by the job.*use zero=0 or zero=3"),
        ("tiny", Layout(dp=2, pp=2, zero=3, precision="fp32"), CPU,
         r"layout\.zero=3 with pp=2.*use zero=0 with pp > 1"),
        ("tiny", Layout(dp=2, pp=2, micro_batches=2, precision="fp32"), CPU,
         r"layout\.micro_batches=2 with pp=2 and dp=2.*use micro_batches=1"),
        ("tiny", Layout(dp=4), CPU, r"layout\.precision='bf16' with zero=0"),
        ("resnet50", Layout(dp=4), CPU, r"model='resnet50' is a module"),
        ("tiny", Layout(tp=8, dp=1, zero=3), {"nodes": 2, "gpus_per_node": 4},
         r"tp=8 does not divide tiny's heads=4"),
        ("tiny", DP_TP, {"nodes": 2, "gpus_per_node": 0},
         r"ranks_per_node=None with gpus_per_node=0.*ranks_per_node=2"),
        ("tiny", DP_TP, {"nodes": 2, "gpus_per_node": 2, "ranks_per_node": 1},
         r"ranks_per_node=1 but gpus_per_node=2: NCCL needs one GPU per rank"),
        ("tiny", DP_TP, {**CPU, "time": "ten minutes"}, r"time='ten minutes'"),
        ("tiny", DP_TP, {**CPU, "mem": "lots"}, r"mem='lots' is not a Slurm memory"),
        ("tiny", DP_TP, {**CPU, "backend": "nccl"},
         r"backend='nccl' with gpus_per_node=0"),
        ("tiny", DP_TP, {**CPU, "steps": 2}, r"steps=2 leaves no step to count"),
        ("tiny", DP_TP, {**CPU, "nodes": 0}, r"write_job: nodes=0 must be a whole"),
        ("tiny", Layout(dp=2, tp=2, zero=3, sequence_parallel=True), CPU,
         r"layout\.sequence_parallel=True is planned but not built"),
        ("tiny", Layout(pp=2, micro_batches=2, virtual_stages=2, dp=2,
                        precision="fp32"),
         CPU, r"layout\.virtual_stages=2 is planned but not built"),
        # Issue 35: ranks_per_node=-1 was named, or every rank failed on the seed.
        ("tiny", DP_TP, {"nodes": 2, "gpus_per_node": -1},
         r"write_job: gpus_per_node=-1 must be 0 \(CPU ranks\) or more"),
        ("tiny", DP_TP, {**CPU, "seed": "x"},
         r"write_job: seed='x' must be a whole number, e\.g\. seed=0"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_before_anything_is_written(
    tmp_path, model, layout, kwargs, match
):
    with pytest.raises(ValueError, match=match):
        write_job(model, layout, tmp_path / "job", **kwargs)
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        # Each gave a raw error before, or (calibrate) was taken as True.
        ({"folder": 5}, TypeError, r"write_job: folder must be a folder name, not 5"),
        ({"folder": None}, TypeError, r"folder must be a folder name, not None"),
        ({"calibrate": "no"}, ValueError,
         r"write_job: calibrate='no' must be True or False"),
        ({"model": ["tiny"]}, ValueError, r"model=\['tiny'\] is not one the planner"),
    ],
)  # fmt: skip
def test_wrong_kinds_are_refused_before_anything_is_written(
    tmp_path, kwargs, error, match
):
    args = {"model": "tiny", "layout": DP_TP, "folder": tmp_path / "job", **CPU}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        write_job(**args)
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        # TypeError from pathlib, "'int' object is not subscriptable" and
        # KeyError: 'node' before.
        (lambda: job_figures(5), TypeError,
         r"job must be the PlannedJob write_job returned or its folder, not 5"),
        (lambda: job_rows(5), TypeError,
         r"job_rows: figures must be a list of the ranks' figures \(dicts\), one "
         r"or more, not 5; e\.g\. figures = job_figures\(job\)"),
        (lambda: job_rows([5]), TypeError, r"not a list holding 5 \(a int\)"),
        (lambda: job_against_estimate([]), ValueError,
         r"job_against_estimate: figures must be .* one or more, not \[\]"),
        (lambda: job_against_estimate([{}]), ValueError,
         r"job_against_estimate: figures must be .* not a list holding one without "
         r"'rank'; e\.g\. figures = job_figures\(job\)"),
    ],
)  # fmt: skip
def test_wrong_figures_are_refused_naming_what_to_pass(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_rank_file_cut_short_is_named(tmp_path):
    (tmp_path / "rank-0.json").write_text('{"rank": 0, "wor')
    with pytest.raises(ValueError, match=r"holds a rank-\*\.json that is not JSON"):
        job_figures(tmp_path)


def test_a_folder_that_cannot_be_made_is_named(tmp_path):
    (tmp_path / "a-file").write_text("")
    folder = tmp_path / "a-file" / "job"  # FileExistsError or NotADirectoryError
    with pytest.raises(ValueError, match=r"write_job: folder='.*/a-file/job' cannot"):
        write_job("tiny", DP_TP, folder, **CPU)


def test_the_table_reads_figures_that_match_the_estimate():
    # Figures as two ranks of a dp=2 DDP job would write them, built from the
    # estimate itself plus what it leaves out: the table says so, line by line.
    lay = Layout(dp=2, **FP32)
    est = estimate("tiny", lay, gpus_per_node=1)
    ranks = []
    for rank in (0, 1):
        held = {k: int(est.memory[t]) for k, t in (("params", "parameters"),
                ("grads", "gradients"), ("optimizer", "optimizer"),
                ("activations", "activations"))}  # fmt: skip
        held["optimizer"] += STEP_COUNTER * 18
        held["activations"] += LOSS_WEIGHT
        ranks.append({
            "rank": rank, "world_size": 2, "node": rank, "device": "cpu",
            "backend": "gloo", "model": shape_fields(model_shape("tiny")),
            "layout": vars(lay),
            "stage": 0, "coordinates": lay.coordinates(rank), "how": "DDP over 2",
            "held": held, "parameter_tensors": 18, "checksum": 1.5,
            "collectives": {k: list(v) for k, v in est.collectives.items()},
            "steps": 3,
        })  # fmt: skip
    table = job_against_estimate(ranks)
    lines = table.splitlines()
    assert lines[0] == (
        "tiny, dp=2 tp=1 pp=1 DDP fp32 mb=2x1: 2 cpu ranks on 2 nodes, gloo, last of "
        "3 steps"
    )
    assert lines[1] == "ranks 0, 1: DDP over 2"
    assert "+72 B = 18 step counters" in lines[5]
    assert "+4 B = loss's total_weight" in lines[6]
    assert lines[-2].endswith("same") and lines[-1].endswith(
        "weights after the steps: yes"
    )
    assert all(len(line) <= 88 for line in lines)
    with pytest.raises(ValueError, match=r"figures must be .* one or more, not \[\]"):
        job_against_estimate([])


# --- the same training on a GPU, under torchrun with NCCL -----------------------------
@pytest.mark.gpu
@pytest.mark.skipif(visible_gpu_count() == 0, reason="needs a CUDA GPU")
def test_on_a_gpu_node_the_same_training_runs_with_nccl(tmp_path):
    gpus = 4 if visible_gpu_count() >= 4 else 2 if visible_gpu_count() >= 2 else 1
    layout = Layout(dp=max(gpus // 2, 1), tp=min(gpus, 2), zero=3, **FP32)
    job = write_job("tiny", layout, tmp_path, nodes=1, gpus_per_node=gpus)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--log-dir={tmp_path / 'torchrun-logs'}",  # not a torchelastic_* in /tmp
         f"--nproc-per-node={gpus}", "-m", "workshop.planner.job_train",
         "--plan", str(job.plan)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=clean_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    figures = job_figures(job)
    assert {f["backend"] for f in figures} <= {"nccl", "cpu:gloo,cuda:nccl"}
    assert all(f["device"].startswith("cuda") for f in figures)
    for row in job_rows(figures):
        guess, seen = row["estimate"], row["measured"]
        if isinstance(guess, int) and row["term"] != "activations":
            assert seen - guess == row["explained"], row
        elif row["term"] != "activations":
            assert seen == guess, row
    print(json.dumps(figures[0]["held"]))
