"""python -m workshop check-node: the verdict (pure, from made-up results), its options
and exit status, each step's failure paths, one real quick run, and
``python -m workshop.bench train --bare`` beside the workshop's loop.

The real run asserts what the hardware in front of it should give: GPU steps
SKIPPED with the reason where no GPU is visible, PASS where one is."""

from __future__ import annotations

import _thread
import io
import json
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import gone

from workshop.__main__ import _parser, main
from workshop.env import visible_gpu_count
from workshop.instructor import check_steps
from workshop.instructor.check_node import (
    WIDTH,
    check_node,
    format_verdict,
    steps_to_run,
)
from workshop.instructor.check_results import (
    STEPS,
    CheckReport,
    CheckStep,
    TrainSettings,
)
from workshop.instructor.check_steps import Context, _run, parse_pytest_counts

GPUS = visible_gpu_count()


def made_up(*failed: str, long: bool = False) -> CheckReport:
    """A report of every step: ``failed`` ones FAILED, nccl SKIPPED, others PASS."""
    steps = []
    for name in STEPS:
        if name in failed:
            text = "word " * 60 if long else f"{name} broke"
            steps.append(CheckStep(name, "FAILED", 2.0, text, f"mend {name} " + text))
        elif name == "nccl":
            steps.append(CheckStep(name, "SKIPPED", 0.0, "no GPU visible"))
        else:
            steps.append(CheckStep(name, "PASS", 1.5, f"{name} fine"))
    return CheckReport("gpu042", steps, seconds=12.0)


def context(tmp_path: Path, **changes) -> Context:
    settings = dict(
        timeout=120.0,
        gpus=GPUS,
        root=tmp_path,
        cpu_train=False,
        train=TrainSettings(),
        launch_repeats=1,
        out=io.StringIO(),
    )
    settings.update(changes)
    return Context(**settings)


# --- the verdict ----------------------------------------------------------------------


def test_verdict_says_ready_and_lists_what_was_skipped():
    text = format_verdict(made_up())
    lines = text.splitlines()
    assert lines[1] == "workshop check-node on gpu042: READY, 12 s"
    assert "doctor     PASS      1.5 s  doctor fine" in lines
    assert lines[-1] == "READY: nothing failed (skipped: nccl)."
    assert made_up().exit_status == 0


def test_a_skipped_step_shows_its_reason():
    row = [ln for ln in format_verdict(made_up()).splitlines() if ln.startswith("nccl")]
    assert row == ["nccl       SKIPPED   0.0 s  no GPU visible"]


def test_failures_are_listed_with_their_fixes():
    report = made_up("nccl", "notebooks")
    report.steps[3] = CheckStep(
        "nccl",
        "FAILED",
        3.0,
        "NCCL all_reduce failed: unhandled system error",
        "check `nvidia-smi topo -m`; rerun with NCCL_DEBUG=INFO set to see why",
    )
    text = format_verdict(report)
    assert "workshop check-node on gpu042: NOT READY (2 failed), 12 s" in text
    assert "NOT READY: 2 of 7 steps failed." in text
    tail = text.split("steps failed.\n")[1].splitlines()
    assert tail == [
        "  nccl: NCCL all_reduce failed: unhandled system error",
        "    -> check `nvidia-smi topo -m`; rerun with NCCL_DEBUG=INFO set to see why",
        "  notebooks: notebooks broke",
        "    -> mend notebooks notebooks broke",
    ]
    assert report.exit_status == 1


@pytest.mark.parametrize("failed", [("launch",), STEPS[:3], STEPS])
def test_the_verdict_fits_one_screen_however_long_the_messages(failed):
    lines = format_verdict(made_up(*failed, long=True)).splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    assert len(lines) <= 27  # seven steps, each failed: a problem and a fix
    assert lines[-1].endswith(" ...")  # cut short, not wrapped on and on


