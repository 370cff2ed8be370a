"""The hub the board benchmark measures: a real JupyterHub, its
configurable-http-proxy and the class board as a hub-managed service, configured as
the portal configures them (docs/portal.md), in a folder of its own that is removed
at the end. No server is spawned and no root is needed: the learners are hub users
with a token each, as the servers' tokens are scoped, and nobody can log in.

Also here: the timer of the hub's pages (:func:`probe_pages`, run by
:class:`PageProbe` in a process of its own). Used by
``workshop/instructor/board_bench.py`` (``python -m workshop.instructor.board_bench``).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .._house import ROOT
from .._procs import die_with_parent, is_alive, signal_group, start_ticks
from ..cluster.ports import quiet_ports
from .portal import INSTRUCTOR, proxy_command

__all__ = ["BenchHub", "BenchHubError", "PageProbe", "probe_pages"]

# The scopes JupyterHub gives a learner's server token, where the board is on
# (the spec's c.Spawner.server_token_scopes): a simulated kernel posts with these.
SERVER_TOKEN_SCOPES = [
    "users:activity!user",
    "access:servers!server",
    "access:services!service=board",
]
# What the instructor's script token may do: read the board, nothing else.
INSTRUCTOR_SCOPES = ["custom:board:read", "access:services!service=board"]
# A request in the hub's log: "[I ... JupyterHub log:192] 200 GET /hub/api/user (...".
REQUEST = re.compile(r" JupyterHub log:\d+\] \d{3} ([A-Z]+) (\S+) \(")
START_TIMEOUT = 90.0  # seconds for the hub to answer /hub/health on a busy machine
# Seconds for the board to list every learner: it asks the hub for its users every
# 10 s, and a busy 2-core machine starts a Python in several.
BOARD_TIMEOUT = 60.0
PROBE_READY_S = 120.0  # for the page timer to import the package, on a busy machine
PAGES = ("/hub/api/", "/hub/login")  # the hub's API root (JSON) and a rendered page


class BenchHubError(RuntimeError):
    """The hub or the board did not start or answer; the message holds the end of
    the hub's log (a managed service writes there too)."""


def hub_config(
    folder: Path,
    ports: dict[str, int],
    api_token: str,
    password: str,
    learners: list[str],
    proxy: Path,
) -> str:
    """The text of ``jupyterhub_config.py``: the board added by the portal's own
    ``portal_hub.add_board`` (its service, scope and roles), so that the benchmark
    measures the board as a portal runs it.

    Args:
        folder: where the hub keeps its database, pid files and the board's state.
        ports: "public" (the proxy), "hub", "proxy_api" and "board".
        api_token: the benchmark's own service token (users, tokens).
        password: the shared password no one is told: nobody logs in.
        learners: the class, made by the hub as it starts (so the board's first
            look at the hub's users finds them all, as in a portal).
        proxy: configurable-http-proxy (:func:`.portal.proxy_command`).

    Returns:
        Python source that sets ``c``.

    Example:
        >>> text = hub_config(Path("/x"), dict(public=1, hub=2, proxy_api=3,
        ...     board=4), "t", "p" * 16, ["learner001"], Path("chp"))
        >>> "add_board(c, " in text and "'board_port': 4" in text
        True
    """
    ip = "127.0.0.1"
    settings = {
        "JupyterHub.bind_url": f"http://{ip}:{ports['public']}/",
        "JupyterHub.hub_bind_url": f"http://{ip}:{ports['hub']}",
        "JupyterHub.db_url": f"sqlite:///{folder / 'hub.sqlite'}",
        "JupyterHub.cookie_secret_file": str(folder / "cookie_secret"),
        "JupyterHub.pid_file": str(folder / "hub.pid"),
        "JupyterHub.cleanup_proxy": True,
        "ConfigurableHTTPProxy.command": [str(proxy)],
        "ConfigurableHTTPProxy.api_url": f"http://{ip}:{ports['proxy_api']}",
        "ConfigurableHTTPProxy.pid_file": str(folder / "proxy.pid"),
        "ConfigurableHTTPProxy.should_start": True,
        "JupyterHub.authenticator_class": "shared-password",
        "SharedPasswordAuthenticator.user_password": password,
        "Authenticator.admin_users": {INSTRUCTOR},
        "Authenticator.allowed_users": set(learners),
        "JupyterHub.services": [{"name": "bench", "api_token": api_token}],
        "JupyterHub.load_roles": [
            {
                "name": "bench",
                "scopes": ["admin:users", "tokens", "list:users", "read:users"],
                "services": ["bench"],
            }
        ],
        "PortalSpawner.environment": {},  # add_board adds the board's address
    }
    # What add_board reads of a portal's settings; no Slurm here, so the board's
    # squeue finds no cluster and shows every job as unknown.
    portal = {
        "board_port": ports["board"],
        "root": str(ROOT),
        "slurm_conf": "",
        "instructor": INSTRUCTOR,
    }
    lines = [
        "# Written by workshop.instructor.board_bench_hub, for one run.",
        "# ruff: noqa: F821 (c is JupyterHub's)",
        "from pathlib import Path",
        "",
        "from workshop.instructor.portal_hub import add_board",
        "",
        *(f"c.{key} = {value!r}" for key, value in settings.items()),
        f"add_board(c, Path({str(folder)!r}), {portal!r})",
    ]
    return "\n".join(lines) + "\n"


