"""python -m workshop.bench launch: it runs, prints its table and writes its figures."""

from __future__ import annotations

import json

from conftest import run_module


def _bench(*args: str, timeout: float = 300):
    return run_module("workshop.bench", *args, timeout=timeout)


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
        "--json",
        str(out),
    )
    assert run.returncode == 0, run.stderr
    text = run.stdout
    assert "workshop.launch start-up, world_size=2, gloo" in text
    for row in ("fork", "server", "  (first, cold start)", "torchrun"):
        assert f"\n{row}" in text
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


def test_bench_without_a_command_shows_usage():
    run = _bench()
    assert run.returncode == 2
    assert "usage: python -m workshop.bench" in run.stderr


def test_train_benchmark_reports_samples_per_second(tmp_path):
    out = tmp_path / "train.json"
    run = _bench(
        "train",
        "--model",
        "smallcnn",
        "--image-size",
        "16",
        "--batch-size",
        "16",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--channels-last",
        "--json",
        str(out),
    )
    assert run.returncode == 0, run.stderr
    assert "smallcnn on CPU (cpu), batch 16, 16px, amp=bf16, channels_last=True: " in (
        run.stdout
    )
    report = json.loads(out.read_text())
    assert report["samples_per_second"] > 0 and report["steps"] == 3
    assert report["amp"] == "bf16" and report["batch_size"] == 16
