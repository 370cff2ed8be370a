"""The learner's kernel posting its record to the instructor's class board, in the
background: one daemon thread, the latest record only, a short timeout.

A portal's learner servers have ``WORKSHOP_BOARD_URL`` (the board service's address,
ending in "/") and their own ``JUPYTERHUB_API_TOKEN``; :mod:`.learner_record` makes a
:class:`BoardPoster` only where both are set, so a learner working alone starts no
thread and posts nothing. A cell never waits on the board: :meth:`BoardPoster.submit`
hands the record over and returns; a board that is down, slow or refusing costs the
thread its timeout, never the cell.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

__all__ = ["BoardPoster"]

# Seconds one post may take (to connect, and for each read): a board that accepted
# the connection and never answers holds the thread this long, not longer.
_POST_TIMEOUT_S = 2.0
# A failed post is tried again after 2 s, then 4, 8, ... up to a minute: never a
# retry loop faster than every 2 s against a board that is down.
_RETRY_FIRST_S = 2.0
_RETRY_MOST_S = 60.0
# The board's answer is one small JSON object; more is not read.
_ANSWER_BYTES = 64 * 1024


class BoardPoster:
    """Posts the latest record handed to it to ``url`` from one daemon thread.

    Only the newest record waits to be sent ("latest record wins": a record that is
    replaced before the thread got to it is never sent, so nothing piles up). A post
    that fails for the network or the board's own error (5xx) is sent again after a
    growing pause unless a newer record came; one the board refuses (4xx: a bad
    token, a bad record) is dropped, since sending it again cannot help.

    Args:
        url: where to POST, e.g. ``http://127.0.0.1:8000/services/board/api/records``.
        token: the server's own JupyterHub API token, sent as
            ``Authorization: token <token>``.
        on_answer: called in the thread with the board's JSON answer to each post
            that succeeded (``{"ok": true, "hand_cleared": ...}``); what it raises is
            swallowed.
        timeout: seconds a post may take; None: 2.

    Example:
        >>> url = "http://127.0.0.1:8000/services/board/api/records"
        >>> poster = BoardPoster(url, "token")  # doctest: +SKIP
        >>> poster.submit({"version": 1, "seq": 3})  # returns at once  # doctest: +SKIP
        >>> poster.close()  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str,
        token: str,
        on_answer: Callable[[dict[str, Any]], None] | None = None,
        timeout: float | None = None,
    ) -> None:
        self.url = url
        self.timeout = _POST_TIMEOUT_S if timeout is None else timeout
        self.on_answer = on_answer
        # What happened so far, for whoever asks (the tests, a curious learner).
        self.posted = 0
        self.failed = 0
        self._token = token
        self._latest: dict[str, Any] | None = None
        self._closed = False
        self._wake = threading.Condition()
        # No proxy: the board sits beside the hub, and a site's HTTP proxy would
        # otherwise be handed the learner's token.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._thread = threading.Thread(
            target=self._run, name="workshop-board-poster", daemon=True
        )
        self._thread.start()

    def submit(self, record: dict[str, Any]) -> None:
        """Hand ``record`` to the thread and return at once; it replaces any record
        still waiting.

        Args:
            record: the record as the board takes it (JSON-serialisable).
        """
        with self._wake:
            self._latest = record
            self._wake.notify()

    def close(self, timeout: float | None = None) -> None:
        """Stop the thread (a post under way finishes first, within its timeout).

        Args:
            timeout: seconds to wait for the thread; None waits until it ends.
        """
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Whether the thread still runs."""
        return self._thread.is_alive()

    def _run(self) -> None:
        failures = 0
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._latest is not None or self._closed)
                if self._closed:
                    return
                record, self._latest = self._latest, None
            try:
                answer = self._post(record)
            except urllib.error.HTTPError as exc:
                exc.close()
                self.failed += 1
                if exc.code < 500:
                    continue  # refused: the same record would be refused again
                failures = self._again(record, failures)
            except Exception:  # down, unreachable, timed out, not JSON
                self.failed += 1
                failures = self._again(record, failures)
            else:
                self.posted += 1
                failures = 0
                if self.on_answer is not None:
                    try:
                        self.on_answer(answer)
                    except Exception:
                        pass  # the learner's side never fails for the board

    def _again(self, record: dict[str, Any], failures: int) -> int:
        """Keep ``record`` to send again unless a newer one came, and pause first."""
        failures += 1
        pause = min(_RETRY_FIRST_S * 2 ** (failures - 1), _RETRY_MOST_S)
        with self._wake:
            if self._latest is None:
                self._latest = record
            # A newer record does not cut the pause short: only close does.
            self._wake.wait_for(lambda: self._closed, timeout=pause)
        return failures

    def _post(self, record: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url,
            data=json.dumps(record, separators=(",", ":")).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Authorization": f"token {self._token}",
            },
        )
        with self._opener.open(request, timeout=self.timeout) as response:
            answer = json.loads(response.read(_ANSWER_BYTES) or b"{}")
        return answer if isinstance(answer, dict) else {}
