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
its ``SLURM_*`` variables.
"""

from __future__ import annotations

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

from .portal_learners import hash_password

# The batch job of one learner's server. {{...}} are batchspawner's fields.
# --export: only the variables the hub hands the server (PATH, the hub's tokens,
# SLURM_CONF, HOME...), not the hub's own environment. The server is told to listen
# on this node's own address (SLURMD_NODENAME): the hub looks for it there, as
# squeue reports it, and on this machine each node's address is on loopback.
BATCH_SCRIPT = """#!/bin/bash
#SBATCH --job-name=jupyter-{{username}}
#SBATCH --output={{homedir}}/jupyter-%j.log
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
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
    script above, and the workshop's notebooks copied into a new learner's home."""

    # batchspawner's default is 0.0.0.0, every interface; start() resets the
    # address to this default, so it is set here, not only in the config.
    ip = Unicode("127.0.0.1").tag(config=True)
    workshop_root = Unicode(help="the project folder the notebooks come from").tag(
        config=True
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.exec_prefix = "runuser -u {username} --"
        self.batch_script = BATCH_SCRIPT

    learner_venv = Unicode(help="the environment the learners run").tag(config=True)

    async def start(self) -> Any:
        copy_workshop(Path(self.workshop_root), self.user.name, Path(self.learner_venv))
        return await super().start()


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
    c.JupyterHub.cleanup_servers = True  # the hub's stop stops every server (scancel)
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
    c.PortalSpawner.notebook_dir = f"~/{COPY}/notebooks"
    c.PortalSpawner.default_url = "/lab"
    c.PortalSpawner.environment = {
        "SLURM_CONF": settings["slurm_conf"],
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        **settings["python_env"],
    }
    c.PortalSpawner.start_timeout = settings["start_timeout"]
    c.PortalSpawner.http_timeout = settings["start_timeout"]
    c.PortalSpawner.startup_poll_interval = 0.5
