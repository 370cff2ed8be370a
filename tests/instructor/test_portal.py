"""workshop.instructor.portal: a private JupyterHub whose learners' servers are Slurm
jobs on the private two-node cluster, driven through the hub's REST API and a kernel
client (tests/browser/test_portal_browser_integration.py drives it from a browser).

One portal for the module, with 6 learners: the classroom run, then the checks of
what it leaves. It needs root, Slurm and the proxy (make setup installs them); it
skips with the reason elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

# The portal's packages (pip install -e ".[portal]": jupyterhub, batchspawner), which
# a GPU node's wheelhouse rightly leaves out: there these tests skip, saying so.
pytest.importorskip(
    "batchspawner",
    reason='the portal extra is not installed (pip install -e ".[portal]")',
)

from workshop.instructor import portal, portal_learners
from workshop.instructor.portal_hub import BATCH_SCRIPT
from workshop.instructor.portal_learners import hash_password

# ---- no portal needed -------------------------------------------------------------


def test_a_password_is_kept_only_as_a_salted_hash():
    salt = bytes(16)
    stored = hash_password("tiger-17", salt)
    assert stored == hash_password("tiger-17", salt)
    assert stored != hash_password("tiger-18", salt)
    assert stored != hash_password("tiger-17", bytes([1]) * 16)
    assert "tiger" not in stored and len(stored) == 128


def test_the_job_script_runs_the_server_in_a_step_on_the_nodes_address():
    assert "#SBATCH --export={{keepvars}}" in BATCH_SCRIPT
    assert "{{srun}} {{cmd}}" in BATCH_SCRIPT  # a job step, as on a site's portal
    rewrite = next(line for line in BATCH_SCRIPT.splitlines() if "sed -E" in line)
    script = (
        "SLURMD_NODENAME=127.0.0.3\n"
        "JUPYTERHUB_SERVICE_URL=http://127.0.0.1:0/user/pupil01/\n"
        'JUPYTERHUB_SERVICE_URL="$(printf %s "$JUPYTERHUB_SERVICE_URL" |\n'
        f"{rewrite}\n"
        'echo "$JUPYTERHUB_SERVICE_URL"\n'
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == "http://127.0.0.3:0/user/pupil01/", done.stderr


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"learners": 0}, r"learners must be a whole number from 1 to 99, not 0"),
        ({"learners": 100}, r"learners must be a whole number from 1 to 99, not 100"),
        ({"learners": True}, r"learners must be a whole number from 1 to 99, not True"),
        ({"prefix": "Learner"}, r"prefix='Learner': give lower-case letters only"),
        ({"prefix": "l-1"}, r"prefix='l-1'"),
    ],
)
def test_bad_arguments_are_refused_with_the_value(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        portal.start(tmp_path, **kwargs)


def test_a_folder_too_long_for_slurms_sockets_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    folder = tmp_path / ("x" * 70)
    with pytest.raises(portal.PortalError, match=r"characters; Slurm's job sockets"):
        portal.start(folder, learners=1)


def test_without_root_it_says_why_and_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(
        portal.PortalError, match=r"it needs root .*HINT: run it as root"
    ):
        portal.start(tmp_path / "p", learners=1)


def test_an_environment_other_users_cannot_enter_is_refused_before_anything_starts(
    monkeypatch, request
):
    # Under /tmp itself: pytest's own tmp_path sits in a folder of mode 0700.
    tmp_path = Path(tempfile.mkdtemp(prefix="wp-closed-", dir="/tmp"))
    tmp_path.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(tmp_path))
    closed = tmp_path / "clone"
    (closed / ".venv").mkdir(parents=True)
    closed.chmod(0o700)
    readable = tmp_path / "open"
    readable.mkdir(mode=0o755)
    readable.chmod(0o755)
    monkeypatch.setattr(
        portal_learners, "_environment_folders", lambda: [closed / ".venv", readable]
    )
    before = {user.pw_name for user in pwd.getpwall()}
    with pytest.raises(portal.PortalError) as caught:
        portal.start(tmp_path / "p", learners=1, prefix="closed")
    message = str(caught.value)
    assert message.startswith("the private portal cannot start here")
    assert f"{closed} (mode 0700) cannot be entered by other users" in message
    assert f"chmod o+rx {closed}" in message
    assert str(readable) + " (" not in message
    assert {user.pw_name for user in pwd.getpwall()} == before  # nobody was made
    assert not (tmp_path / "p").exists()


def test_a_portal_folder_the_learners_cannot_reach_is_refused_before_any_user(
    request,
):
    # A folder of mode 0700 above the portal's: root may enter it, the learners
    # (other uids) may not, so none could reach their home.
    tmp_path = Path(tempfile.mkdtemp(prefix="wp-reach-", dir="/tmp"))
    tmp_path.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(tmp_path))
    closed = tmp_path / "private"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    before = {user.pw_name for user in pwd.getpwall()}
    with pytest.raises(portal.PortalError) as caught:
        portal.start(closed / "class" / "p", learners=1, prefix="reach")
    message = str(caught.value)
    assert message.startswith("the private portal cannot start here")
    assert f"{closed} (mode 0700) cannot be entered by other users" in message
    assert f"chmod o+x {closed}, or give a --folder" in message
    assert str(tmp_path) + " (" not in message  # mode 0755: open
    assert "\n" not in message
    # The folder's own fix, not the machine's hint, where the machine can run it.
    tools = ("slurmctld", "slurmd", "munged", "useradd", "runuser")
    machine_can = os.geteuid() == 0 and all(map(shutil.which, tools))
    if machine_can and not portal_learners.closed_to_others():
        assert "HINT" not in message, message
    assert {user.pw_name for user in pwd.getpwall()} == before  # nobody was made
    assert list(closed.iterdir()) == []  # nothing was made
    # Opened, the same folder is no longer a problem.
    closed.chmod(0o711)
    assert portal_learners.unreachable(closed / "class" / "p") == []


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("", "--folder must be the path of a folder, not ''; e.g. --folder "),
        (".", "--folder must be a folder outside the project {root} (its .portal "
         "apart), not '.'; {root} is the project, and the learners' homes, Slurm's "
         "state and the munge key would go there; e.g. --folder /tmp/wp-class"),
        ("slurm", "not 'slurm'; {root}/slurm is inside the project"),
        ("..", "not '..'; {parent} holds the project"),
        ("/tmp", "--folder must be a folder of the portal's own, not '/tmp'; /tmp is "
         "open to every user"),
    ],
)  # fmt: skip
def test_an_empty_or_a_project_folder_is_refused_before_anything_is_made(
    given, says, capsys, monkeypatch
):
    # Run from the project, where "" and "." are the project itself: start would
    # have put Slurm's state and the munge key in its slurm/ folder.
    root = Path(portal.__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    if given == "/tmp" and (
        root.is_relative_to("/tmp") or not Path("/tmp").stat().st_mode & 0o002
    ):
        pytest.skip("/tmp holds the project (the case of '..'), or is not open")
    listing = {path: sorted(os.listdir(path)) for path in (root, root / "slurm")}
    users = {user.pw_name for user in pwd.getpwall()}
    # Nothing further is reached: a check that comes later fails the test.
    monkeypatch.setattr(portal, "_check_can_start", lambda folder: pytest.fail(given))
    status, out, err = _cli(["start", "--folder", given], capsys)
    assert status == 1 and out == "", out
    assert err.startswith("workshop portal: ") and err.count("\n") == 1, err
    assert says.format(root=root, parent=root.parent) in err
    assert {path: sorted(os.listdir(path)) for path in listing} == listing
    assert {user.pw_name for user in pwd.getpwall()} == users
    # The API refuses it too, naming its argument; the default folder is allowed.
    with pytest.raises(ValueError, match=r"^folder must be "):
        portal.start(given)
    assert portal.check_folder(root / ".portal") == root / ".portal"


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``python -m workshop portal ARGV`` in this process: (status, out, err);
    argparse's own refusals exit with status 2."""
    parser = argparse.ArgumentParser(prog="python -m workshop portal")
    portal.add_arguments(parser)
    try:
        code = portal.run_from_args(parser.parse_args(argv))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["start", "--learners", "0"], 2,
         "argument --learners: 0 is not a whole number from 1 to 99"),
        (["start", "--learners", "many"], 2, "argument --learners: many is not"),
        (["start", "--learners", "100"], 2, "e.g. --learners 6"),
        (["stop", "--folder", "{file}"], 2,
         "argument --folder: {file} is a file, not a folder"),
        (["stop", "--folder", "{portal}", "--keep-homes", "{file}"], 1,
         "--keep-homes {file}: it is a file, not a folder"),
        (["stop", "--folder", "{portal}", "--keep-homes", "{file}/archive"], 1,
         "{file} is a file, not a folder"),
        (["start", "--folder", "{portal}", "--keep-homes", "/tmp"], 1,
         "--keep-homes /tmp is for stop only, not start"),
        (["stop", "--folder", "{empty}"], 1, "no portal in {empty}: the folder holds"),
        (["status", "--folder", "{empty}"], 1, "no portal in {empty}"),
        (["restart", "--folder", "{empty}/none"], 1,
         "no portal in {empty}/none: the folder does not exist"),
        (["classroom", "--folder", "{empty}"], 1, "no portal in {empty}"),
    ],
)  # fmt: skip
def test_bad_command_lines_are_refused_in_one_line(argv, code, says, tmp_path, capsys):
    places = {"file": tmp_path / "a-file", "empty": tmp_path / "empty"}
    places["portal"] = tmp_path / "portal"
    places["file"].write_text("")
    places["empty"].mkdir()
    (places["portal"] / "home").mkdir(parents=True)
    (places["portal"] / "portal.json").write_text("{}")  # read by nothing here
    argv = [arg.format(**places) for arg in argv]
    status, out, err = _cli(argv, capsys)
    assert status == code, (out, err)
    assert says.format(**places) in err
    last = err.strip().splitlines()[-1]  # argparse's usage lines come first
    assert last.startswith(("workshop portal: ", "python -m workshop portal: error"))
    assert "Traceback" not in err and out == ""
    assert (places["portal"] / "portal.json").exists()  # nothing was stopped


