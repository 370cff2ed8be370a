#!/usr/bin/env bash
# Set up the workshop environment: a virtual environment in .venv at the project
# root with the exact versions in requirements.txt and this package installed in
# editable mode.
#
#   bash scripts/setup.sh          # or: make setup
#   PYTHON=python3.12 bash scripts/setup.sh   # choose the interpreter (3.11 to 3.14)
#   bash scripts/setup.sh --check [PYTHON]    # has PYTHON everything? (installs nothing)
#
# Safe to run again: a stamp in .venv records what was installed (a hash of
# requirements.txt, pyproject.toml and the Python version), and a second run with
# nothing changed returns in seconds. Delete .venv (make clean) to start over.
# A .venv made another way (no stamp) that has everything is left as it is.
# Where python3 is a Python that the pins have no wheels for (3.10, as on Ubuntu
# 22.04), setup uses a python3.X on PATH or in pyenv that they have, or says which
# Python to get, before it downloads anything.
#
# --check says whether PYTHON (default python3) already has all the workshop needs:
# this checkout's workshop package importable, and the packages of pyproject.toml
# (its dependencies but torchvision, and the extras in CHECK_EXTRAS) at their minimum
# versions. It prints "PATH Python X.Y.Z, torch V" and exits 0, or says what is
# missing on stderr and exits 1. `make lab` and `make test` ask it about python3
# where there is no .venv, and then set nothing up.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.workshop-setup-stamp"
REQUIREMENTS="$ROOT/requirements.txt"
PYTHON_GIVEN="${PYTHON:-}"  # PYTHON=... chosen by the user: used or refused, never replaced
PYTHON="${PYTHON:-python3}"
# The Pythons (X.Y) that requirements.txt's pins have wheels for, oldest first: every
# pin has one for CPython 3.11 to 3.14; torch 2.15.0, numpy 2.4.6, scikit-learn 1.9.1
# and matplotlib 3.11.2 have none for 3.10, numpy 2.4.6 none for 3.15 (PyPI, checked
# per pin with pip install --dry-run --no-deps --only-binary=:all: --target DIR
# --python-version X.Y). Change it with the pins. A site's own torch (pyproject.toml's
# ranges) works on 3.10 too: that is --check's business, not .venv's.
PINNED_PYTHONS=(3.11 3.12 3.13 3.14)
PINNED_RANGE="${PINNED_PYTHONS[0]} to ${PINNED_PYTHONS[-1]}"
# What `make lab` and `make test` need, and so all that --check asks for: pyproject's
# dependencies and these extras. Not the portal's (jupyterhub, batchspawner: make
# portal only), which a GPU node's wheelhouse rightly leaves out.
CHECK_EXTRAS=(lab test)

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# Prints "3.11.7" for a working interpreter, fails otherwise.
python_version() {
    "$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null
}

# Whether a version "3.12.4" is one that requirements.txt's pins support.
pinned() {
    local minor
    for minor in "${PINNED_PYTHONS[@]}"; do
        [[ "$1" == "$minor".* ]] && return 0
    done
    return 1
}

# ---- system packages -----------------------------------------------------------
# What pip cannot install: Open MPI (mpirun, a launcher taught in notebook 03) and
# Slurm with munge (a private one-node cluster, scripts/local_slurm.sh, on which the
# tests run the batch scripts in slurm/ for real). Installed with apt-get when this
# runs as root on Debian or Ubuntu and they are missing; otherwise setup says what is
# missing and goes on: the notebooks run without them, and on a cluster they are
# the site's own (module load openmpi; Slurm is already there). shellcheck lints the
# batch scripts in the tests. Chromium and its driver let tests/browser open the
# notebooks in JupyterLab in a real (headless) browser, as a learner sees them.
# Node.js and npm run and install JupyterHub's proxy for the private portal (make
# portal), as a site's JupyterHub has it.
SYSTEM_PACKAGES=(openmpi-bin slurm-wlm munge shellcheck chromium chromium-driver nodejs
    npm)
