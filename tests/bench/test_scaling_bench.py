"""python -m workshop.bench scaling: the formulas, the settings' errors, a real run at
1 and 2 ranks, its JSON and CSV, the command line and the torchrun path."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pytest
from conftest import clean_env
from scaling_helpers import scaling_result

from workshop.bench import scaling_measure
from workshop.bench.scaling_measure import (
    measure_scaling,
    scaling_batch,
    scaling_worker,
)
from workshop.bench.scaling_plots import load_scaling
from workshop.bench.scaling_results import strong_scaling, weak_scaling


# ------------------------------------------------------------------ formulas
def test_weak_scaling_is_throughput_over_n_times_one_rank():
    assert weak_scaling(100.0, 360.0, 4) == pytest.approx((3.6, 0.9))
    assert weak_scaling(100.0, 100.0, 1) == (1.0, 1.0)
    # From 2 ranks: 300 -> 1100 samples/s at 8 ranks is 11/3 faster, 4x the ranks.
    speedup, efficiency = weak_scaling(300.0, 1100.0, 8, base_world_size=2)
    assert speedup == pytest.approx(11 / 3)
    assert efficiency == pytest.approx(11 / 12)


def test_strong_scaling_is_time_ratio_and_speedup_over_n():
    assert strong_scaling(0.08, 0.025, 4) == pytest.approx((3.2, 0.8))
    speedup, efficiency = strong_scaling(0.05, 0.02, 8, base_world_size=2)
    assert speedup == pytest.approx(2.5)
    assert efficiency == pytest.approx(0.625)


def test_formulas_refuse_values_that_are_not_positive():
    with pytest.raises(
        ValueError, match=r"baseline must be a number above 0, not 0\.0"
    ):
        weak_scaling(0.0, 10.0, 2)
    with pytest.raises(
        ValueError, match=r"measured value must be a number above 0, not -1"
    ):
        strong_scaling(1.0, -1, 2)
    with pytest.raises(
        ValueError, match=r"world_size must be a whole number, 1 or more, not 0"
    ):
        weak_scaling(1.0, 1.0, 0)


def test_strong_scaling_says_when_the_global_batch_does_not_divide():
    assert scaling_batch("strong", 64, 4) == 16
    assert scaling_batch("weak", 64, 4) == 64
    with pytest.raises(
        ValueError,
        match=r"global batch of 30 samples across the ranks, but 30 does not divide "
        r"by world size 4; pass a global batch that is a multiple of 4 \(for example "
        r"32\), or world sizes that divide 30",
    ):
        scaling_batch("strong", 30, 4)
    with pytest.raises(ValueError, match=r"mode='both' is not known"):
        scaling_batch("both", 30, 4)


def test_settings_are_checked_before_any_rank_starts():
    # Strong scaling at 1, 2, 3 and 4 ranks needs a multiple of 12.
    with pytest.raises(
        ValueError,
        match=r"30 does not divide by world size 4; pass a global batch that is a "
        r"multiple of 12 \(for example 24\)",
    ):
        measure_scaling((1, 2, 3, 4), "both", batch=8, global_batch=30)
    with pytest.raises(ValueError, match=r"does not divide by world size 4"):
        measure_scaling((1, 4), "strong", batch=6)  # the global batch is batch
    with pytest.raises(ValueError, match=r"world_sizes must be one or more .*not \(\)"):
        measure_scaling(())
    with pytest.raises(ValueError, match=r"world_sizes must be one or more .*not 4"):
        measure_scaling(4)
    with pytest.raises(ValueError, match=r"world_sizes=\[1, 2, 2\] repeats"):
        measure_scaling([1, 2, 2])
    with pytest.raises(
        ValueError,
        match=r"world_sizes must be one or more whole numbers, each 1 or more, "
        r"not \[0, 2\]",
    ):
        measure_scaling([0, 2])
    with pytest.raises(
        ValueError, match=r"mode must be one of 'weak', 'strong' or 'both', not 'wide'"
    ):
        measure_scaling(mode="wide")
    with pytest.raises(ValueError, match=r"model must be one of 'cnn', .* not 'vgg'"):
        measure_scaling(model="vgg")
    with pytest.raises(
        ValueError, match=r"steps must be a whole number, 1 or more, not 0"
    ):
        measure_scaling(steps=0)
    with pytest.raises(ValueError, match=r"got alpha=1e-05 and beta=None; pass both"):
        measure_scaling(alpha=1e-5)
    with pytest.raises(ValueError, match=r"need alpha >= 0 and beta > 0"):
        measure_scaling(alpha=1e-5, beta=0.0)
    # Each of these ran, or failed inside every rank, before (issue 35).
    with pytest.raises(ValueError, match=r"both finite numbers, got 0.0 and inf"):
        measure_scaling(alpha=0.0, beta=math.inf)
    with pytest.raises(ValueError, match=r"numbers, got '1e-5' and 1000000000\.0"):
        measure_scaling(alpha="1e-5", beta=1e9)
    with pytest.raises(
        ValueError,
        match=r"seed must be a whole number, 0 or more, not 'x'; e\.g\. seed=0",
    ):
        measure_scaling(seed="x")


def test_alpha_and_beta_from_the_allreduce_benchmarks_file(monkeypatch, tmp_path):
    """Read through load_allreduce where it exists; stubbed here, so this test does
    not depend on the all-reduce benchmark's own format."""
    from workshop.bench.scaling_measure import given_alpha_beta

    path = tmp_path / "allreduce.json"
    monkeypatch.setattr(
        scaling_measure,
        "load_allreduce",
        lambda p: {"fit": {"alpha": 2e-5, "beta": 5e8}},
    )
    alpha, beta, source = given_alpha_beta(None, None, path)
    assert (alpha, beta) == (2e-5, 5e8) and source == f"from {path}"

    class Sweep:  # a result object whose fit() method fits the model
        def fit(self):
            return SimpleNamespace(alpha=3e-5, beta=2e9)

    monkeypatch.setattr(scaling_measure, "load_allreduce", lambda p: Sweep())
    assert given_alpha_beta(None, None, path)[:2] == (3e-5, 2e9)
    monkeypatch.setattr(scaling_measure, "load_allreduce", lambda p: {})
    with pytest.raises(ValueError, match=r"holds no alpha and beta fit; run"):
        given_alpha_beta(None, None, path)
    with pytest.raises(ValueError, match=r"not both"):
        given_alpha_beta(1e-5, 1e9, path)