def test_the_json_form_holds_every_step():
    data = made_up("train").to_dict()
    assert data["ready"] is False and data["exit_status"] == 1
    assert [s["name"] for s in data["steps"]] == list(STEPS)
    train = data["steps"][STEPS.index("train")]
    assert train["status"] == "FAILED" and train["fix"]
    json.dumps(data)  # plain data


# --- options --------------------------------------------------------------------------


def test_skip_and_quick_say_why_a_step_is_left_out():
    assert steps_to_run() == {}
    assert steps_to_run(quick=True) == {"train": "--quick", "notebooks": "--quick"}
    assert steps_to_run(["notebooks", "doctor"], quick=True) == {
        "doctor": "--skip",
        "train": "--quick",
        "notebooks": "--skip",
    }
    with pytest.raises(ValueError, match=r"unknown step 'gpu' to skip; the steps are"):
        steps_to_run(["gpu"])


def test_command_line_options_are_parsed():
    args = _parser().parse_args(
        [
            "check-node",
            "--quick",
            "--skip",
            "nccl",
            "--skip",
            "launch",
            "--json",
            "r.json",
            "--timeout",
            "30",
            "--cpu-train",
            "--train-model",
            "smallcnn",
        ]
    )
    assert args.quick and args.cpu_train
    assert args.skip == ["nccl", "launch"] and args.json == "r.json"
    assert args.timeout == 30.0 and args.train_model == "smallcnn"
    defaults = _parser().parse_args(["check-node"])
    assert defaults.skip == [] and defaults.timeout == 900.0 and not defaults.quick
    assert defaults.train_model == "resnet50" and defaults.train_batch_size is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--skip", "gpu"], "invalid choice: 'gpu'"),
        (["--timeout", "0"], "argument --timeout: 0 is not a number above 0"),
    ],
)
def test_bad_options_are_argparses_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["check-node", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_check_node_rejects_a_bad_timeout():
    with pytest.raises(ValueError, match=r"timeout must be a number of seconds above"):
        check_node(timeout=0)


def test_every_step_skipped_runs_nothing_and_writes_json(tmp_path):
    out, path = io.StringIO(), tmp_path / "check.json"
    report = check_node(STEPS, json_path=path, file=out)
    assert [s.status for s in report.steps] == ["SKIPPED"] * len(STEPS)
    assert report.exit_status == 0
    assert "READY: nothing failed" in out.getvalue()
    assert json.loads(path.read_text())["steps"][0]["summary"] == "--skip"


def test_exit_status_is_1_when_a_step_fails(monkeypatch, capsys):
    broken = CheckStep("doctor", "FAILED", 0.0, "a probe failed", "read the rows")
    monkeypatch.setitem(check_steps.STEP_FUNCTIONS, "doctor", lambda ctx: broken)
    others = [word for step in STEPS[1:] for word in ("--skip", step)]
    assert main(["check-node", *others]) == 1
    out = capsys.readouterr().out
    assert "  doctor: a probe failed\n    -> read the rows" in out
    assert main(["check-node", "--skip", "doctor", *others]) == 0


def test_an_interrupt_stops_the_step_and_names_it_in_one_line(tmp_path, monkeypatch):
    # A step that runs a real command, as every step does; the stop button is
    # pressed while it runs.
    pid_file = tmp_path / "pid"
    code = (
        "import os, time; "
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )

    def step(ctx):
        _run([sys.executable, "-c", code], timeout=60.0)
        raise AssertionError("the command was not interrupted")

    def interrupt_when_it_runs() -> None:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()):
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        _thread.interrupt_main()  # what the kernel's stop button does: SIGINT

    monkeypatch.setitem(check_steps.STEP_FUNCTIONS, "launch", step)
    threading.Thread(target=interrupt_when_it_runs, daemon=True).start()
    others = [s for s in STEPS if s != "launch"]
    with pytest.raises(
        KeyboardInterrupt,
        match=r"^workshop check-node: interrupted in step launch; everything it "
        r"started was stopped$",
    ) as caught:
        check_node(others, file=io.StringIO())
    assert caught.value._render_traceback_() == [f"KeyboardInterrupt: {caught.value}"]
    assert gone([int(pid_file.read_text())]) == []


