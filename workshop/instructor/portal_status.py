"""What an instructor sees of a private portal (``python -m workshop portal status``):
is its hub alive, where it answers, and each learner's Slurm jobs with their state,
the time they have left and their node, in a table that fits a projector::

    portal in /work/main/.portal
      hub        running (pid 41235) at http://127.0.0.1:8123/
      board      http://127.0.0.1:8123/services/board/ (log in as instructor)
      passwords  /work/main/.portal/secrets/passwords.txt (root only)

      user        job  state     time left  node       job name
      learner01    17  RUNNING     1:58:12  127.0.0.2  jupyter-learner01
      learner02     -  no job
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
from pathlib import Path

from .._house import WIDTH
from .._procs import is_alive
from .portal_learners import PortalError, _pid, portal_command

# The class board's service name: its page is at /services/board/ (portal_hub.py).
BOARD = "board"


def board_url(url: str) -> str:
    """The class board's address on the hub that answers at ``url``.

    Example:
        >>> board_url("http://127.0.0.1:8123/")
        'http://127.0.0.1:8123/services/board/'
    """
    return f"{url}services/{BOARD}/"


def board_answers(port: int) -> bool:
    """Whether the board's own port (on 127.0.0.1, behind the proxy) takes a
    connection now (within 2 s).

    Args:
        port: the board's port (``board_port`` in portal.json).

    Returns:
        True when something listens there.

    Example:
        >>> board_answers(8124)  # doctest: +SKIP
        True
    """
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def board_pids(folder: Path) -> list[int]:
    """The processes of the class board of the portal in ``folder``: those whose
    command line runs ``workshop.instructor.board`` on its state folder.

    Args:
        folder: the portal's folder (absolute, as start wrote it).

    Returns:
        Their pids; [] where none runs.

    Example:
        >>> board_pids(Path("/nowhere"))
        []
    """
    state = str(folder / BOARD).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if b"workshop.instructor.board" in words and state in words:
            found.append(int(entry.name))
    return found


def _board_lines(settings: dict, url: str, hub_runs: bool) -> list[str]:
    """What ``status`` says of the class board: where, and as whom to log in."""
    if "board_port" not in settings:
        return ["none: the class began before the board; portal restart adds it"]
    if not hub_runs:
        return [f"stopped with the hub (then at {board_url(url)})"]
    if not board_answers(settings["board_port"]):
        return [
            f"NOT answering on port {settings['board_port']}: the hub starts it",
            "again once it sees it gone (see log/hub.log)",
        ]
    return [f"{board_url(url)} (log in as {settings['instructor']})"]


def no_portal(folder: Path) -> PortalError:
    """The error of an action on a folder that holds no portal."""
    where = "does not exist" if not folder.exists() else "holds no portal.json"
    return PortalError(
        f"no portal in {folder}: the folder {where}. HINT: start one with "
        f"{portal_command('start', folder)}, or name the folder of a running one "
        "with --folder"
    )


def read_settings(folder: Path) -> dict:
    """``folder/portal.json``, what ``start`` wrote.

    Raises:
        PortalError: there is no portal in ``folder``.
    """
    try:
        return json.loads((folder / "portal.json").read_text())
    except FileNotFoundError:
        raise no_portal(folder) from None


def hub_pid(folder: Path) -> int | None:
    """The pid of the portal's hub where it runs, else None (a stale pid file may
    name another process: it must run this portal's configuration)."""
    pid = _pid(folder / "run" / "hub.pid")
    if pid is None or not is_alive(pid):
        return None
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    config = str(folder / "jupyterhub_config.py").encode()
    return pid if config in command else None


def gone_from_the_class(settings: dict, names: list[str]) -> list[str]:
    """What a class lost that its hub needs to start again: its users, its Slurm
    cluster (and with it the servers); empty when nothing is lost."""
    problems = []
    missing = []
    for name in names:
        try:
            pwd.getpwnam(name)
        except KeyError:
            missing.append(name)
    if missing:
        problems.append(f"its users {', '.join(missing)} no longer exist")
    env = dict(os.environ, SLURM_CONF=settings["slurm_conf"])
    try:
        queue = subprocess.run(
            ["squeue", "-h", "-o", "%A"], env=env, capture_output=True, timeout=30
        )
        answered = queue.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        answered = False
    if not answered:
        problems.append(
            f"its Slurm cluster ({settings['slurm_conf']}) does not answer, and the "
            "learners' servers ended with it"
        )
    return problems


