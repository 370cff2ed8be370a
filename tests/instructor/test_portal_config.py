"""The hub's configuration, read from a portal folder without starting anything."""

from __future__ import annotations

import asyncio
import html
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PrefixLoader, nodes
from traitlets.config import Config, PyFileConfigLoader

# The portal's packages (pip install -e ".[portal]"), which a GPU node's wheelhouse
# rightly leaves out: there these tests skip, saying so.
pytest.importorskip(
    "batchspawner",
    reason='the portal extra is not installed (pip install -e ".[portal]")',
)

from batchspawner import SlurmSpawner
from jupyterhub import scopes
from jupyterhub.app import JupyterHub
from jupyterhub.roles import get_default_roles
from jupyterhub.services.service import Service
from jupyterhub.spawner import LocalProcessSpawner

from workshop.instructor import portal_hub
from workshop.instructor.board import INSTRUCTOR_SCOPE
from workshop.instructor.portal_endings import Ending
from workshop.instructor.portal_hub import (
    COPIED,
    COPY,
    PortalSpawner,
    configure,
    job_ended,
)

ROOT = Path(__file__).resolve().parents[2]


def _folder(tmp_path, root, **more):
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
    (tmp_path / "portal.json").write_text(json.dumps({**settings, **more}))
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


def test_a_hub_that_stops_leaves_the_learners_servers_running(tmp_path):
    # A killed or restarted hub must not end the class: portal stop stops the
    # servers itself, through the hub's REST API.
    c = Config()
    configure(c, _folder(tmp_path / "portal", ROOT))
    assert c.JupyterHub.cleanup_servers is False


def test_the_server_serves_the_whole_copy_and_opens_its_notebooks(tmp_path):
    # The notebooks link to ../docs/glossary.md and ../slurm/: every such link must
    # land in a folder that the learner's copy holds, and the server's root must be
    # the copy itself, not notebooks/, for the link to open.
    c = Config()
    configure(c, _folder(tmp_path / "portal", ROOT))
    assert c.PortalSpawner.notebook_dir == f"~/{COPY}"
    assert c.PortalSpawner.default_url == "/lab/tree/notebooks"
    links = set()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                links |= set(
                    re.findall(r"\]\((\.\./[^)#\s]+)", "".join(cell["source"]))
                )
    assert any(link.startswith("../docs/glossary.md") for link in links), links
    for link in sorted(links):
        top = link.split("/")[1]
        assert top in COPIED, f"{link}: {top}/ is not copied to the learners"
        assert (ROOT / "notebooks" / link).resolve().exists(), link


def test_the_hub_sees_an_ended_job_within_10_s_and_its_pages_say_why(tmp_path):
    c = Config()
    configure(c, _folder(tmp_path / "portal", ROOT))
    assert c.PortalSpawner.poll_interval <= 10
    assert c.PortalSpawner.instructor == "teacher"
    (templates,) = c.JupyterHub.template_paths
    # JupyterHub's own loader: "templates/NAME" is its stock page NAME.
    stock = Path(sys.prefix) / "share" / "jupyterhub" / "templates"
    env = Environment(
        loader=ChoiceLoader(
            [
                PrefixLoader({"templates": FileSystemLoader([stock])}, "/"),
                FileSystemLoader([templates, stock]),
            ]
        ),
        autoescape=True,
    )
    parents = {
        "not_running.html": "templates/not_running.html",
        "home.html": "templates/home.html",
        "503.html": "templates/error.html",
        "spawn_pending.html": "templates/spawn_pending.html",
    }
    for page, parent in parents.items():
        tree = env.parse((Path(templates) / page).read_text())
        assert tree.find(nodes.Extends).template.value == parent, page
        env.get_template(page)  # it compiles, and so does what it extends
    variables = c.JupyterHub.template_vars
    assert variables["kept_folder"] == f"~/{COPY}"
    assert variables["autosave_seconds"] == 30  # scripts/lab-settings/overrides.json
    assert variables["job_ended"] is job_ended
    ended = {"sentence": "Your server's Slurm job 7 ended at 02:22: it was cancelled "
             "(scancel by root: the instructor or an administrator).",
             "log": "~/jupyter-7.log"}  # fmt: skip
    shown = env.get_template("job_ended.html").render({**variables, "job_ended": ended})
    text = " ".join(re.sub(r"<[^>]+>", " ", html.unescape(shown)).split())
    assert ended["sentence"] in text
    assert f"your notebooks and files in ~/{COPY} , with every edit saved" in text
    assert "JupyterLab saves an open notebook every 30 s" in text
    assert "run the notebook's cells again from the top" in text
    assert "The old job's log: ~/jupyter-7.log" in text