_PR_SET_PDEATHSIG = 1


def _end_with_us() -> None:
    """In the hub's process before it runs: Linux sends it SIGTERM when the
    benchmark ends, however it ends (even killed), and the hub then stops its proxy
    and the board as it always does."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(
            _PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0
        )


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        if int(data[data.rindex(b")") + 2 :].split()[1]) == pid:
            found.append(int(entry))
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class BenchHub:
    """A JupyterHub with its proxy and the board, started on ``__enter__`` in a
    folder of its own and stopped, with everything it started, on ``__exit__``
    (also after an error or Ctrl-C); the folder is then removed.

    Attributes (once entered):
        url: the proxy's public URL, as a browser and a kernel reach the hub.
        hub_url: the hub's own address, behind the proxy.
        board_url: ``url + "services/board/"``.
        board_own_url: the same path at the board's own address, sparing the
            proxy (on the private portal the compute nodes reach it).
        tokens: each learner's token, with the server token's scopes.
        instructor_token: a token of the instructor that may read the board.
        pids: "hub", "proxy", "board" -> pid, for the CPU figures.

    Example:
        >>> with BenchHub(["learner01"]) as hub:           # doctest: +SKIP
        ...     print(hub.board_url)
        http://127.0.0.1:12345/services/board/
    """

    def __init__(self, learners: list[str]) -> None:
        self.learners = list(learners)
        self.url = ""
        self.hub_url = ""
        self.board_url = ""
        self.board_own_url = ""
        self.tokens: dict[str, str] = {}
        self.instructor_token = ""
        self.pids: dict[str, int] = {}
        self._started: dict[int, int] = {}  # pid -> start ticks: never a reused pid
        self._folder: Path | None = None
        self._hub: subprocess.Popen | None = None
        self._api_token = ""

    # -- start
    def __enter__(self) -> BenchHub:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _start(self) -> None:
        proxy = proxy_command()  # none installed: said before anything is made
        self._folder = Path(tempfile.mkdtemp(prefix="workshop-board-bench-"))
        names = ["public", "hub", "proxy_api", "board"]
        ports = dict(zip(names, quiet_ports(len(names)), strict=True))
        self._api_token = secrets.token_hex(32)
        config = self._folder / "jupyterhub_config.py"
        password = secrets.token_urlsafe(24)
        text = hub_config(
            self._folder, ports, self._api_token, password, self.learners, proxy
        )
        # The file holds a token: its owner's alone, from the first byte.
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        env = dict(os.environ, CONFIGPROXY_AUTH_TOKEN=secrets.token_hex(32))
        # The config imports the workshop, as the portal's does, from this checkout.
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
        )
        with open(self._folder / "hub.log", "ab") as log:
            self._hub = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(config)],
                cwd=self._folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own group: Ctrl-C reaches the benchmark, which stops the hub
                # and then whatever the hub left.
                start_new_session=True,
                preexec_fn=_end_with_us,
            )
        self._remember("hub", self._hub.pid)
        self.url = f"http://127.0.0.1:{ports['public']}/"
        self.hub_url = f"http://127.0.0.1:{ports['hub']}/"
        self.board_url = self.url + "services/board/"
        self.board_own_url = f"http://127.0.0.1:{ports['board']}/services/board/"
        self._wait_for_hub()
        self._find_children()
        self._make_tokens()
        self._wait_for_board()

    def _remember(self, name: str, pid: int) -> None:
        self.pids[name] = pid
        self._started[pid] = start_ticks(pid)

    def log_tail(self, lines: int = 25) -> str:
        """The end of the hub's log (the board's output is there too)."""
        if self._folder is None:
            return "(no log)"
        try:
            text = (self._folder / "hub.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def log_size(self) -> int:
        """Bytes the hub's log holds now: where :meth:`requests_since` starts."""
        try:
            return (self._folder / "hub.log").stat().st_size
        except (OSError, TypeError):
            return 0

    def requests_since(self, offset: int) -> dict[str, int]:
        """The requests the hub logged after byte ``offset`` of its log, counted
        by method and path ("GET /hub/api/user"; a query left out). JupyterHub logs
        every request it answers, at INFO."""
        try:
            with open(self._folder / "hub.log", "rb") as log:
                log.seek(offset)
                text = log.read().decode(errors="replace")
        except (OSError, TypeError):
            return {}
        found: dict[str, int] = {}
        for method, path in REQUEST.findall(text):
            key = f"{method} {path.split('?')[0]}"
            found[key] = found.get(key, 0) + 1
        return found

    def _fail(self, why: str) -> BenchHubError:
        return BenchHubError(f"{why}; the end of the hub's log:\n{self.log_tail()}")

    def _wait_for_hub(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._hub.poll() is not None:
                raise self._fail(
                    f"JupyterHub exited with status {self._hub.returncode} while "
                    "starting"
                )
            try:
                with urllib.request.urlopen(self.url + "hub/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        raise self._fail(
            f"JupyterHub did not answer at {self.url}hub/health within "
            f"{START_TIMEOUT:.0f} s"
        )

    def _find_children(self) -> None:
        """The proxy (its pid file) and the board (the hub's child running it)."""
        pid_file = self._folder / "proxy.pid"
        if pid_file.exists():
            self._remember("proxy", int(pid_file.read_text().strip()))
        deadline = time.monotonic() + 10.0
        while "board" not in self.pids and time.monotonic() < deadline:
            for pid in _children(self._hub.pid):
                if str(self._folder / "board") in _cmdline(pid):  # its --state
                    self._remember("board", pid)
            time.sleep(0.2)
        if "board" not in self.pids:
            raise self._fail("the hub did not start the board service")

    def hub_api(
        self, method: str, path: str, body: Any = None, token: str = ""
    ) -> tuple[int, Any]:
        """One call of the hub's REST API (``/hub/api/PATH``): status and JSON."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + "hub/api/" + path,
            data=data,
            method=method,
            headers={"Authorization": f"token {token or self._api_token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def _make_tokens(self) -> None:
        for name in self.learners:
            self.tokens[name] = self._token(name, SERVER_TOKEN_SCOPES)
        self.instructor_token = self._token(INSTRUCTOR, INSTRUCTOR_SCOPES)

    def _token(self, name: str, scopes: list[str]) -> str:
        body = {"scopes": scopes, "note": "board benchmark", "expires_in": 3600}
        status, answer = self.hub_api("POST", f"users/{name}/tokens", body)
        if status != 201:
            raise self._fail(
                f"the hub refused a token with scopes {scopes} for {name} "
                f"({status}: {answer})"
            )
        return answer["token"]

    def _wait_for_board(self) -> None:
        """Until the board's table lists every learner (it asks the hub every 10 s)."""
        request = urllib.request.Request(
            self.board_url + "api/table",
            headers={"Authorization": f"token {self.instructor_token}"},
        )
        deadline = time.monotonic() + BOARD_TIMEOUT
        said = "no answer"
        while time.monotonic() < deadline:
            if not is_alive(self.pids["board"]):
                raise self._fail("the board service exited")
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    rows = json.loads(answer.read())["learners"]
                listed = {row["learner"] for row in rows}
                if set(self.learners) <= listed:
                    return
                said = f"it listed {len(listed)} of the {len(self.learners)} learners"
            except urllib.error.HTTPError as exc:
                said = f"{exc.code}: {exc.read()[:300].decode(errors='replace')}"
            except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
                said = repr(exc)
            time.sleep(0.5)
        raise self._fail(
            f"the board's api/table did not list every learner within "
            f"{BOARD_TIMEOUT:.0f} s ({said})"
        )

    # -- stop
    def close(self) -> None:
        """Stop the hub (which stops its proxy and the board), then whatever of
        them is still alive, each by its process group (TERM, a grace, KILL), and
        remove the folder. Safe to call twice."""
        if self._hub is not None and self._hub.poll() is None:
            self._hub.send_signal(signal.SIGTERM)  # the hub stops its service, proxy
            try:
                self._hub.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            alive = [pid for pid in self._started if self._ours(pid)]
            for pid in alive:
                signal_group(pid, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(map(self._ours, alive)):
                if self._hub is not None:
                    self._hub.poll()  # reap the hub: it is our child
                time.sleep(0.05)
        if self._hub is not None:
            try:
                self._hub.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _ours(self, pid: int) -> bool:
        """Whether ``pid`` is still the process this hub started (not a reused pid)."""
        return is_alive(pid) and start_ticks(pid) == self._started.get(pid)

    def leftovers(self) -> list[int]:
        """The pids this hub started that are still alive (none after close)."""
        return [pid for pid in self._started if self._ours(pid)]


# -- the timer of the hub's pages
def probe_pages(spec_text: str) -> None:
    """The timer of the hub's pages, in a process of its own, apart from the
    learners' loop (as a browser is): say "ready", wait for "go", then GET each of
    ``spec["urls"]`` ``spec["rounds"]`` times, spread evenly over ``spec["spread"]``
    seconds, and print the round trips as one line of JSON. A page not answered
    200 ends it with the error on stderr.

    Args:
        spec_text: JSON of ``{"urls": {name: url}, "rounds": n, "spread": s}``.

    Example:
        >>> probe_pages('{"urls": {}, "rounds": 1, "spread": 0}')  # doctest: +SKIP
    """
    die_with_parent(os.getppid())  # a killed benchmark leaves no timer behind
    spec = json.loads(spec_text)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    times: dict[str, list[float]] = {page: [] for page in spec["urls"]}
    start, rounds = time.monotonic(), spec["rounds"]
    for k in range(rounds):
        time.sleep(max(0.0, start + k * spec["spread"] / rounds - time.monotonic()))
        for page, url in spec["urls"].items():
            sent = time.monotonic()
            with urllib.request.urlopen(url, timeout=10) as answer:
                answer.read()
            times[page].append(time.monotonic() - sent)
    print(json.dumps(times), flush=True)


class PageProbe:
    """A :func:`probe_pages` process: ``start`` it early (it imports the package),
    ``run`` it when the timing should begin, ``close`` it in any case."""

    def __init__(self, hub: BenchHub, rounds: int, spread: float) -> None:
        urls = {}
        for path in PAGES:
            # Through the proxy, as a browser; and at the hub's own port, which
            # tells the hub's slowness from the proxy's (both serve the board too).
            urls[f"{path} via proxy"] = hub.url + path.lstrip("/")
            urls[f"{path} direct"] = hub.hub_url + path.lstrip("/")
        self.spec = {"urls": urls, "rounds": rounds, "spread": spread}
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        code = (
            "from workshop.instructor.board_bench_hub import probe_pages\n"
            f"probe_pages({json.dumps(self.spec)!r})\n"
        )
        pipe = asyncio.subprocess.PIPE
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stdin=pipe, stdout=pipe, stderr=pipe, cwd=ROOT
        )
        said = await asyncio.wait_for(self.proc.stdout.readline(), PROBE_READY_S)
        if said.strip() != b"ready":
            await self._fail()

    async def run(self) -> dict[str, list[float]]:
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()
        self.proc.stdin.close()
        wait = self.spec["spread"] + 60.0 + 40.0 * self.spec["rounds"]
        said = await asyncio.wait_for(self.proc.stdout.readline(), wait)
        await self.proc.wait()
        if self.proc.returncode != 0 or not said:
            await self._fail()
        return json.loads(said)

    async def _fail(self) -> None:
        await self.close()
        why = (await self.proc.stderr.read()).decode(errors="replace").strip()
        raise RuntimeError(
            f"the timer of the hub's pages ended with code {self.proc.returncode}: "
            + "\n".join(why.splitlines()[-5:])
        )

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
