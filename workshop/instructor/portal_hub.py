"""What runs inside the private portal's JupyterHub: its configuration, the learners'
authenticator and the Slurm spawner. The hub imports this module from the
``jupyterhub_config.py`` that :mod:`workshop.instructor.portal` writes; nothing else
does, so JupyterHub and batchspawner are imported here only.

The layout on one machine, all on loopback::

    browser -> proxy (127.0.0.1:PORT) -> hub (127.0.0.1:HUB_PORT)
                                      -> a learner's server (NODE:PORT, in a Slurm job)

A learner's server is a Slurm job that the hub submits as that learner (``runuser``),
on node 127.0.0.2 or 127.0.0.3 of the private cluster. Its script runs the server in
a job step (``srun``), as a site's portal does, so the kernel runs inside the job with
its ``SLURM_*`` variables. When a job ends without the hub stopping it (cancelled, out
of time, its node down), the spawner asks Slurm how (``portal_endings.py``), and the
hub's pages that the learner meets next say so (``portal/templates``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import pwd
import shutil
from pathlib import Path
from typing import Any

from batchspawner import SlurmSpawner
from jupyterhub.auth import Authenticator
from traitlets import Dict, Unicode

from .portal_endings import Ending, ending_of
from .portal_learners import hash_password

# The batch job of one learner's server. {{...}} are batchspawner's fields.
# --export: only the variables the hub hands the server (PATH, the hub's tokens,
# SLURM_CONF, HOME...), not the hub's own environment. The server is told to listen
# on this node's own address (SLURMD_NODENAME): the hub looks for it there, as
# squeue reports it, and on this machine each node's address is on loopback.
# --no-requeue: after a node failure Slurm would otherwise queue the job again
# (JobRequeue=1 by default), and batchspawner, seeing it PENDING, would keep the
# learner's server as running at the dead node's address; ended, the hub's pages say
# why. No trap of SIGTERM here: when Slurm ends a job, slurmstepd already writes
# "*** JOB 17 ON NODE CANCELLED AT ... DUE TO TIME LIMIT ***" (or NODE FAILURE) into
# the log.
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
    """A fixed set of learners, each with a password made when the portal started.

    ``learners`` maps a name to ``{"salt": hex, "hash": hex}``; the passwords
    themselves are only in the instructor's file (mode 0600)."""

    learners = Dict(help="name -> {'salt': hex, 'hash': hex}").tag(config=True)

    async def authenticate(self, handler: Any, data: dict[str, str]) -> str | None:
        name = (data.get("username") or "").strip()
        entry = self.learners.get(name)
        if entry is None:
            return None
        given = hash_password(data.get("password") or "", bytes.fromhex(entry["salt"]))
        return name if hmac.compare_digest(given, entry["hash"]) else None


class PortalSpawner(SlurmSpawner):
    """batchspawner's SlurmSpawner, as the private portal needs it: jobs submitted
    as the learner with ``runuser`` (the hub runs as root; there is no sudo), the
    script above, the workshop's notebooks copied into a new learner's home, and,
    when a job ends without the hub stopping it, how it ended (``ending``)."""

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
        # How the last server job ended (portal_endings.Ending.as_state()), or None.
        # Part of the spawner's state, so the hub's database keeps it (mode 0600)
        # through a restart of the hub, and for this class only; clear_state leaves
        # it, as the learner reads it after the job is gone, and start() clears it.
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
        """batchspawner's poll (None while the job is queued or running); when it
        finds the job gone, Slurm is asked how it ended, for the learner's pages.
        A stop through the hub does not come here with a job: it is no surprise."""
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


# What a learner gets: the notebooks and what they open by relative path, in
# ~/scaling-pytorch-hpc. Not ~/workshop: a folder of that name in a kernel's working
# folder would be imported in place of the workshop package (as a namespace package,
# found before pip's editable-install finder is asked).
COPY = "scaling-pytorch-hpc"
COPIED = ("notebooks", "slurm", "docs")


def copy_workshop(root: Path, user: str, venv: Path | None = None) -> Path:
    """Copy the notebooks (and the folders they refer to) into ``user``'s home as
    ``~/scaling-pytorch-hpc``, owned by them, unless it is there already: a
    learner's own work survives a restart of their server. ``venv`` becomes the
    copy's ``.venv``, which the batch scripts in slurm/ activate, as in a clone."""
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
    """Fill JupyterHub's config object ``c`` from ``folder/portal.json``, which
    :func:`workshop.instructor.portal.start` wrote. Secrets stay in files of mode 0600
    (the cookie secret, the learners' hashes) or in the environment (the proxy's
    token, CONFIGPROXY_AUTH_TOKEN): never on a command line."""
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
    # Two waits, one after the other: JupyterHub's start_timeout, from sbatch until
    # the job's server has told the hub its port (the queue, then Python starting in
    # the job), and http_timeout, from then until JupyterLab answers (its extensions
    # loading). Measured on the 2-core machine, six learners starting at once while
    # other tests ran (load average 6 to 19): 15-19 s and 17-27 s, 30-47 s in all;
    # the run saw 53-60 s in all. Each wait gets START_WAIT, 5 times the
    # longest start seen, so that a machine five times as busy, or a class five times
    # as large on the same cores, still starts; portal.start's start_timeout may
    # lengthen it, not shorten it.
    wait = max(float(settings["start_timeout"]), START_WAIT)
    c.PortalSpawner.start_timeout = int(wait)
    c.PortalSpawner.http_timeout = int(wait)
    c.PortalSpawner.startup_poll_interval = 0.5
    # The hub asks Slurm (one squeue per running server) whether each job still
    # runs every 10 s (JupyterHub's default: 30 s), so that a learner whose job was
    # cancelled or ran out of time is told why within about 10 s: the pages below.
    c.PortalSpawner.poll_interval = 10

    # The hub's pages a learner meets once their job has ended: JupyterHub's own
    # (not_running.html, home.html, spawn_pending.html, the proxy's 503.html),
    # extended in portal/templates with why it ended, what is kept, and the button
    # that starts a new job.
    c.JupyterHub.template_paths = [str(Path(settings["root"]) / "portal" / "templates")]
    c.JupyterHub.template_vars = {
        "job_ended": job_ended,
        "kept_folder": f"~/{COPY}",
        "autosave_seconds": autosave_seconds(settings_dir),
    }


def job_ended(user: Any) -> dict[str, str] | None:
    """For the hub's templates (JupyterHub calls a callable of template_vars with the
    page's user, None before login): how the user's last server job ended, with the
    sentence to show, while no server runs or a new one starts (*Start My Server*,
    or JupyterLab's *Restart* once the hub has seen the job end: before, the hub
    still counts the server as running and sends the learner to it); else None."""
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
    """How often JupyterLab saves an open notebook, as the lab settings of
    ``settings_dir`` (overrides.json) say; JupyterLab's default, 120 s, otherwise."""
    try:
        overrides = json.loads((settings_dir / "overrides.json").read_text())
    except (OSError, ValueError):
        return 120
    plugin = overrides.get("@jupyterlab/docmanager-extension:plugin", {})
    return int(plugin.get("autosaveInterval", 120))