# --- steps: missing tools, parsing, processes -----------------------------------------


def test_pytest_summary_counts():
    assert parse_pytest_counts("x\n9 skipped, 595 deselected in 1.59s\n") == {
        "skipped": 9,
        "deselected": 595,
    }
    assert parse_pytest_counts("== 1 failed, 2 passed, 1 error in 3.00s ==") == {
        "failed": 1,
        "passed": 2,
        "errors": 1,
    }
    assert parse_pytest_counts("no summary") == {}


@pytest.mark.parametrize(
    ("step", "missing", "pip"),
    [
        ("gpu-tests", "pytest", "pip install pytest pytest-timeout"),
        ("notebooks", "nbclient", "pip install nbclient"),
    ],
)
def test_a_missing_tool_is_failed_with_the_pip_line(
    step, missing, pip, monkeypatch, tmp_path
):
    real = check_steps.find_spec
    monkeypatch.setattr(
        check_steps, "find_spec", lambda name: None if name == missing else real(name)
    )
    result = check_steps.STEP_FUNCTIONS[step](context(tmp_path))
    assert result.status == "FAILED"
    assert missing in result.summary
    assert result.fix.startswith(pip) and 'pip install -e ".[lab,test]"' in result.fix


def test_without_a_gpu_the_gpu_tests_are_not_collected_only_to_skip(
    monkeypatch, tmp_path
):
    (tmp_path / "tests").mkdir()
    ran = []
    monkeypatch.setattr(check_steps, "_run", lambda *args, **kw: ran.append(args))
    result = check_steps.STEP_FUNCTIONS["gpu-tests"](context(tmp_path, gpus=0))
    assert (result.status, ran) == ("SKIPPED", [])
    assert result.summary == "no GPU visible (the tests marked gpu need one; not run)"


def test_train_step_reports_both_loops_and_never_divides_by_zero(monkeypatch, tmp_path):
    rates = {"workshop": 900.0, "bare": 0.0}

    def fake_run(command, timeout, cwd=None):
        loop = "bare" if "--bare" in command else "workshop"
        out = Path(command[command.index("--json") + 1])
        out.write_text(json.dumps({"samples_per_second": rates[loop]}))
        return check_steps._Ran(0, f"{loop}: samples/s\n", "", 1.0)

    monkeypatch.setattr(check_steps, "_run", fake_run)
    ctx = context(tmp_path, gpus=0)
    skipped = check_steps.step_train(ctx)
    assert skipped.status == "SKIPPED"
    assert skipped.summary.startswith("ResNet-50 on a CPU says nothing about the node")
    result = check_steps.step_train(context(tmp_path, gpus=0, cpu_train=True))
    assert result.status == "PASS" and result.figures["ratio"] is None
    assert result.summary == "resnet50 samples/s: workshop 900, plain 0"
    rates["bare"] = 1000.0
    result = check_steps.step_train(context(tmp_path, cpu_train=True))
    assert result.figures["ratio"] == pytest.approx(0.9)
    assert result.summary.endswith("workshop 900, plain 1,000, ratio 0.90")


def ranks(*sums: float, busbw: float | None = None) -> dict:
    """A made-up answer of the NCCL probe: one rank per sum."""
    found = [
        {"device": f"cuda:{i}", "sum": s, "busbw": busbw} for i, s in enumerate(sums)
    ]
    return {"world_size": len(sums), "ranks": found}


