"""A private cluster portal on this machine: JupyterHub with batchspawner's
SlurmSpawner on the private two-node Slurm cluster, as a site's portal works.

    python -m workshop portal start [--folder DIR] [--learners N]   # or: make portal
    python -m workshop portal status [--folder DIR]
    python -m workshop portal restart [--folder DIR]   # the hub only; the class stays
    python -m workshop portal stop [--folder DIR] [--keep-homes ARCHIVE]
    python -m workshop portal classroom [--folder DIR]   # every learner at once

``start`` starts, in ``DIR`` (default ``.portal``), the private Slurm cluster, local
users ``learner01``... and an ``instructor`` (passwords in
``DIR/secrets/passwords.txt``), and JupyterHub with its proxy on 127.0.0.1. The class
outlives its hub (the servers are Slurm jobs): ``start`` on a folder whose hub died
starts it again with the same users, ports and jobs; only ``stop`` ends the class.
It needs root (slurmd starts jobs as their users; ``useradd``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..checks import whole
from ..cluster import slurm_here
from ..cluster.ports import quiet_ports
from ..cluster.slurm_here import LOCAL_SLURM
from .portal_classroom import Hub, classroom
from .portal_handover import Stopped, check_archive, end_hub, stop
from .portal_learners import (
    DEFAULT_FOLDER,
    ROOT,
    PortalError,
    _end,
    _make_user,
    check_folder,
    closed_to_others,
    hash_password,
    learner_python,
    portal_command,
    unreachable,
)
from .portal_status import (
    board_url,
    gone_from_the_class,
    hub_pid,
    no_portal,
    read_settings,
    status,
)

INSTRUCTOR = "instructor"  # the hub's admin, with the default prefix "learner"
# Slurm's job sockets live in FOLDER/slurm/NODE/...: local_slurm.sh allows 68
# characters for that folder.
MAX_FOLDER = 60


@dataclass
class Portal:
    """A running portal: where it answers and who may log in. ``outcome`` says what
    ``start`` did: "started" a new class, found it "running" (nothing changed), or
    "restarted" its hub, which kept ``servers_kept`` learners' servers."""

    folder: Path
    url: str
    learners: list[str]
    passwords: dict[str, str] = field(repr=False)
    slurm_conf: Path
    hub_pid: int
    instructor: str = INSTRUCTOR
    outcome: str = "started"
    servers_kept: int = 0

    def token(self) -> str:
        """The hub's admin API token (``DIR/secrets/api_token``), for REST calls."""
        return (self.folder / "secrets" / "api_token").read_text().strip()

    @property
    def board_url(self) -> str:
        """The instructor's class board, a service of the hub, through its proxy."""
        return board_url(self.url)


def _private_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, from the first byte."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def proxy_command() -> Path:
    """configurable-http-proxy from ``make setup`` (``.venv/proxy``), else PATH.

    Raises:
        PortalError: none is installed, with how to get it.
    """
    local = (
        Path(sys.prefix) / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
    )
    if local.exists():
        return local
    found = shutil.which("configurable-http-proxy")
    if found:
        return Path(found)
    raise PortalError(
        "configurable-http-proxy (JupyterHub's proxy, a Node.js program) is not "
        f"installed: not in {local.parent} and not on PATH. HINT: make setup installs "
        "it with npm from portal/package.json (it needs node and npm: apt-get install "
        "nodejs npm)"
    )


def _check_can_start(folder: Path) -> None:
    problems = []
    if os.geteuid() != 0:
        problems.append(
            "it needs root (slurmd starts jobs as their users, and the "
            "learners are made with useradd)"
        )
    for tool in ("slurmctld", "slurmd", "munged", "useradd", "runuser"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} is not installed")
    problems.extend(closed_to_others())
    # The machine's problems get the hint below; the folder's say their own fix.
    hint = (
        " HINT: run it as root on a machine with Slurm and munge (make setup "
        "installs them as root), or offer the workshop on a real site's "
        "JupyterHub (docs/portal.md)"
        if problems
        else ""
    )
    problems.extend(unreachable(folder))
    if len(str(folder)) > MAX_FOLDER:
        problems.append(
            f"the folder {folder} has {len(str(folder))} characters; Slurm's "
            f"job sockets in it need one of at most {MAX_FOLDER}: give a shorter "
            "--folder"
        )
    if problems:
        raise PortalError(
            "the private portal cannot start here: " + "; ".join(problems) + "." + hint
        )


