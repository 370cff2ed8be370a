"""A client of the private portal, as a learner's browser tab is one: the hub's REST
API (start and stop a learner's server) and a kernel in a learner's server, over its
websocket, through the hub's proxy, with the token of the hub's ``classroom``
service (which may reach every learner's server).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
        """One request to ``url + path``; (status, decoded JSON, or the text of
        what is not JSON, or None when empty)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path.lstrip("/"),
            method=method,
            data=data,
            headers={"Authorization": f"token {self.token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                text = answer.read().decode(errors="replace")
                try:
                    return answer.status, json.loads(text) if text else None
                except json.JSONDecodeError:  # a page, not the API
                    return answer.status, text
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            try:
                return error.code, json.loads(text)
            except json.JSONDecodeError:
                return error.code, text

    def start_server(self, user: str, timeout: float = 180) -> float:
        """Start ``user``'s server (a Slurm job) and wait until it answers; the
        seconds it took.

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
    """A kernel in ``user``'s server, and a websocket to it (use ``async with``)."""

    def __init__(self, hub: Hub, user: str):
        self.hub, self.user = hub, user
        self.id: str | None = None
        self.session = uuid.uuid4().hex
        self._socket: Any = None

    async def __aenter__(self) -> Kernel:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        base = f"user/{self.user}/api/kernels"
        code, answer = await asyncio.to_thread(
            self.hub.call, "POST", base, {"name": "python3"}
        )
        if code != 201:
            raise HubError(f"starting a kernel for {self.user}: HTTP {code}: {answer}")
        self.id = answer["id"]
        url = self.hub.url.replace("http", "ws", 1) + f"{base}/{self.id}/channels"
        request = HTTPRequest(
            url,
            headers={"Authorization": f"token {self.hub.token}"},
            connect_timeout=30,
        )
        self._socket = await websocket_connect(request)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._socket is not None:
            self._socket.close()
        if self.id is not None:
            await asyncio.to_thread(
                self.hub.call, "DELETE", f"user/{self.user}/api/kernels/{self.id}"
            )

    async def run(self, code: str, timeout: float = 300) -> Output:
        """Run ``code`` as one cell; what it printed, showed and raised."""
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
            "metadata": {},
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
