"""The class board: a JupyterHub service that shows the instructor every learner's
exercises, quiz scores, last error, raised hand and job, live.

The hub starts it (a hub-managed service; docs/portal.md, "The instructor's
board")::

    python -m workshop.instructor.board --state <portal folder>/board

It listens at the host and port of ``$JUPYTERHUB_SERVICE_URL`` and answers under
``$JUPYTERHUB_SERVICE_PREFIX`` (``/services/board/``). Who is asking comes from the
hub (``jupyterhub.services.auth.HubOAuth``): a browser logs in through the hub's OAuth,
a kernel or script sends ``Authorization: token <its token>``. The instructor is
whoever holds the hub's custom scope ``custom:board:read``; a learner may post and
read only their own record. The records are checked and kept by ``board_state.py``,
saved to ``<state>/board.json`` after changes, and read back at start, so the board
survives a hub restart. The class (the hub's users who are not instructors) is asked
of the hub every 10 s, the learners' Slurm jobs of ``squeue`` every 5 s in a thread.
The board exits by itself when the hub that started it is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from jupyterhub.services.auth import (
    HubOAuth,
    HubOAuthCallbackHandler,
    HubOAuthenticated,
    UserNotAllowed,
)
from tornado import httpclient, ioloop, web

from .board_page import page_html, refused_html
from .board_state import ClassBoard, csv_text, write_atomic

__all__ = ["INSTRUCTOR_SCOPE", "BoardService", "make_app", "parse_squeue"]

_log = logging.getLogger("workshop.board")

INSTRUCTOR_SCOPE = "custom:board:read"
INSTRUCTORS_GROUP = "instructors"
LEARNERS_EVERY_S, JOBS_EVERY_S, SAVE_EVERY_S, PARENT_EVERY_S = 10.0, 5.0, 0.5, 1.0
# The largest body the server reads at all; the board refuses records over 16 KiB
# with a 413 and a sentence, which needs the body read first.
MAX_BODY_BYTES = 1024 * 1024
NOT_YOURS = (
    "the class board is the instructor's: it needs the hub's scope "
    f"{INSTRUCTOR_SCOPE} (the portal's admin, or the group {INSTRUCTORS_GROUP!r}), "
    "and {user!r} does not hold it"
)


def refuse(status: int, sentence: str) -> web.HTTPError:
    """The error that answers ``status`` with ``{"error": sentence}`` (the sentence
    rides in the body, never in the status line, which takes only Latin-1).

    Example:
        >>> refuse(404, "the board has no record of 'ada'").sentence
        "the board has no record of 'ada'"
    """
    error = web.HTTPError(status)
    error.sentence = sentence
    return error


def parse_squeue(text: str) -> dict[str, dict[str, str]]:
    """Each learner's server job from ``squeue -h -o "%u|%T|%L|%j"``'s output: jobs
    named ``jupyter-<user>`` (the portal's batch script names them so); a running
    job wins over a pending one of the same learner.

    Example:
        >>> parse_squeue("ada|RUNNING|1:58:12|jupyter-ada\\nbo|PENDING|2:00:00|train")
        {'ada': {'state': 'RUNNING', 'left': '1:58:12'}}
    """
    jobs: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4 or not parts[3].startswith("jupyter-"):
            continue
        name = parts[3].removeprefix("jupyter-")
        if name in jobs and jobs[name]["state"] == "RUNNING":
            continue
        jobs[name] = {"state": parts[1], "left": parts[2]}
    return jobs


class JobWatch:
    """``squeue`` every ``every`` seconds in a daemon thread, so a slow Slurm
    controller never holds up the board's event loop. ``jobs`` is None and ``why``
    says why where squeue is missing or fails.

    Example:
        >>> watch = JobWatch().start()  # doctest: +SKIP
        >>> watch.jobs, watch.why  # doctest: +SKIP
        ({'ada': {'state': 'RUNNING', 'left': '1:58:12'}}, None)
    """

    def __init__(self, every: float = JOBS_EVERY_S, command: str = "squeue") -> None:
        self.every, self.command = every, command
        self.jobs: dict[str, dict[str, str]] | None = None
        self.why: str | None = "not asked yet"
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="board-squeue", daemon=True
        )

    def start(self) -> JobWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.every)

    def poll(self) -> None:
        """Ask squeue once; set ``jobs`` and ``why`` together."""
        try:
            done = subprocess.run(
                [self.command, "-h", "-o", "%u|%T|%L|%j"],
                capture_output=True,
                text=True,
                timeout=10,
            )
        except FileNotFoundError:
            self.jobs, self.why = None, f"{self.command} not found on PATH"
            return
        except (OSError, subprocess.TimeoutExpired) as error:
            self.jobs, self.why = None, f"{self.command}: {error}"
            return
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no message"])[0]
            self.jobs, self.why = None, f"squeue failed: {first[:120]}"
            return
        self.jobs, self.why = parse_squeue(done.stdout), None


class BoardService:
    """The board's state: the records, the class, the jobs, and the saving.

    Args:
        state: the folder of ``board.json`` (made 0700 where missing), or None to
            keep nothing on disk (tests).
        hub_api: the hub's REST API URL and the service's token, to ask for the
            class; None where the class is whoever posted.
        jobs: where the jobs come from (a :class:`JobWatch`), or None for none.

    Example:
        >>> service = BoardService(None)
        >>> service.board.accept("ada", b'{"version": 1, "seq": 1}')[0]
        200
        >>> [row["learner"] for row in service.table()["learners"]]
        ['ada']
    """

    def __init__(
        self,
        state: Path | None,
        hub_api: tuple[str, str] | None = None,
        jobs: JobWatch | None = None,
    ) -> None:
        self.path = None if state is None else Path(state) / "board.json"
        if self.path is not None:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.board = ClassBoard() if self.path is None else ClassBoard.load(self.path)
        self.hub_api = hub_api
        self.watch = jobs
        # The class: None until the hub answered (or without hub_api); and the
        # hub's instructors, whose own kernels' posts stay off the table.
        self.learners: list[str] | None = None
        self.instructors: set[str] = set()
        self._saved = self.board.changes
        self._saving = False

    def table(self) -> dict[str, Any]:
        """What ``api/table`` answers."""
        if self.watch is None:
            jobs, why = None, "no squeue watch"
        else:
            jobs, why = self.watch.jobs, self.watch.why
        return self.board.table(self.class_names(), jobs, why)

    def class_names(self) -> list[str] | None:
        """The table's learners: the class as the hub last said, and whoever
        posted since who is not an instructor (a user made after the last
        question to the hub shows at once)."""
        if self.learners is None:
            return None
        posted = set(self.board.learners) - self.instructors
        return sorted(set(self.learners) | posted)

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a learner of the class or has a record."""
        return name in self.board.learners or name in (self.learners or [])

    async def save_if_changed(self) -> None:
        """Save the board where it changed since the last save; the file is
        written in a thread (an fsync may take a while on a busy disk)."""
        if self.path is None or self._saving or self.board.changes == self._saved:
            return
        changes, text = self.board.changes, self.board.snapshot()
        self._saving = True
        try:
            await asyncio.to_thread(write_atomic, self.path, text)
            self._saved = changes
        except OSError as error:
            _log.error("board: could not save %s: %s", self.path, error)
        finally:
            self._saving = False

    def save_now(self) -> None:
        """Save at once, on the way out."""
        if self.path is not None and self.board.changes != self._saved:
            self.board.save(self.path)
            self._saved = self.board.changes

    async def refresh_learners(self) -> None:
        """Ask the hub for its users; the class is those who are not instructors
        (not admin, not in the group ``instructors``). On failure the last class
        stays, and the log says why."""
        if self.hub_api is None:
            return
        url, token = self.hub_api
        client = httpclient.AsyncHTTPClient()
        names, instructors, offset = [], set(), 0
        try:
            while True:
                answer = await client.fetch(
                    f"{url.rstrip('/')}/users?offset={offset}&limit=200",
                    headers={
                        "Authorization": f"token {token}",
                        # Pages of users, with where the next one starts.
                        "Accept": "application/jupyterhub-pagination+json",
                    },
                    request_timeout=10,
                )
                page = json.loads(answer.body)
                for user in page["items"]:
                    if user.get("admin") or INSTRUCTORS_GROUP in user.get("groups", []):
                        instructors.add(user["name"])
                    else:
                        names.append(user["name"])
                following = (page.get("_pagination") or {}).get("next")
                if not following:
                    break
                offset = following["offset"]
        except (OSError, httpclient.HTTPError, ValueError, KeyError) as error:
            _log.warning("board: could not ask the hub for its users: %s", error)
            return
        self.learners, self.instructors = sorted(names), instructors


class _Handler(HubOAuthenticated, web.RequestHandler):
    """Who asks, from the hub (or the app's ``identify`` in tests); refusals as
    JSON ``{"error": "<sentence>"}``."""

    def initialize(self, service: BoardService) -> None:
        self.service = service
        self.hub_auth = self.settings["hub_auth"]

    async def prepare(self) -> None:
        identify = self.settings.get("identify")
        if identify is not None:
            model = await identify(self)
        else:
            # The hub's answer, awaited: get_current_user would block the loop on
            # a request to the hub for each new token.
            model = await self.hub_auth.get_user(self, sync=False)
            if model:
                try:
                    model = self.check_hub_user(model)
                except UserNotAllowed:
                    raise refuse(
                        403,
                        f"{model['kind']} {model['name']!r} has no access to "
                        "the board: the token lacks the scope "
                        f"access:services!service={self._service_name()} (the hub's "
                        "Spawner.server_token_scopes, or the user's roles)",
                    ) from None
        self.current_user = model or None
        # Browser posts (cookie) carry the page's _xsrf; a request with a token in
        # its Authorization header (a kernel, a script) cannot be forged by a page.
        if self.request.method not in ("GET", "HEAD", "OPTIONS") and not getattr(
            self, "_token_authenticated", False
        ):
            try:
                self.check_xsrf_cookie()
            except web.HTTPError:
                raise refuse(
                    403,
                    "a browser's POST needs the page's _xsrf token (header "
                    "X-XSRFToken); reload the board's page. Scripts send "
                    "'Authorization: token <token>' instead",
                ) from None

    def _service_name(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_NAME", "board")

    def user(self) -> dict[str, Any]:
        """The hub user asking, or a 403 saying how to be one."""
        if not self.current_user:
            raise refuse(
                403,
                "no hub user: open the board from the hub, or send "
                "'Authorization: token <token>' with a token of this hub",
            )
        return self.current_user

    def is_instructor(self) -> bool:
        user = self.current_user
        return bool(user) and INSTRUCTOR_SCOPE in user.get("scopes", [])

    def instructor(self) -> dict[str, Any]:
        """The instructor asking, or a 403 saying the board is the instructor's."""
        user = self.user()
        if not self.is_instructor():
            raise refuse(403, NOT_YOURS.format(user=user["name"]))
        return user

    def write_json(self, value: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(value))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        sentence = getattr(error, "sentence", None)
        if sentence is None:
            detail = getattr(error, "log_message", None) or self._reason
            sentence = f"the board refused or failed: HTTP {status_code}: {detail}"
        self.write_json({"error": sentence}, status_code)


class PageHandler(_Handler):
    """GET the prefix: the board's page, for the instructor."""

    async def get(self) -> None:
        if not self.current_user:
            # A browser not yet logged in goes through the hub's OAuth and back.
            self.redirect(self.get_login_url())
            return
        if not self.is_instructor():
            self.set_status(403)
            self.finish(refused_html(NOT_YOURS.format(user=self.current_user["name"])))
            return
        self.set_header("Cache-Control", "no-store")
        self.finish(
            page_html(
                self.hub_auth.base_url, self.xsrf_token.decode(), self.user()["name"]
            )
        )


class TableHandler(_Handler):
    """GET api/table: the rows and the summary, for the instructor."""

    async def get(self) -> None:
        self.instructor()
        self.write_json(self.service.table())


class CsvHandler(_Handler):
    """GET board.csv: the table as a CSV file, for the instructor."""

    async def get(self) -> None:
        self.instructor()
        stamp = time.strftime("%Y%m%d-%H%M", time.localtime())
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header(
            "Content-Disposition", f'attachment; filename="board-{stamp}.csv"'
        )
        self.finish(csv_text(self.service.table()["learners"]))


class RecordsHandler(_Handler):
    """POST a learner's own record."""

    async def post(self) -> None:
        user = self.user()
        if user.get("kind", "user") != "user":
            raise refuse(403, f"only a hub user posts a record, not {user['name']!r}")
        status, answer = self.service.board.accept(user["name"], self.request.body)
        self.write_json(answer, status)


class RecordHandler(_Handler):
    """GET one learner's record: the instructor, or that learner."""

    async def get(self, name: str) -> None:
        user = self.user()
        if user["name"] != name and not self.is_instructor():
            raise refuse(
                403,
                f"{user['name']!r} may read only their own record, not the "
                f"one of {name!r}; the class board is the instructor's",
            )
        record = self.service.board.record(name)
        if record is None:
            raise refuse(404, f"the board has no record of {name!r}")
        self.write_json(record)


class ClearHandHandler(_Handler):
    """POST api/hands/<name>/clear: the instructor lowers a learner's hand."""

    async def post(self, name: str) -> None:
        self.instructor()
        if not self.service.board.clear_hand(name) and not self.service.knows(name):
            raise refuse(404, f"no learner {name!r} on the board")
        self.write_json({"ok": True})


def make_app(
    service: BoardService,
    prefix: str,
    hub_auth: HubOAuth,
    cookie_secret: bytes,
    identify: Callable[[web.RequestHandler], Awaitable[dict | None]] | None = None,
) -> web.Application:
    """The board's tornado application under ``prefix`` ("/services/board/").

    Args:
        service: the board's state.
        prefix: the URL path it answers under, ending in "/".
        hub_auth: the hub's OAuth client (``HubOAuth``), which names who asks.
        cookie_secret: signs the login cookie and the _xsrf token.
        identify: stands in for the hub (tests): an async function of the
            request handler giving the user model, or None.

    Returns:
        The application; ``listen`` it at the service's address.

    Example:
        >>> app = make_app(BoardService(None), "/services/board/", auth, secret)  # doctest: +SKIP
    """  # noqa: E501
    callback = urlparse(hub_auth.oauth_redirect_uri).path or f"{prefix}oauth_callback"
    handlers = [
        (prefix, PageHandler),
        (f"{prefix}api/table", TableHandler),
        (f"{prefix}api/records", RecordsHandler),
        (f"{prefix}api/records/([^/]+)", RecordHandler),
        (f"{prefix}api/hands/([^/]+)/clear", ClearHandHandler),
        (f"{prefix}board.csv", CsvHandler),
    ]
    routes: list[Any] = [(p, h, {"service": service}) for p, h in handlers]
    routes.append((callback, HubOAuthCallbackHandler))
    # The hub's link to a service may lack the last "/".
    routes.append((prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}))
    return web.Application(
        routes,
        hub_auth=hub_auth,
        cookie_secret=cookie_secret,
        identify=identify,
        log_function=_log_request,
    )


def _log_request(handler: web.RequestHandler) -> None:
    # A class posting every few seconds would fill the hub's log: refusals,
    # failures and slow answers only.
    took = 1000.0 * handler.request.request_time()
    status = handler.get_status()
    if status >= 400 or took > 1000:
        _log.warning(
            "%d %s %s %.0f ms",
            status,
            handler.request.method,
            handler.request.path,
            took,
        )


def _cookie_secret(state: Path) -> bytes:
    """The secret in ``state/cookie_secret`` (0600), made once: a board restarted
    with the hub keeps the instructor's login and the open page's _xsrf valid."""
    path = state / "cookie_secret"
    try:
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        secret = secrets.token_bytes(32)
        write_atomic(path, secret.hex())
        return secret


def _parent_gone(parent: int) -> bool:
    # The hub starts its services in their own session: a killed hub's signal
    # never reaches the board, which would hold the port for good.
    return os.getppid() != parent


async def serve(service: BoardService, app: web.Application, url: str) -> None:
    """Answer at ``url``'s host and port until SIGTERM (the hub stopping its
    service), SIGINT or the death of this process's parent (the hub); then save
    and stop.

    Args:
        service: the board's state, saved on the way out.
        app: :func:`make_app`'s application.
        url: ``$JUPYTERHUB_SERVICE_URL``, e.g. "http://127.0.0.1:8123".

    Example:
        >>> asyncio.run(serve(service, app, "http://127.0.0.1:8123"))  # doctest: +SKIP
    """
    where = urlparse(url)
    server = app.listen(
        where.port or 80, address=where.hostname, max_body_size=MAX_BODY_BYTES
    )
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    parent = os.getppid()

    def check_parent() -> None:
        if _parent_gone(parent):
            _log.warning("board: the hub (pid %d) is gone; saving and stopping", parent)
            stopped.set()

    timers = [
        ioloop.PeriodicCallback(check_parent, PARENT_EVERY_S * 1000),
        ioloop.PeriodicCallback(service.save_if_changed, SAVE_EVERY_S * 1000),
        ioloop.PeriodicCallback(service.refresh_learners, LEARNERS_EVERY_S * 1000),
    ]
    for timer in timers:
        timer.start()
    first = loop.create_task(service.refresh_learners())  # not 10 s later
    try:
        await stopped.wait()
    finally:
        for timer in timers:
            timer.stop()
        first.cancel()
        server.stop()
        if service.watch is not None:
            service.watch.stop()
        service.save_now()


def main(argv: list[str] | None = None) -> int:
    """``python -m workshop.instructor.board --state DIR``: run the board as the
    hub's service until the hub stops it or is gone.

    Returns:
        The exit status: 0, or 2 where it is not started by a hub.

    Example:
        >>> main(["--state", "/srv/portal/board"])  # doctest: +SKIP
    """
    parser = argparse.ArgumentParser(
        prog="python -m workshop.instructor.board",
        description="The class board, a JupyterHub service (docs/portal.md).",
    )
    parser.add_argument(
        "--state", required=True, type=Path, help="folder of board.json (0700)"
    )
    parser.add_argument(
        "--learners-from-hub",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the class is the hub's users who are not instructors (default); "
        "--no-learners-from-hub: whoever posted",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="[%(levelname).1s %(asctime)s board] %(message)s"
    )
    url = os.environ.get("JUPYTERHUB_SERVICE_URL")
    if not url:
        print(
            "board: JUPYTERHUB_SERVICE_URL is not set: the board runs as a service "
            "the hub starts (c.JupyterHub.services; docs/portal.md, The instructor's "
            "board)",
            file=sys.stderr,
        )
        return 2
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/board/")
    hub_api = (os.environ["JUPYTERHUB_API_URL"], os.environ["JUPYTERHUB_API_TOKEN"])
    service = BoardService(
        args.state,
        hub_api if args.learners_from_hub else None,
        JobWatch().start(),
    )
    app = make_app(service, prefix, HubOAuth.instance(), _cookie_secret(args.state))
    _log.info("board: answering at %s, state in %s", url, args.state)
    asyncio.run(serve(service, app, url))
    return 0


if __name__ == "__main__":
    sys.exit(main())
