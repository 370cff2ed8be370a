"""python -m workshop.bench launch and train: they run, print their tables and write
their figures. Launch times gloo ranks everywhere; train runs on the CPU where the
test hides the GPUs, and on the GPU in the test marked gpu."""

from __future__ import annotations

import json
import re

import pytest
from conftest import run_module

from workshop.env import visible_gpu_count

# What CUDA_VISIBLE_DEVICES="" gives: no GPU for this process, whatever the machine.
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


def _bench(*args: str, timeout: float = 300, **env: str):
    return run_module("workshop.bench", *args, timeout=timeout, **env)


def test_launch_benchmark_prints_ratios_and_writes_json(tmp_path):
    out = tmp_path / "launch.json"
    run = _bench(
        "launch",
        "--world-size",
        "2",
        "--repeats",
        "2",
        "--slow-repeats",
        "1",
        "--in-a-row",
        "3",
        "--methods",
        "fork,server",
        "--ddp-repeats",
        "0",  # test_launch_benchmark_sets_a_ddp_launch_against_a_trivial_one
        "--json",
        str(out),
    )
    assert run.returncode == 0, run.stderr
    text = run.stdout
    assert "workshop.launch start-up, world_size=2, gloo" in text
    for row in (
        "fork",
        "server",
        "  (first, cold start)",
        "bare fork+join",
        "torchrun",
    ):
        assert f"\n{row}" in text
    assert re.search(r"\nfork path: \d+\.\d\d times a bare fork-and-join", text)
    assert (
        "fastest path (" in text and "of torchrun's time (goal: at most 0.02)" in text
    )
    assert "3 launches in a row: 3 finished, 0 hung, 0 failed" in text
    report = json.loads(out.read_text())
    assert report["world_size"] == 2
    assert [p["method"] for p in report["paths"]] == ["fork", "server"]
    assert all(len(p["seconds"]) == 2 and p["median"] > 0 for p in report["paths"])
    assert report["paths"][1]["first"] > 0
    assert len(report["torchrun"]["seconds"]) == 1
    # Starting ranks by forking beats starting fresh interpreters under torchrun.
    assert report["paths"][0]["median"] < report["torchrun"]["median"]
    assert report["in_a_row"]["done"] == 3
    assert len(report["bare_fork"]["seconds"]) == 2
    assert report["bare_fork"]["median"] > 0


def test_launch_benchmark_sets_a_ddp_launch_against_a_trivial_one(tmp_path):
    out = tmp_path / "launch.json"
    run = _bench(
        *("launch", "--world-size", "2", "--repeats", "1", "--in-a-row", "0"),
        *("--methods", "fork", "--no-torchrun", "--ddp-repeats", "1"),
        *("--json", str(out)),
    )
    assert run.returncode == 0, run.stderr
    text = run.stdout
    assert (
        "\na launch whose 2 ranks build DDP + AdamW and step once, against a trivial"
        in text
    )
    assert "\nstart path             trivial s    DDP s   more s  first s\n" in text
    number = r"-?\d+\.\d{3}"
    for label in ("fork", "fork, no preload"):
        assert re.search(rf"\n{label} +{number} +{number} +{number} +{number}\n", text)
    assert re.search(
        r"\n  \(fork: the kernel's one-time import at its first launch: "
        r"\d+\.\d\d s, \d+ MB of RSS\)\n",
        text,
    )
    assert re.search(
        rf"\nfork: DDP \+ AdamW launch - trivial launch = {number} s "
        r"\(goal: at most 0\.35\): (met|NOT met)\n",
        text,
    )
    assert "no preload: DDP" not in text  # the figure before has no goal line
    rows = json.loads(out.read_text())["optimizer_launch"]
    assert [(r["method"], r["preload"]) for r in rows] == [
        ("fork", True),
        ("fork", False),
    ]
    assert all(len(r["trivial"]) == len(r["ddp"]) == 1 for r in rows)
    assert rows[0]["preload_seconds"] > 0 and rows[1]["preload_seconds"] is None


def test_a_failed_fresh_process_says_what_it_printed():
    from workshop.bench.launch_bench import time_optimizer_launch

    with pytest.raises(
        RuntimeError, match=r"(?s)timing nosuch launches failed:.*nosuch"
    ):
        time_optimizer_launch("nosuch", 2, 1)


def test_bench_without_a_command_shows_usage():
    run = _bench()
    assert run.returncode == 2
    assert "usage: python -m workshop.bench" in run.stderr


TRAIN = (
    *("train", "--model", "smallcnn", "--image-size", "16", "--batch-size", "16"),
    *("--steps", "3", "--warmup", "1", "--channels-last"),
)


def test_train_benchmark_reports_samples_per_second(tmp_path):
    out = tmp_path / "train.json"
    # The CPU on any machine: the train benchmark has no device option, and picks
    # the GPU where one is visible.
    run = _bench(*TRAIN, "--json", str(out), **NO_GPU)
    assert run.returncode == 0, run.stderr
    assert "smallcnn on CPU (cpu), batch 16, 16px, amp=bf16, channels_last=True: " in (
        run.stdout
    )
    report = json.loads(out.read_text())
    assert report["samples_per_second"] > 0 and report["steps"] == 3
    assert report["amp"] == "bf16" and report["batch_size"] == 16
    assert report["device"] == "CPU"


@pytest.mark.gpu
@pytest.mark.skipif(visible_gpu_count() == 0, reason="needs a CUDA GPU; none here")
def test_train_benchmark_runs_on_the_gpu_where_there_is_one(tmp_path):
    out = tmp_path / "train.json"
    # float32: bf16 is refused on GPUs before Ampere, and this test is for any GPU.
    run = _bench(*TRAIN, "--amp", "none", "--json", str(out))
    assert run.returncode == 0, run.stderr
    line = re.search(
        r"smallcnn on (.+) \((cuda(?::\d+)?)\), batch 16, 16px, amp=fp32, "
        r"channels_last=True: [\d,]+ samples/s",
        run.stdout,
    )
    assert line, run.stdout
    report = json.loads(out.read_text())
    assert report["device"] == line[1] != "CPU"  # the GPU's name, e.g. NVIDIA H100
    assert report["samples_per_second"] > 0