def test_an_ending_is_shown_while_no_server_runs_and_kept_in_the_spawners_state():
    ended = {"job_id": "7", "at": "02:22", "state": "TIMEOUT", "log": "~/jupyter-7.log",
             "why": "it reached its time limit of 02:00:00"}  # fmt: skip
    spawner = PortalSpawner()
    spawner.load_state({"job_id": "", "job_ended": ended})
    shown = job_ended(SimpleNamespace(spawner=spawner))
    assert shown["sentence"] == (
        "Your server's Slurm job 7 ended at 02:22: it reached its time limit of "
        "02:00:00."
    )
    assert shown["log"] == "~/jupyter-7.log"
    # batchspawner's clear_state, when the server is stopped, keeps it: the learner
    # reads it after the job has gone, and the hub's database keeps it.
    spawner.clear_state()
    assert spawner.get_state() == {"job_ended": ended}
    assert job_ended(None) is None  # the login page: nobody yet
    assert job_ended(SimpleNamespace(spawner=PortalSpawner())) is None
    # A new server starting (Start My Server, or JupyterLab's Restart once the hub
    # has seen the job end): its progress page says why the last one ended; once it
    # runs, nothing is said.
    spawner.previous_ending, spawner.ending = spawner.ending, None
    spawner._spawn_pending = True
    assert job_ended(SimpleNamespace(spawner=spawner))["job_id"] == "7"
    spawner._spawn_pending = False
    spawner.server = SimpleNamespace()  # running
    assert job_ended(SimpleNamespace(spawner=spawner)) is None


def test_a_job_found_gone_is_asked_how_it_ended_once(monkeypatch):
    async def gone(self):
        self.job_id = ""  # as batchspawner's poll does
        return 1

    asked = []

    def ending_of(job_id, owner, admin):
        asked.append((job_id, owner, admin))
        return Ending(job_id, "02:22", "CANCELLED", "it was cancelled (scancel)",
                      "/root/jupyter-7.log")  # fmt: skip

    monkeypatch.setattr(SlurmSpawner, "poll", gone)
    monkeypatch.setattr(portal_hub, "ending_of", ending_of)
    spawner = PortalSpawner(instructor="teacher")
    spawner.user = SimpleNamespace(name="root")
    spawner.job_id = "7"
    assert asyncio.run(spawner.poll()) == 1
    assert asyncio.run(spawner.poll()) == 1  # the hub polls again: nothing to ask
    assert asked == [("7", "root", "teacher")]
    assert spawner.ending["why"] == "it was cancelled (scancel)"
    assert spawner.ending["log"] == "~/jupyter-7.log"  # in the learner's home


def test_a_server_may_take_five_times_the_longest_start_measured(tmp_path):
    # 60 s, six learners at once on two busy cores: portal_hub.py's START_WAIT.
    c = Config()
    configure(c, _folder(tmp_path / "portal", ROOT))  # start_timeout=120 asked
    assert (c.PortalSpawner.start_timeout, c.PortalSpawner.http_timeout) == (300, 300)
    longer = _folder(tmp_path / "longer", ROOT)
    settings = json.loads((longer / "portal.json").read_text())
    (longer / "portal.json").write_text(json.dumps({**settings, "start_timeout": 600}))
    c = Config()
    configure(c, longer)
    assert (c.PortalSpawner.start_timeout, c.PortalSpawner.http_timeout) == (600, 600)


def _roles(c) -> dict[str, dict]:
    return {role["name"]: role for role in c.JupyterHub.load_roles}


