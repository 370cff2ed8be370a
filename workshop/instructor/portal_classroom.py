"""A classroom on the private portal, driven as learners would: every learner's
server started through the hub's REST API, a kernel in each, notebook cells run in
it, and the servers stopped again::

    python -m workshop portal classroom     # on a running portal
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import pwd
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cluster.slurm_watchdog import _quiet
from .portal_learners import processes_of

# Notebook 02's first launch cells: the imports, hello on 4 ranks, its results, the
# all-reduce, its check, and a launch in which one rank fails. Each with a line it
# must print.
LAUNCH_CELLS = {
    2: "",
    4: "[rank 3] hello from rank 3 of 4",
    6: "exit codes: [0, 0, 0, 0]",
    11: "after  all_reduce: 6.0",
    12: "every rank holds 6: True",
    15: "ranks that failed: [2]",
}
NOTEBOOK = "02_distributed_data_parallel.ipynb"

# Run in learner B's kernel while learner A's ranks sleep: which of A's processes
# could B signal? (os.kill with signal 0 asks without sending anything.)
_PROBE = """
import os
from pathlib import Path

def _uid(p):
    try:
        return p.stat().st_uid
    except OSError:
        return None

theirs = [int(p.name) for p in Path("/proc").iterdir()
          if p.name.isdigit() and _uid(p) == {uid}]
reachable = []
for pid in theirs:
    try:
        os.kill(pid, 0)
        reachable.append(pid)
    except (PermissionError, ProcessLookupError):
        pass
print(f"probe: {{len(theirs)}} processes of the other learner,",
      f"{{len(reachable)}} reachable")
"""

_SLEEPY = """
import time

def sleepy(seconds):
    time.sleep(seconds)
    return dist.get_rank()

slept = workshop.launch(sleepy, {seconds}, world_size=2, show="none")
print("slept:", slept.returns)
"""


# ------------------------------------------------------------------ the client
class HubError(RuntimeError):
    """The hub or a learner's server answered with an error."""


