"""The hub's configuration, read from a portal folder without starting anything."""

from __future__ import annotations

import json
from pathlib import Path

from traitlets.config import Config

from workshop.instructor.portal_hub import configure

ROOT = Path(__file__).resolve().parents[2]


def _folder(tmp_path, root):
    (tmp_path / "secrets").mkdir(parents=True)
    (tmp_path / "secrets" / "learners.json").write_text(json.dumps({}))
    (tmp_path / "secrets" / "api_token").write_text("not-a-real-token\n")
    settings = {
        "port": 8000, "hub_port": 8081, "proxy": "configurable-http-proxy",
        "proxy_api_port": 8001, "instructor": "teacher", "root": str(root),
        "cpus_per_server": 1, "time_limit": "02:00:00", "partition": "",
        "python": str(root / ".venv" / "bin" / "python"), "slurm_conf": "/x/slurm.conf",
        "python_env": {}, "start_timeout": 120,
    }  # fmt: skip
    (tmp_path / "portal.json").write_text(json.dumps(settings))
    return tmp_path


def test_learners_servers_get_the_same_jupyterlab_settings_as_make_lab(tmp_path):
    c = Config()
    configure(c, _folder(tmp_path / "portal", ROOT))
    settings_dir = ROOT / "scripts" / "lab-settings"
    assert c.PortalSpawner.args == [f"--LabApp.app_settings_dir={settings_dir}"]
    # The folder holds what make lab gives too: no news prompt, no update check.
    overrides = json.loads((settings_dir / "overrides.json").read_text())
    notification = overrides["@jupyterlab/apputils-extension:notification"]
    assert notification == {"fetchNews": "false", "checkForUpdates": False}