def test_the_board_is_a_service_the_hub_starts_with_its_scope_and_roles(
    tmp_path, monkeypatch
):
    folder = _folder(tmp_path / "portal", ROOT, board_port=8002)
    c = Config()
    configure(c, folder)
    services = {service["name"]: service for service in c.JupyterHub.services}
    assert set(services) == {"classroom", "board"}  # the classroom's is kept
    board = services["board"]
    # Hub-managed: the hub runs this command (its own Python, which imports the
    # workshop from the project), on the port portal.json gave it, and starts it
    # again after a hub restart; its state lives in the portal's folder.
    assert board["command"] == [
        sys.executable, "-m", "workshop.instructor.board",
        "--state", str(folder / "board"),
    ]  # fmt: skip
    assert board["url"] == "http://127.0.0.1:8002"
    assert board["cwd"] == str(ROOT)
    assert board["environment"] == {"SLURM_CONF": "/x/slurm.conf"}  # for squeue
    assert board["oauth_no_confirm"] is True and board["display"] is True
    assert board["oauth_client_allowed_scopes"] == [INSTRUCTOR_SCOPE]
    # Every key is a field of JupyterHub's Service (the hub refuses any other).
    assert set(board) <= set(Service.class_trait_names()), set(board)
    roles = _roles(c)
    access = "access:services!service=board"
    # The instructor (the portal's admin) and an "instructors" group read it; every
    # user may reach it, so that their server's token can post their own record.
    assert roles["board-instructors"]["users"] == ["teacher"]
    assert roles["board-instructors"]["groups"] == ["instructors"]
    assert set(roles["board-instructors"]["scopes"]) == {INSTRUCTOR_SCOPE, access}
    assert set(roles["user"]["scopes"]) == {"self", access}
    assert roles["board-service"]["services"] == ["board"]
    assert "list:users" in roles["board-service"]["scopes"]
    assert roles["classroom"]["services"] == ["classroom"]
    # The server's token keeps JupyterHub's own server scopes (activity, and the
    # batchspawner's report of its port) and may reach the board.
    server = next(r for r in get_default_roles() if r["name"] == "server")
    token_scopes = c.PortalSpawner.server_token_scopes
    assert set(server["scopes"]) | {access} == set(token_scopes)
    # Every scope named exists in this JupyterHub once the custom one is defined
    # (as the hub does at start; a copy of its table, not the process's own).
    monkeypatch.setattr(scopes, "scope_definitions", dict(scopes.scope_definitions))
    with pytest.raises(scopes.ScopeNotFound, match=INSTRUCTOR_SCOPE):
        scopes._check_scopes_exist([INSTRUCTOR_SCOPE])
    scopes.define_custom_scopes(c.JupyterHub.custom_scopes)
    named = [scope for role in roles.values() for scope in role["scopes"]]
    scopes._check_scopes_exist(named + token_scopes + [INSTRUCTOR_SCOPE])
    # The kernels find it through the proxy, at the hub's public address.
    url = c.PortalSpawner.environment["WORKSHOP_BOARD_URL"]
    assert url == "http://127.0.0.1:8000/services/board/"
    assert url.startswith(c.JupyterHub.bind_url) and url.endswith("/")
    # The server's other variables are kept beside it.
    assert c.PortalSpawner.environment["SLURM_CONF"] == "/x/slurm.conf"


def test_a_portal_json_from_before_the_board_configures_none(tmp_path):
    # A class started before the board existed and configured as it is (portal
    # start gives it a board_port on its next hub start): the hub still starts.
    c = Config()
    configure(c, _folder(tmp_path / "portal", ROOT))
    assert [service["name"] for service in c.JupyterHub.services] == ["classroom"]
    assert set(_roles(c)) == {"classroom"}
    assert "WORKSHOP_BOARD_URL" not in c.PortalSpawner.environment
    assert "server_token_scopes" not in c.PortalSpawner
    assert "custom_scopes" not in c.JupyterHub


def test_a_sites_lines_in_docs_set_the_board_up_as_the_portal_does(tmp_path):
    # docs/portal.md's jupyterhub_config.py lines for a site's own hub, loaded as
    # JupyterHub loads its config file, against what the portal configures.
    text = (ROOT / "docs" / "portal.md").read_text()
    section = text[text.index("### On a site's own JupyterHub") :]
    (tmp_path / "jupyterhub_config.py").write_text(
        re.search(r"```python\n(.*?)```", section, re.S)[1]
    )
    site = JupyterHub(
        config=PyFileConfigLoader(
            "jupyterhub_config.py", path=str(tmp_path)
        ).load_config()
    )
    spawner = LocalProcessSpawner(config=site.config)
    c = Config()
    configure(c, _folder(tmp_path / "portal", ROOT, board_port=8002))
    ours = next(s for s in c.JupyterHub.services if s["name"] == "board")
    (theirs,) = site.services
    assert theirs["command"][:3] == ours["command"][:3]  # python -m the board
    assert theirs["command"][3] == "--state" == ours["command"][3]
    # The same but for where it listens, where it keeps its state and its cwd.
    same = set(ours) - {"url", "command", "cwd"}
    assert {k: theirs[k] for k in same - {"environment"}} == {
        k: ours[k] for k in same - {"environment"}
    }
    assert set(theirs["environment"]) == set(ours["environment"]) == {"SLURM_CONF"}
    assert site.custom_scopes == c.JupyterHub.custom_scopes
    board_roles = [r for r in c.JupyterHub.load_roles if r["name"] != "classroom"]
    for role in board_roles:
        role.pop("users", None)
    for role in site.load_roles:
        role.pop("users", None)  # the site's instructors, the portal's admin
    assert site.load_roles == board_roles
    assert spawner.server_token_scopes == c.PortalSpawner.server_token_scopes
    assert spawner.environment["WORKSHOP_BOARD_URL"].endswith("/services/board/")