def _wait_for_hub(url: str, hub: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and hub.poll() is None:
        try:
            with urllib.request.urlopen(url + "hub/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    if hub.poll() is not None:
        why = f"JupyterHub exited with status {hub.returncode} while starting"
    else:
        why = f"JupyterHub did not answer at {url}hub/health within {timeout:.0f} s"
    raise PortalError(f"{why}; the end of its log ({log}):\n" + _tail(log))


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start(
    folder: str | os.PathLike[str] = DEFAULT_FOLDER,
    learners: int | None = None,
    prefix: str | None = None,
    cpus_per_server: int = 1,
    time_limit: str = "02:00:00",
    start_timeout: float = 300,
    slurm_conf: str | os.PathLike[str] | None = None,
) -> Portal:
    """Start the private portal in ``folder``, or reattach to the class there: a
    running hub is left as it is; a dead one starts again with the class's own
    settings (the other arguments unused), keeping the servers that still run.

    Args:
        folder: where everything lives.
        learners: learner accounts to make (1 to 99; 6 by default); refused where
            the folder's class has another number.
        prefix: the learners' names are PREFIX01, ... ("learner"); refused where
            the folder's class has others.
        cpus_per_server: CPUs of each learner's Slurm job (``--cpus-per-task``).
        time_limit: each server job's ``--time``.
        start_timeout: seconds for each of the hub's two waits on a server.
        slurm_conf: a running private cluster's ``slurm.conf`` to use instead of
            one in ``folder/slurm`` (the tests'); ``stop`` cancels only its jobs.

    Returns:
        The running :class:`Portal`; its ``outcome`` says what happened.

    Raises:
        ValueError: a bad argument or ``folder`` (:func:`check_folder`); nothing
            was made.
        PortalError: it cannot start here, or a part failed; a new portal is
            stopped again, a class whose hub would not restart is left as it was.

    Example:
        >>> portal = start("/tmp/portal", learners=2)   # doctest: +SKIP
        >>> portal.url, portal.learners                  # doctest: +SKIP
        ('http://127.0.0.1:41235/', ['learner01', 'learner02'])
    """
    if learners is not None:  # the learners' names have two digits
        whole("learners", learners, most=99, fix="e.g. learners=6")
    if prefix is not None and (
        not prefix.isalpha() or not prefix.islower() or len(prefix) > 20
    ):
        raise ValueError(
            f"prefix={prefix!r}: give lower-case letters only (at most 20), "
            "as in 'learner'"
        )
    folder = check_folder(folder)
    if (folder / "portal.json").exists():
        return _reattach(folder, learners, prefix)
    learners = 6 if learners is None else learners
    prefix = "learner" if prefix is None else prefix
    _check_can_start(folder)
    proxy = proxy_command()
    made_above = [parent for parent in folder.parents if not parent.exists()]
    for sub in ("run", "log", "secrets", "home", "board"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    # The learners reach their homes through it, and through the folders made
    # above it (a umask of 077 would have closed them).
    for opened in [folder, *made_above]:
        opened.chmod(0o755)
    # The board's state names each learner and what they did: root's only.
    for private in ("secrets", "board"):
        (folder / private).chmod(0o700)
    # Another prefix (a test's) gets an admin of its own, so that two portals never
    # share, move or remove each other's users.
    admin = INSTRUCTOR if prefix == "learner" else f"{prefix}admin"
    names = [f"{prefix}{i:02d}" for i in range(1, learners + 1)] + [admin]
    try:
        made = [name for name in names if _make_user(name, folder / "home" / name)]
        _write_json(folder / "users.json", {"made": made, "names": names})
        python, python_env = learner_python(folder, names[0])
        if slurm_conf is None:
            cmd = ["bash", str(LOCAL_SLURM), "start", str(folder / "slurm")]
            started = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
            if started.returncode != 0:
                raise PortalError(
                    f"the private Slurm cluster did not start: {started.stderr.strip()}"
                )
            conf = folder / "slurm" / "slurm.conf"
            slurm_here._unique_job_ids(conf)
        else:
            conf = Path(slurm_conf).resolve()
        passwords = {name: secrets.token_urlsafe(9) for name in names}
        hashes = {}
        for name, password in passwords.items():
            salt = secrets.token_bytes(16)
            hashes[name] = {"salt": salt.hex(), "hash": hash_password(password, salt)}
        _private_file(folder / "secrets" / "learners.json", json.dumps(hashes))
        _private_file(
            folder / "secrets" / "passwords.txt",
            "".join(f"{name} {pw}\n" for name, pw in passwords.items()),
        )
        for name in ("cookie_secret", "proxy_token", "api_token"):
            _private_file(folder / "secrets" / name, secrets.token_hex(32))
        # Below the system's own port range: no outgoing connection takes them.
        port, hub_port, api_port, board_port = quiet_ports(4)
        settings = {
            "root": str(ROOT),
            "port": port,
            "hub_port": hub_port,
            "proxy_api_port": api_port,
            "board_port": board_port,
            "proxy": str(proxy),
            "python": str(python),
            "python_env": python_env,
            "instructor": admin,
            "slurm_conf": str(conf),
            "own_cluster": slurm_conf is None,
            "cpus_per_server": cpus_per_server,
            "time_limit": time_limit,
            "start_timeout": start_timeout,
        }
        _write_json(folder / "portal.json", settings)
        (folder / "jupyterhub_config.py").write_text(
            "# Written by workshop.instructor.portal; the settings: portal.json.\n"
            "from workshop.instructor.portal_hub import configure\n\n"
            f"configure(c, {str(folder)!r})  # noqa: F821 (c is JupyterHub's)\n"
        )
        hub = _start_hub(folder, settings)
    except BaseException:
        stop(folder)
        raise
    return Portal(folder, _url(settings), names[:-1], passwords, conf, hub, admin)


def _url(settings: dict) -> str:
    return f"http://127.0.0.1:{settings['port']}/"


def _start_hub(folder: Path, settings: dict) -> int:
    """Start JupyterHub and wait until it answers (60 s at most); its pid."""
    config = folder / "jupyterhub_config.py"  # hub_pid knows the hub by it
    env = _hub_env(folder, Path(settings["slurm_conf"]))
    log = folder / "log" / "hub.log"
    # The hub's log and database name the learners and their servers: readable by
    # the portal's owner only (an empty file is a new database to SQLite).
    for private in (log, folder / "hub.sqlite"):
        os.close(os.open(private, os.O_CREAT | os.O_WRONLY, 0o600))
        os.chmod(private, 0o600)
    with open(log, "ab") as out:
        hub = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(config)],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for_hub(_url(settings), hub, log, 60)
    except PortalError:
        _end(hub.pid, 10)  # one that hangs; it leaves the servers running
        raise
    return hub.pid


def _reattach(folder: Path, learners: int | None, prefix: str | None) -> Portal:
    """The class in ``folder``: as it runs, or with its hub started again."""
    settings = read_settings(folder)
    try:
        users = json.loads((folder / "users.json").read_text())
    except (OSError, ValueError) as error:
        raise PortalError(
            f"the portal in {folder} has no readable users.json ({error}), so its "
            f"class cannot come back. HINT: end it ({portal_command('stop', folder)})"
            " and start a new one"
        ) from error
    names = [name for name in users["names"] if name != settings["instructor"]]
    asked = []
    if learners is not None and learners != len(names):
        asked.append(f"--learners {learners}")
    if prefix is not None and names and names[0] != f"{prefix}01":
        asked.append(f"prefix {prefix!r}")
    if asked:
        raise PortalError(
            f"the portal in {folder} has {len(names)} learners ({names[0]} to "
            f"{names[-1]}), and you asked for {' and '.join(asked)}. HINT: stop it "
            f"first ({portal_command('stop', folder)}), then start a new one; or leave "
            "out --learners to come back to this class"
        )
    passwords = {}
    with contextlib.suppress(OSError):  # the instructor may have moved it away
        for line in (folder / "secrets" / "passwords.txt").read_text().splitlines():
            name, _, password = line.partition(" ")
            passwords[name] = password
    portal = Portal(
        folder,
        _url(settings),
        names,
        passwords,
        Path(settings["slurm_conf"]),
        0,
        settings["instructor"],
        outcome="running",
    )
    running = hub_pid(folder)
    if running is not None:
        portal.hub_pid = running
        return portal
    _check_can_start(folder)
    problems = gone_from_the_class(settings, users["names"])
    if problems:
        raise PortalError(
            f"the class in {folder} cannot be started again: {'; '.join(problems)}. "
            f"HINT: end it ({portal_command('stop', folder)}) and start a new one"
        )
    _give_board(folder, settings)
    # The proxy outlives a killed hub; the new hub stops it by its pid file, starts
    # its own, and routes each server of its database that still answers.
    try:
        portal.hub_pid = _start_hub(folder, settings)
    except PortalError as error:
        raise PortalError(
            f"{error}\nThe class is kept as it was (users, passwords, the learners' "
            "jobs). HINT: see the hub's log, then try again ("
            f"{portal_command('start', folder)}), or end the class ("
            f"{portal_command('stop', folder)})"
        ) from error
    portal.outcome = "restarted"
    portal.servers_kept = len(Hub.of(folder).servers_answering(names, 60))
    return portal


def _give_board(folder: Path, settings: dict) -> None:
    """The board's folder (0700), and a port for it where the class began before
    the board existed: its hub, started again, starts the board too. The servers
    started before then post nothing; a new server of theirs does."""
    (folder / "board").mkdir(mode=0o700, exist_ok=True)
    if "board_port" in settings:
        return
    taken = {settings[key] for key in ("port", "hub_port", "proxy_api_port")}
    settings["board_port"] = next(
        port for port in iter(lambda: quiet_ports(1)[0], None) if port not in taken
    )
    _write_json(folder / "portal.json", settings)


def restart(folder: str | os.PathLike[str] = DEFAULT_FOLDER) -> Portal:
    """Stop the portal's hub and start it again as ``start`` does after a crash;
    the learners' servers keep running and the new hub takes them back.

    Returns:
        The :class:`Portal`, ``outcome`` "restarted".

    Raises:
        PortalError: there is no portal in ``folder``, or its hub did not start.
    """
    folder = Path(folder).resolve()
    read_settings(folder)  # a portal is there
    # SIGTERM: the hub stops its proxy and leaves every server running.
    end_hub(folder)
    return _reattach(folder, None, None)


def stop_command(folder: str | os.PathLike[str]) -> str:
    """The shell command that stops the portal in ``folder``, from any folder."""
    return portal_command("stop", folder)


def _hub_env(folder: Path, conf: Path) -> dict[str, str]:
    """This environment, with the proxy's token and the cluster's SLURM_CONF."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["CONFIGPROXY_AUTH_TOKEN"] = (folder / "secrets" / "proxy_token").read_text()
    env["SLURM_CONF"] = str(conf)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), env.get("PYTHONPATH")])
    )
    return env


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


# ------------------------------------------------------------------ command line
def _learners_count(text: str) -> int:
    """An argparse ``type=``: 1 to 99 learners (their names have two digits)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 99:
        raise argparse.ArgumentTypeError(
            f"{text} is not a whole number from 1 to 99 (the learners' names have "
            "two digits); e.g. --learners 6"
        )
    return value


_learners_count.__name__ = "number of learners"  # what argparse names in errors


def _portal_folder(text: str) -> str:
    """An argparse ``type=``: a folder, or a path where one can be made."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text} is a file, not a folder; e.g. --folder .portal"
        )
    return text


_portal_folder.__name__ = "folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m workshop portal``."""
    parser.add_argument(
        "action",
        choices=("start", "stop", "status", "restart", "classroom"),
        help="start a class, or come back to it after its hub died; stop it "
        "(everything of its learners goes); status: the hub and each learner's "
        "jobs; restart: the hub only, the learners' servers keep running; "
        "classroom: every learner at once runs notebook 02's launch cells on the "
        "running portal",
    )
    parser.add_argument(
        "--folder",
        type=_portal_folder,
        default=str(DEFAULT_FOLDER),
        help="where the portal lives (default: .portal in the project)",
    )
    parser.add_argument(
        "--learners",
        type=_learners_count,
        default=None,
        help="learner accounts to make, 1 to 99 (default 6); used by start only "
        "(make portal-stop passes the same PORTAL_ARGS to stop)",
    )
    parser.add_argument(
        "--keep-homes",
        metavar="DIR",
        default=None,
        help="stop only: move the learners' homes and their files in /tmp (and "
        "the other places open to all) to DIR/NAME/, owned by root, instead of "
        "removing them",
    )


def _print_portal(portal: Portal) -> None:
    if portal.outcome == "running":
        print(
            f"portal in {portal.folder} is running already (hub pid "
            f"{portal.hub_pid}): nothing changed"
        )
    elif portal.outcome == "restarted":
        print(
            f"portal in {portal.folder}: hub restarted; {portal.servers_kept} "
            "learners' servers kept"
        )
    port = portal.url.rsplit(":", 1)[1].strip("/")
    print(
        f"portal: {portal.url} (on 127.0.0.1 only; from another machine: "
        f"ssh -L {port}:127.0.0.1:{port} THIS-MACHINE)"
    )
    print(f"learners: {', '.join(portal.learners)}; admin: {portal.instructor}")
    print(f"the instructor's board: {portal.board_url} (log in as {portal.instructor})")
    print(f"passwords: {portal.folder / 'secrets' / 'passwords.txt'} (root only)")
    print(f"stop it: {stop_command(portal.folder)}")


def _print_stopped(folder: Path, stopped: Stopped) -> None:
    files = stopped.files
    if files.archived:
        where = ", ".join(str(p) for p in files.archived.values())
        handed = f"{files.removed} of the learners' files and folders moved to {where}"
    else:
        handed = f"{files.removed} of the learners' files and folders removed"
    print(
        f"portal in {folder} stopped: {len(stopped.servers_stopped)} learners' "
        f"servers stopped, {len(stopped.jobs_left)} jobs were still queued, "
        f"{len(stopped.killed)} learner processes had to be killed, {handed}, "
        f"{files.ipc_removed} System V IPC objects removed, "
        f"{len(stopped.users_removed)} users removed"
    )
    for problem in stopped.problems:
        print(f"  while stopping the servers: {problem}")


def run_from_args(args: argparse.Namespace) -> int:
    """``python -m workshop portal ACTION``: exit status 0, or 1 with the reason in
    one line (``workshop portal: ...``)."""
    folder = Path(args.folder).resolve()
    try:
        if args.keep_homes is not None and args.action != "stop":
            raise ValueError(
                f"--keep-homes {args.keep_homes} is for stop only, not "
                f"{args.action}: {portal_command('stop', folder)} --keep-homes DIR"
            )
        if args.action == "start" or not args.folder.strip():
            # Named as given ("" and "." both resolve to the shell's folder), and
            # before anything is made.
            check_folder(args.folder, "--folder")
        if args.action != "start" and not (folder / "portal.json").exists():
            raise no_portal(folder)
        if args.action == "start":
            _print_portal(start(folder, learners=args.learners))
        elif args.action == "restart":
            _print_portal(restart(folder))
        elif args.action == "stop":
            if args.keep_homes is not None:
                check_archive(args.keep_homes, folder)  # before anything stops
            _print_stopped(folder, stop(folder, args.keep_homes))
        elif args.action == "classroom":
            result = classroom(folder)
            print(result.summary())
            return 1 if result.failures else 0
        else:
            print(status(folder))
    except (PortalError, ValueError) as error:
        print(f"workshop portal: {error}", file=sys.stderr)
        return 1
    return 0