@dataclass
class Hub:
    """The hub's REST API at ``url`` (the proxy's address), with ``token``."""

    url: str
    token: str

    @classmethod
    def of(cls, folder: str | Path) -> Hub:
        """The hub of the portal in ``folder``, with its classroom service's token."""
        folder = Path(folder)
        settings = json.loads((folder / "portal.json").read_text())
        token = (folder / "secrets" / "api_token").read_text().strip()
        return cls(f"http://127.0.0.1:{settings['port']}/", token)

    def call(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        """One request; (status, decoded JSON, else its text, or None if empty)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path.lstrip("/"),
            method=method,
            data=data,
            headers={"Authorization": f"token {self.token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                code, text = answer.status, answer.read().decode(errors="replace")
            if not text:
                return code, None
        except urllib.error.HTTPError as error:
            code, text = error.code, error.read().decode(errors="replace")
        try:
            return code, json.loads(text)
        except json.JSONDecodeError:  # a page, not the API
            return code, text

    def active(self) -> dict[str, dict[str, Any]]:
        """The users whose server is active or pending: name -> the hub's model.

        Raises:
            HubError: the hub answered with an error.
            OSError: it did not answer.
        """
        # The hub's pages hold 50 users unless asked for more; a portal has 100 at
        # most.
        code, answer = self.call("GET", "hub/api/users?state=active&limit=200")
        if code != 200 or not isinstance(answer, list):
            raise HubError(f"listing the hub's active users: HTTP {code}: {answer}")
        return {user["name"]: user for user in answer}

    def servers_answering(self, names: list[str], timeout: float) -> list[str]:
        """Those of ``names`` whose server answers through the proxy once the hub
        has checked every server it knows (or ``timeout`` passed)."""
        deadline = time.monotonic() + timeout
        ready: list[str] = []
        while time.monotonic() < deadline:
            try:
                active = self.active()
            except (HubError, OSError):
                time.sleep(0.5)  # not answering yet
                continue
            if not any(user.get("pending") for user in active.values()):
                servers = {
                    n: u.get("servers", {}).get("", {}) for n, u in active.items()
                }
                ready = [n for n in names if servers.get(n, {}).get("ready")]
                break
            time.sleep(0.5)
        answering: list[str] = []
        while ready and time.monotonic() < deadline:
            for name in [n for n in ready if n not in answering]:
                try:
                    if self.call("GET", f"user/{name}/api/status")[0] == 200:
                        answering.append(name)
                except OSError:
                    pass
            if len(answering) == len(ready):
                break
            time.sleep(0.3)
        return answering

    def start_server(self, user: str, timeout: float = 180) -> float:
        """Start ``user``'s server (a Slurm job), wait until it answers; seconds.

        Raises:
            HubError: the hub refused, or the server was not ready in ``timeout``.
        """
        started = time.monotonic()
        code, answer = self.call("POST", f"hub/api/users/{user}/server", {})
        if code not in (201, 202, 400):  # 400: it runs already
            raise HubError(f"starting {user}'s server: HTTP {code}: {answer}")
        while time.monotonic() - started < timeout:
            code, answer = self.call("GET", f"hub/api/users/{user}")
            server = (
                (answer or {}).get("servers", {}).get("", {}) if code == 200 else {}
            )
            if server.get("ready"):
                return time.monotonic() - started
            # The POST returns once the server answers, or after the hub's
            # 10 s; from then on a server neither ready nor pending has failed.
            if code == 200 and not server and not answer.get("pending"):
                raise HubError(
                    f"{user}'s server stopped while starting; see the "
                    f"hub's log and jupyter-*.log in {user}'s home"
                )
            time.sleep(0.5)
        raise HubError(f"{user}'s server was not ready within {timeout:.0f} s")

    def stop_server(self, user: str, timeout: float = 60) -> None:
        """Stop ``user``'s server (the hub cancels its job) and wait until it is."""
        code, answer = self.call("DELETE", f"hub/api/users/{user}/server")
        if code not in (202, 204, 400):
            raise HubError(f"stopping {user}'s server: HTTP {code}: {answer}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code, answer = self.call("GET", f"hub/api/users/{user}")
            if code == 200 and not answer.get("servers"):
                return
            time.sleep(0.5)
        raise HubError(f"{user}'s server did not stop within {timeout:.0f} s")


@dataclass
class Output:
    """What one cell printed and showed, and its error, if any."""

    text: str = ""
    displays: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0


class Kernel:
    """A websocket to a kernel in ``user``'s server (``async with``): a new one, shut
    down at the end, or ``kernel_id``'s, left running (``keep`` overrides)."""

    def __init__(
        self,
        hub: Hub,
        user: str,
        kernel_id: str | None = None,
        keep: bool | None = None,
    ):
        self.hub, self.user = hub, user
        self.id = kernel_id
        self.keep = kernel_id is not None if keep is None else keep
        self.session = uuid.uuid4().hex
        self._socket: Any = None

    async def __aenter__(self) -> Kernel:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        base = f"user/{self.user}/api/kernels"
        if self.id is None:
            code, answer = await asyncio.to_thread(
                # In notebooks/, where a learner's notebook runs its kernel: the
                # server's root is the copy above it (portal_hub.configure).
                self.hub.call,
                "POST",
                base,
                {"name": "python3", "path": "notebooks"},
            )
            if code != 201:
                raise HubError(
                    f"starting a kernel for {self.user}: HTTP {code}: {answer}"
                )
            self.id = answer["id"]
        url = self.hub.url.replace("http", "ws", 1) + f"{base}/{self.id}/channels"
        # tornado gives a request 20 s in all unless told: a CI run's loaded
        # machine took longer for six learners' hand-shakes through the proxy at
        # once, so the whole hand-shake gets the time a connection does.
        request = HTTPRequest(
            url,
            headers={"Authorization": f"token {self.hub.token}"},
            connect_timeout=120,
            request_timeout=120,
        )
        self._socket = await websocket_connect(request)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._socket is not None:
            self._socket.close()
        if self.id is not None and not self.keep:
            await asyncio.to_thread(
                self.hub.call, "DELETE", f"user/{self.user}/api/kernels/{self.id}"
            )

    async def run(
        self, code: str, timeout: float = 300, cell_id: str | None = None
    ) -> Output:
        """Run ``code`` as one cell; what it printed, showed and raised. With
        ``cell_id``, as the notebook's cell of that id, as JupyterLab sends it (the
        kernel's ``post_run_cell`` hooks see it)."""
        msg_id = uuid.uuid4().hex
        now = datetime.datetime.now(datetime.timezone.utc).isoformat()
        message = {
            "header": {
                "msg_id": msg_id,
                "username": self.user,
                "session": self.session,
                "msg_type": "execute_request",
                "version": "5.3",
                "date": now,
            },
            "parent_header": {},
            "metadata": {"cellId": cell_id} if cell_id else {},
            "buffers": [],
            "channel": "shell",
            "content": {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
        }
        started = time.monotonic()
        await self._socket.write_message(json.dumps(message))
        out = Output()
        while True:
            left = timeout - (time.monotonic() - started)
            if left <= 0:
                raise HubError(f"a cell in {self.user}'s kernel ran past {timeout} s")
            raw = await asyncio.wait_for(self._socket.read_message(), left)
            if raw is None:
                raise HubError(f"{self.user}'s kernel closed its websocket")
            reply = json.loads(raw)
            if reply.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = reply["msg_type"], reply["content"]
            if kind == "stream":
                out.text += content["text"]
            elif kind in ("display_data", "execute_result"):
                out.displays.append(content["data"])
                out.text += content["data"].get("text/plain", "") + "\n"
            elif kind == "error":
                out.error = f"{content['ename']}: {content['evalue']}"
            elif kind == "status" and content["execution_state"] == "idle":
                out.seconds = time.monotonic() - started
                return out


def notebook_cells(path: str | Path, indexes: list[int]) -> list[str]:
    """The source of the code cells ``indexes`` (positions among all cells)."""
    cells = json.loads(Path(path).read_text())["cells"]
    chosen = []
    for i in indexes:
        if cells[i]["cell_type"] != "code":
            raise ValueError(f"cell {i} of {path} is {cells[i]['cell_type']}, not code")
        chosen.append("".join(cells[i]["source"]))
    return chosen


# ------------------------------------------------------------------ the classroom
@dataclass
class Learner:
    """One learner's run: seconds for server, kernel and each cell; failures."""

    name: str
    server_s: float = 0.0
    kernel_s: float = 0.0
    cells_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


@dataclass
class Classroom:
    """What a classroom run found (see :func:`classroom`)."""

    learners: list[Learner]
    launches: int
    failures: list[str]
    isolation: str
    scancel: str
    seconds: float

    def summary(self) -> str:
        """A few lines for the instructor (and the test's output)."""
        servers = sorted(learner.server_s for learner in self.learners)
        kernels = sorted(learner.kernel_s for learner in self.learners)
        hello = sorted(
            learner.cells_s[1] for learner in self.learners if len(learner.cells_s) > 1
        )
        lines = [
            f"classroom: {len(self.learners)} learners at once, {self.launches} "
            f"launches, {len(self.failures)} failures, {self.seconds:.0f} s in all",
            f"  server start (a Slurm job): {servers[0]:.1f} to {servers[-1]:.1f} s; "
            f"first kernel: {kernels[0]:.1f} to {kernels[-1]:.1f} s",
        ]
        if hello:
            lines.append(
                f"  hello on 4 ranks: {hello[0]:.2f} to {hello[-1]:.2f} s per cell"
            )
        lines += [f"  isolation: {self.isolation}", f"  scancel: {self.scancel}"]
        lines += [f"  FAILED: {failure}" for failure in self.failures]
        return "\n".join(lines)


async def _learner_run(
    hub: Hub, name: str, cells: dict[int, str], root: Path
) -> Learner:
    learner = Learner(name)
    try:
        learner.server_s = await asyncio.to_thread(hub.start_server, name)
        started = time.monotonic()
        async with Kernel(hub, name) as kernel:
            await kernel.run("1")
            learner.kernel_s = time.monotonic() - started
            sources = notebook_cells(root / NOTEBOOK, list(cells))
            for (index, expected), source in zip(cells.items(), sources, strict=True):
                out = await kernel.run(source)
                learner.cells_s.append(out.seconds)
                if out.error or expected not in out.text:
                    learner.failures.append(
                        f"{name}, cell {index}: {out.error or 'no ' + repr(expected)}"
                    )
    except (HubError, OSError, asyncio.TimeoutError) as error:
        learner.failures.append(f"{name}: {error}")
    return learner


async def _isolation(hub: Hub, a: str, b: str) -> str:
    """While ``a``'s ranks run, can ``b`` signal any of ``a``'s processes?"""
    async with Kernel(hub, a) as ka, Kernel(hub, b) as kb:
        await ka.run("import torch.distributed as dist\nimport workshop")
        waiting = asyncio.ensure_future(ka.run(_SLEEPY.format(seconds=6)))
        await asyncio.sleep(3)  # a's ranks are up and sleeping
        probe = await kb.run(_PROBE.format(uid=pwd.getpwnam(a).pw_uid))
        slept = await waiting
    if probe.error or slept.error or "slept: [0, 1]" not in slept.text:
        launch = slept.error or slept.text
        return f"FAILED: probe {probe.error or probe.text!r}, launch {launch!r}"
    return (
        probe.text.strip().removeprefix("probe: ")
        + f" (by {b}); {a}'s launch ended well"
    )


def _queue(slurm_conf: str, user: str | None = None) -> list[str]:
    """The ids of the jobs in the portal's queue (of ``user``, if given)."""
    command = ["squeue", "-h", "-o", "%A"] + (["-u", user] if user else [])
    return _quiet(command, dict(os.environ, SLURM_CONF=slurm_conf), 30).split()


def _wait_until_gone(
    users: list[str], slurm_conf: str, within: float
) -> tuple[int, int]:
    """(processes, jobs) of ``users`` left after ``within`` s, or (0, 0) sooner."""
    deadline = time.monotonic() + within
    while True:
        processes = processes_of(users)
        jobs = [job for user in users for job in _queue(slurm_conf, user)]
        if (not processes and not jobs) or time.monotonic() > deadline:
            return len(processes), len(jobs)
        time.sleep(0.5)


async def _scancel(hub: Hub, name: str, slurm_conf: str) -> str:
    """Cancel ``name``'s job while their kernel's ranks run: nothing may be left."""
    async with Kernel(hub, name) as kernel:
        await kernel.run("import torch.distributed as dist\nimport workshop")
        running = asyncio.ensure_future(kernel.run(_SLEEPY.format(seconds=60), 90))
        await asyncio.sleep(4)
        jobs = _queue(slurm_conf, name)
        env = {"SLURM_CONF": slurm_conf, "PATH": "/usr/bin:/bin"}
        subprocess.run(["scancel", *jobs], capture_output=True, timeout=30, env=env)
        try:
            await asyncio.wait_for(running, 30)
        except (HubError, asyncio.TimeoutError, OSError):
            pass  # the server went with its job: the cell cannot finish
        kernel.id = None  # nothing left to shut down
    processes, left = await asyncio.to_thread(_wait_until_gone, [name], slurm_conf, 30)
    await asyncio.to_thread(hub.stop_server, name)  # the hub forgets the server
    return (
        f"job {','.join(jobs)} of {name} cancelled during a 2-rank launch: "
        f"{processes} processes and {left} jobs left after it"
    )


def classroom(
    folder: str | Path,
    learners: int | None = None,
    cells: dict[int, str] | None = None,
    keep_servers: bool = False,
) -> Classroom:
    """Run a class on the portal in ``folder``: every learner (or the first
    ``learners``) at once runs ``cells`` of notebook 02 in a kernel of a new server;
    then one probes another's ranks, one's job is cancelled mid-launch, and every
    server is stopped (unless ``keep_servers``). Failures are collected, not raised.

    Returns:
        A :class:`Classroom`; ``failures`` is empty when every launch worked,
        nobody could reach another's processes and nothing was left behind.
    """
    folder = Path(folder)
    settings = json.loads((folder / "portal.json").read_text())
    names = json.loads((folder / "users.json").read_text())["names"]
    names = [n for n in names if n != settings["instructor"]][:learners]
    hub, conf = Hub.of(folder), settings["slurm_conf"]
    cells = LAUNCH_CELLS if cells is None else cells
    root = Path(settings["root"]) / "notebooks"
    started = time.monotonic()

    async def run() -> Classroom:
        runs = await asyncio.gather(*(_learner_run(hub, n, cells, root) for n in names))
        failures = [f for learner in runs for f in learner.failures]
        isolation = scancel = "not run (needs 2 and 3 learners)"
        if len(names) >= 2 and not failures:
            isolation = await _isolation(hub, names[0], names[1])
            if isolation.startswith("FAILED") or " 0 reachable" not in isolation:
                failures.append(f"isolation: {isolation}")
        if len(names) >= 3 and not failures:
            scancel = await _scancel(hub, names[-1], conf)
            if "0 processes and 0 jobs left" not in scancel:
                failures.append(f"scancel: {scancel}")
        if keep_servers:
            processes = jobs = 0
        else:
            stops = (asyncio.to_thread(hub.stop_server, n) for n in names)
            await asyncio.gather(*stops)
            processes, jobs = await asyncio.to_thread(_wait_until_gone, names, conf, 30)
        if processes or jobs:
            failures.append(
                f"after every server stopped: {processes} processes and "
                f"{jobs} jobs of the learners left"
            )
        sources = notebook_cells(root / NOTEBOOK, list(cells))
        launches = len(runs) * sum("launch(" in source for source in sources)
        return Classroom(
            runs, launches, failures, isolation, scancel, time.monotonic() - started
        )

    return asyncio.run(run())
