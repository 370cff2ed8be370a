"""The slow tests of test_board.py: the class board as a service of a real JupyterHub
(no Slurm: the hub's users are made through its REST API), configured as the portal
configures it (docs/portal.md, "The instructor's board"). Tokens are the hub's, made
for each user with the scopes a learner's server gets; the browser's login is the
hub's OAuth.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("jupyterhub")
import requests
from conftest import ROOT, clean_env, proxy_missing

from workshop.cluster.ports import quiet_ports
from workshop.instructor import portal

# What a learner's server token holds (c.Spawner.server_token_scopes).
SERVER_TOKEN_SCOPES = [
    "users:activity!user",
    "access:servers!server",
    "access:services!service=board",
]
INSTRUCTOR_SCOPES = ["custom:board:read", "access:services!service=board"]
PASSWORD = "board-test"


pytestmark = pytest.mark.skipif(
    proxy_missing() is not None, reason=str(proxy_missing())
)

CONFIG = """
c.JupyterHub.bind_url = "http://127.0.0.1:{public}/"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub}"
c.JupyterHub.db_url = "sqlite:///{folder}/hub.sqlite"
c.JupyterHub.cookie_secret_file = "{folder}/cookie_secret"
c.JupyterHub.pid_file = "{folder}/hub.pid"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api}"
c.ConfigurableHTTPProxy.pid_file = "{folder}/proxy.pid"
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {password!r}
c.Authenticator.allow_all = True
c.Authenticator.admin_users = {{"teacher"}}
c.JupyterHub.custom_scopes = {{
    "custom:board:read": {{"description": "read the class board, clear hands"}}}}
c.JupyterHub.services = [
    {{"name": "classroom", "api_token": {token!r}}},
    {{"name": "board", "url": "http://127.0.0.1:{board}",
      "command": [{python!r}, "-m", "workshop.instructor.board",
                  "--state", "{folder}/board"],
      "environment": {{"PYTHONPATH": {root!r}}},
      "oauth_no_confirm": True,
      "oauth_client_allowed_scopes": ["custom:board:read"],
      "display": True}}]
c.JupyterHub.load_roles = [
    {{"name": "classroom", "scopes": ["admin:users", "admin:groups", "tokens"],
      "services": ["classroom"]}},
    {{"name": "user", "scopes": ["self", "access:services!service=board"]}},
    {{"name": "board-instructors",
      "scopes": ["custom:board:read", "access:services!service=board"],
      "users": ["teacher"], "groups": ["instructors"]}},
    {{"name": "board-service", "scopes": ["list:users", "read:users", "read:groups"],
      "services": ["board"]}}]
