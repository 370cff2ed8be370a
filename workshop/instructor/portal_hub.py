"""What runs inside the private portal's JupyterHub: its configuration, the learners'
authenticator and the Slurm spawner. Only the hub's ``jupyterhub_config.py`` imports
it, so JupyterHub and batchspawner are imported here only.

A learner's server is a Slurm job the hub submits as that learner, its server in a
job step (``srun``) as on a site's portal; when a job ends without the hub stopping
it, the learner's next page says how (``portal_endings.py``, ``portal/templates``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import pwd
import shutil
import sys
from pathlib import Path
from typing import Any

from batchspawner import SlurmSpawner
from jupyterhub.auth import Authenticator
from traitlets import Dict, Unicode

from .board import INSTRUCTOR_SCOPE, INSTRUCTORS_GROUP
from .portal_endings import Ending, ending_of
from .portal_learners import hash_password
from .portal_status import BOARD, board_url

# The batch job of one learner's server ({{...}}: batchspawner's fields). --export:
# only what the hub hands the server. It listens on its node's address, where the
# hub looks for it (squeue's). --no-requeue: a job requeued after a node failure
# would look PENDING, and batchspawner would keep a server at the dead node. No
# SIGTERM trap: slurmstepd already writes "*** JOB 17 ... CANCELLED ..." to the log.
BATCH_SCRIPT = """#!/bin/bash
#SBATCH --job-name=jupyter-{{username}}
#SBATCH --output={{homedir}}/jupyter-%j.log
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
#SBATCH --no-requeue
#SBATCH --nodes=1
#SBATCH --ntasks=1
{% if nprocs %}#SBATCH --cpus-per-task={{nprocs}}
{% endif %}{% if runtime %}#SBATCH --time={{runtime}}
{% endif %}{% if partition %}#SBATCH --partition={{partition}}
{% endif %}
set -euo pipefail
JUPYTERHUB_SERVICE_URL="$(printf %s "$JUPYTERHUB_SERVICE_URL" |
    sed -E "s#^(https?://)[^:/]*#\\1$SLURMD_NODENAME#")"
export JUPYTERHUB_SERVICE_URL
echo "jupyter server of {{username}}: job $SLURM_JOB_ID on $SLURMD_NODENAME"
{{srun}} {{cmd}}
"""


class LearnerAuthenticator(Authenticator):
    """A fixed set of learners, each with a password made when the portal started
    (only its salted hash is here)."""

    learners = Dict(help="name -> {'salt': hex, 'hash': hex}").tag(config=True)

    async def authenticate(self, handler: Any, data: dict[str, str]) -> str | None:
        name = (data.get("username") or "").strip()
        entry = self.learners.get(name)
        if entry is None:
            return None
        given = hash_password(data.get("password") or "", bytes.fromhex(entry["salt"]))
        return name if hmac.compare_digest(given, entry["hash"]) else None


class PortalSpawner(SlurmSpawner):
    """batchspawner's SlurmSpawner submitting as the learner with ``runuser`` (no
    sudo), copying the notebooks into a new home, and keeping how a job ended."""

    # batchspawner's default is 0.0.0.0, every interface; start() resets the
    # address to this default, so it is set here, not only in the config.
    ip = Unicode("127.0.0.1").tag(config=True)
    workshop_root = Unicode(help="the project folder the notebooks come from").tag(
        config=True
    )
    learner_venv = Unicode(help="the environment the learners run").tag(config=True)
    instructor = Unicode(help="the portal's admin, named as such to a learner").tag(
        config=True
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.exec_prefix = "runuser -u {username} --"
        self.batch_script = BATCH_SCRIPT
        # How the last server job ended, or None: in the spawner's state, so it
        # survives a hub restart; clear_state keeps it (read after the job is gone).
        self.ending: dict[str, str] | None = None
        # The same while a new server starts, for the page that shows its progress.
        self.previous_ending: dict[str, str] | None = None

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.ending = state.get("job_ended")

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.ending:
            state["job_ended"] = self.ending
        return state

    async def start(self) -> Any:
        self.previous_ending, self.ending = self.ending, None
        # In a thread: a class pressing Start at once is a copy per learner, during
        # which the hub keeps answering.
        await asyncio.to_thread(
            copy_workshop,
            Path(self.workshop_root),
            self.user.name,
            Path(self.learner_venv),
        )
        return await super().start()

    async def poll(self) -> int | None:
        """batchspawner's poll; a job found gone is asked of Slurm how it ended."""
        job_id = self.job_id  # batchspawner's poll clears it when the job is gone
        status = await super().poll()
        if status is not None and job_id:
            ending = await asyncio.to_thread(
                ending_of, job_id, self.user.name, self.instructor
            )
            home = os.path.expanduser(f"~{self.user.name}").rstrip("/") + "/"
            if ending.log.startswith(home):
                ending.log = "~/" + ending.log[len(home) :]
            self.ending = ending.as_state()
            self.log.warning("%s: %s", self._log_name, ending.sentence())
        return status


