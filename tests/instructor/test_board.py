"""board: the class board's HTTP service, in this process, with the hub's answer to
"who is asking" stood in for (tests/instructor/test_board_integration.py asks a real
hub): who may see and do what, the page, the table, a cleared hand, the CSV, _xsrf,
the class from the hub's users, the jobs from squeue, saving, and stopping."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import re
import shutil
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest

pytest.importorskip("jupyterhub")
import requests
from jupyterhub.services.auth import HubOAuth
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from workshop.instructor import board, board_page
from workshop.instructor.board import (
    BoardService,
    JobWatch,
    make_app,
    parse_squeue,
)

PREFIX = "/services/board/"
ACCESS = "access:services!service=board"
# Tokens of the stand-in hub and whose they are, with the scopes the hub would give.
USERS = {
    "teach": {
        "name": "teacher",
        "kind": "user",
        "scopes": ["custom:board:read", ACCESS],
    },
    "ada": {"name": "ada", "kind": "user", "scopes": [ACCESS]},
    "bo": {"name": "bo", "kind": "user", "scopes": [ACCESS]},
    "svc": {"name": "classroom", "kind": "service", "scopes": [ACCESS]},
}


async def stand_in_hub(handler: web.RequestHandler) -> dict | None:
    """Who asks: the header's token (as a kernel or script sends it), else the
    cookie "stand-in" (as a browser logged in through OAuth)."""
    found = re.fullmatch(
        r"token (\S+)", handler.request.headers.get("Authorization", "")
    )
    if found:
        handler._token_authenticated = True
        return USERS.get(found.group(1))
    return USERS.get(handler.get_cookie("stand-in", ""))


class FakeHubUsers(web.RequestHandler):
    """The hub's GET /hub/api/users, two pages of users."""

    PAGES: ClassVar[dict] = {
        0: (["ada", ("teacher", True, []), "bo"], {"offset": 3}),
        3: (["cy", ("dee", False, ["instructors"]), "ed"], None),
    }

    def get(self) -> None:
        assert self.request.headers["Authorization"] == "token service-token"
        assert "pagination" in self.request.headers["Accept"]
        names, following = self.PAGES[int(self.get_argument("offset"))]
        items = []
        for entry in names:
            name, admin, groups = entry if isinstance(entry, tuple) else (entry, 0, [])
            items.append({"name": name, "admin": bool(admin), "groups": groups})
        self.finish({"items": items, "_pagination": {"next": following}})