def test_a_class_from_before_the_board_gets_one_when_its_hub_starts_again(
    tmp_path, monkeypatch
):
    # Its portal.json has no board_port: the hub started again gets a board on a
    # port none of the class's others is (the dead hub's own port is free now, so
    # a free port alone is not enough), and the board's folder, root's only.
    settings = {"port": 20001, "hub_port": 20002, "proxy_api_port": 20003}
    (tmp_path / "portal.json").write_text(json.dumps(settings))
    offered = iter([[20002], [20001], [20003], [20004]])
    monkeypatch.setattr(portal, "quiet_ports", lambda count: next(offered))
    portal._give_board(tmp_path, dict(settings))
    given = json.loads((tmp_path / "portal.json").read_text())
    assert given == {**settings, "board_port": 20004}
    assert stat.S_IMODE((tmp_path / "board").stat().st_mode) == 0o700
    # Given once: a class that has one keeps it, and its state.
    (tmp_path / "board" / "board.json").write_text("{}")
    portal._give_board(tmp_path, given)
    assert json.loads((tmp_path / "portal.json").read_text()) == given
    assert (tmp_path / "board" / "board.json").read_text() == "{}"


def test_start_names_the_board_and_whom_to_log_in_as(tmp_path, capsys):
    started = portal.Portal(
        tmp_path, "http://127.0.0.1:8123/", ["pupil01"], {}, tmp_path / "slurm.conf",
        4321, "pupiladmin",
    )  # fmt: skip
    portal._print_portal(started)
    lines = capsys.readouterr().out.splitlines()
    assert (
        "the instructor's board: http://127.0.0.1:8123/services/board/ "
        "(log in as pupiladmin)"
    ) in lines
    assert started.board_url == "http://127.0.0.1:8123/services/board/"


# ---- a running portal -------------------------------------------------------------
