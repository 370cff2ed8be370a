"""workshop.instructor.portal_status: the instructor's table of a portal's hub and
learners' jobs, from a portal folder written here and squeue's answer given to it
(test_portal.py reads it from a real portal)."""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import wait_exec

from workshop.instructor import portal_status
from workshop.instructor.portal import MAX_FOLDER
from workshop.instructor.portal_learners import PortalError, portal_command

NAMES = ["learner01", "learner02", "learner03", "instructor"]
JOBS = {
    "learner01": [["17", "RUNNING", "1:58:12", "127.0.0.2", "jupyter-learner01"]],
    "learner03": [
        ["18", "RUNNING", "1-02:00:00", "127.0.0.3", "jupyter-learner03"],
        ["19", "PENDING", "10:00", "(Priority)", "a-very-long-job-name-" * 4],
    ],
}


@pytest.fixture
def folder(monkeypatch):
    # As long a folder as a portal may have (portal.MAX_FOLDER, for Slurm's sockets):
    # pytest's own, under a pytest-xdist worker, can be longer than any portal's.
    base = Path(tempfile.mkdtemp(prefix="wps-", dir="/tmp"))
    where = base / ("f" * (MAX_FOLDER - len(str(base)) - 1))
    where.mkdir()
    (where / "portal.json").write_text(
        json.dumps({"port": 8123, "slurm_conf": "/nowhere/slurm.conf"})
    )
    (where / "users.json").write_text(json.dumps({"names": NAMES, "made": NAMES}))
    monkeypatch.setattr(portal_status, "_jobs", lambda names, conf: (JOBS, None))
    yield where
    shutil.rmtree(base)


def test_each_learners_jobs_are_listed_in_88_columns(folder, monkeypatch):
    monkeypatch.setattr(portal_status, "hub_pid", lambda folder: 4321)
    lines = portal_status.status(folder).splitlines()
    assert lines[1] == "  hub        running (pid 4321) at http://127.0.0.1:8123/"
    assert all(len(line) <= 88 for line in lines), max(lines, key=len)
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == [
        "user", "job", "state", "time", "left", "node", "job", "name"
    ]  # fmt: skip
    assert table[1].split() == [
        "learner01", "17", "RUNNING", "1:58:12", "127.0.0.2", "jupyter-learner01"
    ]  # fmt: skip
    assert table[2].split() == ["learner02", "-", "no", "job"]
    assert table[3].split()[:5] == [
        "learner03", "18", "RUNNING", "1-02:00:00", "127.0.0.3"
    ]  # fmt: skip
    # A pending job: the reason it waits where the node would be; a long name cut.
    assert table[4].split()[:5] == ["learner03", "19", "PENDING", "10:00", "(Priority)"]
    assert table[4].endswith("…") and len(table[4]) == 88
    assert table[5].split() == ["instructor", "-", "no", "job"]
    # The columns line up: each job id ends where the header's "job" does.
    end = table[0].index("job") + len("job")
    ids = ["17", "-", "18", "19", "-"]
    ends = {line.index(j) + len(j) for line, j in zip(table[1:], ids, strict=True)}
    assert ends == {end}


def test_a_dead_hub_is_said_with_how_to_start_it_again(folder, monkeypatch):
    monkeypatch.setattr(portal_status, "hub_pid", lambda folder: None)
    text = portal_status.status(folder)
    assert "  hub        NOT running (it answered at http://127.0.0.1:8123/)" in text
    # The command, with the longest folder a portal may have, on lines as a shell
    # reads them (a backslash before each break): every line fits a projector, and
    # the lines are the command that works in a new shell, this interpreter by its
    # full path (test_portal_integration.py pastes it into one).
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("cd "))
    hint = [lines[at]]
    while hint[-1].endswith(" \\"):
        at += 1
        hint.append(lines[at])
    pasted = " ".join(line.strip().removesuffix(" \\") for line in hint)
    assert pasted == portal_command("start", folder)
    assert f" {shlex.quote(sys.executable)} -m workshop portal start " in pasted
    assert " python -m" not in text  # a bare python: the system's, in a new shell
    assert all(len(line) <= 88 for line in lines), max(lines, key=len)
    assert "  passwords  in secrets/passwords.txt there (root only)" in text