c.Spawner.server_token_scopes = {scopes!r}
"""


class Hub:
    """A JupyterHub in ``folder`` with the board as its service."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        names = ("public", "hub", "proxy_api", "board")
        self.ports = dict(zip(names, quiet_ports(len(names)), strict=True))
        self.token = os.urandom(16).hex()
        (folder / "jupyterhub_config.py").write_text(
            CONFIG.format(
                folder=folder,
                proxy=str(portal.proxy_command()),
                password=PASSWORD,
                token=self.token,
                python=sys.executable,
                root=str(ROOT),
                scopes=SERVER_TOKEN_SCOPES,
                **self.ports,
            )
        )
        self.url = f"http://127.0.0.1:{self.ports['public']}/"
        self.board = self.url + "services/board/"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.folder / "hub.log", "ab")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", "jupyterhub_config.py"],
            cwd=self.folder,
            env=clean_env(CONFIGPROXY_AUTH_TOKEN=self.token),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._log = log
        # Up when the board answers through the hub's proxy (its JSON refusal).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log_tail()
            try:
                answer = requests.get(self.board + "api/table", timeout=5)
                if answer.headers.get("Content-Type", "").startswith(
                    "application/json"
                ):
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"the hub or its board did not start:\n{self.log_tail()}")

    def log_tail(self) -> str:
        return (self.folder / "hub.log").read_text(errors="replace")[-3000:]

    def api(self, method: str, path: str, body=None) -> requests.Response:
        return requests.request(
            method,
            self.url + "hub/api/" + path,
            json=body,
            headers={"Authorization": f"token {self.token}"},
            timeout=30,
        )

    def token_for(self, name: str, scopes: list[str]) -> str:
        answer = self.api("POST", f"users/{name}/tokens", {"scopes": scopes})
        assert answer.status_code == 201, answer.text
        return answer.json()["token"]

    def board_pids(self) -> list[int]:
        """The board processes of this hub (by their state folder)."""
        state = str(self.folder / "board").encode()
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    command = Path(f"/proc/{entry}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"workshop.instructor.board" in command and state in command:
                    pids.append(int(entry))
        return pids

    def kill(self) -> None:
        """SIGKILL the hub, as a crash would; its proxy and board are left."""
        self.process.kill()
        self.process.wait(30)
        self._log.close()

    def stop(self) -> None:
        """SIGTERM the hub (it stops its board and proxy), then whatever is left."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
            self._log.close()
        for pid in self.board_pids() + _pid(self.folder / "proxy.pid"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _pid(path: Path) -> list[int]:
    try:
        return [int(path.read_text().strip())]
    except (OSError, ValueError):
        return []


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    folder = tmp_path_factory.mktemp("board-hub")
    started = Hub(folder)
    try:
        started.start()
        made = started.api("POST", "users", {"usernames": ["ada", "bo", "cy"]})
        assert made.status_code == 201, made.text
        # cy assists: an instructor by the group, not the admin.
        grouped = started.api("POST", "groups/instructors/users", {"users": ["cy"]})
        assert grouped.status_code == 200, grouped.text
        started.tokens = {
            name: started.token_for(name, SERVER_TOKEN_SCOPES) for name in ("ada", "bo")
        }
        started.tokens["teacher"] = started.token_for("teacher", INSTRUCTOR_SCOPES)
        started.tokens["cy"] = started.token_for("cy", INSTRUCTOR_SCOPES)
        started.tokens["teacher's server"] = started.token_for(
            "teacher", SERVER_TOKEN_SCOPES
        )
        yield started
    finally:
        started.stop()
    assert started.board_pids() == []


def call(hub, method, path, who, body=None):
    data = body if isinstance(body, bytes) or body is None else json.dumps(body)
    return requests.request(
        method,
        hub.board + path,
        data=data,
        headers={"Authorization": f"token {hub.tokens[who]}"},
        timeout=30,
    )


def a_record(seq, **parts):
    return {
        "version": 1,
        "seq": seq,
        "where": {"notebook": "02_ddp.ipynb", "section": "The ring"},
        "exercises": {
            "02.ring": {"passed": False, "failures": 1, "reason": "sum is 5, not 6"}
        },
        **parts,
    }


def _row(hub, name):
    table = call(hub, "GET", "api/table", "teacher")
    assert table.status_code == 200, table.text
    return next(r for r in table.json()["learners"] if r["learner"] == name)


def test_a_learner_s_post_shows_on_the_instructor_s_table(hub):
    posted = call(
        hub, "POST", "api/records", "ada", a_record(3, hand={"kind": "help", "seq": 3})
    )
    assert (posted.status_code, posted.json()) == (
        200,
        {"ok": True, "hand_cleared": None},
    )
    # The board is read back the moment it took the post; 5 s is the bound.
    deadline = time.monotonic() + 5
    while _row(hub, "ada")["seen"] is None and time.monotonic() < deadline:
        time.sleep(0.2)
    row = _row(hub, "ada")
    assert row["exercises"]["02.ring"] == {
        "state": "failed",
        "failures": 1,
        "reason": "sum is 5, not 6",
    }
    assert row["hand"] == "help"
    # The class is the hub's users who are not instructors: not the admin, not cy
    # of the group "instructors", who reads the board as the admin does.
    assert call(hub, "GET", "api/table", "cy").status_code == 200
    deadline = time.monotonic() + 30  # the board asks the hub every 10 s
    while time.monotonic() < deadline:
        names = [
            r["learner"]
            for r in call(hub, "GET", "api/table", "teacher").json()["learners"]
        ]
        if names == ["ada", "bo"]:
            break
        time.sleep(0.5)
    assert names == ["ada", "bo"]


def test_a_learner_gets_403_on_the_board_and_on_another_s_record(hub):
    call(hub, "POST", "api/records", "bo", a_record(1))
    for path in ("api/table", "", "board.csv", "api/records/bo"):
        answer = call(hub, "GET", path, "ada")
        assert answer.status_code == 403, (path, answer.text)
    assert (
        "the class board is the instructor"
        in call(hub, "GET", "api/table", "ada").json()["error"]
    )
    assert call(hub, "GET", "api/records/bo", "bo").status_code == 200
    assert call(hub, "GET", "api/records/bo", "teacher").status_code == 200
    # The instructor's own server token is a learner's kind: it posts, it does not read.
    assert call(hub, "GET", "api/table", "teacher's server").status_code == 403
    # A token without access to the board (the classroom service's) is refused.
    service = requests.get(
        hub.board + "api/table",
        headers={"Authorization": f"token {hub.token}"},
        timeout=30,
    )
    assert service.status_code == 403
    assert "access:services!service=board" in service.json()["error"]


def test_bad_posts_are_refused(hub):
    assert call(hub, "POST", "api/records", "bo", a_record(5)).status_code == 200
    other = call(hub, "POST", "api/records", "bo", a_record(5, learner="ada"))
    assert other.status_code == 403
    assert "names another learner ('ada')" in other.json()["error"]
    assert call(hub, "POST", "api/records", "bo", b"{").status_code == 400
    unknown = call(hub, "POST", "api/records", "bo", a_record(5, code="print(1)"))
    assert unknown.status_code == 400
    assert unknown.json()["error"].startswith("unknown key 'code' in the record")
    assert call(hub, "POST", "api/records", "bo", b" " * 20000).status_code == 413
    assert call(hub, "GET", "api/records/bo", "teacher").json() == {
        "where": None,
        "quizzes": {},
        "error": None,
        "hand": None,
        **a_record(5),
    }


def _browser_log_in(hub, name):
    """Log in at the hub's form, then open the board: through the hub's OAuth."""
    browser = requests.Session()
    browser.get(hub.url + "hub/login", timeout=30)
    form = {"username": name, "password": PASSWORD, "_xsrf": browser.cookies["_xsrf"]}
    page = browser.post(
        hub.url + "hub/login?next=/services/board/", data=form, timeout=60
    )
    return browser, page


def test_the_instructor_s_browser_login_carries_the_board_s_scope(hub):
    up = a_record(10, hand={"kind": "help", "seq": 10})
    assert call(hub, "POST", "api/records", "ada", up).status_code == 200
    browser, page = _browser_log_in(hub, "teacher")
    assert page.status_code == 200 and page.url == hub.board, page.text[:300]
    xsrf = re.search(r'data-xsrf="([^"]+)"', page.text).group(1)
    headers = {"X-XSRFToken": xsrf, "Sec-Fetch-Mode": "cors"}
    table = browser.get(hub.board + "api/table", headers=headers, timeout=30)
    assert table.status_code == 200
    assert _row(hub, "ada")["hand"] == "help"
    forged = browser.post(hub.board + "api/hands/ada/clear", timeout=30)
    assert forged.status_code == 403
    assert _row(hub, "ada")["hand"] == "help"
    cleared = browser.post(
        hub.board + "api/hands/ada/clear", headers=headers, timeout=30
    )
    assert cleared.status_code == 200
    assert _row(hub, "ada")["hand"] is None
    csv = browser.get(hub.board + "board.csv", timeout=30)
    assert csv.status_code == 200 and csv.text.startswith("learner,")


def test_a_learner_s_browser_login_gets_the_403_page(hub):
    _, page = _browser_log_in(hub, "bo")
    assert page.status_code == 403 and page.url == hub.board
    assert "the class board is the instructor&#x27;s" in page.text


def _port_free(port: int) -> bool:
    """Whether no process listens on ``port`` (a server binds it as the hub's
    would: SO_REUSEADDR, past the closed connections still in TIME_WAIT)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_killed_hub_s_board_exits_and_its_state_survives_a_restart(hub):
    up = a_record(20, hand={"kind": "done", "seq": 20})
    assert call(hub, "POST", "api/records", "ada", up).status_code == 200
    assert call(hub, "POST", "api/hands/ada/clear", "teacher").status_code == 200
    (board_pid,) = hub.board_pids()
    hub.kill()
    deadline = time.monotonic() + 15  # the board checks its parent every second
    while hub.board_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert hub.board_pids() == [], hub.log_tail()
    assert _port_free(hub.ports["board"])
    assert "the hub (pid" in hub.log_tail() and "saving and stopping" in hub.log_tail()
    # The hub comes back (its proxy outlived it): the board reads its file again.
    hub.start()
    (again,) = hub.board_pids()
    assert again != board_pid
    row = _row(hub, "ada")
    assert row["exercises"]["02.ring"]["reason"] == "sum is 5, not 6"
    assert row["hand"] is None  # cleared before the restart, and still
    assert call(hub, "GET", "api/records/ada", "ada").json()["seq"] == 20
    # The kernel's next post hears that its hand was cleared.
    again = a_record(21, hand={"kind": "done", "seq": 20})
    reposted = call(hub, "POST", "api/records", "ada", again)
    assert reposted.json() == {"ok": True, "hand_cleared": 20}
