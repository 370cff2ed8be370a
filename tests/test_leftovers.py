"""tests/leftovers.py: what a run left in the temporary folders, found by comparing
their entries at the start and at the end. Folders under tmp_path stand in for
/tmp and /var/tmp."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from leftovers import (
    FOLDERS_VARIABLE,
    Spans,
    judge,
    left_behind,
    made_by,
    other_runs,
    report,
    summary,
    temp_entries,
)


def test_only_new_entries_of_this_user_are_left_and_pytest_s_own_are_not(tmp_path):
    tmp, var_tmp = tmp_path / "tmp", tmp_path / "var-tmp"
    tmp.mkdir()
    var_tmp.mkdir()
    (tmp / "there-before").mkdir()
    (tmp / "made-and-removed").mkdir()
    before = temp_entries([str(tmp), str(var_tmp)])
    assert before == {
        str(tmp): {"there-before", "made-and-removed"},
        str(var_tmp): set(),
    }

    shutil.rmtree(tmp / "made-and-removed")
    (tmp / "torchelastic_abc").mkdir()
    (tmp / "pytest-of-someone").mkdir()  # pytest's basetemp: kept on purpose
    (var_tmp / "tmp1234.json").write_text("{}")
    after = temp_entries([str(tmp), str(var_tmp)])

    assert left_behind(before, after) == [
        str(tmp / "torchelastic_abc"),
        str(var_tmp / "tmp1234.json"),
    ]
    # Someone else's new entry is not the run's.
    assert left_behind(before, after, uid=os.getuid() + 1) == []
    # An entry gone by the time it is looked at was not left.
    shutil.rmtree(tmp / "torchelastic_abc")
    assert left_behind(before, after) == [str(var_tmp / "tmp1234.json")]


def test_a_folder_that_cannot_be_read_is_left_out_not_an_error(tmp_path):
    missing = tmp_path / "no-such-folder"
    readable = tmp_path / "tmp"
    readable.mkdir()
    before = temp_entries([str(missing), str(readable)])
    assert before == {str(readable): set()}
    (readable / "new").touch()
    # Compared only where both lists exist (a folder readable at the end alone).
    after = {**temp_entries([str(readable)]), str(missing): {"x"}}
    assert left_behind(before, after) == [str(readable / "new")]


def test_the_summary_counts_and_cuts_a_long_list():
    assert summary([]) == [
        "workshop: the run left nothing new in /tmp, /var/tmp, /dev/shm"
    ]
    lines = summary([f"/tmp/torchelastic_{i}" for i in range(25)], shown=20)
    assert lines[0] == "workshop: the run left 25 entries in the temporary folders:"
    assert lines[1:3] == ["    /tmp/torchelastic_0", "    /tmp/torchelastic_1"]
    assert lines[-1] == "    ... and 5 more"
    assert len(lines) == 22


def test_what_the_suite_s_programs_make_is_counted_with_the_tests_then_running(
    tmp_path,
):
    elastic, mine = tmp_path / "torchelastic_x1", tmp_path / "notes.txt"
    elastic.mkdir()
    mine.write_text("an editor's file")
    made = time.time()
    os.utime(elastic, (made, made))
    times = Spans()
    times.add("tests/a.py::test_before", made - 60, made - 50)
    times.add("tests/b.py::test_during", made - 5, made + 5)
    verdict = judge([str(elastic), str(mine)], times)
    assert verdict.counted == {
        str(elastic): "torchrun's log folder (a torchrun without --log-dir); "
        "made during tests/b.py::test_during"
    }
    assert verdict.listed == [str(mine)] and verdict.failed
    # Another run going on at the same time: listed with it, not failed on.
    shared = judge([str(elastic)], times, {4321: "python -m pytest tests"})
    assert not shared.failed
    lines = report(shared, ["/tmp"])
    assert "1 other runs of this user" in lines[0]
    assert lines[1] == "    pid 4321: python -m pytest tests"


def test_torch_s_precompiled_headers_alone_are_kept_on_purpose_not_failed_on(tmp_path):
    # torch puts them in <tmp>/torchinductor_<user> whatever TORCHINDUCTOR_CACHE_DIR
    # says; the same folder holding anything else is compile's cache, and counted.
    headers = tmp_path / "torchinductor_site"
    (headers / "precompiled_headers").mkdir(parents=True)
    verdict = judge([str(headers)], Spans())
    assert not verdict.failed and verdict.kept == {
        str(headers): "torch.compile's precompiled headers"
    }
    assert "kept there on purpose" in report(verdict, ["/tmp"])[-1]
    (headers / "ab").mkdir()
    verdict = judge([str(headers)], Spans())
    assert verdict.failed and not verdict.kept


@pytest.mark.parametrize(
    ("name", "who"),
    [
        ("torchinductor_root", "torch.compile's cache"),
        ("ompi.vm.0", "Open MPI 4's session folder"),
        ("prte.vm.1000", "Open MPI 5's session folder"),
        ("tmp7l4sm_e6.json", "Python's tempfile"),
        ("workshop-torchrun-abc", "the workshop's own"),
        ("bash_tool_1234", None),
        ("systemd-private-abc", None),
    ],
)
def test_names_are_matched_to_the_program_that_gives_them(name, who):
    found = made_by(f"/tmp/{name}")
    assert (found is None) if who is None else found.startswith(who)


def test_the_test_running_at_a_time_or_else_the_last_one_started_is_named():
    times = Spans()
    times.add("t::one", 10.0, 20.0)
    times.add("t::one", 20.0, 21.0)  # its teardown report widens its span
    times.add("t::two", 30.0, 40.0)
    assert times.around(21.5) == ["t::one"]
    assert times.around(25.0) == ["t::one"]  # none running: the last one started
    assert times.around(35.0) == ["t::two"]
    assert times.around(5.0) == []


def _process(proc: Path, pid: int, parent: int, line: str) -> None:
    (proc / str(pid)).mkdir()
    (proc / str(pid) / "stat").write_text(f"{pid} (py (x)) S {parent} 1 1 0")
    (proc / str(pid) / "cmdline").write_bytes(line.replace(" ", "\0").encode())


def test_other_runs_are_those_outside_this_run_s_own_process_tree(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    _process(proc, 1, 0, "init")
    _process(proc, 10, 1, "make test")
    _process(proc, 11, 10, "python -m pytest tests")  # this run
    _process(proc, 12, 11, "python -c import xdist.remote")  # its worker
    _process(proc, 13, 12, "torchrun --standalone s.py")  # started by a test
    _process(proc, 20, 1, "python -m pytest tests/cluster")  # another run
    _process(proc, 21, 1, "python -m ipykernel_launcher -f k.json")  # a kernel
    _process(proc, 22, 1, "vim notes.txt")
    assert other_runs(11, str(proc)) == {
        20: "python -m pytest tests/cluster",
        21: "python -m ipykernel_launcher -f k.json",
    }


LEAVES = """
import os, sys
from pathlib import Path