def test_worker_outside_a_process_group_says_how_to_run_it():
    with pytest.raises(RuntimeError, match=r"scaling_worker needs a process group"):
        scaling_worker()


def test_one_backend_serves_every_world_size(monkeypatch):
    """The backend "auto" is settled for the largest world size, so that a node with
    one GPU does not measure 1 rank on the GPU and 2 on the CPU."""
    import torch.distributed as dist

    import workshop.env
    import workshop.ranks.launcher

    backends = []

    def fake_launch(fn, *, world_size, backend, **kwargs):
        backends.append(backend)
        times = [[0.01] * kwargs["steps"]] * world_size
        raw = {
            **{k: kwargs[k] for k in ("mode", "model", "fit_sizes")},
            **{"world_size": world_size, "backend": backend, "device": "CPU"},
            **{"batch_per_rank": 8, "global_batch": 8 * world_size},
            **{"image_size": 16, "parameters": 10, "gradient_bytes": 40},
            **{"threads_per_rank": 1, "fit_seconds": []},
            **{"step_seconds": times, "compute_seconds": times},
            "allreduce_seconds": [0.0] * kwargs["steps"],
        }
        return SimpleNamespace(returns=[raw])

    monkeypatch.setattr(workshop.ranks.launcher, "launch", fake_launch)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    settings = {"alpha": 1e-5, "beta": 1e9, "steps": 2}
    for gpus, expected in ((0, "gloo"), (1, "gloo"), (2, "nccl")):
        monkeypatch.setattr(workshop.env, "visible_gpu_count", lambda gpus=gpus: gpus)
        backends.clear()
        result = measure_scaling((1, 2), "weak", **settings)
        assert backends == [expected, expected], gpus
        assert result.backend == expected
    monkeypatch.setattr(workshop.env, "visible_gpu_count", lambda: 1)
    backends.clear()
    with pytest.raises(ValueError, match=r"world_size=2 but only 1 GPU is visible"):
        measure_scaling((1, 2), "weak", backend="nccl", **settings)
    assert backends == []  # refused before any launch


