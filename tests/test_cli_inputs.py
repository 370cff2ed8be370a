"""Every numeric and written-path option of ``python -m workshop`` and
``python -m workshop.bench`` refuses a bad value as argparse's one-line error that
names the option, the value and an example, before any work and without a
traceback (issue 35, item 6). In-process through each ``main``; a few cases through
a real ``python -m`` to see what a user sees."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workshop.__main__ import main as workshop_main
from workshop.bench import __main__ as bench

ROOT = Path(__file__).resolve().parents[1]

# (command line, the error line after "PROG: error: ")
BENCH = [
    ("launch --repeats 0", "argument --repeats: 0 is not a whole number, 1 or more; "
     "e.g. --repeats 5"),
    ("launch --world-size 0", "argument --world-size: 0 is not a whole number, 1 or "
     "more; e.g. --world-size 4"),
    ("launch --world-size -2", "argument --world-size: -2 is not a whole number, 1 "
     "or more; e.g. --world-size 4"),
    ("launch --slow-repeats x", "argument --slow-repeats: x is not a whole number, 1 "
     "or more; e.g. --slow-repeats 2"),
    ("launch --in-a-row -1", "argument --in-a-row: -1 is not a whole number, 0 or "
     "more; e.g. --in-a-row 50 (0 skips it)"),
    ("launch --ddp-repeats 1.5", "argument --ddp-repeats: 1.5 is not a whole number, "
     "0 or more; e.g. --ddp-repeats 3 (0 skips them)"),
    ("launch --methods fork,bogus", "argument --methods: fork,bogus is not a list of "
     "start paths from fork, server, spawn; e.g. --methods fork,server"),
    ("train --batch-size 0", "argument --batch-size: 0 is not a whole number, 1 or "
     "more; e.g. --batch-size 32"),
    ("train --image-size -1", "argument --image-size: -1 is not a whole number, 1 or "
     "more; e.g. --image-size 224"),
    ("train --steps 0", "argument --steps: 0 is not a whole number, 1 or more; e.g. "
     "--steps 30"),
    ("train --warmup -1", "argument --warmup: -1 is not a whole number, 0 or more; "
     "e.g. --warmup 5"),
    ("allreduce --world-size 1", "argument --world-size: 1 is not a whole number, 2 "
     "or more (an all-reduce needs 2 ranks); e.g. --world-size 2"),
    ("allreduce --factor 1", "argument --factor: 1 is not a whole number, 2 or more; "
     "e.g. --factor 4"),
    ("allreduce --repeats 0", "argument --repeats: 0 is not a whole number, 1 or "
     "more (each size is timed at least once); e.g. --repeats 20"),
    ("allreduce --warmup -1", "argument --warmup: -1 is not a whole number, 0 or "
     "more; e.g. --warmup 5"),
    ("allreduce --timeout 0", "argument --timeout: 0 is not a number above 0; e.g. "
     "--timeout 600"),
    ("allreduce --timeout nan", "argument --timeout: nan is not a number above 0; "
     "e.g. --timeout 600"),
]  # fmt: skip

WORKSHOP = [
    ("check-node --timeout -5", "argument --timeout: -5 is not a number above 0; "
     "e.g. --timeout 900"),
    ("check-node --launch-repeats 0", "argument --launch-repeats: 0 is not a whole "
     "number, 1 or more; e.g. --launch-repeats 3"),
    ("check-node --train-batch-size 0", "argument --train-batch-size: 0 is not a "
     "whole number, 1 or more; e.g. --train-batch-size 32"),
    ("check-node --train-image-size abc", "argument --train-image-size: abc is not a "
     "whole number, 1 or more; e.g. --train-image-size 224"),
    ("check-node --train-steps 0", "argument --train-steps: 0 is not a whole number, "
     "1 or more; e.g. --train-steps 30"),
    ("check-node --train-warmup -1", "argument --train-warmup: -1 is not a whole "
     "number, 0 or more; e.g. --train-warmup 5"),
    ("monitor --interval inf", "argument --interval: inf is not a number above 0; "
     "e.g. --interval 1"),
    ("monitor --seconds 0", "argument --seconds: 0 is not a number above 0; e.g. "
     "--seconds 600"),
    ("kernel-spec --timeout soon", "argument --timeout: soon is not a number above "
     "0; e.g. --timeout 120"),
]  # fmt: skip


def _refused(main, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(("line", "message"), BENCH)
def test_a_bench_option_refuses_a_bad_value(line, message, capsys):
    command = line.split()[0]
    last = _refused(bench.main, line.split(), capsys)
    assert last == f"python -m workshop.bench {command}: error: {message}"


@pytest.mark.parametrize(("line", "message"), WORKSHOP)
def test_a_workshop_option_refuses_a_bad_value(line, message, capsys):
    command = line.split()[0]
    last = _refused(workshop_main, line.split(), capsys)
    assert last == f"python -m workshop {command}: error: {message}"


def _places(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """Paths that cannot be written, and the reason the error gives."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    return {
        "under a file": (f"{a_file}/out.json", f"{a_file} is a file, not a folder"),
        "a folder": (str(tmp_path), "it is a folder; name a file in it"),
        "no folder": (
            f"{tmp_path}/missing/out.json",
            f"its folder {tmp_path}/missing does not exist; make it first",
        ),
    }


@pytest.mark.parametrize("place", ["under a file", "a folder", "no folder"])
@pytest.mark.parametrize(
    ("main", "prog", "option", "example"),
    [
        (workshop_main, "python -m workshop check-node", "--json", "check.json"),
        (workshop_main, "python -m workshop monitor", "--output", "monitor.csv"),
        (bench.main, "python -m workshop.bench launch", "--json", "launch.json"),
        (bench.main, "python -m workshop.bench train", "--json", "train.json"),
    ],
)
def test_a_file_that_cannot_be_written_is_refused_before_the_work(
    main, prog, option, example, place, tmp_path, capsys
):
    path, why = _places(tmp_path)[place]
    last = _refused(main, [prog.split()[-1], option, path], capsys)
    assert last == (
        f"{prog}: error: argument {option}: cannot write {path}: {why}; "
        f"e.g. {option} {example}"
    )


def test_a_value_error_inside_a_benchmark_is_one_line(monkeypatch, capsys):
    def refuse(args):
        raise ValueError("world_size=0 is not 1 or more; pass --world-size 4")

    text, add, _ = bench.COMMANDS["launch"]
    monkeypatch.setitem(bench.COMMANDS, "launch", (text, add, refuse))
    assert bench.main(["launch"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "python -m workshop.bench launch: error: world_size=0 is not 1 or more; "
        "pass --world-size 4\n"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["workshop.bench", "launch", "--repeats", "0"],
        ["workshop.bench", "launch", "--world-size", "0"],
        ["workshop", "check-node", "--json", "{file}/check.json"],
    ],
)
def test_what_a_user_sees_is_usage_and_one_error_line(argv, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    argv = [a.format(file=a_file) for a in argv]
    done = subprocess.run(
        [sys.executable, "-m", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("usage: ")
    last = done.stderr.splitlines()[-1]
    assert last.startswith(
        f"python -m {argv[0]} {argv[1]}: error: argument {argv[2]}: "
    )
    assert argv[3] in last
