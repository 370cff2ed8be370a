#!/usr/bin/env bash
# Set up the workshop environment: a virtual environment in .venv at the project
# root with the exact versions in requirements.txt and this package installed in
# editable mode.
#
#   bash scripts/setup.sh          # or: make setup
#   PYTHON=python3.12 bash scripts/setup.sh   # choose the interpreter (>= 3.10)
#
# Safe to run again: a stamp in .venv records what was installed (a hash of
# requirements.txt, pyproject.toml and the Python version), and a second run with
# nothing changed returns in seconds. Delete .venv (make clean) to start over.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.workshop-setup-stamp"
REQUIREMENTS="$ROOT/requirements.txt"
PYTHON="${PYTHON:-python3}"
MIN_PYTHON="3.10"

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# Prints "3.11.7" for a working interpreter of at least $MIN_PYTHON, fails otherwise.
python_version() {
    "$1" -c 'import sys
if sys.version_info < (3, 10):
    raise SystemExit(1)
print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null
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
SYSTEM_PACKAGES=(openmpi-bin slurm-wlm munge shellcheck chromium chromium-driver)
install_system_packages() {
    local missing=()
    command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
    { command -v slurmctld && command -v slurmd && command -v srun; } >/dev/null 2>&1 \
        || missing+=(slurm-wlm)
    command -v munged >/dev/null 2>&1 || missing+=(munge)
    command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
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
    apt-get update -qq || die "apt-get update failed; is the package mirror reachable?"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed.
HINT: run it by hand to see why: apt-get install ${missing[*]}"
}

find_python() {
    command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found.
HINT: install Python $MIN_PYTHON or newer with its venv module (Debian/Ubuntu:
  apt install python3 python3-venv; on a cluster: module load python), or point
  PYTHON at one: PYTHON=/path/to/python3.11 bash scripts/setup.sh"
    local found
    found="$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)" \
        || die "'$PYTHON' ($(command -v "$PYTHON")) does not run."
    python_version "$PYTHON" >/dev/null || die "'$PYTHON' is Python $found; the workshop needs $MIN_PYTHON or newer.
HINT: install a newer Python (Debian/Ubuntu: apt install python3.11 python3.11-venv;
  on a cluster: module load python/3.11) and run
  PYTHON=python3.11 bash scripts/setup.sh"
    say "using $PYTHON ($(command -v "$PYTHON"), Python $found)"
}

# Reuses a working .venv; creates it when missing, recreates it when broken.
make_venv() {
    if [[ -d "$VENV" ]] && python_version "$VENV/bin/python" >/dev/null; then
        say "reusing $VENV (Python $(python_version "$VENV/bin/python"))"
        return
    fi
    find_python
    if [[ -e "$VENV" ]]; then
        say "$VENV does not hold a working Python >= $MIN_PYTHON; recreating it"
        rm -rf "$VENV"
    fi
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV" || die "'$PYTHON -m venv' failed.
HINT: Debian/Ubuntu ship venv separately: apt install python3-venv (or python3.X-venv)."
}

setup_hash() {
    {
        cat "$REQUIREMENTS" "$ROOT/pyproject.toml"
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
    rm -f "$STAMP"  # an interrupted install must not look finished
    say "installing requirements.txt (the first time this downloads about 2.7 GB)"
    "${pip[@]}" install -r "$REQUIREMENTS"
    say "installing the workshop package in editable mode"
    "${pip[@]}" install --no-deps -e "$ROOT"
    say "checking that the installed packages are consistent"
    "${pip[@]}" check
    "$VENV/bin/python" -c 'import importlib.util, torch
if importlib.util.find_spec("workshop") is None:
    raise SystemExit("[setup] ERROR: the workshop package is not importable from .venv")
print("[setup] torch", torch.__version__, "| CUDA build", torch.version.cuda)'
}

main() {
    local start=$SECONDS
    cd "$ROOT"
    install_system_packages
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