def _bench_here(monkeypatch, *args: str) -> int:
    """``python -m workshop.bench scaling ARGS`` in this process, as if no launcher
    started it (a test run under srun or mpirun has their variables); its exit code,
    argparse's included."""
    from workshop.bench.__main__ import main as bench

    for key in set(os.environ) - set(clean_env()):
        monkeypatch.delenv(key)
    try:
        return bench(["scaling", *args])
    except SystemExit as exc:  # argparse's own errors
        return exc.code


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # Each of these was taken for "the default" (32) or passed over before.
        (["--batch", "0"], "argument --batch: 0 is not a whole number, 1 or more; "
         "e.g. --batch 32"),
        (["--image-size", "0"], "argument --image-size: 0 is not a whole number, 1 "
         "or more; e.g. --image-size 32"),
        (["--global-batch", "0"], "argument --global-batch: 0 is not a whole number, "
         "1 or more; e.g. --global-batch 64"),
        (["--steps", "0"], "argument --steps: 0 is not a whole number, 1 or more"),
        (["--warmup", "-1"], "argument --warmup: -1 is not a whole number, 0 or more"),
        (["--timeout", "0"], "argument --timeout: 0 is not a number above 0; e.g. "
         "--timeout 600"),
        (["--baseline", "/missing"], "argument --baseline: cannot use /missing as a "
         "baseline: no scaling results at '/missing'; write them with `python -m "
         "workshop.bench scaling --out PREFIX` (PREFIX.json)"),
        (["--allreduce-json", "/missing"], "argument --allreduce-json: cannot use "
         "/missing as the all-reduce fit: no all-reduce result at /missing; pass the "
         ".json file"),
        (["--image-size", "2"], "image_size must be a whole number, 4 or more, not 2; "
         "pixels for model 'cnn' (its two 2x2 poolings need 4); pass, e.g., "
         "image_size=32"),
    ],
)  # fmt: skip
def test_cli_refuses_bad_values_before_measuring(monkeypatch, capsys, args, message):
    assert _bench_here(monkeypatch, "--world-sizes", "1", *args) == 2
    shown = capsys.readouterr()
    assert message in shown.err
    assert "measuring" not in shown.out  # nothing started


def test_measure_scaling_refuses_an_image_size_of_zero():
    with pytest.raises(
        ValueError,
        match=r"image_size must be a whole number, 1 or more, not 0; pixels for "
        r"model 'resnet18'; pass, e.g., image_size=224, or None for that default",
    ):
        measure_scaling((1,), model="resnet18", image_size=0)


def test_cli_refuses_a_baseline_when_it_measures_every_world_size_itself(
    monkeypatch, capsys, tmp_path
):
    baseline, _ = scaling_result([]).save(tmp_path / "base")
    assert _bench_here(monkeypatch, "--baseline", str(baseline)) == 2
    shown = capsys.readouterr()
    assert (
        "python -m workshop.bench scaling: error: --baseline compares a run that "
        "torchrun, srun or mpirun started at one world size with an earlier run; "
        "this run measures every world size itself and compares them with the "
        "smallest. Leave --baseline out, or run under a launcher"
    ) in shown.err
    assert "measuring" not in shown.out


def test_cli_checks_that_out_can_be_written_before_measuring(
    monkeypatch, capsys, tmp_path
):
    # As root, chmod stops no write: a path under a regular file cannot be made.
    (tmp_path / "file.txt").write_text("x")
    out = tmp_path / "file.txt" / "out"
    assert _bench_here(monkeypatch, "--world-sizes", "1", "--out", str(out)) == 2
    shown = capsys.readouterr()
    assert (
        f"python -m workshop.bench scaling: error: --out {out}: cannot write files "
        f"there ({tmp_path / 'file.txt'} is a file, not a folder); checked before "
        "measuring. Pass a PREFIX in a folder you can write, e.g. --out runs/out"
    ) in shown.err
    assert "measuring" not in shown.out
    # A folder that is missing is made (and nothing is left in it but the results).
    made = tmp_path / "new" / "deeper"
    from workshop.bench.bench_output import check_writable

    assert check_writable(made / "scale") == made and list(made.iterdir()) == []


