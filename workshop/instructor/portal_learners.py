"""The private portal's learners: their accounts, processes, Python and folders.

A learner's server runs as that learner. Where this environment's interpreter is
private (pyenv's under /root, mode 0700), the learners get a venv in the portal's
folder on a hard-linked copy of the base interpreter, seeing the same packages.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterable
from pathlib import Path

from .._house import ROOT  # the notebooks a learner gets, the hub's configuration
from .._procs import is_alive
from ..checks import message

DEFAULT_FOLDER = ROOT / ".portal"  # the portal's folder, unless one is named


class PortalError(RuntimeError):
    """The portal could not start, or could not be stopped cleanly."""


def portal_command(action: str, folder: str | os.PathLike[str]) -> str:
    """``python -m workshop portal ACTION --folder FOLDER`` as a line that works in
    a new login shell, in any folder: this interpreter's full path (a bare
    ``python`` there lacks the workshop), run from the project root."""
    return (
        f"cd {shlex.quote(str(ROOT))} && {shlex.quote(sys.executable)} -m workshop "
        f"portal {action} --folder {shlex.quote(str(Path(folder).resolve()))}"
    )


def unreachable(folder: Path) -> list[str]:
    """Why the learners could not reach their homes in ``folder/home``: the folders
    above ``folder`` that other users cannot enter; one problem or none."""
    closed = _closed(folder.parents)
    if not closed:
        return []
    where = ", ".join(f"{path} (mode {mode:04o})" for path, mode in closed.items())
    return [
        f"the learners' homes would be in {folder / 'home'}, but {where} cannot be "
        "entered by other users, so no learner could reach their home: chmod o+x "
        + " ".join(shlex.quote(str(path)) for path in closed)
        + ", or give a --folder that every user can enter (e.g. /tmp/wp-class)"
    ]


def check_folder(folder: str | os.PathLike[str], name: str = "folder") -> Path:
    """``folder`` made absolute, where a new portal may live: not empty, outside the
    project (``.portal`` apart), not holding it, and not open to every user
    (``/tmp`` itself would lose its mode 1777).

    Raises:
        ValueError: in the one sentence of workshop.checks (``name`` is the option
            named: "--folder" on the command line), before anything is made.
    """
    given = os.fspath(folder)
    cli = name.startswith("-")  # an option, or the API's argument
    example = f"{name} /tmp/wp-class" if cli else f"{name}='/tmp/wp-class'"
    fix = f"e.g. {example}, or leave it out for {DEFAULT_FOLDER}"
    if not str(given).strip():
        raise ValueError(message(name, "the path of a folder", given, fix))
    path = Path(given).resolve()
    if path != DEFAULT_FOLDER and (
        path.is_relative_to(ROOT) or ROOT.is_relative_to(path)
    ):
        if path == ROOT:
            where = "is the project"
        elif path.is_relative_to(ROOT):
            where = "is inside the project"
        else:
            where = "holds the project"
        raise ValueError(
            message(
                name,
                f"a folder outside the project {ROOT} (its .portal apart)",
                given,
                f"{path} {where}, and the learners' homes, Slurm's state and the "
                f"munge key would go there; {fix}",
            )
        )
    with contextlib.suppress(OSError):
        if path.is_dir() and path.stat().st_mode & 0o002:
            mode = path.stat().st_mode & 0o7777
            raise ValueError(
                message(
                    name,
                    "a folder of the portal's own",
                    given,
                    f"{path} is open to every user (mode {mode:04o}), and start "
                    f"would close it (0755); give a new folder in it, {fix}",
                )
            )
    return path


def _make_user(name: str, home: Path) -> bool:
    """Make the user ``name`` with home ``home``; False where it existed (its home
    is moved here)."""
    try:
        old_home = Path(pwd.getpwnam(name).pw_dir)
        existed = True
        other = old_home.parent.parent
        hub = _pid(other / "run" / "hub.pid")
        live = (other / "portal.json").exists() and hub is not None and is_alive(hub)
        if other != home.parent.parent and live:
            raise PortalError(
                f"the user {name} belongs to the portal running in {other}: stop it "
                f"first ({portal_command('stop', other)}), or give this one another "
                "prefix"
            )
        subprocess.run(
            ["usermod", "-d", str(home), name], check=True, capture_output=True
        )
    except KeyError:
        existed = False
        useradd = ["useradd", "--no-create-home", "--home-dir", str(home)]
        useradd += ["--shell", "/bin/bash", "--user-group", name]
        subprocess.run(useradd, check=True, capture_output=True)
    entry = pwd.getpwnam(name)
    home.mkdir(parents=True, exist_ok=True)
    # A home left by an earlier portal belonged to a user of the same name, but
    # perhaps of another uid: all of it becomes this one's.
    for folder, dirs, files in os.walk(home):
        for item in [folder] + [os.path.join(folder, n) for n in dirs + files]:
            os.lchown(item, entry.pw_uid, entry.pw_gid)
    home.chmod(0o700)  # a learner's files are theirs alone
    return not existed


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _end(pid: int | None, grace: float) -> None:
    """SIGTERM ``pid``, wait ``grace`` seconds, then SIGKILL it."""
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return
        time.sleep(0.2)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def processes_of(users: list[str]) -> list[tuple[int, str, str]]:
    """Every live process owned by one of ``users``: (pid, user, command)."""
    uids = {}
    for name in users:
        try:
            uids[pwd.getpwnam(name).pw_uid] = name
        except KeyError:
            pass
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            uid = entry.stat().st_uid
            if uid in uids and is_alive(int(entry.name)):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                found.append(
                    (int(entry.name), uids[uid], command.decode(errors="replace"))
                )
        except OSError:
            continue
    return found


def hash_password(password: str, salt: bytes) -> str:
    """The hex scrypt hash of ``password`` with ``salt``: what the hub keeps, so the
    file it reads holds no password."""
    return hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1).hex()


# ------------------------------------------------------------------ their Python
def runs_as(user: str, python: str | os.PathLike[str]) -> bool:
    """True when ``user`` can start ``python`` and import the workshop with it."""
    try:
        done = subprocess.run(
            ["runuser", "-u", user, "--", str(python), "-c", "import workshop"],
            capture_output=True,
            timeout=60,
            cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _link_tree(source: Path, target: Path, skip: tuple[str, ...] = ()) -> None:
    """Hard-link ``source`` into ``target`` (copy across file systems): a link
    reaches the inode, past a private folder above ``source``."""
    shutil.copytree(
        source,
        target,
        symlinks=True,
        copy_function=_link_file,
        ignore=shutil.ignore_patterns(*skip) if skip else None,
    )


def _link_file(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _environment_folders() -> list[Path]:
    """The folders a learner's job reads the workshop from: this environment, its
    site-packages (a venv's may be a link elsewhere) and the checkout."""
    return [
        Path(sys.prefix),
        Path(sysconfig.get_paths()["purelib"]).resolve(),
        ROOT,
    ]


def closed_to_others() -> list[str]:
    """What stops the learners from reading the workshop's packages (a private
    folder above them, such as a clone in ``mktemp -d``): one problem or none."""
    closed = _closed(f for p in _environment_folders() for f in [p, *p.parents])
    if not closed:
        return []
    where = [f"{path} (mode {mode:04o})" for path, mode in sorted(closed.items())]
    return [
        "the learners' jobs run this environment's Python as their own users, but "
        f"{', '.join(where)} cannot be entered by other users: chmod o+rx "
        + " ".join(str(path) for path in sorted(closed))
        + ", or clone the workshop into a folder every user can read"
    ]


def _closed(folders: Iterable[Path]) -> dict[Path, int]:
    """The ``folders`` other users cannot enter (no o+x), top first, with modes."""
    closed: dict[Path, int] = {}
    for folder in sorted(set(folders)):
        try:
            mode = folder.stat().st_mode & 0o7777
        except OSError:
            continue
        if folder.is_dir() and not mode & 0o001:
            closed[folder] = mode
    return closed


def learner_python(folder: Path, user: str) -> tuple[Path, dict[str, str]]:
    """The interpreter ``user`` runs the workshop with, and the variables it needs.

    This one where ``user`` can run it; otherwise a venv in ``folder/venv`` on a
    linked copy of the base interpreter in ``folder/python``.

    Raises:
        RuntimeError: even the venv does not run for ``user``, with what it said.
    """
    if runs_as(user, sys.executable):
        return Path(sys.executable), {}
    base = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    python_copy, venv = folder / "python", folder / "venv"
    shutil.rmtree(python_copy, ignore_errors=True)
    shutil.rmtree(venv, ignore_errors=True)
    python_copy.mkdir(parents=True)
    # The interpreter, its shared library and its standard library: not the base's
    # own site-packages, which the venv does not see anyway.
    _link_tree(base / "bin", python_copy / "bin")
    (python_copy / "lib").mkdir()
    for entry in (base / "lib").iterdir():
        if entry.name.startswith("libpython") and entry.is_file():
            _link_file(entry, python_copy / "lib" / entry.name)
    _link_tree(
        base / "lib" / version,
        python_copy / "lib" / version,
        skip=("site-packages", "test", "__pycache__"),
    )
    (python_copy / "lib" / version / "site-packages").mkdir()
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / version).mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(
        f"home = {python_copy / 'bin'}\ninclude-system-site-packages = false\n"
        f"version = {'.'.join(map(str, sys.version_info[:3]))}\n"
    )
    (venv / "lib" / version / "site-packages").symlink_to(
        sysconfig.get_paths()["purelib"]
    )
    interpreter = venv / "bin" / "python"
    interpreter.symlink_to(python_copy / "bin" / version)
    for alias in ("python3", version):
        (venv / "bin" / alias).symlink_to("python")
    _rewrite_scripts(Path(sys.executable).parent, venv / "bin", interpreter)
    # JupyterLab's settings and app folder: without them the server runs with no
    # /lab (its extension is enabled by a file in etc/jupyter).
    for sub in ("etc/jupyter", "share/jupyter"):
        source = Path(sys.prefix) / sub
        if source.is_dir():
            (venv / sub).parent.mkdir(parents=True, exist_ok=True)
            (venv / sub).symlink_to(source, target_is_directory=True)
    library = python_copy / "lib"
    env = {"LD_LIBRARY_PATH": str(library)}
    _write_activate(venv, library)
    done = subprocess.run(
        ["runuser", "-u", user, "--", str(interpreter), "-c", "import workshop"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env=dict(os.environ, **env),
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{user} cannot run this environment's Python ({sys.executable}), nor the "
            f"venv made for the learners in {venv}: {done.stderr.strip()[-400:]}. "
            "HINT: put the workshop's environment where every user can read it (not "
            "under /root)"
        )
    return interpreter, env


def _rewrite_scripts(source: Path, target: Path, interpreter: Path) -> None:
    """Copy ``source``'s console scripts into ``target``, run by ``interpreter``."""
    for script in source.iterdir():
        copy = target / script.name
        if not script.is_file() or script.is_symlink() or copy.exists():
            continue
        try:
            first, _, body = script.read_bytes().partition(b"\n")
        except OSError:
            continue
        if not first.startswith(b"#!") or b"python" not in first[:256]:
            continue
        copy.write_bytes(b"#!" + bytes(interpreter) + b"\n" + body)
        copy.chmod(0o755)


def _write_activate(venv: Path, library: Path) -> None:
    """``venv/bin/activate`` (slurm/'s scripts source one): this environment's,
    naming the new venv, with the library path its interpreter needs."""
    own = Path(sys.prefix) / "bin" / "activate"
    text = own.read_text() if own.exists() else ""
    text = text.replace(sys.prefix, str(venv))
    if "VIRTUAL_ENV" not in text:  # no activate to start from: the essentials
        text = f'export VIRTUAL_ENV="{venv}"\nexport PATH="$VIRTUAL_ENV/bin:$PATH"\n'
    text += (
        f'export LD_LIBRARY_PATH="{library}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n'
    )
    (venv / "bin" / "activate").write_text(text)
