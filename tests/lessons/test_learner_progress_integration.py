"""The learner's record in a real Jupyter kernel: the kernel a Jupyter server starts
for a notebook (JPY_SESSION_NAME names it), with a class board to post to. After
each cell the record says where the cell is and what its error was; a check
records its verdict and prints what it always printed; the board receives the
record with the server's token; a board that went away never fails a cell."""

from __future__ import annotations

import json
import time
from pathlib import Path
from queue import Empty

import pytest
from conftest import repo_env
from progress_helpers import BoardStandIn, wait_until

jupyter_client = pytest.importorskip("jupyter_client")

SECRET = "hunter2-never-in-a-record"
TOKEN = "kernel-token-5d1c"
CELLS = [
    ("markdown", "m0", "# 02 · A lesson"),
    ("code", "c-import", "import workshop"),
    ("markdown", "m1", '## <a id="first"></a>1. The first section'),
    ("code", "c-fails", f"secret = {SECRET!r}\nraise KeyError(secret)"),
    ("markdown", "m2", "## 2. Exercises"),
    ("code", "c-check", 'workshop.check("01.accumulate", 8)'),
    ("code", "c-hand", 'workshop.raise_hand("help")'),
    ("code", "c-after", 'workshop.check("01.dp", (1, 1))'),
]
SOURCES = {cell_id: source for _, cell_id, source in CELLS}
# The check's cell was edited after the last save: the file holds another source,
# so only the cell's id (JupyterLab sends it with the execution) finds its section.
SAVED = SOURCES | {"c-check": 'workshop.check("01.accumulate", ...)  # to do'}
SCHEMA = {"version", "seq", "where", "exercises", "quizzes", "error", "hand"}


def _write_notebook(path: Path) -> Path:
    cells = [
        {"cell_type": kind, "id": cell_id, "metadata": {}, "source": SAVED[cell_id]}
        | ({"outputs": [], "execution_count": None} if kind == "code" else {})
        for kind, cell_id, _ in CELLS
    ]
    path.write_text(
        json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    )
    return path


def _run_cell(kc, cell_id: str, timeout: float = 120.0) -> tuple[dict, str]:
    """Run the notebook's cell ``cell_id`` as JupyterLab does (its id in the
    request's metadata); its reply and what it printed on stdout."""
    content = {
        "code": SOURCES[cell_id],
        "silent": False,
        "store_history": True,
        "user_expressions": {},
        "allow_stdin": False,
        "stop_on_error": True,
    }
    msg = kc.session.msg("execute_request", content, metadata={"cellId": cell_id})
    kc.shell_channel.send(msg)
    msg_id = msg["header"]["msg_id"]
    reply = kc.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=timeout)
    stdout = []
    while True:  # up to the kernel's "idle" after this cell
        try:
            out = kc.get_iopub_msg(timeout=10)
        except Empty:
            break
        if out["parent_header"].get("msg_id") != msg_id:
            continue
        if out["msg_type"] == "stream" and out["content"]["name"] == "stdout":
            stdout.append(out["content"]["text"])
        if out["msg_type"] == "status" and out["content"]["execution_state"] == "idle":
            break
    return reply["content"], "".join(stdout)


@pytest.fixture
def board():
    with BoardStandIn(clear_hands=True) as stand_in:
        yield stand_in


def test_a_kernel_records_where_and_what_and_posts_it_to_the_board(tmp_path, board):
    notebook = _write_notebook(tmp_path / "02_lesson.ipynb")
    kept = tmp_path / "progress.json"
    env = repo_env(
        JPY_SESSION_NAME=str(notebook),
        WORKSHOP_PROGRESS=str(kept),
        WORKSHOP_BOARD_URL=board.url,
        JUPYTERHUB_API_TOKEN=TOKEN,
    )
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3", env=env)
    try:
        reply, _ = _run_cell(kc, "c-import")
        assert reply["status"] == "ok", reply

        # A cell that fails: its error's type and section, never its code or message.
        reply, _ = _run_cell(kc, "c-fails")
        assert reply["status"] == "error" and reply["ename"] == "KeyError"
        record = json.loads(kept.read_text())
        first = {"notebook": "02_lesson", "section": "1. The first section"}
        assert record["where"] == first
        assert record["error"] == {"type": "KeyError", **first, "seq": record["seq"]}

        # A check: its verdict recorded, its output exactly what it always was; its
        # section found by the cell's id.
        reply, printed = _run_cell(kc, "c-check")
        assert reply["status"] == "ok" and printed == "Right: 01.accumulate\n"
        record = json.loads(kept.read_text())
        assert record["exercises"]["01.accumulate"]["passed"] is True
        assert record["where"] == {"notebook": "02_lesson", "section": "2. Exercises"}
        assert record["error"]["section"] == "1. The first section"  # the last one

        # The board got the record with the server's token, the schema's keys alone.
        post = board.wait_for(lambda r: "01.accumulate" in r["exercises"])
        assert post["path"] == "/services/board/api/records"
        assert post["authorization"] == f"token {TOKEN}"
        assert set(post["record"]) == SCHEMA
        assert post["record"]["error"]["type"] == "KeyError"

        # A raised hand reaches the board; the instructor clears it there, and the
        # kernel lowers it in the file and tells the board.
        reply, printed = _run_cell(kc, "c-hand")
        assert reply["status"] == "ok"
        assert printed.startswith('Your hand is up, "I need help"; the instructor')
        raised = board.wait_for(lambda r: r["hand"] is not None)["record"]["hand"]
        wait_until(
            lambda: json.loads(kept.read_text())["hand_cleared"] == raised["seq"],
            what="the hand cleared by the board",
        )
        board.wait_for(lambda r: r["hand"] is None and r["seq"] > raised["seq"])

        # The board goes away: the next cell runs and succeeds all the same.
        board.stop()
        started = time.perf_counter()
        reply, printed = _run_cell(kc, "c-after")
        took = time.perf_counter() - started
        assert reply["status"] == "ok" and printed.startswith("Not yet: 01.dp.")
        assert json.loads(kept.read_text())["exercises"]["01.dp"]["failures"] == 1
        print(f"a cell with the board stopped: {took * 1000:.0f} ms")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)

    everything = kept.read_text() + "".join(p["body"] for p in board.posts)
    assert SECRET not in everything
    assert "raise KeyError" not in everything