def test_cli_prints_the_results_when_writing_them_fails_at_the_end(
    monkeypatch, capsys, tmp_path
):
    from workshop.bench import scaling_bench
    from workshop.bench.scaling_results import ScalingRow

    folder = tmp_path / "runs"
    row = ScalingRow("weak", 1, 8, 8, 2, 800.0, 0.01, 0.008, 0.002, 0.0, 0.0)

    def measured(*args, **kwargs):
        # The folder was writable when checked, and is gone by the end (a file
        # took its place), as when a shared disk fills or a job's folder is cleared.
        folder.rmdir()
        folder.write_text("not a folder")
        return scaling_result([row])

    monkeypatch.setattr(scaling_bench, "measure_scaling", measured)
    prefix = folder / "scale"
    assert _bench_here(monkeypatch, "--world-sizes", "1", "--out", str(prefix)) == 1
    shown = capsys.readouterr()
    assert (
        f"could not write the results to {prefix}.json ({folder} is a file, not a "
        "folder). They follow as that file would have held them: copy the lines "
        "between the markers to scale.json in a folder you can write"
    ) in shown.err
    assert "mode   ranks batch/rank samples/s" in shown.out  # the table, as ever
    text = shown.out.split("----- scale.json -----\n")[1]
    text = text.split("\n----- end of scale.json -----")[0]
    kept = tmp_path / "kept.json"
    kept.write_text(text)
    assert load_scaling(kept).rows[0].samples_per_second == 800.0  # nothing lost


def test_docstring_examples_run():
    import doctest

    from workshop.bench import scaling_measure, scaling_results

    for module in (scaling_results, scaling_measure):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_explain_flags_a_busy_machine_when_equal_work_took_unequal_time():
    from workshop.bench.scaling_results import ScalingRow

    def row(mode: str, seconds: float) -> ScalingRow:
        return ScalingRow(mode, 1, 32, 32, 2, 32 / seconds, seconds, seconds, 0, 0)

    result = scaling_result([row("weak", 0.029), row("strong", 0.179)])
    assert (
        "check: at 1 rank the weak and strong runs did the same work but took "
        "29.0 and 179.0 ms per step; something else was using the machine, so run "
        "again when it is idle"
    ) in result.explain()
    result.rows[1] = row("strong", 0.031)
    assert not any(line.startswith("check:") for line in result.explain())


def test_table_and_report_fit_88_columns_with_big_numbers_and_long_names():
    from workshop.bench.scaling_results import ScalingRow

    # 1,024 GPUs, a batch of 4,096 per rank, 2.5 million samples/s, 9.9 s steps.
    rows = [
        ScalingRow(mode, n, 4096, 4096 * n, 8, 2.5e6 * n / 1024, 9.9, 8.1, 1.8, 7.25,
                   predicted_allreduce_seconds=1.5)
        for mode in ("weak", "strong")
        for n in (1, 1024)
    ]  # fmt: skip
    result = scaling_result(
        rows,
        model="resnet152-with-a-long-experiment-name-for-the-record",
        parameters=60_192_808,
        gradient_bytes=240_771_232,
        alpha_beta_source="fitted in this run to all-reduces of 4 sizes at each "
        "world size",
        machine={"cpu_count": 128},
        versions={"torch": "2.15.0+cu132"},
    )
    from workshop.bench.scaling_results import add_speedups

    add_speedups(result.rows)
    table, report = result.table(), result.report()
    assert "2,500,000" in table and "9900.0" in table and "1024.00" in table
    assert max(len(line) for line in (table + "\n" + report).splitlines()) <= 88
    # The table's header: what each column is, with the unit above the times.
    assert table.splitlines()[1].split() == [
        "mode", "ranks", "batch/rank", "samples/s", "speed-up", "effic.",
        "step", "compute", "comm", "pred.", "in", "flight",
    ]  # fmt: skip
    assert "ms per step" in table.splitlines()[0]
    assert "all-reduce ms" in table.splitlines()[0]
    # The report's sentences are whole once their wrapped lines are joined.
    assert " ".join(report.split()).count("resnet152-with-a-long-experiment-name") == 1