@pytest.mark.parametrize(
    ("answer", "status", "summary"),
    [
        (ranks(3.0, 3.0, busbw=150e9), "PASS",
         "2 GPUs, sum correct, busbw 150.0 GB/s at 256 MiB"),
        (ranks(1.0), "PASS", "1 GPU, sum correct, no busbw (1 GPU)"),
        (ranks(2.0, 3.0), "FAILED",
         "NCCL all_reduce gave [2.0, 3.0], expected 3 on each GPU"),
        ({"error": "LaunchError: rank 1 raised DistBackendError", "log": ""}, "FAILED",
         "NCCL all_reduce failed: LaunchError: rank 1 raised DistBackendError"),
    ],
)  # fmt: skip
def test_nccl_step_checks_the_sum(answer, status, summary, monkeypatch, tmp_path):
    monkeypatch.setattr(check_steps, "_probe", lambda *args: answer)
    result = check_steps.step_nccl(context(tmp_path, gpus=2))
    assert (result.status, result.summary) == (status, summary)
    if status == "FAILED":
        assert result.fix.startswith(
            "check `nvidia-smi topo -m`; rerun with NCCL_DEBUG"
        )
    no_gpu = check_steps.step_nccl(context(tmp_path, gpus=0))
    assert (no_gpu.status, no_gpu.summary) == ("SKIPPED", "no GPU visible")


def _after_backward(took="fork", hazard=None, sum_ok=True, **more):
    """A probe's answer about the launch after a backward pass in a fresh process."""
    from workshop.ranks.forkable import HAZARDS

    reason = HAZARDS.get(hazard, "the kernel can still fork")
    return {"took": took, "hazard": hazard, "reason": reason, "sum_ok": sum_ok} | more


def test_launch_step_fails_when_a_path_falls_back(monkeypatch, tmp_path):
    def fake_probe(timeout, probe, method, *args):
        if probe == "after-backward":
            return _after_backward()
        took = "spawn" if method == "server" else method
        return {"took": took, "sum_ok": True, "first": 1.0, "median": None}

    monkeypatch.setattr(check_steps, "_probe", fake_probe)
    result = check_steps.step_launch(context(tmp_path))
    assert result.status == "FAILED"
    assert result.summary == "start_method='server' ran on spawn"
    assert "python -m workshop.bench launch --world-size 2" in result.fix


@pytest.mark.parametrize(
    ("answer", "status", "said"),
    [
        (
            _after_backward("server", "autograd"),
            "PASS",
            "after a backward pass: server (this kernel ran a backward pass on a GPU",
        ),
        (_after_backward(), "PASS", "after a backward pass: fork (the kernel can"),
        (
            _after_backward("fork", "autograd"),
            "FAILED",
            "a launch after a backward pass forked a kernel that cannot",
        ),
        (
            _after_backward("server", "autograd", sum_ok=False),
            "FAILED",
            "the ranks' backward passes after the kernel's gave wrong sums",
        ),
        (
            {"error": "LaunchError: rank 0 of 1 failed", "log": "Unable to handle"},
            "FAILED",
            "a launch after a backward pass failed: LaunchError: rank 0 of 1 failed",
        ),
    ],
)
def test_the_launch_step_checks_a_launch_after_a_backward_pass(
    monkeypatch, tmp_path, answer, status, said
):
    # On a GPU node a kernel that trained can no longer fork (forkable.fork_hazard): the
    # check's launch step starts ranks after a backward pass, as notebook 02 does.
    asked = []

    def fake_probe(timeout, probe, *args):
        asked.append((probe, *args))
        if probe == "after-backward":
            return answer
        return {"took": args[0], "sum_ok": True, "first": 1.0, "median": 0.5}

    monkeypatch.setattr(check_steps, "_probe", fake_probe)
    ctx = context(tmp_path, gpus=1)
    result = check_steps.step_launch(ctx)
    assert ("after-backward", 1) in asked  # one rank per GPU
    assert result.status == status
    assert said in (result.summary if status == "FAILED" else ctx.out.getvalue())
    assert result.figures["after_backward"] == answer


# --- one real run ---------------------------------------------------------------------


# --- python -m workshop.bench train --bare --------------------------------------------
