"""Every option of every command line of the workshop (``python -m workshop``,
``python -m workshop.bench``, the planner's job, the sources' index, the site-env
script) refuses a bad value in one line that names the option, the value and what is
allowed, before any work and without a traceback (issue 35, items 5 and 6):
argparse's error (status 2), or the command's own (status 1 or 2). In-process
through each ``main``; a few cases through a real ``python -m`` to see what a user
sees. The gallery's folder: tests/test_gallery.py."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from workshop.__main__ import main as workshop_main
from workshop.bench import __main__ as bench
from workshop.planner import job_train

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
     "names from fork, server, spawn; e.g. --methods fork,server"),
    ("launch --methods ,", "argument --methods: , is not a list of names from fork, "
     "server, spawn; e.g. --methods fork,server"),
    ("train --batch-size 0", "argument --batch-size: 0 is not a whole number, 1 or "
     "more; e.g. --batch-size 32"),
    ("train --image-size -1", "argument --image-size: -1 is not a whole number, 1 or "
     "more; e.g. --image-size 224"),
    ("train --steps 0", "argument --steps: 0 is not a whole number, 1 or more; e.g. "
     "--steps 30"),
    ("train --warmup -1", "argument --warmup: -1 is not a whole number, 0 or more; "
     "e.g. --warmup 5"),
    ("train --model bogus", "argument --model: invalid choice: 'bogus' (choose from "
     "'smallcnn', 'resnet18', 'resnet34', 'resnet50', 'resnet101', 'resnet152')"),
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
    ("allreduce --timeout inf", "argument --timeout: inf is not a finite number "
     "above 0; e.g. --timeout 600"),
    ("allreduce --min-time inf", "argument --min-time: inf is not a finite number 0 "
     "or more; e.g. --min-time 1"),
    ("allreduce --min-time x", "argument --min-time: x is not a number 0 or more; "
     "e.g. --min-time 1"),
    ("allreduce --min-time -1", "argument --min-time: -1 is not a number 0 or more; "
     "e.g. --min-time 1"),
    ("allreduce --min-size 0", "argument --min-size: 0 is not a whole number of "
     "float32 values: give a multiple of 4 bytes, 4 or more; e.g. 4K or 64M"),
    ("allreduce --max-size 6", "argument --max-size: 6 is not a whole number of "
     "float32 values: give a multiple of 4 bytes, 4 or more; e.g. 4K or 64M"),
    ("scaling --world-sizes 0,1", "argument --world-sizes: 0,1 is not a list of rank "
     "counts, each 1 or more and none twice; e.g. --world-sizes 1,2,4"),
    ("scaling --world-sizes 1,1", "argument --world-sizes: 1,1 is not a list of rank "
     "counts, each 1 or more and none twice; e.g. --world-sizes 1,2,4"),
    ("scaling --model vgg", "argument --model: invalid choice: 'vgg' (choose from "
     "'cnn', 'smallcnn', 'resnet18', 'resnet34', 'resnet50', 'resnet101', "
     "'resnet152')"),
    ("scaling --batch -4", "argument --batch: -4 is not a whole number, 1 or more; "
     "e.g. --batch 32"),
    ("scaling --timeout inf", "argument --timeout: inf is not a finite number above "
     "0; e.g. --timeout 600"),
    ("scaling --alpha x", "argument --alpha: x is not a number 0 or more; e.g. "
     "--alpha 1e-5 --beta 1e9"),
    ("scaling --alpha nan", "argument --alpha: nan is not a number 0 or more; e.g. "
     "--alpha 1e-5 --beta 1e9"),
    ("scaling --beta inf", "argument --beta: inf is not a finite number above 0; "
     "e.g. --alpha 1e-5 --beta 1e9"),
    ("scaling --mode wide", "argument --mode: invalid choice: 'wide' (choose from "
     "'weak', 'strong', 'both')"),
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
    ("monitor --interval inf", "argument --interval: inf is not a finite number "
     "above 0; e.g. --interval 1"),
    ("monitor --seconds 0", "argument --seconds: 0 is not a number above 0; e.g. "
     "--seconds 600"),
    ("kernel-spec --timeout soon", "argument --timeout: soon is not a number above "
     "0; e.g. --timeout 120"),
    ("check-node --timeout inf", "argument --timeout: inf is not a finite number "
     "above 0; e.g. --timeout 900"),
    ("check-node --train-model vgg", "argument --train-model: invalid choice: 'vgg' "
     "(choose from 'smallcnn', 'resnet18', 'resnet34', 'resnet50', 'resnet101', "
     "'resnet152')"),
    ("site-env --venv=", "argument --venv: no path was given; e.g. --venv .venv"),
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


# --- folders the command writes into, made if missing --------------------------------


@pytest.mark.parametrize("place", ["under a file", "a file"])
@pytest.mark.parametrize(
    ("main", "argv", "prog", "message"),
    [
        (job_train.main, ["--out"], "python -m workshop.planner.job_train",
         "argument --out: cannot write into {path}: {why}; e.g. --out runs/job"),
        (workshop_main, ["site-env", "--venv"], "python -m workshop site-env",
         "argument --venv: cannot make {path}: {why}; e.g. --venv .venv"),
    ],
)  # fmt: skip
def test_a_folder_that_cannot_be_made_is_refused_before_the_work(
    main, argv, prog, message, place, tmp_path, capsys
):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    path, why = {
        "under a file": (a_file / "out", f"{a_file} is a file, not a folder"),
        "a file": (a_file, "it is a file, not a folder"),
    }[place]
    last = _refused(main, [*argv, str(path)], capsys)
    assert last == f"{prog}: error: " + message.format(path=path, why=why)


# --- values refused once the options are read together -------------------------------


@pytest.mark.parametrize(
    ("main", "line", "message"),
    [
        # The first step failed with torch's "Output size is too small" traceback.
        (bench.main, "train --model smallcnn --image-size 2 --batch-size 8",
         "python -m workshop.bench train: error: --image-size 2 is too small for "
         "smallcnn in batches of 8: 4 or more; e.g. --image-size 32"),
        # ...and with BatchNorm's "Expected more than 1 value per channel".
        (bench.main, "train --model resnet18 --image-size 32 --batch-size 1",
         "python -m workshop.bench train: error: --image-size 32 is too small for "
         "resnet18 in batches of 1: 33 or more; e.g. --image-size 33"),
        (bench.main, "allreduce --min-size 1M --max-size 4K",
         "python -m workshop.bench allreduce: error: max_size=4096 bytes (4 KiB) is "
         "smaller than min_size=1048576 bytes (1 MiB); raise max_size or lower "
         "min_size"),
        (workshop_main, "check-node --train-model smallcnn --train-image-size 2",
         "python -m workshop check-node: error: --train-image-size 2 is too small "
         "for smallcnn: 4 or more; e.g. --train-image-size 32"),
    ],
)  # fmt: skip
def test_options_that_do_not_go_together_are_one_line_before_the_work(
    main, line, message, capsys
):
    assert main(line.split()) == 2
    shown = capsys.readouterr()
    assert shown.err == message + "\n"
    assert "samples/s" not in shown.out and "[1/" not in shown.out


# --- files read while the options are read ------------------------------------------


@pytest.mark.parametrize("kind", ["missing", "a folder", "not JSON"])
@pytest.mark.parametrize(
    ("main", "argv", "prog", "what", "why"),
    [
        (bench.main, ["scaling", "--allreduce-json"],
         "python -m workshop.bench scaling", "the all-reduce fit",
         {"missing": "no all-reduce result at {path}; pass the .json file that "
          "`python -m workshop.bench allreduce --out PREFIX` wrote",
          "a folder": "Is a directory",
          "not JSON": "{path} is not JSON (Expecting value: line 1 column 1 (char "
          "0)); pass the .json file, not the .csv"}),
        # A traceback in every rank that torchrun started, before.
        (job_train.main, ["--plan"], "python -m workshop.planner.job_train",
         "the plan",
         {"missing": "no plan file {path}; write one with "
          "workshop.planner.job.write_job",
          "a folder": "no plan file {path}; write one with "
          "workshop.planner.job.write_job",
          "not JSON": "{path} is not a plan written by write_job (JSONDecodeError: "
          "Expecting value: line 1 column 1 (char 0)); write it again with "
          "workshop.planner.job.write_job"}),
    ],
)  # fmt: skip
def test_a_file_that_cannot_be_used_is_refused_before_the_work(
    main, argv, prog, what, why, kind, tmp_path, capsys
):
    path = {
        "missing": tmp_path / "gone.json",
        "a folder": tmp_path,
        "not JSON": tmp_path / "notes.json",
    }[kind]
    if kind == "not JSON":
        path.write_text("not json\n")
    last = _refused(main, [*argv, str(path)], capsys)
    option = argv[-1]
    assert last == (
        f"{prog}: error: argument {option}: cannot use {path} as {what}: "
        + why[kind].format(path=path)
    )


# --- kernel-spec: a --python that is no Python ---------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # Each was a traceback before: IndexError, and OSError (Exec format error).
        ("#!/bin/sh\nexit 0\n", "{path} did not run Python's -c (it printed ''). "
         "HINT: --python the Python that has torch and the workshop, or --venv its "
         "folder"),
        ("not a program\n", "cannot run {path}: Exec format error. HINT: --python "
         "the Python that has torch and the workshop, or --venv its folder"),
        ("#!/bin/sh\nexit 3\n", "{path} failed (exit status 3); it said: nothing"),
    ],
)  # fmt: skip
def test_kernel_spec_says_in_one_line_that_python_is_no_python(
    text, message, tmp_path, capsys
):
    path = tmp_path / "python"
    path.write_text(text)
    path.chmod(0o755)
    assert workshop_main(["kernel-spec", "--dry-run", "--python", str(path)]) == 1
    err = capsys.readouterr().err
    assert err == "kernel-spec: ERROR: " + message.format(path=path) + "\n"


def test_kernel_spec_suggests_a_name_for_an_empty_one(capsys):
    assert workshop_main(["kernel-spec", "--dry-run", "--name", ""]) == 1
    assert capsys.readouterr().err.endswith(
        "HINT: e.g. --name scaling-pytorch-hpc\n"
    )  # it was "e.g. --name " and nothing after


# --- the two entry points without argparse's main ------------------------------------


def test_the_sources_index_of_a_folder_without_the_documents_is_one_line(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(sys, "argv", ["workshop.sources", "index", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("workshop.sources", run_name="__main__")
    assert str(exit_info.value.code).startswith(
        "python -m workshop.sources index: error: "
    )
    assert f"{tmp_path} should hold the five source documents" in str(
        exit_info.value.code
    )


def test_the_site_env_script_refuses_a_file_for_its_venv(tmp_path, monkeypatch, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    script = ROOT / "workshop" / "instructor" / "site_env.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--venv", str(a_file)])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python workshop/instructor/site_env.py: error: argument --venv: cannot make "
        f"{a_file}: it is a file, not a folder; e.g. --venv .venv"
    )