def test_one():
    folder = Path(os.environ["WORKSHOP_TEMP_FOLDERS"].split(os.pathsep)[0])
    for name in os.environ["LEAVE"].split():
        (folder / name).mkdir()
    made = folder / "tmp-made-and-removed"
    made.mkdir()
    made.rmdir()
"""


@pytest.mark.parametrize(
    ("workers", "leave", "fails"),
    [
        ([], "", False),
        ([], "torchelastic_abc", True),
        ([], "an-editors-file", False),
        # Under xdist the workers run the tests and the controller checks.
        (["-n", "2"], "torchelastic_abc", True),
    ],
)
def test_a_run_fails_on_what_it_left_and_names_it(tmp_path, workers, leave, fails):
    temp = tmp_path / "tmp"
    temp.mkdir()
    (temp / "there-before").mkdir()
    (tmp_path / "test_leaves.py").write_text(textwrap.dedent(LEAVES))
    tests = Path(__file__).parent
    env = {
        **os.environ,
        # Kept, not replaced: where the packages were installed with pip --target
        # (make test-site), pytest itself is found through PYTHONPATH.
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(tests), os.environ.get("PYTHONPATH", "")) if p
        ),
        FOLDERS_VARIABLE: str(temp),
        "LEAVE": leave,
        "PYTEST_ADDOPTS": "",
    }
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "leftovers", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "-q", *workers, "test_leaves.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = ran.stdout + ran.stderr
    assert "1 passed" in out, out
    assert ran.returncode == (1 if fails else 0), out
    if fails:
        assert (
            f"workshop: FAILED: the run left 1 entries in {temp} (tests/leftovers.py)"
            in out
        )
        assert (
            f"    {temp / leave}: torchrun's log folder (a torchrun without "
            "--log-dir); made during test_leaves.py::test_one" in out
        )
    elif leave:
        assert f"workshop: the run left nothing in {temp}" in out
        assert f"not failed on): {temp / leave}" in out
    else:
        assert f"workshop: the run left nothing in {temp}\n" in out