# What a learner gets, in ~/scaling-pytorch-hpc: not ~/workshop, which a kernel
# would import in place of the workshop package (as a namespace package).
COPY = "scaling-pytorch-hpc"
COPIED = ("notebooks", "slurm", "docs")


def copy_workshop(root: Path, user: str, venv: Path | None = None) -> Path:
    """Copy the notebooks and what they open into ``~user/scaling-pytorch-hpc``,
    unless there already (a learner's work survives a restart); ``venv`` becomes
    its ``.venv``, as in a clone."""
    entry = pwd.getpwnam(user)
    target = Path(entry.pw_dir) / COPY
    if target.exists():
        return target
    partial = target.with_name(f".{COPY}-copying")
    shutil.rmtree(partial, ignore_errors=True)
    for name in COPIED:
        shutil.copytree(
            root / name,
            partial / name,
            ignore=shutil.ignore_patterns(
                "__pycache__", ".ipynb_checkpoints", "traces"
            ),
        )
    for folder, _, files in os.walk(partial):
        os.chown(folder, entry.pw_uid, entry.pw_gid)
        for file in files:
            os.chown(os.path.join(folder, file), entry.pw_uid, entry.pw_gid)
    if venv is not None:
        (partial / ".venv").symlink_to(venv, target_is_directory=True)
        os.lchown(partial / ".venv", entry.pw_uid, entry.pw_gid)
    partial.rename(target)
    return target


# Seconds each of the hub's two waits for a starting server may last: configure().
START_WAIT = 300.0


def configure(c: Any, folder: str | os.PathLike[str]) -> None:
    """Fill JupyterHub's config ``c`` from ``folder/portal.json``; secrets stay in
    files of mode 0600 or the environment, never on a command line."""
    folder = Path(folder)
    settings = json.loads((folder / "portal.json").read_text())
    learners = json.loads((folder / "secrets" / "learners.json").read_text())
    ip = "127.0.0.1"
    c.JupyterHub.bind_url = f"http://{ip}:{settings['port']}/"
    c.JupyterHub.hub_bind_url = f"http://{ip}:{settings['hub_port']}"
    c.JupyterHub.pid_file = str(folder / "run" / "hub.pid")
    c.JupyterHub.db_url = f"sqlite:///{folder / 'hub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(folder / "secrets" / "cookie_secret")
    # A hub that stops (restart, crash) leaves the learners' servers running, so the
    # class survives it; portal stop stops each one through the REST API instead.
    c.JupyterHub.cleanup_servers = False
    c.JupyterHub.cleanup_proxy = True
    c.ConfigurableHTTPProxy.command = [settings["proxy"]]
    c.ConfigurableHTTPProxy.api_url = f"http://{ip}:{settings['proxy_api_port']}"
    c.ConfigurableHTTPProxy.pid_file = str(folder / "run" / "proxy.pid")
    c.ConfigurableHTTPProxy.should_start = True

    # A service whose token (a file of mode 0600) may drive the hub's REST API:
    # the classroom test and an instructor's scripts start and stop servers with it.
    token = (folder / "secrets" / "api_token").read_text().strip()
    c.JupyterHub.services = [{"name": "classroom", "api_token": token}]
    c.JupyterHub.load_roles = [
        {
            "name": "classroom",
            "scopes": ["admin:users", "admin:servers", "access:servers", "tokens"],
            "services": ["classroom"],
        }
    ]

    c.JupyterHub.authenticator_class = LearnerAuthenticator
    c.LearnerAuthenticator.learners = learners
    c.Authenticator.allowed_users = set(learners)
    c.Authenticator.admin_users = {settings["instructor"]}

    c.JupyterHub.spawner_class = PortalSpawner
    c.PortalSpawner.workshop_root = settings["root"]
    c.PortalSpawner.req_nprocs = str(settings["cpus_per_server"])
    c.PortalSpawner.req_runtime = settings["time_limit"]
    c.PortalSpawner.req_partition = settings.get("partition", "")
    # The learners' Python (this environment's, or a venv on it that they may run:
    # workshop.instructor.portal_learners), its scripts first on PATH.
    python = settings["python"]
    bin_dir = str(Path(python).parent)
    c.PortalSpawner.batchspawner_singleuser_cmd = f"{python} -m batchspawner.singleuser"
    c.PortalSpawner.cmd = ["jupyterhub-singleuser"]
    # The same JupyterLab defaults as make lab's (scripts/lab-settings): no news prompt
    # over the corner of every page a learner projects.
    settings_dir = Path(settings["root"]) / "scripts" / "lab-settings"
    c.PortalSpawner.args = [f"--LabApp.app_settings_dir={settings_dir}"]
    c.PortalSpawner.learner_venv = str(Path(python).parent.parent)
    # The server's root is the learner's whole copy, so that the notebooks' links to
    # ../docs/glossary.md and ../slurm/ open; JupyterLab opens in notebooks/, and a
    # kernel still starts in the folder of its notebook.
    c.PortalSpawner.notebook_dir = f"~/{COPY}"
    c.PortalSpawner.default_url = "/lab/tree/notebooks"
    c.PortalSpawner.instructor = settings["instructor"]
    c.PortalSpawner.environment = {
        "SLURM_CONF": settings["slurm_conf"],
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        **settings["python_env"],
    }
    if "board_port" in settings:  # a portal.json from before the board has none
        add_board(c, folder, settings)
    # Two waits in turn: start_timeout (sbatch until the server reports its port)
    # and http_timeout (until JupyterLab answers). Six learners at once on the
    # 2-core machine took 30-60 s in all; START_WAIT, 5 times the longest, leaves
    # room for a machine or class five times as busy.
    wait = max(float(settings["start_timeout"]), START_WAIT)
    c.PortalSpawner.start_timeout = int(wait)
    c.PortalSpawner.http_timeout = int(wait)
    c.PortalSpawner.startup_poll_interval = 0.5
    # Every 10 s (JupyterHub's default: 30 s), so that a learner whose job ended is
    # told why within about 10 s.
    c.PortalSpawner.poll_interval = 10

    # JupyterHub's pages, extended with why the job ended and what is kept.
    c.JupyterHub.template_paths = [str(Path(settings["root"]) / "portal" / "templates")]
    c.JupyterHub.template_vars = {
        "job_ended": job_ended,
        "kept_folder": f"~/{COPY}",
        "autosave_seconds": autosave_seconds(settings_dir),
    }


