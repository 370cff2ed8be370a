"""A private cluster portal on this machine: JupyterHub with batchspawner's
SlurmSpawner on the private two-node Slurm cluster, as a site's portal works.

    python -m workshop portal start [--folder DIR] [--learners N]   # or: make portal
    python -m workshop portal status [--folder DIR]
    python -m workshop portal stop [--folder DIR]                   # make portal-stop
    python -m workshop portal classroom [--folder DIR]   # every learner at once

``start`` starts, in ``DIR`` (default ``.portal`` in the project):

- the private Slurm cluster (``scripts/local_slurm.sh``: nodes 127.0.0.2 and
  127.0.0.3);
- learners ``learner01``... and an ``instructor`` (an admin of the hub) as real local
  users whose homes are in ``DIR/home``, each with a password made now, written to
  ``DIR/secrets/passwords.txt`` (mode 0600) for the instructor to hand out;
- JupyterHub and its proxy (configurable-http-proxy, installed by ``make setup``
  into ``.venv/proxy``), both on 127.0.0.1 only.

A learner logs in, the hub submits a Slurm job as that learner, and JupyterLab runs
inside the job on a node, on a copy of the notebooks in the learner's home.
``stop`` stops the hub (which cancels every server's job), then the cluster, kills
whatever any learner still runs, removes the users it made, and says what was left.
Everything needs root (slurmd starts jobs as their users; users are made with
``useradd``). The learners' accounts and Python are in ``portal_learners.py``, what
runs inside the hub in ``portal_hub.py``, the classroom in ``portal_classroom.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .._procs import is_alive
from ..cluster import slurm_here, slurm_watchdog
from ..cluster.ports import quiet_ports
from ..cluster.slurm_watchdog import _quiet
from .portal_classroom import classroom
from .portal_learners import (
    PortalError,
    _end,
    _make_user,
    _pid,
    closed_to_others,
    hash_password,
    learner_python,
    processes_of,
)

ROOT = Path(__file__).resolve().parents[2]
LOCAL_SLURM = ROOT / "scripts" / "local_slurm.sh"
DEFAULT_FOLDER = ROOT / ".portal"
INSTRUCTOR = "instructor"  # the hub's admin, with the default prefix "learner"
# Slurm's job sockets live in FOLDER/slurm/NODE/...: local_slurm.sh allows 68
# characters for that folder.
MAX_FOLDER = 60


@dataclass
class Portal:
    """A running portal: where it answers and who may log in."""

    folder: Path
    url: str
    learners: list[str]
    passwords: dict[str, str] = field(repr=False)
    slurm_conf: Path
    hub_pid: int
    instructor: str = INSTRUCTOR

    def token(self) -> str:
        """The hub's admin API token (``DIR/secrets/api_token``), for REST calls."""
        return (self.folder / "secrets" / "api_token").read_text().strip()