class Running:
    """The board's app (and a stand-in hub API) served by a thread's event loop."""

    def __init__(self, service: BoardService) -> None:
        self.service = service
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10), "the board's test server did not start"
        self.url = f"http://127.0.0.1:{self.port}{PREFIX}"
        self.hub_api = f"http://127.0.0.1:{self.hub_port}/hub/api"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        auth = HubOAuth(
            api_token="unused",
            oauth_client_id="service-board",
            base_url=PREFIX,
            api_url="http://127.0.0.1:9/hub/api",
        )
        app = make_app(self.service, PREFIX, auth, b"s" * 32, identify=stand_in_hub)
        self.servers = []
        for application in (app, web.Application([("/hub/api/users", FakeHubUsers)])):
            sockets = bind_sockets(0, "127.0.0.1")
            server = HTTPServer(application, max_body_size=board.MAX_BODY_BYTES)
            server.add_sockets(sockets)
            self.servers.append((server, sockets[0].getsockname()[1]))
        self.port, self.hub_port = (port for _, port in self.servers)

    def call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(10)

    def stop(self) -> None:
        for server, _ in self.servers:
            self.loop.call_soon_threadsafe(server.stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def running():
    started = Running(BoardService(None))
    started.service.learners = ["ada", "bo", "cy"]
    yield started
    started.stop()


def get(running, path, who=None, **kwargs):
    headers = {"Authorization": f"token {who}"} if who else {}
    return requests.get(running.url + path, headers=headers, timeout=10, **kwargs)


def post(running, path, who=None, body=b"", **kwargs):
    headers = {"Authorization": f"token {who}"} if who else {}
    return requests.post(
        running.url + path, data=body, headers=headers, timeout=10, **kwargs
    )


def a_record(seq=1, hand=None, **parts):
    return json.dumps(
        {
            "version": 1,
            "seq": seq,
            "where": {"notebook": "02_ddp.ipynb", "section": "The ring"},
            "exercises": {
                "02.ring": {"passed": False, "failures": 1, "reason": "sum is 5"}
            },
            "hand": hand,
            **parts,
        }
    ).encode()


def test_the_instructor_gets_the_page_with_its_xsrf_and_nothing_from_elsewhere(
    running,
):
    answer = get(running, "", "teach")
    assert answer.status_code == 200
    page = answer.text
    xsrf = re.search(r'data-xsrf="([^"]+)"', page).group(1)
    assert answer.cookies.get("_xsrf") == xsrf
    assert f'data-base="{PREFIX}"' in page
    assert f'href="{PREFIX}board.csv"' in page and "Export CSV" in page
    assert 'fetch(base + "api/table"' in page and "setInterval(refresh, 2000)" in page
    assert "signed in as teacher" in page
    # No script, style or font from another site: a portal's browser may be offline.
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    assert "@import" not in page and "url(" not in page
    # Legible on a projector: no type below 12 px.
    sizes = [int(s) for s in re.findall(r"font(?:-size)?:[^;]*?(\d+)px", page)]
    assert sizes and min(sizes) >= 12


@pytest.mark.skipif(shutil.which("node") is None, reason="no node to parse it")
def test_the_page_s_script_parses(tmp_path):
    script = tmp_path / "board.js"
    script.write_text(board_page.SCRIPT)
    checked = subprocess.run(
        ["node", "--check", str(script)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stderr


def test_a_learner_gets_403_on_the_page_and_the_table_and_the_csv(running):
    page = get(running, "", "ada")
    assert page.status_code == 403
    assert "the class board is the instructor&#x27;s" in page.text
    for path in ("api/table", "board.csv"):
        answer = get(running, path, "ada")
        assert answer.status_code == 403
        assert answer.json() == {
            "error": "the class board is the instructor's: it needs the hub's scope "
            "custom:board:read (the portal's admin, or the group 'instructors'), "
            "and 'ada' does not hold it"
        }


def test_nobody_is_sent_to_the_hub_s_login_and_refused_by_the_api(running):
    page = get(running, "", allow_redirects=False)
    assert page.status_code == 302
    where = page.headers["Location"]
    assert where.startswith("/hub/api/oauth2/authorize?")
    assert "client_id=service-board" in where and "state=" in where
    answer = get(running, "api/table")
    assert answer.status_code == 403
    assert answer.json()["error"].startswith("no hub user: open the board from the hub")
    assert get(running, "api/table", "stranger").status_code == 403
    bare = requests.get(running.url.rstrip("/"), allow_redirects=False, timeout=10)
    assert (bare.status_code, bare.headers["Location"]) == (301, PREFIX)


def test_a_learner_s_post_shows_in_the_instructor_s_table(running):
    answer = post(
        running, "api/records", "ada", a_record(hand={"kind": "help", "seq": 1})
    )
    assert (answer.status_code, answer.json()) == (
        200,
        {"ok": True, "hand_cleared": None},
    )
    table = get(running, "api/table", "teach").json()
    assert [row["learner"] for row in table["learners"]] == ["ada", "bo", "cy"]
    ada = table["learners"][0]
    assert ada["exercises"] == {
        "02.ring": {"state": "failed", "failures": 1, "reason": "sum is 5"}
    }
    assert (ada["notebook"], ada["section"], ada["hand"]) == (
        "02_ddp.ipynb",
        "The ring",
        "help",
    )
    assert table["summary"]["lines"] == [
        "exercise 02.ring: 0 passed, 1 failed, 2 not yet",
        "1 hands up (1 help, 0 done); 0 with an error",
    ]
    assert table["summary"]["jobs_unknown"] == "no squeue watch"


def test_records_are_read_by_their_learner_or_the_instructor_only(running):
    post(running, "api/records", "ada", a_record(seq=2))
    own = get(running, "api/records/ada", "ada")
    assert own.status_code == 200 and own.json()["seq"] == 2
    assert get(running, "api/records/ada", "teach").json() == own.json()
    other = get(running, "api/records/ada", "bo")
    assert other.status_code == 403
    assert other.json()["error"] == (
        "'bo' may read only their own record, not the one of 'ada'; the class "
        "board is the instructor's"
    )
    none = get(running, "api/records/cy", "teach")
    assert (none.status_code, none.json()) == (
        404,
        {"error": "the board has no record of 'cy'"},
    )


def test_bad_posts_are_refused_with_their_sentence(running):
    other = post(running, "api/records", "bo", a_record(learner="ada"))
    assert other.status_code == 403
    assert "names another learner ('ada')" in other.json()["error"]
    bad = post(running, "api/records", "bo", b"{")
    assert bad.status_code == 400
    assert bad.json()["error"].startswith("the record is not JSON")
    big = post(running, "api/records", "bo", b" " * 20000)
    assert big.status_code == 413
    assert big.json()["error"].startswith("the record is 20000 bytes")
    service = post(running, "api/records", "svc", a_record())
    assert service.status_code == 403
    assert service.json() == {
        "error": "only a hub user posts a record, not 'classroom'"
    }
    assert running.service.board.learners == {}


def test_the_instructor_clears_a_hand_and_a_learner_cannot(running):
    post(
        running, "api/records", "ada", a_record(seq=3, hand={"kind": "help", "seq": 3})
    )
    refused = post(running, "api/hands/ada/clear", "bo")
    assert refused.status_code == 403
    cleared = post(running, "api/hands/ada/clear", "teach")
    assert (cleared.status_code, cleared.json()) == (200, {"ok": True})
    assert get(running, "api/table", "teach").json()["learners"][0]["hand"] is None
    # The kernel learns it with its next post.
    again = post(
        running, "api/records", "ada", a_record(seq=4, hand={"kind": "help", "seq": 3})
    )
    assert again.json() == {"ok": True, "hand_cleared": 3}
    # A learner of the class without a record: nothing to clear, but known.
    assert post(running, "api/hands/bo/clear", "teach").status_code == 200
    unknown = post(running, "api/hands/zed/clear", "teach")
    assert (unknown.status_code, unknown.json()) == (
        404,
        {"error": "no learner 'zed' on the board"},
    )


def test_a_browser_s_post_needs_the_page_s_xsrf_and_a_token_s_does_not(running):
    post(running, "api/records", "ada", a_record(hand={"kind": "done", "seq": 1}))
    browser = requests.Session()
    browser.cookies.set("stand-in", "teach")
    page = browser.get(running.url, timeout=10)
    xsrf = re.search(r'data-xsrf="([^"]+)"', page.text).group(1)
    forged = browser.post(running.url + "api/hands/ada/clear", timeout=10)
    assert forged.status_code == 403
    assert forged.json()["error"].startswith(
        "a browser's POST needs the page's _xsrf token (header X-XSRFToken)"
    )
    assert running.service.board.hand("ada") == "done"
    wrong = browser.post(
        running.url + "api/hands/ada/clear", headers={"X-XSRFToken": "x"}, timeout=10
    )
    assert wrong.status_code == 403
    right = browser.post(
        running.url + "api/hands/ada/clear", headers={"X-XSRFToken": xsrf}, timeout=10
    )
    assert right.status_code == 200
    assert running.service.board.hand("ada") is None
    # A kernel's post carries its token, no _xsrf and no cookie: it is taken.
    assert post(running, "api/records", "bo", a_record()).status_code == 200


def test_the_csv_is_an_attachment_with_a_row_per_learner(running):
    post(running, "api/records", "bo", a_record(seq=1))
    answer = get(running, "board.csv", "teach")
    assert answer.status_code == 200
    assert answer.headers["Content-Type"].startswith("text/csv")
    assert re.fullmatch(
        r'attachment; filename="board-\d{8}-\d{4}\.csv"',
        answer.headers["Content-Disposition"],
    )
    rows = list(csv.DictReader(io.StringIO(answer.text)))
    assert [r["learner"] for r in rows] == ["ada", "bo", "cy"]
    assert rows[1]["02.ring"] == "failed 1: sum is 5"
    assert rows[0]["02.ring"] == ""


def test_the_class_is_the_hub_s_users_but_its_instructors(running):
    service = BoardService(None, (running.hub_api, "service-token"))
    running.call(service.refresh_learners())
    assert service.learners == ["ada", "bo", "cy", "ed"]
    assert service.instructors == {"teacher", "dee"}
    # A user made since, who posts, shows at once; an instructor's kernel does not.
    for name in ("fay", "teacher", "dee"):
        service.board.accept(name, a_record())
    names = [row["learner"] for row in service.table()["learners"]]
    assert names == ["ada", "bo", "cy", "ed", "fay"]


def test_a_hub_that_does_not_answer_keeps_the_last_class(running, caplog):
    service = BoardService(None, ("http://127.0.0.1:9/hub/api", "service-token"))
    service.learners = ["ada"]
    running.call(service.refresh_learners())
    assert service.learners == ["ada"]
    assert "could not ask the hub for its users" in caplog.text


def test_squeue_s_lines_give_each_learner_s_server_job():
    text = (
        "ada|PENDING|2:00:00|jupyter-ada\n"
        "ada|RUNNING|1:58:12|jupyter-ada\n"
        "bo|RUNNING|10:00|train\n"
        "cy|PENDING|INVALID|jupyter-cy\n"
        "garbage\n"
    )
    assert parse_squeue(text) == {
        "ada": {"state": "RUNNING", "left": "1:58:12"},
        "cy": {"state": "PENDING", "left": "INVALID"},
    }


def _script(folder: Path, body: str) -> str:
    path = folder / "squeue"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_the_job_watch_says_why_the_jobs_are_unknown(tmp_path):
    watch = JobWatch(command=str(tmp_path / "no-squeue"))
    watch.poll()
    assert (watch.jobs, watch.why) == (
        None,
        f"{tmp_path / 'no-squeue'} not found on PATH",
    )
    watch = JobWatch(
        command=_script(tmp_path, "echo 'slurm_load_jobs error: x' >&2; exit 1")
    )
    watch.poll()
    assert (watch.jobs, watch.why) == (None, "squeue failed: slurm_load_jobs error: x")
    watch = JobWatch(command=_script(tmp_path, "echo 'ada|RUNNING|0:59|jupyter-ada'"))
    watch.poll()
    assert (watch.jobs, watch.why) == (
        {"ada": {"state": "RUNNING", "left": "0:59"}},
        None,
    )


def test_the_table_shows_the_jobs_of_a_watch_running_in_its_thread(tmp_path):
    command = _script(tmp_path, 'echo "bo|RUNNING|1:00:00|jupyter-bo"')
    watch = JobWatch(every=0.05, command=command).start()
    try:
        service = BoardService(None, jobs=watch)
        service.learners = ["ada", "bo"]
        deadline = time.monotonic() + 30  # the thread's first round, however busy
        while watch.jobs is None and time.monotonic() < deadline:
            time.sleep(0.02)
        rows = service.table()["learners"]
        assert [r["job"] for r in rows] == [
            None,
            {"state": "RUNNING", "left": "1:00:00"},
        ]
        assert service.table()["summary"]["jobs_unknown"] is None
    finally:
        watch.stop()
        watch._thread.join(5)
    assert not watch._thread.is_alive()


def test_changes_are_saved_privately_and_read_back_at_start(tmp_path):
    state = tmp_path / "board"
    service = BoardService(state)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    service.board.accept("ada", a_record(seq=5))
    asyncio.run(service.save_if_changed())
    saved = state / "board.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    before = saved.stat().st_mtime_ns
    asyncio.run(service.save_if_changed())  # nothing changed: not written again
    assert saved.stat().st_mtime_ns == before
    assert BoardService(state).board.record("ada")["seq"] == 5


def test_serve_saves_and_returns_when_its_parent_is_gone(tmp_path, monkeypatch):
    service = BoardService(tmp_path / "board")
    service.board.accept("ada", a_record(seq=7))
    gone = threading.Event()
    monkeypatch.setattr(board, "PARENT_EVERY_S", 0.02)
    monkeypatch.setattr(board, "_parent_gone", lambda parent: gone.is_set())
    auth = HubOAuth(
        api_token="unused", oauth_client_id="service-board", base_url=PREFIX
    )
    app = make_app(service, PREFIX, auth, b"s" * 32, identify=stand_in_hub)
    sockets = bind_sockets(0, "127.0.0.1")
    port = sockets[0].getsockname()[1]
    for s in sockets:
        s.close()
    url = f"http://127.0.0.1:{port}"

    async def scenario():
        served = asyncio.create_task(board.serve(service, app, url))
        await asyncio.sleep(0)  # serve's first step: it listens
        answer = await asyncio.to_thread(
            requests.get,
            f"{url}{PREFIX}api/records/ada",
            headers={"Authorization": "token ada"},
            timeout=10,
        )
        assert answer.status_code == 200
        gone.set()
        await asyncio.wait_for(served, 10)

    asyncio.run(scenario())
    assert (
        json.loads((tmp_path / "board" / "board.json").read_text())["learners"]["ada"][
            "record"
        ]["seq"]
        == 7
    )
    with pytest.raises(requests.ConnectionError):
        requests.get(url, timeout=2)


def test_run_by_hand_it_says_it_is_the_hub_s_service(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("JUPYTERHUB_SERVICE_URL", raising=False)
    assert board.main(["--state", str(tmp_path / "board")]) == 2
    assert "JUPYTERHUB_SERVICE_URL is not set" in capsys.readouterr().err
    assert not (tmp_path / "board").exists()


def test_the_cookie_secret_is_made_once_and_private(tmp_path):
    first = board._cookie_secret(tmp_path)
    assert len(first) == 32 and board._cookie_secret(tmp_path) == first
    assert stat.S_IMODE((tmp_path / "cookie_secret").stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["cookie_secret"]
