"""allreduce_worker: the sweep's checks before any rank starts, a real sweep on ranks,
and the command line."""

from __future__ import annotations

import os

import pytest
from conftest import clean_env
from test_allreduce_result import _synthetic

from workshop.bench.allreduce_result import (
    human_size,
    load_allreduce,
    message_sizes,
)
from workshop.bench.allreduce_worker import (
    allreduce_sweep,
    check_reference,
    check_sweep,
    measure_allreduce,
)


def test_default_sizes_run_from_4_kib_to_64_mib_by_fours():
    sizes = message_sizes()
    assert [human_size(s) for s in sizes] == [
        "4 KiB",
        "16 KiB",
        "64 KiB",
        "256 KiB",
        "1 MiB",
        "4 MiB",
        "16 MiB",
        "64 MiB",
    ]
    assert message_sizes(4096, 4096) == [4096]
    assert message_sizes(4096, 40000, factor=2) == [4096, 8192, 16384, 32768]


def test_bad_sizes_and_options_say_what_to_change():
    with pytest.raises(
        ValueError,
        match=r"max_size=1024 bytes \(1 KiB\) is smaller than min_size=4096 bytes "
        r"\(4 KiB\); raise max_size or lower min_size",
    ):
        message_sizes(4096, 1024)
    with pytest.raises(ValueError, match=r"min_size=6 bytes is not a whole number"):
        message_sizes(6, 1024)
    with pytest.raises(ValueError, match=r"factor=1: give 2 or more"):
        message_sizes(4096, 8192, factor=1)
    with pytest.raises(ValueError, match=r"sizes is empty"):
        check_sweep([], 1, 0, 0.0)
    with pytest.raises(ValueError, match=r"sizes \[10\] are not whole numbers"):
        check_sweep([4096, 10], 1, 0, 0.0)
    with pytest.raises(ValueError, match=r"repeats must be a whole number, 1 or more"):
        check_sweep([4096], 0, 0, 0.0)
    with pytest.raises(ValueError, match=r"warmup must be a whole number, 0 or more"):
        check_sweep([4096], 1, -1, 0.0)
    with pytest.raises(ValueError, match=r"min_time=-1\.0: give 0 or more seconds"):
        check_sweep([4096], 1, 0, -1.0)
    # Passed before, and every rank failed on it (OverflowError, issue 35).
    with pytest.raises(ValueError, match=r"min_time=inf: give 0 or more seconds per "):
        check_sweep([4096], 1, 0, float("inf"))
    with pytest.raises(ValueError, match=r"min_time='1': give 0 or more seconds per "):
        check_sweep([4096], 1, 0, "1")
    assert check_sweep([65536, 4096, 4096], 1, 0, 0.0) == [4096, 65536]


def test_one_rank_is_refused_before_anything_starts():
    with pytest.raises(
        ValueError, match=r"world_size must be a .*an all-reduce on one rank"
    ):
        measure_allreduce(1)


def test_a_reference_copy_too_small_to_time_is_refused_before_anything_starts():
    # 0 became a 4-byte copy, and busbw was reported as 160% (or 800%) of it.
    message = (
        r"a reference copy of 0 bytes is too small to time: give 1 MiB or more "
        r"\(--reference-size 1M, reference_bytes=1048576\); the default is 256 MiB\. "
        r"A smaller copy takes a few microseconds, mostly the call's own cost, so "
        r"its bandwidth says nothing about memory"
    )
    with pytest.raises(ValueError, match=message):
        measure_allreduce(2, sizes=[4096], reference_bytes=0)
    with pytest.raises(ValueError, match=r"a reference copy of 1048572 bytes is too"):
        check_reference((1 << 20) - 4)
    assert check_reference(1 << 20) == 1 << 20


def test_the_sweep_outside_a_rank_says_how_to_run_it():
    with pytest.raises(
        RuntimeError, match=r"allreduce_sweep runs in every rank.*measure_allreduce"
    ):
        allreduce_sweep([4096])


def test_every_rank_returns_the_same_result(no_leftover_children):
    from workshop import launch

    run = launch(
        allreduce_sweep,
        [4096, 16384],
        repeats=2,
        warmup=0,
        min_time=0,
        reference_bytes=1 << 20,  # the smallest reference allowed
        world_size=2,
        show="none",
    )
    assert run.returns[0] == run.returns[1]
    assert run.returns[0].warmup == 0
    assert [len(times) for times in run.returns[0].seconds] == [2, 2]


def test_min_time_repeats_fast_sizes_up_to_max_repeats(no_leftover_children):
    result = measure_allreduce(
        2,
        sizes=[4096],
        repeats=3,
        warmup=2,
        min_time=60.0,
        reference_bytes=1 << 20,  # the smallest reference allowed
        max_repeats=7,
    )
    assert len(result.seconds[0]) == 7  # 60 s of 4 KiB calls, cut at 7


