"""Where each rank was: at its timeout, ``workshop.launch`` asks every rank still
running for its Python stack (faulthandler on SIGUSR1) and names the frames of the
lesson's function, on every start method, leaving no file and no process behind.
The ranks are pinned to gloo: where a rank waits does not depend on the backend."""

from __future__ import annotations

import faulthandler
import inspect
import os
import subprocess
import sys
import tempfile
import threading

import pytest
import torch
import torch.distributed as dist

from workshop import launch
from workshop.ranks import rank as stacks
from workshop.ranks.rank import (
    Frame,
    StackDumps,
    fatal_error,
    format_frames,
    parse_dump,
    rank_frames,
    short_path,
)
from workshop.ranks.start import SpawnedRank

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_a_launch_that_ends_leaves_no_stack_files(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = launch(dist.get_rank, world_size=2, backend="gloo", show="none")
    assert result.returns == [0, 1]
    assert os.listdir(tmp_path) == []


def test_a_rank_that_has_not_registered_is_not_signalled(tmp_path, monkeypatch):
    # Without faulthandler's handler, SIGUSR1 would end the process.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dumps = StackDumps()
    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        handle = SpawnedRank(0, popen, -1, -1, -1)
        assert dumps.collect([handle], wait=0.5) == {}
        assert popen.poll() is None, "the process was signalled"
    finally:
        popen.kill()
        popen.wait(10)
        dumps.close()
    assert os.listdir(tmp_path) == []


def run_rank(body):  # stands in for workshop.ranks.rank.run_rank in a real dump
    return body()


def _waits(started: threading.Event, done: threading.Event) -> None:
    started.set()
    done.wait(30)


def test_frames_of_a_real_dump_start_below_run_rank(tmp_path):
    started, done = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=run_rank, args=(lambda: _waits(started, done),), daemon=True
    )
    thread.start()
    started.wait(30)
    try:
        with open(tmp_path / "dump.txt", "w+") as f:
            faulthandler.dump_traceback(f, all_threads=True)
            f.seek(0)
            dump = f.read()
    finally:
        done.set()
        thread.join(30)
    assert len(parse_dump(dump)) >= 2  # this thread and the waiting one
    frames = rank_frames(dump)
    names = [f.name for f in frames]
    assert names[0] == "<lambda>" and "_waits" in names
    assert "run_rank" not in names
    # threading's wait: a run of standard-library frames, kept as its innermost one
    assert names[-1] == "wait" and names.count("wait") == 1
    assert f"test_stacks.py, line {_line_of(_waits, 'done.wait')}, in _waits: " in (
        "\n".join(format_frames(frames))
    )


def test_runs_of_library_frames_are_cut_to_the_call_and_the_last_six_kept():
    torch_file = os.path.join(os.path.dirname(torch.__file__), "distributed", "x.py")
    own = os.path.join(os.path.dirname(stacks.__file__), "rank.py")
    user = "/somewhere/train.py"
    frames = [Frame(own, 166, "run_rank")] + [
        Frame(user, n, f"f{n}") for n in range(1, 8)
    ]
    frames += [Frame(torch_file, 9, "wrapper"), Frame(torch_file, 20, "all_reduce")]
    text = "Thread 0x00007f0000000001 (most recent call first):\n" + "".join(
        f'  File "{f.filename}", line {f.line} in {f.name}\n' for f in frames[::-1]
    )
    kept = rank_frames(text)
    assert kept == [Frame(user, n, f"f{n}") for n in range(3, 8)] + [frames[-1]]
    assert rank_frames(text, limit=2) == kept[-2:]
    assert rank_frames(text.replace("run_rank", "elsewhere")) == []


def test_a_crash_report_gives_its_fatal_error_and_the_functions_frames():
    own = os.path.join(os.path.dirname(stacks.__file__), "rank.py")
    ctypes_file = os.path.join(os.path.dirname(os.__file__), "ctypes", "__init__.py")
    frames = [
        Frame(own, 199, "run_rank"),
        Frame("/somewhere/train.py", 8, "crash"),
        Frame(ctypes_file, 519, "string_at"),
    ]
    report = (
        "Fatal Python error: Segmentation fault\n\n"
        "Current thread 0x00007f0000000001 (most recent call first):\n"
        + "".join(
            f'  File "{f.filename}", line {f.line} in {f.name}\n' for f in frames[::-1]
        )
        + "\nExtension modules: numpy._core._multiarray_umath, torch._C (total: 2)\n"
    )
    # What the rank printed before (a line that only looks like a report included)
    # is not the crash: the last fatal error is.
    earlier = "Fatal Python error: a line the function printed\nstep 3\n"
    assert fatal_error(earlier + report) == (
        "Fatal Python error: Segmentation fault",
        frames[1:],
    )
    aborted = "Fatal Python error: Aborted\n\nno stack here\n"
    assert fatal_error(aborted) == ("Fatal Python error: Aborted", [])
    assert fatal_error("Traceback (most recent call last):\nValueError: x\n") is None


def test_paths_are_shown_without_this_machine_s_folders():
    assert short_path(inspect.getfile(dist.all_reduce)) in (
        "torch/distributed/distributed_c10d.py",
        "torch/distributed/c10d_logger.py",
    )
    assert short_path("/nowhere/in/particular/train.py") == "train.py"
    assert short_path("/tmp/ipykernel_1/123.py", {"/tmp/ipykernel_1/123.py": 7}) == (
        "cell In[7]"
    )
    long = [Frame("/x/y.py", 1, "f" * 200)]
    assert len(format_frames(long, width=88)[0]) == 88