install_system_packages() {
    local missing=()
    command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
    { command -v slurmctld && command -v slurmd && command -v srun; } >/dev/null 2>&1 \
        || missing+=(slurm-wlm)
    command -v munged >/dev/null 2>&1 || missing+=(munge)
    command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
    command -v node >/dev/null 2>&1 || missing+=(nodejs)
    command -v npm >/dev/null 2>&1 || missing+=(npm)
    if [[ ${#missing[@]} -eq 0 ]]; then
        say "system packages: present (${SYSTEM_PACKAGES[*]})"
        return
    fi
    if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        say "system packages missing: ${missing[*]}; the tests that run mpirun, a
[setup]   local Slurm or a browser will say so and skip. To have them, ask an
[setup]   administrator for: apt-get install ${missing[*]}
[setup]   (on a cluster: module load openmpi)"
        return
    fi
    say "installing ${missing[*]} with apt-get (mpirun, a local Slurm, shellcheck and a\
 headless Chromium for the tests)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get update -qq; then
        apt_failed "apt-get update failed; is the package mirror reachable?" "${missing[@]}"
    elif ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
        apt_failed "apt-get install ${missing[*]} failed." "${missing[@]}"
    fi
}

# CI must have the system packages, so there a failed apt-get stops setup. Elsewhere
# (a compute node with no network, a mirror that lacks Slurm) it is said and setup
# goes on: the notebooks do not need them, and the tests that do skip with the reason.
apt_failed() {
    local why="$1"
    shift
    if [[ -n "${CI:-}" ]]; then
        die "$why
HINT: run it by hand to see why: apt-get update && apt-get install $*"
    fi
    say "$why
[setup]   Going on without $*: not in CI, and the notebooks do not need them;
[setup]   the tests that do (mpirun, a local Slurm, shellcheck, a browser) will say
[setup]   so and skip. To have them later: apt-get update && apt-get install $*"
}

# Other Pythons the pins support, the newest first: python3.X on PATH, then pyenv's
# (its shims on PATH answer only for the versions it has active).
other_pythons() {
    local i minor dir best patch
    for ((i = ${#PINNED_PYTHONS[@]} - 1; i >= 0; i--)); do
        command -v "python${PINNED_PYTHONS[i]}" 2>/dev/null || true
    done
    local pyenv_root="${PYENV_ROOT:-$HOME/.pyenv}"
    for ((i = ${#PINNED_PYTHONS[@]} - 1; i >= 0; i--)); do
        minor="${PINNED_PYTHONS[i]}" best="" patch=-1
        for dir in "$pyenv_root/versions/$minor".*; do
            # 3.13.1, not 3.13.1t (free-threaded) nor 3.13-dev
            [[ "${dir##*/}" =~ ^$minor\.([0-9]+)$ && -x "$dir/bin/python$minor" ]] \
                || continue
            ((BASH_REMATCH[1] > patch)) && patch="${BASH_REMATCH[1]}" best="$dir"
        done
        [[ -z "$best" ]] || printf '%s\n' "$best/bin/python$minor"
    done
}

# Sets PYTHON to the interpreter .venv is made with: PYTHON as given, else python3,
# else (python3 missing, or a version the pins have no wheels for) the newest other
# Python the pins support. Says which in one line; or, finding none, says in one line
# which Python is needed and how to have one, and exits 1. Downloads nothing.
find_python() {
    local found="" other version
    if command -v "$PYTHON" >/dev/null 2>&1; then
        found="$(python_version "$PYTHON")" \
            || die "'$PYTHON' ($(command -v "$PYTHON")) does not run."
        if pinned "$found"; then
            say "using $PYTHON ($(command -v "$PYTHON"), Python $found)"
            return
        fi
    elif [[ -n "$PYTHON_GIVEN" ]]; then
        die "'$PYTHON' not found. HINT: name an installed Python $PINNED_RANGE:\
 PYTHON=/path/to/python3.12 bash scripts/setup.sh"
    fi
    local why="there is no $PYTHON"
    [[ -z "$found" ]] || why="$PYTHON is Python $found, which requirements.txt's pins\
 have no wheels for (they need $PINNED_RANGE)"
    if [[ -z "$PYTHON_GIVEN" ]]; then
        while read -r other; do
            if ! version="$(python_version "$other")" || ! pinned "$version"; then
                continue
            fi
            say "$why: using $other (Python $version) instead"
            PYTHON="$other"
            return
        done < <(other_pythons)
        why+=", and no python${PINNED_PYTHONS[0]}..${PINNED_PYTHONS[-1]} is on PATH"
        why+=" or in pyenv"
    fi
    die "$why. HINT: apt install python3.11 python3.11-venv (Ubuntu 22.04), pyenv\
 install 3.12, or module load python/3.12 (a cluster); then PYTHON=python3.11 make setup"
}

# Whether .venv holds a working Python that the pins support.
venv_usable() {
    local version
    [[ -d "$VENV" ]] && version="$(python_version "$VENV/bin/python")" \
        && pinned "$version"
}

# Reuses a working .venv; creates it when missing, recreates it when broken or of a
# Python the pins do not support. find_python has chosen PYTHON.
make_venv() {
    if venv_usable; then
        say "reusing $VENV (Python $(python_version "$VENV/bin/python"))"
        return
    fi
    if [[ -e "$VENV" ]]; then
        say "$VENV does not hold a working Python $PINNED_RANGE; recreating it"
        rm -rf "$VENV"
    fi
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV" || die "'$PYTHON -m venv' failed.
HINT: Debian/Ubuntu ship venv separately: apt install python3-venv (or python3.X-venv)."
}

setup_hash() {
    {
        cat "$REQUIREMENTS" "$ROOT/pyproject.toml" "$ROOT/portal/package-lock.json"
        "$VENV/bin/python" -c 'import sys; print(sys.version)'
    } | sha256sum | cut -d' ' -f1
}

install_python_packages() {
    # This machine's pip configuration may name a site-wide constraint file that caps
    # torch below our pin. PIP_CONSTRAINT in the environment takes the place of the
    # configured one, so pointing it at our own pins keeps them while leaving the
    # system's files alone.
    export PIP_CONSTRAINT="$REQUIREMENTS"
    local pip=("$VENV/bin/python" -m pip)
    if [[ -n "${CI:-}" ]]; then
        export PIP_PROGRESS_BAR=off  # progress bars only clutter CI logs
    fi
    # An interrupted install must not look finished, nor like a .venv made another
    # way (one with no stamp at all, which setup leaves alone when it is complete).
    printf 'unfinished\n' >"$STAMP"
    say "installing requirements.txt (the first time this downloads about 2.7 GB)"
    "${pip[@]}" install -r "$REQUIREMENTS"
    say "installing the workshop package in editable mode"
    "${pip[@]}" install --no-deps -e "$ROOT"
    say "checking that the installed packages are consistent"
    "${pip[@]}" check
    install_proxy
    "$VENV/bin/python" -c 'import importlib.util, torch
if importlib.util.find_spec("workshop") is None:
    raise SystemExit("[setup] ERROR: the workshop package is not importable from .venv")
print("[setup] torch", torch.__version__, "| CUDA build", torch.version.cuda)'
}

# JupyterHub's proxy (configurable-http-proxy, a Node.js program) for the private
# portal, at the versions of portal/package-lock.json, into .venv/proxy, where
# workshop.instructor.portal looks for it. Without node and npm the portal cannot start
# (it says so) and its tests skip; nothing else needs them. In CI they must be there.
install_proxy() {
    local proxy="$VENV/proxy"
    if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
        [[ -z "${CI:-}" ]] || die "node and npm are missing: the portal's proxy cannot
be installed.
HINT: apt-get install nodejs npm"
        say "no node/npm: JupyterHub's proxy for make portal is not installed (the"
        say "  portal's tests will skip; apt-get install nodejs npm, then make setup)"
        return
    fi
    say "installing JupyterHub's proxy (portal/package-lock.json) into $proxy"
    rm -rf "$proxy"
    mkdir -p "$proxy"
    cp "$ROOT/portal/package.json" "$ROOT/portal/package-lock.json" "$proxy/"
    (cd "$proxy" && npm ci --omit=dev --no-audit --no-fund --loglevel=error) \
        || die "npm ci of the portal's proxy failed (above).
HINT: is the npm registry reachable? (npm ping)"
}

# ---- is an environment complete? ------------------------------------------------
# Run by the Python in question, with this checkout's path and the extras to count
# (CHECK_EXTRAS) as its arguments; prints "Python X.Y.Z, torch V" and exits 0, or
# prints what is missing and exits 1. The needed packages and their minimum versions
# are pyproject.toml's dependencies and those extras, but torchvision: a site's
# torch module may lack it, and what needs it says so. Python 3.10 has no tomllib:
# there it reads pyproject.toml with tomli, or the copy that pip carries.
# shellcheck disable=SC2016  # Python code, not shell: nothing to expand
CHECK_CODE='
import importlib
import importlib.metadata as metadata
import importlib.util
import os
import re
import sys

if not getattr(sys.flags, "safe_path", False):
    del sys.path[0]  # the current folder: count only what this Python finds anywhere


def toml_reader():
    for name in ("tomllib", "tomli", "pip._vendor.tomli"):
        try:
            return importlib.import_module(name)
        except ImportError:
            pass
    raise SystemExit("tomli, to read pyproject.toml (pip install tomli; Python 3.11 "
                     "has tomllib)")


root = os.path.realpath(sys.argv[1])
with open(os.path.join(root, "pyproject.toml"), "rb") as file:
    project = toml_reader().load(file)["project"]
requirements = list(project["dependencies"])
for extra in sys.argv[2:]:
    requirements += project["optional-dependencies"][extra]
needed = {}
for requirement in requirements:
    form = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:>=([0-9.]+))?", requirement.replace(" ", ""))
    if form is None:
        raise SystemExit(f"pyproject.toml: {requirement!r} is not name or name>=version"
                         ", the forms scripts/setup.sh --check reads")
    needed[form.group(1)] = form.group(2) or "0"
needed.pop("torchvision", None)
modules = {"scikit-learn": "sklearn", "pytest-timeout": "pytest_timeout"}


def numbers(version):
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])


missing, found = [], {}
oldest = re.fullmatch(r">=([0-9.]+)", project["requires-python"]).group(1)
if sys.version_info[:2] < numbers(oldest):
    missing.append(f"Python>={oldest} (found %d.%d)" % sys.version_info[:2])
for name, minimum in needed.items():
    module = modules.get(name, name.replace("-", "_"))
    if importlib.util.find_spec(module) is None:
        missing.append(f"{name} (not importable)")
        continue
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:  # a module built without metadata
        version = getattr(__import__(module), "__version__", "0")
    found[name] = version
    if numbers(version) < numbers(minimum):
        missing.append(f"{name}>={minimum} (found {version})")
spec = importlib.util.find_spec("workshop")
where = spec and spec.submodule_search_locations
here = os.path.join(root, "workshop")
if not where:
    missing.append(f"the workshop package (not importable; PYTHONPATH={root} or "
                   "pip install -e . would make it so)")
elif os.path.realpath(list(where)[0]) != here:
    missing.append(f"the workshop package of this checkout ({here}; it imports "
                   f"{list(where)[0]} instead)")
if missing:
    print("; ".join(missing))
    raise SystemExit(1)
print("Python %d.%d.%d," % sys.version_info[:3], "torch", found["torch"])
'

# check_environment PYTHON: what --check says, for setup itself too.
check_environment() {
    local py="$1" path said
    path="$(command -v "$py" 2>/dev/null)" || {
        printf "'%s' not found\n" "$py" >&2
        return 1
    }
    # Absolute, but not resolved: a venv's python is a link to the one it was made from.
    [[ "$path" == /* ]] || path="$(cd "$(dirname "$path")" && pwd)/${path##*/}"
    if said="$("$path" -c "$CHECK_CODE" "$ROOT" "${CHECK_EXTRAS[@]}" 2>&1)"; then
        printf '%s %s\n' "$path" "$said"
    else
        printf '%s lacks: %s\n' "$path" "${said:-nothing said; it does not run}" >&2
        return 1
    fi
}

# A .venv without setup's stamp was made by hand (python -m venv, pip install -e
# .) or by a site's tools; when it has everything, setup leaves it as it is. Sets
# ANOTHER_WAY to what --check says of it.
ANOTHER_WAY=""
made_another_way() {
    [[ -x "$VENV/bin/python" && ! -e "$STAMP" ]] || return 1
    ANOTHER_WAY="$(check_environment "$VENV/bin/python" 2>/dev/null)"
}

main() {
    if [[ "${1:-}" == --check ]]; then
        check_environment "${2:-python3}"
        return
    fi
    [[ $# -eq 0 ]] || die "unknown argument '$1'.
HINT: bash scripts/setup.sh, or bash scripts/setup.sh --check [PYTHON]"
    local start=$SECONDS
    cd "$ROOT"
    # The Python to make .venv with is chosen first, before apt-get or pip download
    # anything; a complete .venv made another way needs none.
    made_another_way || venv_usable || find_python
    install_system_packages
    if [[ -n "$ANOTHER_WAY" ]]; then
        say "found $VENV made another way (it has no stamp of this script) and complete:"
        say "  ${ANOTHER_WAY#* }; leaving it as it is (make clean, then make setup, to have"
        say "  setup build its own)"
        return
    fi
    make_venv
    local want
    want="$(setup_hash)"
    if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
        say "up to date (requirements.txt, pyproject.toml and Python unchanged)"
    else
        install_python_packages
        printf '%s\n' "$want" >"$STAMP"
        say "done in $((SECONDS - start)) s"
    fi
    say ".venv uses $(du -sh "$VENV" | cut -f1) of disk"
}

main "$@"
