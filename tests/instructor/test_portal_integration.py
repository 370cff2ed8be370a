"""The slow tests of test_portal.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: a real portal on the
private cluster."""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, needs_private_slurm, open_to_all, proxy_missing
from test_portal import _cli

from workshop.instructor import portal
from workshop.instructor.board import INSTRUCTOR_SCOPE
from workshop.instructor.portal_classroom import NOTEBOOK, Hub, Kernel, classroom
from workshop.instructor.portal_handover import ipc_objects
from workshop.instructor.portal_hub import COPY
from workshop.instructor.portal_learners import processes_of
from workshop.instructor.portal_status import board_answers, board_pids, hub_pid
from workshop.lessons import board_client

LEARNERS = 6


needs_proxy = pytest.mark.skipif(
    proxy_missing() is not None, reason=str(proxy_missing())
)


@pytest.fixture(scope="module")
def running(private_slurm):
    """A portal on the run's private cluster (it stops the portal's jobs, not the
    cluster: start's slurm_conf)."""
    folder = Path(tempfile.mkdtemp(prefix="wp-", dir="/tmp"))
    try:
        with open_to_all(private_slurm) as conf:
            try:
                started = portal.start(
                    folder, learners=LEARNERS, prefix="pupil", slurm_conf=conf
                )
            except portal.PortalError as error:
                if str(error).startswith("the private portal cannot start here"):
                    pytest.skip(str(error))  # no root, no Slurm, or a private clone
                pytest.fail(f"the portal did not start: {error}")
            yield started
            portal.stop(folder)  # stops nothing where the last test stopped it
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _listening(pids: set[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every TCP socket listening in one of ``pids``."""
    inodes = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes[link[8:-1]] = pid
        except OSError:
            continue
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            raw, port = fields[1].split(":")
            packed = bytes.fromhex(raw)
            if family == socket.AF_INET:
                address = socket.inet_ntop(family, packed[::-1])
            else:  # four little-endian words
                words = [packed[i : i + 4][::-1] for i in range(0, 16, 4)]
                address = socket.inet_ntop(family, b"".join(words))
            found.append((address, int(port, 16), inodes[fields[9]]))
    return found


def _portal_pids(started: portal.Portal) -> set[int]:
    """The hub and all it started (the proxy), the cluster's daemons (those of its
    own cluster, or of the one start's slurm_conf named) and every process of a
    learner."""
    from workshop.cluster.reaper import descendants

    hub = int((started.folder / "run" / "hub.pid").read_text().split()[0])
    pids = {hub, *descendants(hub)}
    pids |= {p for p, _, _ in processes_of([*started.learners, started.instructor])}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        # slurmctld, slurmd: -f FOLDER/slurm.conf, munged: --socket=FOLDER/run/...
        if str(started.folder) in command or str(started.slurm_conf.parent) in command:
            pids.add(int(entry.name))
    return pids


def test_status_and_stop_of_a_folder_without_a_portal(tmp_path):
    with pytest.raises(portal.PortalError, match=rf"no portal in {tmp_path}: "):
        portal.status(tmp_path)
    # The API's stop clears what is there (start's clean-up after a failed start).
    stopped = portal.stop(tmp_path)
    assert (stopped.jobs_left, stopped.killed, stopped.users_removed) == ([], [], [])
    assert stopped.servers_stopped == [] and stopped.files.removed == 0


def test_the_stop_hint_works_from_a_fresh_shell_in_any_folder(tmp_path):
    # What start prints as "stop it: ...": a shell elsewhere, with none of this
    # process's environment, runs it as it is.
    folder = tmp_path / "no portal here"
    folder.mkdir()
    done = subprocess.run(
        ["bash", "-c", portal.stop_command(folder)], cwd="/", env=clean_env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    # The workshop ran (no "No module named workshop") and found no portal there.
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"workshop portal: no portal in {folder}: ")
    assert "Traceback" not in done.stderr


def test_the_dead_hubs_hint_works_pasted_into_a_new_login_shell(tmp_path):
    # What status prints for a dead hub, pasted as it is (its lines and their
    # backslashes) into a shell with a login's bare environment, elsewhere: the
    # same command with status for start (start would start a class) runs this
    # interpreter on that folder. A bare "python" there is the system's.
    folder = tmp_path / "class"
    folder.mkdir()
    (folder / "portal.json").write_text(
        json.dumps({"port": 8123, "slurm_conf": "/nowhere/slurm.conf"})
    )
    (folder / "users.json").write_text(json.dumps({"names": [], "made": []}))
    lines = portal.status(folder).splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("cd "))
    hint = [lines[at]]
    while hint[-1].endswith("\\"):
        at += 1
        hint.append(lines[at])
    pasted = "\n".join(hint).replace(" portal start ", " portal status ")
    login = {"PATH": "/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8"}
    done = subprocess.run(
        ["bash", "-c", pasted], cwd="/", env=login,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"portal in {folder}\n  hub        NOT running")
    assert "Traceback" not in done.stderr


@needs_private_slurm
@needs_proxy
def test_the_portal_answers_on_loopback_only_and_keeps_its_secrets_private(running):
    with socket.create_connection(
        ("127.0.0.1", int(running.url.rsplit(":", 1)[1][:-1]))
    ):
        pass
    settings = json.loads((running.folder / "portal.json").read_text())
    _board_up(running)  # the hub starts it, and it takes a moment to answer
    listening = _listening(_portal_pids(running))
    ports = {port for _, port, _ in listening}
    # The proxy (for browsers, and its API), the hub, its board: all found, and on
    # loopback.
    keys = ("port", "proxy_api_port", "hub_port", "board_port")
    assert {settings[k] for k in keys} <= ports
    outside = [(a, p) for a, p, _ in listening if not a.startswith("127.")]
    assert outside == []
    for name in (
        "learners.json",
        "passwords.txt",
        "cookie_secret",
        "proxy_token",
        "api_token",
    ):
        mode = stat.S_IMODE((running.folder / "secrets" / name).stat().st_mode)
        assert mode == 0o600, (name, oct(mode))
    assert stat.S_IMODE((running.folder / "secrets").stat().st_mode) == 0o700
    # The hub's database and log name the learners: the owner's only.
    for private in ("hub.sqlite", "log/hub.log"):
        mode = stat.S_IMODE((running.folder / private).stat().st_mode)
        assert mode == 0o600, (private, oct(mode))
    # The hub's config holds no secret; no command line names one.
    secrets = [
        (running.folder / "secrets" / n).read_text().strip()
        for n in ("proxy_token", "api_token", "cookie_secret")
    ]
    secrets += list(running.passwords.values())
    config = (running.folder / "jupyterhub_config.py").read_text()
    config += (running.folder / "portal.json").read_text()
    for pid in _portal_pids(running):
        try:
            config += Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            pass
    assert not [s for s in secrets if s in config]


def _log_in(url: str, name: str, password: str, then: str = ""):
    """Log in at the hub's form as a browser does, then follow ``then`` (a path);
    (status, the page it ended at, the browser: an opener with its cookies)."""
    cookies = urllib.request.HTTPCookieProcessor()
    opener = urllib.request.build_opener(cookies)
    opener.open(url + "hub/login", timeout=30).read()  # the _xsrf cookie
    xsrf = next(c.value for c in cookies.cookiejar if c.name == "_xsrf")
    body = urllib.parse.urlencode(
        {"username": name, "password": password, "_xsrf": xsrf}
    ).encode()
    where = url + "hub/login?next=" + urllib.parse.quote(then)
    try:
        with opener.open(where, body, timeout=60) as answer:
            return answer.status, answer.geturl(), opener
    except urllib.error.HTTPError as error:
        return error.code, error.geturl(), opener


@needs_private_slurm
@needs_proxy
def test_a_wrong_password_is_refused_and_the_right_one_logs_in(running):
    name = running.learners[0]
    assert _log_in(running.url, name, "not-" + running.passwords[name])[0] == 403
    status, where, _ = _log_in(running.url, name, running.passwords[name])
    assert status == 200 and "/hub/login" not in where, where


@needs_private_slurm
@needs_proxy
def test_a_learners_server_is_a_slurm_job_and_runs_a_launch(running):
    hub, name = Hub.of(running.folder), running.learners[0]
    seconds = hub.start_server(name)
    env = dict(os.environ, SLURM_CONF=str(running.slurm_conf))
    queue = subprocess.run(
        ["squeue", "-h", "-u", name, "-o", "%u %T %N %j"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    user, state, node, job_name = queue.stdout.split()
    assert (user, state, job_name) == (name, "RUNNING", f"jupyter-{name}")
    assert node in ("127.0.0.2", "127.0.0.3")
    # JupyterLab itself answers, not only the server's REST API.
    code, _ = hub.call("GET", f"user/{name}/lab")
    assert code == 200

    async def cells():
        async with Kernel(hub, name) as kernel:
            inside = await kernel.run(
                "import os, torch.distributed as dist, workshop\n"
                "print(os.environ['SLURM_JOB_ID'], os.environ['SLURMD_NODENAME'])"
            )
            launched = await kernel.run(
                "r = workshop.launch(lambda: dist.get_rank(), world_size=2, "
                "show='none')\nprint('ranks returned', r.returns)"
            )
            return inside, launched

    inside, launched = asyncio.run(cells())
    assert inside.error is None and node in inside.text
    assert launched.error is None, launched.error
    assert "ranks returned [0, 1]" in launched.text
    print(
        f"server of {name} ready in {seconds:.1f} s; "
        f"launch cell {launched.seconds:.2f} s"
    )
    hub.stop_server(name)


@needs_private_slurm
@needs_proxy
def test_a_classroom_at_once(running):
    # The servers stay for the tests below: a class whose hub is killed, then the
    # end of the class (which checks that nothing of it is left).
    result = classroom(running.folder, keep_servers=True)
    print(result.summary())
    assert result.failures == []
    assert len(result.learners) == LEARNERS
    assert result.launches == LEARNERS * 3
    assert " 0 reachable " in result.isolation
    assert "0 processes and 0 jobs left" in result.scancel


@needs_private_slurm
@needs_proxy
def test_a_class_survives_its_hub_killed_and_started_again(running, capsys):
    folder, names = running.folder, running.learners
    hub = Hub.of(folder)
    begun = time.monotonic()

    async def a_kernel_each() -> list[str]:
        async def one(name: str) -> str:
            # The classroom left five servers running and one learner's job
            # cancelled: that server starts again while the others open a kernel.
            await asyncio.to_thread(hub.start_server, name)
            async with Kernel(hub, name, keep=True) as kernel:
                out = await kernel.run(f"kept = 'the state of {name}'")
                assert out.error is None, out.error
                return kernel.id

        return await asyncio.gather(*(one(name) for name in names))

    kernels = dict(zip(names, asyncio.run(a_kernel_each()), strict=True))
    ready = time.monotonic()
    passwords = (folder / "secrets" / "passwords.txt").read_text()
    settings = (folder / "portal.json").read_text()
    os.kill(hub_pid(folder), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while hub_pid(folder) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hub_pid(folder) is None

    # What the instructor types: the same start. The class comes back as it was.
    code, out, err = _cli(["start", "--folder", str(folder)], capsys)
    restarted = time.monotonic()
    assert code == 0, err
    assert (
        f"portal in {folder}: hub restarted; {LEARNERS} learners' servers kept" in out
    )
    assert f"portal: {running.url} " in out  # the same address
    assert (folder / "secrets" / "passwords.txt").read_text() == passwords
    assert (folder / "portal.json").read_text() == settings
    # Started again on a living hub: nothing changes; another class size: refused.
    again = portal.start(folder)
    assert (again.outcome, again.hub_pid) == ("running", hub_pid(folder))
    with pytest.raises(portal.PortalError, match=r"has 6 learners .* asked for "
                       r"--learners 5\. HINT: stop it first"):  # fmt: skip
        portal.start(folder, learners=5)

    # Each learner logs in with the password handed out this morning, reaches their
    # server, and finds their kernel alive, its variables kept.
    def learner(name: str) -> tuple[int, str, dict]:
        status, where, browser = _log_in(
            running.url, name, running.passwords[name], f"/user/{name}/lab"
        )
        assert status == 200 and where.endswith(f"/user/{name}/lab"), where
        api = f"{running.url}user/{name}/api/kernels/{kernels[name]}"
        with browser.open(api, timeout=30) as answer:
            return answer.status, where, json.loads(answer.read())

    async def state(name: str) -> str:
        async with Kernel(hub, name, kernel_id=kernels[name]) as kernel:
            out = await kernel.run("print(kept)")
            return out.error or out.text.strip()

    async def everyone():
        logged = [asyncio.to_thread(learner, name) for name in names]
        return await asyncio.gather(*logged), await asyncio.gather(
            *(state(name) for name in names)
        )

    pages, states = asyncio.run(everyone())
    for name, (status, _, model) in zip(names, pages, strict=True):
        assert status == 200 and model["id"] == kernels[name], model
    assert states == [f"the state of {name}" for name in names]
    # The instructor's view: each learner's server job, running, on a node.
    table = portal.status(folder)
    assert f"hub        running (pid {hub_pid(folder)})" in table
    for name in names:
        row = next(line.split() for line in table.splitlines() if f" {name} " in line)
        assert row[2] == "RUNNING" and row[4] in ("127.0.0.2", "127.0.0.3"), row
    checked = time.monotonic()
    # On purpose: portal restart stops the hub (which leaves the servers) and starts
    # it again the same way; a learner's kernel still holds its state.
    old_hub = hub_pid(folder)
    code, out, err = _cli(["restart", "--folder", str(folder)], capsys)
    assert code == 0, err
    assert f"hub restarted; {LEARNERS} learners' servers kept" in out, out
    assert hub_pid(folder) not in (None, old_hub)
    assert asyncio.run(state(names[0])) == f"the state of {names[0]}"
    print(
        f"{LEARNERS} servers and kernels ready in {ready - begun:.1f} s; hub killed "
        f"and started again in {restarted - ready:.1f} s; logins and kernels "
        f"checked in {checked - restarted:.1f} s; portal restart and a kernel "
        f"checked in {time.monotonic() - checked:.1f} s"
    )


# ---- the class board (a service of the portal's hub) ---------------------------
ACCESS = "access:services!service=board"


def _board(
    running, path: str, token: str | None = None, body: bytes | None = None
) -> tuple[int, Any]:
    """One request to the board through the proxy: GET, or POST ``body``, with
    ``token`` if given; (status, its JSON, else its text)."""
    request = urllib.request.Request(
        running.board_url + path,
        data=body,
        method="GET" if body is None else "POST",
        headers={"Authorization": f"token {token}"} if token else {},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            code, text = answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        code, text = error.code, error.read().decode()
    try:
        return code, json.loads(text)
    except json.JSONDecodeError:
        return code, text


def _instructor_token(running) -> str:
    """A token of the portal's admin that may read the board (a script's)."""
    code, answer = Hub.of(running.folder).call(
        "POST",
        f"hub/api/users/{running.instructor}/tokens",
        {"scopes": [INSTRUCTOR_SCOPE, ACCESS], "expires_in": 3600, "note": "a test"},
    )
    assert code == 201, answer
    return answer["token"]


async def _server_token(hub: Hub, name: str) -> str:
    """The token of ``name``'s server, as their kernel has it."""
    async with Kernel(hub, name) as kernel:
        out = await kernel.run("import os\nprint(os.environ['JUPYTERHUB_API_TOKEN'])")
    assert out.error is None, out.error
    return out.text.strip()


def _with_server(running, names: list[str]) -> Hub:
    """The hub, with a server for each of ``names`` (started where a test above
    has not left one running: when this test runs alone)."""
    hub = Hub.of(running.folder)
    active = hub.active()
    for name in names:
        if name not in active:
            hub.start_server(name)
    return hub


def _wait_for(what: str, probe, timeout: float, poll: float = 0.5):
    """``probe()`` once it is truthy; AssertionError naming ``what`` and the last
    answer after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got or time.monotonic() > deadline:
            assert got, f"{what}: not within {timeout:.0f} s; last: {got!r}"
            return got
        time.sleep(poll)


def _board_up(running) -> list[int]:
    """The board's pids, once it answers (the hub starts it with itself)."""
    port = json.loads((running.folder / "portal.json").read_text())["board_port"]
    _wait_for("the board", lambda: board_answers(port), 120)
    return board_pids(running.folder)


def _record(running, token: str, name: str) -> dict | None:
    code, answer = _board(running, f"api/records/{name}", token)
    return answer if code == 200 else None


@needs_private_slurm
@needs_proxy
def test_the_board_is_the_hubs_service_on_loopback_and_keeps_its_state_private(
    running,
):
    folder, name = running.folder, running.learners[0]
    settings = json.loads((folder / "portal.json").read_text())
    (board,) = _board_up(running)
    parent = int(Path(f"/proc/{board}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert parent == hub_pid(folder)  # the hub started it: a managed service
    listening = [(a, p) for a, p, pid in _listening({board}) if pid == board]
    assert listening == [("127.0.0.1", settings["board_port"])]
    shown = f"  board      {running.board_url} (log in as {running.instructor})"
    assert shown in portal.status(folder).splitlines()
    hub = _with_server(running, [name])

    async def cell() -> str:
        async with Kernel(hub, name) as kernel:
            out = await kernel.run(
                "import os, workshop\nprint(os.environ['WORKSHOP_BOARD_URL'])\n"
                'workshop.check("01.accumulate", 8)'
            )
        assert out.error is None, out.error
        return out.text

    text = asyncio.run(cell())
    # The server has the board's address; the kernel's check reached the board.
    assert text.splitlines()[0] == running.board_url
    token = _instructor_token(running)
    _wait_for(
        f"{name}'s check on the board",
        lambda: (
            (_record(running, token, name) or {})
            .get("exercises", {})
            .get("01.accumulate", {})
            .get("passed")
        ),
        timeout=30,
    )
    # Written there, the hub's user's only: the folder 0700, the file 0600.
    state = folder / "board"
    saved = _wait_for("board.json", lambda: (state / "board.json").exists(), 10)
    assert saved and stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((state / "board.json").stat().st_mode) == 0o600
    assert (state / "board.json").stat().st_uid == os.geteuid()
    assert name in json.loads((state / "board.json").read_text())["learners"]


@needs_private_slurm
@needs_proxy
def test_a_learner_gets_403_on_the_board_and_on_anothers_record(running):
    me, other = running.learners[1], running.learners[2]
    hub = _with_server(running, [me])
    token = asyncio.run(_server_token(hub, me))  # what their kernel posts with
    refused = {
        "": "the board's page",
        "api/table": "the table",
        "board.csv": "the CSV",
        f"api/records/{other}": "another learner's record",
    }
    for path, what in refused.items():
        code, answer = _board(running, path, token)
        assert code == 403, (what, code, answer)
        said = answer["error"] if isinstance(answer, dict) else html.unescape(answer)
        assert "the instructor's" in said, (what, said)
    code, answer = _board(running, f"api/hands/{other}/clear", token, b"")
    assert code == 403 and "instructor's" in answer["error"], answer
    # Their own record they may read; the instructor reads the whole class.
    assert _board(running, f"api/records/{me}", token)[0] in (200, 404)
    code, table = _board(running, "api/table", _instructor_token(running))
    assert code == 200, table
    assert sorted(row["learner"] for row in table["learners"]) == running.learners
    # In a browser, logged in to the hub: the learner is sent through the hub's
    # OAuth to the board, which refuses them; their hub menu lists it (their token
    # may reach it). The instructor's browser gets the page.
    status, _, browser = _log_in(running.url, me, running.passwords[me], "/hub/home")
    assert status == 200
    with browser.open(running.url + "hub/home", timeout=30) as answer:
        assert "/services/board/" in answer.read().decode()
    with pytest.raises(urllib.error.HTTPError) as refusal:
        browser.open(running.board_url, timeout=60)
    assert refusal.value.code == 403
    assert "is the instructor's" in html.unescape(refusal.value.read().decode())
    admin = running.instructor
    status, _, browser = _log_in(running.url, admin, running.passwords[admin])
    assert status == 200
    with browser.open(running.board_url, timeout=60) as answer:
        assert answer.status == 200 and "api/table" in answer.read().decode()


@needs_private_slurm
@needs_proxy
def test_bad_posts_are_refused_with_one_clear_sentence(running):
    me, other = running.learners[1], running.learners[2]
    hub = _with_server(running, [me])
    token = asyncio.run(_server_token(hub, me))
    before = _board(running, f"api/records/{me}", token)
    good = {"version": 1, "seq": 10**5, "where": None, "exercises": {},
            "quizzes": {}, "error": None, "hand": None}  # fmt: skip
    bad = [
        (b"{not json", 400, "JSON"),
        (json.dumps({**good, "code": "print(1)"}).encode(), 400, "'code'"),
        (json.dumps({**good, "learner": other}).encode(), 403, "names another"),
        (json.dumps({**good, "where": {"notebook": "x" * 17000, "section": ""}})
         .encode(), 413, "KiB"),
    ]  # fmt: skip
    for body, status, says in bad:
        code, answer = _board(running, "api/records", token, body)
        assert code == status, (body[:60], code, answer)
        assert says in answer["error"], answer
        assert "\n" not in answer["error"]  # one sentence
    # Without a token: nobody, and no page's _xsrf either.
    code, answer = _board(running, "api/records", None, json.dumps(good).encode())
    assert code == 403, answer
    # Nothing of it reached the learner's record.
    assert _board(running, f"api/records/{me}", token) == before


@needs_private_slurm
@needs_proxy
def test_a_stopped_board_never_fails_a_learners_cell(running):
    name = running.learners[2]
    hub = _with_server(running, [name])
    token = _instructor_token(running)
    (board,) = _board_up(running)

    def passed_on_the_board():
        record = _record(running, token, name) or {}
        return record.get("exercises", {}).get("01.dp", {}).get("passed") and record

    async def cells() -> tuple[list, dict, float]:
        async with Kernel(hub, name) as kernel:
            outs = [
                await kernel.run('import workshop\nworkshop.check("01.dp", (1, 2))')
            ]
            # The board hangs (it holds its port and never answers): a post waits
            # for its timeout, in the kernel's thread, not in the cell.
            os.kill(board, signal.SIGSTOP)
            outs.append(await kernel.run('workshop.check("01.dp", (3, 4))'))
            # Gone: the connection is refused.
            os.kill(board, signal.SIGKILL)
            killed = time.monotonic()
            outs.append(await kernel.run('workshop.check("01.dp", (64, 4))'))
            # The hub starts its board again (it looks every 30 s); the kernel,
            # still running, sends its latest record again until it is taken.
            new = await asyncio.to_thread(
                _wait_for, "a new board", lambda: board_pids(running.folder), 120
            )
            assert new != [board]
            record = await asyncio.to_thread(
                _wait_for, f"{name}'s record on the new board", passed_on_the_board, 180
            )
            return outs, record, time.monotonic() - killed

    try:
        (first, hung, gone), record, seconds = asyncio.run(cells())
    finally:
        with contextlib.suppress(OSError):
            os.kill(board, signal.SIGKILL)
    for out, says in ((first, "Not yet"), (hung, "Not yet"), (gone, "Right")):
        assert out.error is None and f"{says}: 01.dp" in out.text, out
    # A cell that waited for the post would take its whole timeout at least.
    timeout = board_client._POST_TIMEOUT_S
    assert hung.seconds < timeout and gone.seconds < timeout, (hung, gone)
    assert record["exercises"]["01.dp"]["failures"] == 2
    print(
        f"cells with the board hung: {hung.seconds:.2f} s, gone: {gone.seconds:.2f} "
        f"s; the new board had the record {seconds:.1f} s after the kill"
    )


@needs_private_slurm
@needs_proxy
def test_a_cancelled_job_tells_its_learner_why_and_how_to_start_again(running):
    # The last learner's server, which the test above left running (started here
    # when this test runs alone).
    hub, name = Hub.of(running.folder), running.learners[-1]
    if name not in hub.active():
        hub.start_server(name)
    begun = time.monotonic()
    # The server's root is the learner's copy (for the notebooks' links to
    # ../docs/glossary.md, which it serves); a notebook opened in notebooks/ still
    # has its kernel working there.
    code, session = hub.call(
        "POST",
        f"user/{name}/api/sessions",
        {"path": f"notebooks/{NOTEBOOK}", "type": "notebook", "kernel": {}},
    )
    assert code == 201, session

    async def working_folder() -> str:
        async with Kernel(hub, name, kernel_id=session["kernel"]["id"]) as kernel:
            out = await kernel.run("import os\nprint(os.getcwd())")
            return out.error or out.text.strip()

    home = pwd.getpwnam(name).pw_dir
    assert asyncio.run(working_folder()) == f"{home}/{COPY}/notebooks"
    code, glossary = hub.call("GET", f"user/{name}/api/contents/docs/glossary.md")
    assert code == 200 and glossary["content"].startswith("# "), code

    # The learner is logged in; the instructor cancels the job as root.
    status, where, browser = _log_in(
        running.url, name, running.passwords[name], f"/user/{name}/lab"
    )
    assert status == 200 and where.endswith(f"/user/{name}/lab"), where
    env = dict(os.environ, SLURM_CONF=str(running.slurm_conf))
    queue = ["squeue", "-h", "-u", name, "-o", "%A"]
    (job,) = subprocess.run(
        queue, env=env, capture_output=True, text=True, timeout=30
    ).stdout.split()
    subprocess.run(["scancel", job], env=env, check=True, timeout=30)
    cancelled = time.monotonic()
    # What the learner's page shows, reloaded: the proxy's 503 page (which reloads
    # itself) or the server's last answers, until the hub has seen the job end.
    seen = []
    while time.monotonic() - cancelled < 60:
        try:
            with browser.open(f"{running.url}user/{name}/lab", timeout=30) as answer:
                code, page = answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            code, page = error.code, error.read().decode()
        seen.append(code)
        if 'id="job-ended"' in page:
            break
        assert code == 200 or 'http-equiv="refresh"' in page, (code, page[-600:])
        time.sleep(1)
    seconds = time.monotonic() - cancelled
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())
    assert code == 424, (seen, text)
    assert re.search(
        rf"Your server's Slurm job {job} ended at \d\d:\d\d: it was cancelled "
        r"\(scancel by root: the instructor or an administrator\)\.",
        text,
    ), text
    assert f"Kept: your notebooks and files in ~/{COPY}" in text
    start = re.search(r'<a id="start"[^>]*href="([^"]+)"[^>]*>\s*Start My Server', page)
    assert start and start[1].startswith(f"/hub/spawn/{name}?next="), page
    with browser.open(f"{running.url}hub/home", timeout=30) as answer:
        assert f"Your server&#39;s Slurm job {job} ended at " in answer.read().decode()
    print(
        f"the learner read why {seconds:.1f} s after scancel (answers: {seen}); "
        f"{time.monotonic() - begun:.1f} s in all"
    )


def _owned_by(uids: set[int], tops: list[Path]) -> list[str]:
    """Every path under ``tops`` whose owner is one of ``uids`` (links not
    followed)."""
    found = []
    for top in tops:
        for folder, dirs, files in os.walk(top):
            for name in dirs + files:
                path = os.path.join(folder, name)
                try:
                    if os.lstat(path).st_uid in uids:
                        found.append(path)
                except OSError:
                    continue  # gone meanwhile
    return found


@needs_private_slurm
@needs_proxy
def test_stop_ends_the_class_and_hands_nothing_of_it_to_the_next(
    running, tmp_path, capsys
):
    folder, name = running.folder, running.learners[0]
    everyone = [*running.learners, running.instructor]
    uids = {pwd.getpwnam(user).pw_uid for user in everyone}
    made = json.loads((folder / "users.json").read_text())["made"]
    serving = sorted(Hub.of(folder).active())
    # What a learner leaves where everyone may write, under names that are not
    # theirs: found by uid. And what the outside test found inherited by the next
    # class's learner of the same uid: a lock file in /run/lock, a System V shared
    # memory segment and message queue, which live in the kernel.
    left = f"wp-left-{os.getpid()}"
    lock = Path("/run/lock")
    script = (
        f"mkdir /tmp/{left} && echo x > /tmp/{left}/file && "
        f"echo y > /var/tmp/{left} && echo z > /dev/shm/{left}"
    )
    if lock.is_dir():
        script += f" && echo l > /run/lock/{left}"
    if shutil.which("ipcmk") and Path("/proc/sysvipc").is_dir():
        script += " && ipcmk -M 4096 && ipcmk -Q"
    subprocess.run(["runuser", "-u", name, "--", "bash", "-c", script], check=True)
    ipc_left = ipc_objects({pwd.getpwnam(name).pw_uid: name}, {})
    if "ipcmk" in script:
        assert sorted(kind for kind, _, _ in ipc_left) == ["msg", "shm"], ipc_left
    archive = tmp_path / "archive"

    begun = time.monotonic()
    code, out, err = _cli(
        ["stop", "--folder", str(folder), "--keep-homes", str(archive)], capsys
    )
    print(f"stopped in {time.monotonic() - begun:.1f} s: {out}")
    assert code == 0, err
    assert out.startswith(
        f"portal in {folder} stopped: {len(serving)} learners' servers stopped, "
        "0 jobs were still queued, 0 learner processes had to be killed, "
    )
    assert f"{len(made)} users removed" in out
    assert processes_of(running.learners) == []
    for user in made:  # the users it made, and only those
        with pytest.raises(KeyError):
            pwd.getpwnam(user)
    # Nothing is owned by a uid that the next useradd may hand to someone else:
    # no file, no IPC object.
    tops = [folder, Path("/tmp"), Path("/var/tmp"), Path("/dev/shm")]
    tops += [lock] if lock.is_dir() else []
    assert _owned_by(uids, tops) == []
    assert ipc_objects(dict.fromkeys(uids, "?"), {}) == []
    removed = int(re.search(r"(\d+) System V IPC objects removed", out)[1])
    assert removed >= len(ipc_left), (out, ipc_left)
    # The archive: the learner's notebooks and their files in /tmp and the other
    # places open to all, all root's.
    kept = archive / name
    notebook = kept / "home" / "scaling-pytorch-hpc" / "notebooks" / NOTEBOOK
    assert notebook.stat().st_uid == 0 and json.loads(notebook.read_text())["cells"]
    assert (kept / "tmp" / left / "file").read_text() == "x\n"
    assert (kept / "dev" / "shm" / left).read_text() == "z\n"
    if lock.is_dir():
        assert (kept / lock.resolve().relative_to("/") / left).read_text() == "l\n"
    assert _owned_by({0}, [kept]) and not _owned_by(uids, [archive])
    # The class's secrets, its passwords first, and the hub's database are gone.
    assert list((folder / "secrets").iterdir()) == []
    assert not (folder / "hub.sqlite").exists()
    assert not (folder / "portal.json").exists()
    # The board went with the hub, and its state (each learner's record) with the
    # class.
    assert board_pids(folder) == []
    assert not (folder / "board").exists()