def _jobs(
    names: list[str], slurm_conf: str
) -> tuple[dict[str, list[list[str]]], str | None]:
    """Each user's jobs as [job id, state, time left, node or pending reason, job
    name], and what went wrong asking Slurm, if it did."""
    command = ["squeue", "-h", "-u", ",".join(names), "-o", "%u|%A|%T|%L|%N|%r|%j"]
    env = dict(os.environ, SLURM_CONF=slurm_conf)
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return {}, f"squeue did not answer: {error}"
    if done.returncode != 0:
        return {}, f"squeue failed: {done.stderr.strip() or done.returncode}"
    jobs: dict[str, list[list[str]]] = {}
    for line in done.stdout.splitlines():
        user, job, state, left, node, reason, name = line.split("|", 6)
        where = node or f"({reason})"
        jobs.setdefault(user, []).append([job, state, left, where, name])
    return jobs, None


def _table(rows: list[list[str]]) -> list[str]:
    """Rows as aligned columns, each line cut to fit :data:`WIDTH`."""
    widths = [max(len(row[i]) for row in rows if len(row) > i) for i in range(6)]
    right = {1, 3}
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        line = ("  " + "  ".join(cells)).rstrip()
        if len(line) > WIDTH:
            line = line[: WIDTH - 1] + "…"
        lines.append(line)
    return lines


def _command_lines(command: str, indent: int) -> list[str]:
    """``command`` on as few lines as fit :data:`WIDTH` at ``indent``, continued
    (``\\``) before " --" and after " && " only, so that it pastes whole."""
    pieces = []
    parts = command.split(" && ")
    for number, part in enumerate(parts):
        first, *options = part.split(" --")
        words = [first, *(f"--{option}" for option in options)]
        if number < len(parts) - 1:
            words[-1] += " &&"
        pieces += words
    lines = [pieces[0]]
    for piece in pieces[1:]:
        if indent + len(lines[-1]) + 1 + len(piece) + 2 <= WIDTH:
            lines[-1] += f" {piece}"
        else:
            lines[-1] += " \\"
            lines.append(f"    {piece}")
    return lines


def status(folder: str | os.PathLike[str]) -> str:
    """The portal in ``folder``: its hub, the instructor's class board, the
    passwords file, and every learner's jobs, one line each, at most 88 columns.

    Raises:
        PortalError: there is no portal in ``folder``.

    Example:
        >>> print(status(".portal"))   # doctest: +SKIP
    """
    folder = Path(folder).resolve()
    settings = read_settings(folder)
    url = f"http://127.0.0.1:{settings['port']}/"
    pid = hub_pid(folder)
    if pid:
        hub = [f"running (pid {pid}) at {url}"]
    else:  # the learners' jobs outlive it: say how to get them back
        hub = [
            f"NOT running (it answered at {url}). Start it again,",
            "keeping the learners and their servers (their jobs below):",
            *_command_lines(portal_command("start", folder), 13),
        ]
    board = _board_lines(settings, url, pid is not None)
    lines = [
        f"portal in {folder}",  # the only line with the folder: it fits from here
        f"  hub        {hub[0]}",
        *(f"             {more}" for more in hub[1:]),
        f"  board      {board[0]}",
        *(f"             {more}" for more in board[1:]),
        "  passwords  in secrets/passwords.txt there (root only)",
        "",
    ]
    try:
        names = json.loads((folder / "users.json").read_text())["names"]
    except (OSError, ValueError, KeyError):
        names = []
    jobs, problem = _jobs(names, settings["slurm_conf"]) if names else ({}, None)
    if problem:
        lines.append(f"  jobs: unknown, {problem}")
        return "\n".join(lines)
    rows = [["user", "job", "state", "time left", "node", "job name"]]
    for name in names:
        rows += [[name, *job] for job in jobs.get(name, [])] or [[name, "-", "no job"]]
    lines += _table(rows)
    return "\n".join(lines)