def add_board(c: Any, folder: Path, settings: dict[str, Any]) -> None:
    """Add the class board to JupyterHub's config ``c``: a service the hub starts
    and restarts, its scope and roles, and what each learner's server needs to
    post to it (a token that may reach it, and its address). docs/portal.md shows
    the same lines for a site's own hub.

    Args:
        c: JupyterHub's config, its services, roles and spawner's environment set.
        folder: the portal's folder; the board keeps its state in ``folder/board``.
        settings: portal.json's, with ``board_port``.

    Example:
        >>> add_board(c, Path(".portal"), settings)  # doctest: +SKIP
    """
    access = f"access:services!service={BOARD}"
    c.JupyterHub.custom_scopes = {
        INSTRUCTOR_SCOPE: {"description": "read the class board, clear hands"}
    }
    c.JupyterHub.services.append(
        {
            "name": BOARD,
            "url": f"http://127.0.0.1:{settings['board_port']}",
            # The hub's own interpreter, which imports the workshop (cwd: the
            # project); the hub runs it as itself and starts it again if it dies.
            "command": [
                sys.executable,
                "-m",
                "workshop.instructor.board",
                "--state",
                str(folder / BOARD),
            ],
            "cwd": settings["root"],
            "environment": {"SLURM_CONF": settings["slurm_conf"]},
            # The instructor's browser logs in through the hub without a page
            # asking to allow it; its OAuth token may carry only the board's scope.
            "oauth_no_confirm": True,
            "oauth_client_allowed_scopes": [INSTRUCTOR_SCOPE],
            "display": True,
        }
    )
    c.JupyterHub.load_roles.extend(
        [
            # A server's token holds only scopes its owner holds: every learner may
            # reach the board (it answers them 403 but for their own record).
            {"name": "user", "scopes": ["self", access]},
            {
                "name": "board-instructors",
                "scopes": [INSTRUCTOR_SCOPE, access],
                "users": [settings["instructor"]],
                "groups": [INSTRUCTORS_GROUP],
            },
            {
                # Who the class is: the hub's users that are not instructors.
                "name": "board-service",
                "scopes": ["list:users", "read:users", "read:groups"],
                "services": [BOARD],
            },
        ]
    )
    # JupyterHub's server role, and the board: the kernel posts with the server's
    # own $JUPYTERHUB_API_TOKEN.
    c.PortalSpawner.server_token_scopes = [
        "users:activity!user", "access:servers!server", access,
    ]  # fmt: skip
    # Through the proxy, which every node of the portal's cluster reaches.
    c.PortalSpawner.environment["WORKSHOP_BOARD_URL"] = board_url(c.JupyterHub.bind_url)


def job_ended(user: Any) -> dict[str, str] | None:
    """For the hub's templates: how ``user``'s last server job ended, with its
    sentence, while no server runs or a new one starts; else None."""
    spawner = getattr(user, "spawner", None)
    if spawner is None:
        return None
    if not spawner.active:
        ending = getattr(spawner, "ending", None)
    elif spawner.pending == "spawn":
        ending = getattr(spawner, "previous_ending", None)
    else:
        ending = None
    return {**ending, "sentence": Ending(**ending).sentence()} if ending else None


def autosave_seconds(settings_dir: Path) -> int:
    """JupyterLab's autosave interval in ``settings_dir``'s overrides.json (120)."""
    try:
        overrides = json.loads((settings_dir / "overrides.json").read_text())
    except (OSError, ValueError):
        return 120
    plugin = overrides.get("@jupyterlab/docmanager-extension:plugin", {})
    return int(plugin.get("autosaveInterval", 120))