def _private_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, from the first byte."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def proxy_command() -> Path:
    """configurable-http-proxy as ``make setup`` installs it (``.venv/proxy``), else
    one on PATH.

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
    if len(str(folder)) > MAX_FOLDER:
        problems.append(
            f"the folder {folder} has {len(str(folder))} characters; Slurm's "
            f"job sockets in it need one of at most {MAX_FOLDER}"
        )
    if problems:
        raise PortalError(
            "the private portal cannot start here: " + "; ".join(problems) + ". "
            "HINT: run it as root on a machine with Slurm and munge (make setup "
            "installs them as root), or offer the workshop on a real site's "
            "JupyterHub (docs/portal.md)"
        )


def _wait_for_hub(url: str, hub: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if hub.poll() is not None:
            raise PortalError(
                f"JupyterHub exited with status {hub.returncode} while starting; the "
                f"end of its log ({log}):\n" + _tail(log)
            )
        try:
            with urllib.request.urlopen(url + "hub/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise PortalError(
        f"JupyterHub did not answer at {url}hub/health within {timeout:.0f} s; the end "
        f"of its log ({log}):\n" + _tail(log)
    )


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start(
    folder: str | os.PathLike[str] = DEFAULT_FOLDER,
    learners: int = 6,
    prefix: str = "learner",
    cpus_per_server: int = 1,
    time_limit: str = "02:00:00",
    start_timeout: float = 120,
    slurm_conf: str | os.PathLike[str] | None = None,
) -> Portal:
    """Start the private portal in ``folder`` (see the module's docstring).

    Args:
        folder: where everything lives; a portal already running there is stopped
            first.
        learners: how many learner accounts to make (1 to 99).
        prefix: the learners' names are PREFIX01, PREFIX02, ...
        cpus_per_server: CPUs of each learner's Slurm job (``--cpus-per-task``).
        time_limit: each server job's ``--time``.
        start_timeout: seconds a learner's server may take to start.
        slurm_conf: the ``slurm.conf`` of a running private cluster (its folder
            readable by the learners) to use instead of one in ``folder/slurm``, as
            the tests do; ``stop`` then cancels only the portal's jobs.

    Returns:
        The running :class:`Portal`.

    Raises:
        ValueError: a bad argument.
        PortalError: it cannot start here (not root, no Slurm, no proxy), or a part
            of it failed; what was started is stopped again.

    Example:
        >>> portal = start("/tmp/portal", learners=2)   # doctest: +SKIP
        >>> portal.url, portal.learners                  # doctest: +SKIP
        ('http://127.0.0.1:41235/', ['learner01', 'learner02'])
    """
    if type(learners) is not int or not 1 <= learners <= 99:  # bool is not a number
        raise ValueError(f"learners={learners!r}: give a whole number from 1 to 99")
    if not prefix.isalpha() or not prefix.islower() or len(prefix) > 20:
        raise ValueError(
            f"prefix={prefix!r}: give lower-case letters only (at most 20), "
            "as in 'learner'"
        )
    folder = Path(folder).resolve()
    _check_can_start(folder)
    proxy = proxy_command()
    if (folder / "portal.json").exists():
        stop(folder)
    for sub in ("run", "log", "secrets", "home"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)  # learners reach their homes through it
    (folder / "secrets").chmod(0o700)
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
        port, hub_port, api_port = quiet_ports(3)
        settings = {
            "root": str(ROOT),
            "port": port,
            "hub_port": hub_port,
            "proxy_api_port": api_port,
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
        config = folder / "jupyterhub_config.py"
        config.write_text(
            "# Written by workshop.instructor.portal; the settings: portal.json.\n"
            "from workshop.instructor.portal_hub import configure\n\n"
            f"configure(c, {str(folder)!r})  # noqa: F821 (c is JupyterHub's)\n"
        )
        env = _hub_env(folder, conf)
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
        url = f"http://127.0.0.1:{port}/"
        _wait_for_hub(url, hub, log, 60)
    except BaseException:
        stop(folder)
        raise
    return Portal(folder, url, names[:-1], passwords, conf, hub.pid, admin)


def stop_command(folder: str | os.PathLike[str]) -> str:
    """The shell command that stops the portal in ``folder``, from any shell: this
    Python, run from the project root (where the package is found, whatever folder
    the shell is in and whether or not the package is installed)."""
    return (
        f"cd {shlex.quote(str(ROOT))} && {shlex.quote(sys.executable)} -m workshop "
        f"portal stop --folder {shlex.quote(str(Path(folder).resolve()))}"
    )


def _hub_env(folder: Path, conf: Path) -> dict[str, str]:
    """The hub's environment: this one, with the proxy's token (the hub hands it to
    the proxy through the environment too) and the cluster's SLURM_CONF."""
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


@dataclass
class Stopped:
    """What ``stop`` found: jobs it had to cancel, processes it had to kill (both
    should be empty after a clean stop), and the users it removed."""

    jobs_left: list[str]
    killed: list[tuple[int, str, str]]
    users_removed: list[str]


def stop(folder: str | os.PathLike[str] = DEFAULT_FOLDER) -> Stopped:
    """Stop the portal in ``folder``: the hub (it stops every learner's server, which
    cancels its job, and its proxy), then the cluster; then kill whatever a learner
    still runs and remove the users ``start`` made.

    Returns:
        A :class:`Stopped` saying what had to be forced.
    """
    folder = Path(folder).resolve()
    found = folder / "portal.json"
    settings = json.loads(found.read_text()) if found.exists() else {}
    conf = Path(settings.get("slurm_conf", folder / "slurm" / "slurm.conf"))
    users = {"made": [], "names": []}
    if (folder / "users.json").exists():
        users = json.loads((folder / "users.json").read_text())
    # The hub first: on SIGTERM it stops each server (batchspawner's scancel) and
    # its proxy. Then whatever is left of them.
    _end(_pid(folder / "run" / "hub.pid"), 60)
    _end(_pid(folder / "run" / "proxy.pid"), 5)
    jobs_left: list[str] = []
    env = dict(os.environ, SLURM_CONF=str(conf))
    if not settings.get("own_cluster", True):
        # A cluster the portal did not start (start's slurm_conf): it keeps
        # running; only the jobs of the portal's users are cancelled.
        if users["names"]:
            queue = ["squeue", "-h", "-o", "%A", "-u", ",".join(users["names"])]
            jobs_left = _quiet(queue, env, 15).split()
        if jobs_left:
            _quiet(["scancel", *jobs_left], env, 15)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and _quiet(queue, env, 15):
                time.sleep(0.3)
    else:
        if (folder / "slurm" / "run" / "slurmctld.pid").exists():
            jobs_left = _quiet(["squeue", "-h", "-o", "%A"], env, 15).split()
        slurm_watchdog.stop_cluster(folder / "slurm", LOCAL_SLURM)
    killed = processes_of(users["names"])
    for pid, _, _ in killed:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    removed = []
    for name in users["made"]:
        done = subprocess.run(["userdel", name], capture_output=True)
        if done.returncode == 0:
            removed.append(name)
    for name in ("portal.json", "users.json", "run/hub.pid", "run/proxy.pid"):
        (folder / name).unlink(missing_ok=True)
    return Stopped(jobs_left, killed, removed)


def status(folder: str | os.PathLike[str] = DEFAULT_FOLDER) -> str:
    """One paragraph: is a portal running in ``folder``, where, and its jobs."""
    folder = Path(folder).resolve()
    if not (folder / "portal.json").exists():
        return f"no portal in {folder} (start one: python -m workshop portal start)"
    settings = json.loads((folder / "portal.json").read_text())
    hub = _pid(folder / "run" / "hub.pid")
    alive = hub is not None and is_alive(hub)
    env = dict(os.environ, SLURM_CONF=settings["slurm_conf"])
    queue = _quiet(["squeue", "-h", "-o", "%A %u %T %N"], env, 15)
    lines = [
        f"portal in {folder}: hub {'running' if alive else 'NOT running'} at "
        f"http://127.0.0.1:{settings['port']}/",
        f"passwords: {folder / 'secrets' / 'passwords.txt'} (root only)",
        "jobs: " + (", ".join(queue.split("\n")).strip() or "none"),
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------ command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m workshop portal``."""
    parser.add_argument(
        "action",
        choices=("start", "stop", "status", "classroom"),
        help="classroom: every learner at once runs notebook 02's "
        "launch cells on the running portal; the counts",
    )
    parser.add_argument(
        "--folder",
        default=str(DEFAULT_FOLDER),
        help="where the portal lives (default: .portal in the project)",
    )
    parser.add_argument(
        "--learners", type=int, default=6, help="learner accounts to make (default 6)"
    )


def run_from_args(args: argparse.Namespace) -> int:
    """``python -m workshop portal ACTION``: exit status 0, or 1 with the reason."""
    try:
        if args.action == "start":
            portal = start(args.folder, learners=args.learners)
            print(
                f"portal: {portal.url} (on 127.0.0.1 only; from another machine: "
                f"ssh -L {portal.url.rsplit(':', 1)[1].strip('/')}:127.0.0.1:"
                f"{portal.url.rsplit(':', 1)[1].strip('/')} THIS-MACHINE)"
            )
            print(f"learners: {', '.join(portal.learners)}; admin: {portal.instructor}")
            print(
                f"passwords: {portal.folder / 'secrets' / 'passwords.txt'} (root only)"
            )
            print(f"stop it: {stop_command(portal.folder)}")
        elif args.action == "stop":
            stopped = stop(args.folder)
            print(
                f"portal in {Path(args.folder).resolve()} stopped: "
                f"{len(stopped.jobs_left)} jobs were still queued, "
                f"{len(stopped.killed)} learner processes had to be killed, "
                f"{len(stopped.users_removed)} users removed"
            )
        elif args.action == "classroom":
            if not (Path(args.folder) / "portal.json").exists():
                raise PortalError(f"no portal runs in {args.folder}: make portal first")
            result = classroom(args.folder)
            print(result.summary())
            return 1 if result.failures else 0
        else:
            print(status(args.folder))
    except (PortalError, ValueError) as error:
        print(f"workshop portal: {error}", file=sys.stderr)
        return 1
    return 0
