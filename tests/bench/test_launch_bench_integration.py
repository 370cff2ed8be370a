"""python -m workshop.bench launch (workshop.bench.launch_bench): it runs, prints its
table and writes its figures, timing gloo ranks everywhere. All slow: make test runs
them, make test-fast leaves them out."""

from __future__ import annotations

import json
import re

import pytest
from conftest import run_module


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
