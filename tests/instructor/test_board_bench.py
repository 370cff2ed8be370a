"""The class board's benchmark without a hub (workshop.instructor.board_bench and its
board_bench_figures and board_bench_hub): the command's refusals, the percentile,
CPU and latency arithmetic on made-up samples, the table's width, the records it
posts and the hub configuration it writes (test_board_bench_integration.py runs it
against a real hub)."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jupyterhub")  # the portal extra: the hub, tornado
from traitlets.config import Config

from workshop._house import WIDTH
from workshop._procs import is_alive
from workshop.instructor import board_bench, board_bench_hub
from workshop.instructor.board_bench import (
    _Burners,
    _in_own_thread,
    _lowest_priority,
    _Run,
    check_board_load,
    learner_record,
)
from workshop.instructor.board_bench_figures import (
    CONTROL_MARGIN,
    GOAL_S,
    LOWEST_NICE,
    BoardLoad,
    board_table,
    burner_duties,
    control_plan,
    cpu_share,
    machine_ticks,
    percentile,
    process_ticks,
    slower_because,
)
from workshop.instructor.board_state import check_record


@pytest.fixture
def nothing_starts(monkeypatch):
    """A refused command must start no hub: fail the test if it tries."""

    def start(*args, **kwargs):
        raise AssertionError("run_board_load was called")

    monkeypatch.setattr(board_bench, "run_board_load", start)


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["--learners", "0"],
            "argument --learners: 0 is not a whole number, 1 or more",
        ),
        (["--learners", "ten"], "argument --learners: ten is not a whole number"),
        (["--seconds", "-1"], "argument --seconds: -1 is not a number above 0"),
        (["--seconds", "0"], "argument --seconds: 0 is not a number above 0"),
        (["--seconds", "inf"], "inf is not a finite number above 0"),
        (["--poll-interval", "0"], "argument --poll-interval: 0 is not a number"),
        (["--page-requests", "0"], "argument --page-requests: 0 is not a whole"),
        (["--learners", "1000"], "learners must be a whole number from 1 to 999"),
        (["--post-to", "hub"], "argument --post-to: invalid choice: 'hub'"),
    ],
)
def test_a_bad_option_is_one_clear_line_and_starts_nothing(
    argv, said, nothing_starts, capsys
):
    with pytest.raises(SystemExit) as stopped:
        board_bench.main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert said in err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("python -m workshop.instructor")


def test_a_json_file_that_cannot_be_written_is_refused_first(
    tmp_path, nothing_starts, capsys
):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        board_bench.main(["--json", str(tmp_path / "file" / "board.json")])
    assert "argument --json" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, said",
    [
        ((0, 30, 0.1, 50), "learners must be a whole number from 1 to 999, not 0"),
        ((2.0, 30, 0.1, 50), "learners must be a whole number from 1 to 999, not 2.0"),
        ((5, -1, 0.1, 50), "seconds must be a number above 0, not -1; e.g. seconds=30"),
        ((5, 3, float("nan"), 50), "poll_interval must be a number above 0, not nan"),
        ((5, 3, 0.1, 0), "page_rounds must be a whole number, 1 or more, not 0"),
        ((5, 3, 0.1, 5, "hub"), "post_to must be one of proxy, board, not 'hub'"),
    ],
)
def test_the_function_refuses_what_the_command_refuses(args, said):
    with pytest.raises(ValueError, match=said.replace("(", r"\(")):
        check_board_load(*args)


def test_percentiles_are_numpys_linear_ones():
    rng = random.Random(48)
    for n in (1, 2, 3, 10, 101):
        values = [rng.uniform(0, 2) for _ in range(n)]
        for q in (0, 5, 50, 95, 100):
            assert percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # any order
    assert percentile([], 95) is None
    with pytest.raises(ValueError, match="q must be a number from 0 to 100, not 101"):
        percentile([1.0], 101)


def test_cpu_share_is_a_share_of_one_core_and_never_divides_by_zero():
    assert cpu_share(50, 100, 1.0) == pytest.approx(50.0)
    assert cpu_share(300, 100, 2.0) == pytest.approx(150.0)  # two cores busy: > 100
    assert cpu_share(10, 100, 0.0) is None
    assert cpu_share(10, 0, 1.0) is None


def test_process_ticks_counts_this_process_and_none_for_a_gone_one():
    assert process_ticks() >= 0
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert process_ticks(gone.pid) is None


def test_the_hub_s_requests_are_counted_from_its_log(tmp_path):
    hub = board_bench_hub.BenchHub([])
    hub._folder = tmp_path
    log = tmp_path / "hub.log"
    log.write_text(
        "[I 2026-11-30 01:22:44.795 JupyterHub log:192] 200 GET /hub/api/users"
        "?offset=0&limit=200 (board@127.0.0.1) 65.13ms\n"
    )
    start = hub.log_size()
    assert start == log.stat().st_size
    with open(log, "a") as f:
        f.write(
            "[I 2026-11-30 01:22:45.1 JupyterHub log:192] 200 GET /hub/api/user "
            "(learner001@127.0.0.1) 5.20ms\n"
            "01:22:45.118 [ConfigProxy] info: 201 POST /api/routes/services/board\n"
            "[W 2026-11-30 01:22:45.2 JupyterHub log:192] 403 GET /hub/api/user "
            "(@127.0.0.1) 2.00ms\n"
            "[I 2026-11-30 01:22:45.3 JupyterHub log:192] 200 GET /hub/api/users"
            "?offset=0&limit=200 (board@127.0.0.1) 40.00ms\n"
        )
    assert hub.requests_since(start) == {
        "GET /hub/api/user": 2,
        "GET /hub/api/users": 1,
    }
    assert hub.requests_since(0)["GET /hub/api/users"] == 2
    hub._folder = None
    assert hub.requests_since(0) == {} and hub.log_size() == 0


def test_machine_ticks_leave_out_idle_and_io_wait(tmp_path):
    stat = tmp_path / "stat"
    #               user nice sys idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 10 40 800 50 5 5 0 30 0\ncpu0 1 2 3 4\n")
    assert machine_ticks(str(stat)) == (160, 1010)
    assert machine_ticks(str(tmp_path / "missing")) == (0, 0)


class FakeHub:
    def __init__(self) -> None:
        self.tokens = {"learner001": "t1", "learner002": "t2"}
        self.board_url = "http://127.0.0.1:1/services/board/"  # the proxy's
        self.board_own_url = "http://127.0.0.1:2/services/board/"


def test_the_learners_post_through_the_proxy_or_to_the_board_s_own_address():
    load = BoardLoad(2, 3.0, 0.1, 2, [0.0, 0.0, 0.0])
    assert _Run(FakeHub(), load, None).post_url == FakeHub().board_url + "api/records"
    load.post_to = "board"
    own = FakeHub().board_own_url + "api/records"
    assert _Run(FakeHub(), load, None).post_url == own
    assert "to the board's own address, sparing the proxy" in board_table(load)


def test_a_post_is_seen_when_the_table_shows_it_or_a_later_one():
    load = BoardLoad(2, 3.0, 0.1, 2, [0.0, 0.0, 0.0])
    run = _Run(FakeHub(), load, client=None)
    run.pending["learner001"] = {1: 10.0, 2: 11.0, 3: 12.0}
    run.pending["learner002"] = {1: 10.5}
    rows = [
        {"learner": "learner001", "section": "post 2"},  # 1 and 2, not yet 3
        {"learner": "learner002", "section": None},  # never posted: nothing seen
        {"learner": "someone", "section": "post 9"},  # not one of ours
    ]
    run.start = 9.0
    run.see(rows, 11.25)
    assert sorted(load.update) == pytest.approx([0.25, 1.25])
    assert sorted(load.update_sent) == pytest.approx([1.0, 2.0])  # from the start
    assert run.pending == {"learner001": {3: 12.0}, "learner002": {1: 10.5}}
    run.see([{"learner": "learner002", "section": "post 1"}], 10.75)
    assert sorted(load.update) == pytest.approx([0.25, 0.25, 1.25])
    run.see(rows, 13.0)  # post 2 again: post 3 stays unseen
    assert run.pending["learner001"] == {3: 12.0}


def _load(update: list[float], **more) -> BoardLoad:
    load = BoardLoad(999, 3600.0, 0.05, 2, [12.34, 10.5, 9.25], [15.5, 11.0, 9.5])
    load.update, load.post, load.table = update, [0.01, 2.5], [0.02]
    load.update_sent = [float(i) for i in range(len(update))]  # one a second
    load.pages = {
        "before": {"/hub/login via proxy": [0.004, 0.006]},
        "during": {"/hub/login via proxy": [0.008, 0.012]},
    }
    load.cpu = {"hub": 12.5, "board": 150.0, "proxy": None, "client": 33.0}
    load.posts = len(update)
    load.hub_requests = {
        "GET /hub/api/user": 999,
        "GET /hub/api/users": 360,
        "GET /hub/api/": 100,
        "GET /hub/login": 100,
        "POST /hub/api/users/x/tokens": 1,
    }
    for key, value in more.items():
        setattr(load, key, value)
    return load


def test_the_table_fits_88_columns_and_says_the_verdict():
    slow = _load([0.5, 5.0, 120.0] * 10, refused=["413: " + "x" * 200] * 3)
    for load in (_load([0.1, 0.2]), slow, _load([])):
        text = board_table(load)
        assert max(map(len, text.splitlines())) <= WIDTH, text
    assert board_table(_load([0.1, 0.2])).splitlines()[-1].endswith(": met")
    assert "NOT met" in board_table(slow)
    assert "1 over a kernel's 2 s timeout" in board_table(slow)
    assert "2.00x" in board_table(slow)  # the login page's p95, during / before
    assert "proxy -," in board_table(slow)  # a process whose CPU was not read
    assert "999 token checks" in board_table(slow)
    assert "360 lists of the class (GET /hub/api/users), 200 timed pages, 1 other" in (
        board_table(slow)
    )
    empty = board_table(_load([]))
    assert "board update (sent -> on table)" in empty and "NOT met" in empty


def test_the_first_seconds_of_the_load_are_shown_apart():
    rows = _load([0.1 * i for i in range(8)]).rows()  # sent at 0, 1, ... 7 s
    first, later = rows[1], rows[2]
    assert first["what"] == "  of posts sent in the first 5 s"
    assert first["n"] == 5 and first["max_s"] == pytest.approx(0.4)
    assert later["n"] == 3 and later["p50_s"] == pytest.approx(0.6)


def test_the_goal_needs_every_post_answered_and_shown():
    fast = [GOAL_S / 10] * 20
    assert _load(fast).met()
    assert not _load([GOAL_S] * 20).met()  # p95 must be under the goal
    assert not _load(fast, refused=["500: boom"]).met()
    assert not _load(fast, unseen=1).met()
    assert not _load([]).met()


def test_a_page_ratio_is_none_without_a_time_before():
    load = _load([0.1])
    load.pages = {"before": {"p": [0.0, 0.0]}, "during": {"p": [0.01]}}
    assert load.page_ratios() == {"p": None}
    load.pages = {"before": {"p": [0.01]}, "during": {}}
    assert load.page_ratios() == {"p": None}


def test_the_report_is_json_with_the_rows_and_the_verdict():
    report = _load([0.1, 0.3]).report()
    again = json.loads(json.dumps(report))
    assert again["met"] is True and again["goal_p95_s"] == GOAL_S
    first = again["rows"][0]
    assert first["n"] == 2 and first["p50_s"] == pytest.approx(0.2)
    assert again["run"]["learners"] == 999


def test_every_record_a_learner_posts_is_one_the_board_accepts():
    for seq in range(1, 41):
        record = learner_record(seq, seq % 7)
        assert check_record(record) is not None
        assert len(json.dumps(record).encode()) < 16 * 1024
        assert record["where"]["section"] == f"post {seq}"


def test_the_hub_config_adds_the_board_as_the_portal_does(tmp_path):
    pytest.importorskip("batchspawner")  # portal_hub's, which adds the board
    ports = {"public": 10001, "hub": 10002, "proxy_api": 10003, "board": 10004}
    text = board_bench_hub.hub_config(
        tmp_path, ports, "token", "p" * 24, ["ada"], Path("/x/chp")
    )
    c = Config()
    exec(compile(text, "jupyterhub_config.py", "exec"), {"c": c})
    assert c.JupyterHub.bind_url == "http://127.0.0.1:10001/"
    assert c.ConfigurableHTTPProxy.command == ["/x/chp"]
    assert c.Authenticator.allowed_users == {"ada"}  # made as the hub starts
    services = {s["name"]: s for s in c.JupyterHub.services}
    assert set(services) == {"bench", "board"}
    board = services["board"]
    assert board["url"] == "http://127.0.0.1:10004"
    assert board["command"][-2:] == ["--state", str(tmp_path / "board")]
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert "custom:board:read" in roles["board-instructors"]["scopes"]
    assert board_bench_hub.INSTRUCTOR in roles["board-instructors"]["users"]
    # A learner's simulated kernel gets the scopes of a real server's token.
    assert set(board_bench_hub.SERVER_TOKEN_SCOPES) == set(
        c.PortalSpawner.server_token_scopes
    )


# -- the control phase: a plain CPU load of the load phase's size
@pytest.mark.parametrize("share", [1.0, 37.0, 99.9, 100.0, 100.1, 150.0, 199.0])
def test_the_busy_loops_use_the_share_asked_in_as_few_processes_as_can(share):
    duties = burner_duties(share, 4)
    assert sum(duties) == pytest.approx(share / 100)
    assert len(duties) == math.ceil(share / 100 - 1e-9)  # fewest: each below 1
    assert all(0 < duty <= 1 for duty in duties)
    assert len(set(duties)) == 1  # equal duties


def test_the_busy_loops_never_ask_more_than_the_machine_or_a_bad_share():
    assert burner_duties(500.0, 2) == [1.0, 1.0]  # every core, no more
    for share in (None, 0.0, -5.0, float("nan"), float("inf")):
        assert burner_duties(share, 2) == []
    assert burner_duties(50.0, 0) == []


def test_the_control_plan_runs_the_learners_share_at_the_lowest_priority():
    plan = control_plan({"hub": 9.0, "board": 18.0, "proxy": 19.0, "client": 123.0}, 2)
    normal = [duty for duty, nice in plan if nice == 0]
    lowest = [duty for duty, nice in plan if nice == LOWEST_NICE]
    assert sum(normal) == pytest.approx(0.37)  # the board and the proxy: not the hub
    assert sum(lowest) == pytest.approx(1.23) and len(lowest) == 2
    assert control_plan({"board": 0.0, "proxy": 0.0, "client": 0.0}, 2) == []
    for gone in ("board", "proxy", "client"):
        cpu = {"board": 18.0, "proxy": 19.0, "client": 23.0, gone: None}
        assert control_plan(cpu, 2) is None  # not measured: no control sized on it


def test_the_hub_is_slower_because_of_the_board_only_beyond_the_margin():
    plain = 0.010
    assert slower_because(plain, plain) == "the machine"
    assert slower_because(plain * (1 + CONTROL_MARGIN), plain) == "the machine"  # at it
    assert slower_because(plain * (1 + CONTROL_MARGIN) * 1.01, plain) == "the board"
    assert slower_because(plain / 2, plain) == "the machine"  # faster: not the board
    assert slower_because(0.05, 0.01, margin=5.0) == "the machine"
    assert slower_because(None, plain) is None
    assert slower_because(plain, None) is None
    assert slower_because(plain, 0.0) is None  # a measured 0: no division


def _controlled(during: float, plain: float) -> BoardLoad:
    load = _load([0.1, 0.2])
    load.pages = {
        "before": {"/hub/api/ direct": [0.002] * 3, "/hub/api/ via proxy": [0.003] * 3},
        "during": {"/hub/api/ direct": [during] * 3, "/hub/api/ via proxy": [0.06] * 3},
        "control": {"/hub/api/ direct": [plain] * 3, "/hub/api/ via proxy": [0.01] * 3},
    }
    load.cpu["machine"] = 40.0
    load.control = {
        "plan": [(0.37, 0), (0.23, LOWEST_NICE)],
        "target": 60.0,
        "got": 58.0,
    }
    load.control["machine"] = 41.0
    return load


def test_the_control_is_printed_beside_the_board_s_load_with_its_verdict():
    load = _controlled(during=0.013, plain=0.012)
    rows = {row["page"]: row for row in load.control_rows()}
    direct = rows["/hub/api/ direct"]
    assert direct["before_p95_s"] == pytest.approx(0.002)
    assert direct["board_vs_plain"] == pytest.approx(0.013 / 0.012)
    assert direct["because"] == "the machine"
    assert rows["/hub/api/ via proxy"]["because"] == "the board"  # 6x the plain
    text = board_table(load)
    assert max(map(len, text.splitlines())) <= WIDTH, text
    assert "duty cycle 0.37 at nice 0, 0.23 at nice 19" in text
    assert "60% of one core asked" in text and "58% used" in text
    line = next(s for s in text.splitlines() if s.startswith("/hub/api/ direct"))
    assert line.split()[2:7] == ["2.0", "13.0", "12.0", "1.08x", "the"]
    assert "at the hub's port: the machine; through the proxy: the board" in text
    slower = board_table(_controlled(during=0.040, plain=0.012))
    assert "at the hub's port: the board;" in slower
    report = json.loads(json.dumps(load.report()))
    assert report["control_margin"] == CONTROL_MARGIN
    assert {row["because"] for row in report["control_rows"]} == {
        "the machine",
        "the board",
    }


def test_a_control_without_figures_says_so_and_divides_by_nothing():
    load = _controlled(during=0.013, plain=0.0)  # a plain p95 of 0
    assert {row["board_vs_plain"] for row in load.control_rows()} == {None, 6.0}
    assert "at the hub's port: -;" in board_table(load)
    load.control = {"skipped": "the CPU of the board, proxy or learners unread"}
    assert "no control: the CPU of the board" in board_table(load)
    assert "the board: 0.0" not in board_table(_load([0.1]))  # no control: no lines


def test_the_busy_loops_take_their_nice_and_all_stop_with_their_group():
    burners = _Burners()
    try:
        burners.start()
        launcher = burners.proc.pid
        pids = burners.burn([(0.05, 0), (0.05, LOWEST_NICE)])
        assert len(pids) == 2
        assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in pids] == [
            os.getpriority(os.PRIO_PROCESS, 0),
            LOWEST_NICE,
        ]
        assert {os.getpgid(pid) for pid in pids} == {launcher}  # one group
    finally:
        burners.close()
    assert not [pid for pid in [launcher, *pids] if is_alive(pid)]
    burners.close()  # twice: nothing left to signal, no error
    assert burners.proc is None


def test_the_learners_thread_runs_at_the_lowest_priority_and_the_caller_not():
    me = threading.get_native_id()
    mine = os.getpriority(os.PRIO_PROCESS, me)
    seen = {}

    async def work() -> None:
        seen["thread"] = threading.get_native_id()
        seen["nice"] = _lowest_priority()

    _in_own_thread(work())
    assert seen["thread"] != me
    assert seen["nice"] == LOWEST_NICE
    assert os.getpriority(os.PRIO_PROCESS, me) == mine  # the caller keeps its own


def test_an_error_in_the_learners_thread_reaches_the_caller():
    async def work() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        _in_own_thread(work())
