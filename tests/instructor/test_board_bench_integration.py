"""The slow tests of test_board_bench.py: the benchmark against a real JupyterHub,
its proxy and the board (no root, no Slurm): a short run's figures are all there and
sane, and nothing it started outlives it, also when it is interrupted."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import proxy_missing

pytest.importorskip("jupyterhub")  # the portal extra: the hub, tornado
pytest.importorskip("batchspawner")  # portal_hub's, whose add_board the hub runs

from workshop._procs import is_alive, signal_group
from workshop.instructor import board_bench
from workshop.instructor.board_bench_hub import _children

pytestmark = pytest.mark.skipif(
    proxy_missing() is not None, reason=str(proxy_missing())
)


def _our_folders() -> set[str]:
    return {
        name
        for name in os.listdir(tempfile.gettempdir())
        if name.startswith("workshop-board-bench-")
    }


def test_the_command_line_runs_as_a_module_and_says_its_options():
    shown = subprocess.run(
        [sys.executable, "-m", "workshop.instructor.board_bench", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    for option in ("--learners", "--seconds", "--poll-interval", "--json"):
        assert option in shown.stdout


def test_a_short_run_measures_every_figure_and_leaves_nothing(tmp_path, capsys):
    before = _our_folders()
    out = tmp_path / "board.json"
    argv = ["--learners", "5", "--seconds", "3", "--page-requests", "5"]
    code = board_bench.main([*argv, "--json", str(out)])
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    run = report["run"]
    # Every learner posted once a second, every post answered and seen on the table.
    assert run["posts"] == 5 * 3
    assert run["refused"] == [] and run["unseen"] == 0
    rows = {row["what"].strip(): row for row in report["rows"]}
    # Whether the goal is met is a figure of this machine's load (a busy 2-core CI
    # machine has missed it): the test checks that the verdict, the exit status and
    # the counts agree with the measured times, not that the machine was quiet.
    update_p95 = rows["board update (sent -> on table)"]["p95_s"]
    assert report["met"] is (update_p95 < 1)
    assert code == (0 if report["met"] else 1), printed
    assert ("NOT met" in printed) is not report["met"]
    slowest_post = rows["POST api/records round trip"]["max_s"]
    over = report["posts_over_post_timeout"]
    assert 0 <= over <= run["posts"] and (over > 0) is (slowest_post > 2.0)
    assert rows["board update (sent -> on table)"]["n"] == run["posts"]
    assert rows["POST api/records round trip"]["n"] == run["posts"]
    # The two halves hold every post (on a loaded machine a 3 s run's posts can go
    # out after its 5th second).
    halves = ("of posts sent in the first 5 s", "of posts sent after 5 s")
    assert sum(rows[half]["n"] for half in halves) == run["posts"]
    for what, row in rows.items():
        if what in ("of posts sent after 5 s", "client loop lag (50 ms sleeps)"):
            continue
        assert row["n"] > 0, row
        assert 0 <= row["p50_s"] <= row["p95_s"] <= row["max_s"], row
    pages = [what for what in rows if what.startswith("hub /hub/")]
    assert len(pages) == 8  # two pages, through the proxy and direct, before, during
    assert all(rows[what]["n"] == 5 for what in pages)
    assert all(rows[what]["p95_vs_before"] > 0 for what in pages if "during" in what)
    for name in ("hub", "board", "proxy", "client", "machine", "hub_pages_s"):
        assert run["cpu"][name] is not None and run["cpu"][name] >= 0, name
    # The control: the hub's pages again under a plain load of the measured size,
    # the learners' share of it at the lowest priority, as the learners ran.
    assert run["nice"] == 19
    plan = run["control"]["plan"]
    assert sum(duty for duty, _ in plan) == pytest.approx(
        sum(run["cpu"][name] for name in ("board", "proxy", "client")) / 100
    )
    assert {nice for _, nice in plan} <= {0, 19} and run["control"]["got"] >= 0
    control = report["control_rows"]
    assert len(control) == 4 and all(row["plain_p95_s"] > 0 for row in control)
    assert all(row["because"] in ("the board", "the machine") for row in control)
    assert "is the hub slower because of the board" in printed
    assert set(run["pids"]) == {"hub", "board", "proxy"}
    assert not [pid for pid in run["pids"].values() if is_alive(pid)]
    assert _our_folders() <= before
    assert "board update (sent -> on table)" in printed
    # 88 columns, but for the line naming the JSON file: a path is as long as it is.
    lines = [line for line in printed.splitlines() if not line.startswith("wrote ")]
    assert max(map(len, lines)) <= 88


def test_learners_can_post_to_the_board_s_own_address(capsys):
    # As compute nodes on the private portal: the posts spare the proxy.
    argv = ["--learners", "2", "--seconds", "2", "--page-requests", "2"]
    code = board_bench.main([*argv, "--post-to", "board"])
    printed = capsys.readouterr().out
    assert code in (0, 1), printed  # 1: the goal missed on a busy machine, as above
    assert "the learners post to the board's own address" in printed
    # Every post answered and shown; how many took over 2 s is the machine's figure.
    said = re.search(
        r"posts: 4 sent, 0 refused, (\d+) over a kernel's 2 s timeout, "
        r"0 never on the table",
        printed,
    )
    assert said, printed


def _read_until(proc: subprocess.Popen, text: str, timeout: float) -> str:
    """What ``proc`` printed until a line holding ``text`` (or it ended, or the
    time ran out)."""
    said, deadline = "", time.monotonic() + timeout
    while text not in said and time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 1.0)[0]:
            line = proc.stdout.readline()
            if not line:
                break
            said += line
    return said


@pytest.mark.parametrize(
    "sig",
    [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
    ids=["ctrl-c", "kill", "kill-9"],
)
def test_a_stopped_benchmark_leaves_no_hub_proxy_or_board(sig):
    # Ctrl-C (SIGINT to the command's group), a kill, and a kill -9 in the middle of
    # the load: the hub, its proxy and the board all end. Only after SIGKILL, which
    # no program can catch, is the folder left (the hub ends, told by Linux).
    before = _our_folders()
    command = ["-m", "workshop.instructor.board_bench", "--learners", "3"]
    bench = subprocess.Popen(
        [sys.executable, *command, "--seconds", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    started = {}
    try:
        said = _read_until(bench, "learners post for", 180)
        assert "learners post for" in said, said
        # The hub, the timers of its pages under the load and under the control's
        # plain load (probe_pages), and the launcher of the control's busy loops.
        children = {pid: _cmd(pid) for pid in _children(bench.pid)}
        hub = next(pid for pid, cmd in children.items() if "jupyterhub" in cmd)
        timers = [pid for pid, cmd in children.items() if "probe_pages" in cmd]
        loops = [pid for pid, cmd in children.items() if "die_with" in cmd]
        assert len(timers) == 2 and len(loops) == 1 and len(children) == 4, children
        started = {"hub": hub, "timer": timers[0], "control": timers[1]}
        started |= {"busy loops": loops[0]}
        started |= {_name(pid): pid for pid in _children(hub)}
        assert len(started) == 6 and {"board", "proxy"} <= set(started), started
        if sig == signal.SIGINT:
            os.killpg(bench.pid, sig)  # as the terminal sends Ctrl-C
        else:
            bench.send_signal(sig)
        bench.wait(timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(map(is_alive, started.values())):
            time.sleep(0.2)
        assert [pid for pid in started.values() if is_alive(pid)] == []
        assert len(_our_folders() - before) == (1 if sig == signal.SIGKILL else 0)
    finally:
        for pid in [bench.pid, *started.values()]:
            if is_alive(pid):  # only where the test failed
                signal_group(pid, signal.SIGKILL)
        bench.wait(timeout=10)
        bench.stdout.close()
        for name in _our_folders() - before:
            shutil.rmtree(Path(tempfile.gettempdir(), name), ignore_errors=True)


def _cmd(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")


def _name(pid: int) -> str:
    return "board" if "workshop.instructor.board" in _cmd(pid) else "proxy"
