"""Stand-ins for the instructor's class board, for the tests of the learner's side
(tests/lessons/test_learner_progress*.py): one that answers posts as the board does,
and one that takes a post and holds it unanswered until told."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from workshop.instructor.board_record import Refused, parse_post

# Whose token the stand-in takes each post to carry (the real board asks the hub).
LEARNER = "learner"


class BoardStandIn:
    """An HTTP server on 127.0.0.1 that keeps every post it receives (path,
    Authorization header, JSON body) and answers ``{"ok": true, "hand_cleared":
    ...}``; ``status`` lists the codes of the next answers (then the board's own),
    and ``clear_hands`` answers each posted hand as cleared, as an instructor would.

    Every body is checked as the real board checks it (board_record.parse_post): a
    record the board would refuse gets the board's status (400 or 413) and its
    sentence, kept as ``"refused"``, so a test of the learner's side also finds a
    record the board would not take.

    Use it in a ``with`` block: it stops on leaving it."""

    def __init__(self, status: list[int] | None = None, clear_hands: bool = False):
        self.posts: list[dict[str, Any]] = []
        self.status = list(status or [])
        self.clear_hands = clear_hands
        self._arrived = threading.Condition()
        board = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                record = json.loads(body)
                try:
                    parse_post(body, LEARNER)
                    code, refused = 200, None
                except Refused as error:
                    code, refused = error.status, str(error)
                with board._arrived:
                    code = board.status.pop(0) if board.status else code
                    hand = record.get("hand")
                    cleared = hand["seq"] if board.clear_hands and hand else None
                    board.posts.append(
                        {
                            "path": self.path,
                            "authorization": self.headers.get("Authorization"),
                            "body": body.decode(),
                            "record": record,
                            "code": code,
                            "refused": refused,
                        }
                    )
                    board._arrived.notify_all()
                answer = (
                    {"ok": True, "hand_cleared": cleared}
                    if code == 200
                    else {"error": refused or "refused by the stand-in"}
                )
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass  # quiet

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/services/board/"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def wait_for(self, test, timeout: float = 30.0) -> dict[str, Any]:
        """The first post whose record passes ``test``; AssertionError after
        ``timeout`` seconds, listing what did arrive."""
        with self._arrived:
            found = self._arrived.wait_for(
                lambda: next((p for p in self.posts if test(p["record"])), None),
                timeout=timeout,
            )
        assert found, f"no such post within {timeout} s; got {self.posts}"
        return found

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)

    def __enter__(self) -> BoardStandIn:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class HoldingBoard:
    """A board that accepts one connection, reads the whole post, then holds it
    unanswered until :meth:`release` (or 60 s): what a board stuck in a long pause
    looks like to the kernel. Use it in a ``with`` block."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/services/board/"
        self.received = threading.Event()
        self._release = threading.Event()
        self.body = b""
        self._conn: socket.socket | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return  # closed before anyone came
        self._conn = conn
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        length = int(re.search(rb"content-length: *(\d+)", head, re.I).group(1))
        while len(body) < length:
            body += conn.recv(65536)
        self.body = body
        self.received.set()
        self._release.wait(60)
        answer = b'{"ok": true, "hand_cleared": null}'
        try:
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                % (len(answer), answer)
            )
        except OSError:
            pass  # the kernel gave up first

    def client_waiting(self) -> bool:
        """Whether the poster still holds its connection open, waiting for an
        answer (it closes it when it gives up)."""
        assert self._conn is not None
        try:
            return self._conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True  # open, nothing sent: still waiting
        except OSError:
            return False

    def release(self) -> None:
        self._release.set()

    def __enter__(self) -> HoldingBoard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
        try:  # wakes an accept() still waiting (close alone does not, on Linux)
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._thread.join(10)
        if self._conn is not None:
            self._conn.close()


def wait_until(test, timeout: float = 30.0, what: str = "the condition") -> None:
    """Poll ``test()`` until it is true; AssertionError naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not test():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.02)