def test_sizes_beyond_memory_are_skipped_on_every_rank(
    monkeypatch, no_leftover_children
):
    from workshop import launch
    from workshop.bench import allreduce_worker

    # Ranks are forked, so they see this: 80 KiB usable, a quarter for messages.
    # (Forking needs this process free of CUDA: conftest runs GPU tests last and
    # fails a test that starts CUDA here.)
    monkeypatch.setattr(allreduce_worker, "_usable_bytes", lambda *_: 80 * 1024)
    run = launch(
        allreduce_sweep,
        [4096, 16384, 65536],
        repeats=1,
        warmup=0,
        min_time=0,
        world_size=2,
        show="none",
        start_method="fork",
    )
    result = run.returns[0]
    assert result.sizes == [4096, 16384] and result.skipped_sizes == [65536]
    assert result.reference["bytes"] == 20 * 1024  # the copy is capped too
    assert run.returns[1].sizes == result.sizes


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--min-size", "4K", "--max-size", "1K"],
            "max_size=1024 bytes (1 KiB) is "
            "smaller than min_size=4096 bytes (4 KiB); raise max_size",
        ),
        (
            ["--world-size", "1"],
            "argument --world-size: 1 is not a whole number, 2 or "
            "more (an all-reduce needs 2 ranks); e.g. --world-size 2",
        ),
        (["--max-size", "3X"], "cannot read the size '3X'"),
        (
            ["--repeats", "0"],
            "argument --repeats: 0 is not a whole number, 1 or more "
            "(each size is timed at least once); e.g. --repeats 20",
        ),
        (
            ["--reference-size", "0"],
            "argument --reference-size: a reference copy of 0 bytes is too small to "
            "time: give 1 MiB or more (--reference-size 1M, ",
        ),
        (
            ["--reference-size", "64K"],
            "a reference copy of 65536 bytes is too small to time: give 1 MiB or more",
        ),
    ],
)
def test_cli_rejects_bad_options_before_starting_ranks(
    tmp_path, monkeypatch, capsys, args, message
):
    from workshop.bench.__main__ import main as bench

    monkeypatch.chdir(tmp_path)
    try:
        code = bench(["allreduce", *args])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def _cli_without_a_launcher(monkeypatch, *args: str) -> int:
    """``python -m workshop.bench allreduce ARGS`` in this process, as if no launcher
    started it (a test run under srun or mpirun has their variables)."""
    from workshop.bench.__main__ import main as bench

    for key in set(os.environ) - set(clean_env()):
        monkeypatch.delenv(key)
    return bench(["allreduce", *args])


def test_cli_checks_that_out_can_be_written_before_starting_ranks(
    tmp_path, monkeypatch, capsys
):
    # As root, chmod stops no write: a path under a regular file cannot be made.
    (tmp_path / "file.txt").write_text("x")
    out = tmp_path / "file.txt" / "ar"
    assert _cli_without_a_launcher(monkeypatch, "--out", str(out)) == 2
    shown = capsys.readouterr()
    assert shown.err == (
        f"python -m workshop.bench allreduce: error: --out {out}: cannot write files "
        f"there ({tmp_path / 'file.txt'} is a file, not a folder); checked before "
        "measuring. Pass a PREFIX in a folder you can write, e.g. --out runs/ar\n"
    )
    assert shown.out == ""  # no rank was started


def test_cli_prints_the_results_when_writing_them_fails_at_the_end(
    tmp_path, monkeypatch, capsys
):
    from workshop.bench import allreduce_worker

    folder = tmp_path / "runs"

    def measured(*args, **kwargs):
        # The folder was writable when checked, and is gone by the end (a file
        # took its place), as when a shared disk fills or a job's folder is cleared.
        folder.rmdir()
        folder.write_text("not a folder")
        return _synthetic()

    monkeypatch.setattr(allreduce_worker, "measure_allreduce", measured)
    prefix = folder / "ar"
    assert _cli_without_a_launcher(monkeypatch, "--out", str(prefix), "--plot") == 1
    shown = capsys.readouterr()
    assert shown.err == (
        f"could not write the results to {prefix}.json ({folder} is a file, not a "
        "folder). They follow as that file would have held them: copy the lines "
        "between the markers to ar.json in a folder you can write\n"
    )
    assert "ring model: alpha = 300.0 us per step" in shown.out  # the summary, too
    assert "wrote " not in shown.out
    text = shown.out.split("----- ar.json -----\n")[1]
    text = text.split("\n----- end of ar.json -----")[0]
    (tmp_path / "kept.json").write_text(text)
    kept = load_allreduce(tmp_path / "kept.json")
    assert kept.seconds == _synthetic().seconds  # every repetition, none lost


def test_cli_under_a_launcher_of_one_rank_asks_for_two(monkeypatch, capsys):
    from workshop.bench.__main__ import main as bench

    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    assert bench(["allreduce"]) == 2
    assert "torchrun started 1 rank, and an all-reduce needs 2 or more" in (
        capsys.readouterr().err
    )