def test_the_hint_of_a_folder_without_a_portal_works_in_a_new_shell(tmp_path):
    error = str(portal_status.no_portal(tmp_path / "none"))
    assert f"start one with {portal_command('start', tmp_path / 'none')}, " in error
    assert shlex.quote(sys.executable) in error and " python -m" not in error


def test_a_cluster_that_does_not_answer_is_said(folder, monkeypatch):
    monkeypatch.setattr(
        portal_status, "_jobs", lambda names, conf: ({}, "squeue failed: no cluster")
    )
    assert "  jobs: unknown, squeue failed: no cluster" in portal_status.status(folder)


def test_a_folder_without_a_portal_is_an_error_naming_it(tmp_path):
    with pytest.raises(
        PortalError, match=rf"no portal in {tmp_path}: the folder holds"
    ):
        portal_status.status(tmp_path)
    with pytest.raises(PortalError, match=r"the folder does not exist. HINT: start"):
        portal_status.status(tmp_path / "none")


def _with_board(folder: Path) -> dict:
    settings = json.loads((folder / "portal.json").read_text())
    settings |= {"board_port": 8124, "instructor": "pupiladmin"}
    (folder / "portal.json").write_text(json.dumps(settings))
    return settings


def test_the_board_is_named_with_its_address_and_whom_to_log_in_as(folder, monkeypatch):
    _with_board(folder)
    monkeypatch.setattr(portal_status, "hub_pid", lambda folder: 4321)
    asked = []
    monkeypatch.setattr(
        portal_status, "board_answers", lambda port: asked.append(port) or True
    )
    lines = portal_status.status(folder).splitlines()
    assert lines[2] == (
        "  board      http://127.0.0.1:8123/services/board/ (log in as pupiladmin)"
    )
    assert asked == [8124]  # its own port, behind the proxy
    # Not answering: said, with what happens next (the hub starts it again).
    monkeypatch.setattr(portal_status, "board_answers", lambda port: False)
    text = portal_status.status(folder)
    assert "  board      NOT answering on port 8124: the hub starts it\n" in text
    assert all(len(line) <= 88 for line in text.splitlines())
    # A dead hub: the board went with it (the hub's service), and comes back
    # with it.
    monkeypatch.setattr(portal_status, "hub_pid", lambda folder: None)
    text = portal_status.status(folder)
    assert (
        "  board      stopped with the hub (then at "
        "http://127.0.0.1:8123/services/board/)" in text
    )


def test_a_class_from_before_the_board_says_it_has_none(folder, monkeypatch):
    monkeypatch.setattr(portal_status, "hub_pid", lambda folder: 4321)
    text = portal_status.status(folder)
    assert "  board      none: the class began before the board; portal restart" in text


def test_the_boards_port_is_asked_whether_it_answers():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert portal_status.board_answers(port) is True
    assert portal_status.board_answers(port) is False  # closed now


def test_the_boards_processes_are_found_by_their_state_folder(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    sleeping = "import time; time.sleep(60)"
    started = [
        subprocess.Popen([sys.executable, "-c", sleeping, "-m",
                          "workshop.instructor.board", "--state", str(f / "board")])
        for f in (ours, theirs)
    ]  # fmt: skip
    try:
        wait_exec([process.pid for process in started], "workshop.instructor.board")
        assert portal_status.board_pids(ours) == [started[0].pid]
        assert portal_status.board_pids(theirs) == [started[1].pid]
        assert portal_status.board_pids(tmp_path) == []
    finally:
        for process in started:
            process.kill()
            process.wait()
