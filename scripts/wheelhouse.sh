#!/usr/bin/env bash
# Download wheels of the workshop's Python packages into wheelhouse/ at the project
# root, for a compute node with no internet. Everything in requirements.txt except
# torch and torchvision (and their CUDA libraries): on a cluster those are the site's
# own module. Run it on a machine that can reach PyPI, copy wheelhouse/ over, and
# install from it on the node with pip --no-index; the script prints how at the end.
#
#   bash scripts/wheelhouse.sh                   # or: make wheelhouse
#   make wheelhouse PY=3.12 PLATFORM=manylinux_2_28_x86_64
#   make wheelhouse PY=3.12 PLATFORM=manylinux_2_28_aarch64   # an ARM cluster
#   bash scripts/wheelhouse.sh --dry-run         # or DRY_RUN=1: print, do nothing
#
# PY        the node's Python, X.Y (default: the version of .venv, else of python3)
# PLATFORM  the node's platform tag (default: manylinux_2_28_x86_64, for glibc 2.28 or
#           newer: RHEL/Rocky 8 and later). A node with glibc 2.N takes wheels of
#           manylinux_2_N and older, so name the node's glibc (ldd --version) here.
# WHEELHOUSE_PYTHON  the Python that runs pip (default: pythonX.Y, else .venv's)
#
# The wheelhouse gains a requirements-offline.txt, a wheel of the workshop package
# itself and one of setuptools (to install the package with -e . offline). Running
# again with other PY or PLATFORM values adds their wheels next to the others, and
# pip on the node picks the ones that fit; rm -rf wheelhouse to start over.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQUIREMENTS="$ROOT/requirements.txt"
DEST="$ROOT/wheelhouse"
OFFLINE_REQUIREMENTS="$DEST/requirements-offline.txt"
MIN_PYTHON="3.10"  # requires-python in pyproject.toml
DEFAULT_PLATFORM="manylinux_2_28_x86_64"
DRY_RUN="${DRY_RUN:-}"

say() { printf '[wheelhouse] %s\n' "$*"; }
die() { printf '[wheelhouse] ERROR: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

# Prints "3.11" for an interpreter that runs and has pip; fails otherwise.
pip_python_version() {
    "$1" -c 'import sys; import pip; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}

# ---- the node: Python version and platform tags --------------------------------

check_py() {
    [[ "$PY" =~ ^([0-9]+)\.([0-9]+)$ ]] || die "PY='$PY' is not a Python version.
HINT: give major.minor, the version of the node's Python: make wheelhouse PY=3.12"
    local major="${BASH_REMATCH[1]}" minor="${BASH_REMATCH[2]}"
    if ((major < 3 || (major == 3 && minor < ${MIN_PYTHON#3.}))); then
        die "PY=$PY is below the workshop's minimum, Python $MIN_PYTHON
  (requires-python in pyproject.toml).
HINT: give the version of the Python in the node's PyTorch module (module load pytorch;
  python --version); if that is older than $MIN_PYTHON, ask for a newer module."
    fi
}

# Sets PLATFORMS to every tag a node of $PLATFORM accepts, newest first. pip takes
# --platform values literally (it widens only manylinux2014 and manylinux2010), so
# a wheel tagged manylinux_2_27 alone is refused unless that tag is listed too.
expand_platform() {
    local glibc arch legacy=""
    if [[ "$PLATFORM" =~ ^manylinux_2_([0-9]+)_([a-z0-9_]+)$ ]]; then
        glibc="${BASH_REMATCH[1]}" arch="${BASH_REMATCH[2]}"
    elif [[ "$PLATFORM" =~ ^manylinux(1|2010|2014)_([a-z0-9_]+)$ ]]; then
        legacy="${BASH_REMATCH[1]}" arch="${BASH_REMATCH[2]}"
        case "$legacy" in 1) glibc=5 ;; 2010) glibc=12 ;; 2014) glibc=17 ;; esac
    else
        die "PLATFORM='$PLATFORM' is not a manylinux platform tag.
HINT: name the node's glibc and CPU (ldd --version; uname -m), for example
  PLATFORM=manylinux_2_28_x86_64 (glibc 2.28, RHEL/Rocky 8 or newer),
  PLATFORM=manylinux2014_x86_64 (glibc 2.17) or PLATFORM=manylinux_2_28_aarch64"
    fi
    local oldest
    case "$arch" in
        x86_64 | i686) oldest=5 ;;
        aarch64 | ppc64le | s390x | armv7l) oldest=17 ;;
        *) die "PLATFORM=$PLATFORM: unknown CPU '$arch'.
HINT: one of x86_64, aarch64, ppc64le, s390x, i686, armv7l (uname -m on the node)" ;;
    esac
    if ((glibc < oldest)); then
        die "PLATFORM=$PLATFORM: there are no $arch wheels for glibc older than 2.$oldest.
HINT: PLATFORM=manylinux_2_${oldest}_$arch or newer (ldd --version on the node)"
    fi
    PLATFORMS=()
    local n
    for ((n = glibc; n >= oldest; n--)); do
        PLATFORMS+=("manylinux_2_${n}_$arch")
    done
    ((glibc >= 17)) && PLATFORMS+=("manylinux2014_$arch")
    if [[ "$arch" == x86_64 || "$arch" == i686 ]]; then
        ((glibc >= 12)) && PLATFORMS+=("manylinux2010_$arch")
        PLATFORMS+=("manylinux1_$arch")
    fi
    return 0
}

# ---- what to download ----------------------------------------------------------

# requirements.txt less torch, torchvision and the CUDA libraries pip would bring
# with them: the node has the site's build of those. Less JupyterHub and its Slurm
# spawner too: they run the private portal of make portal, not a node's lab (a
# site's portal has its own hub).
offline_requirements() {
    local line name
    while IFS= read -r line || [[ -n "$line" ]]; do
        line="${line%%#*}"
        line="${line//[[:space:]]/}"
        [[ -n "$line" ]] || continue
        name="${line%%[=<>!~;[]*}"
        name="${name,,}"
        name="${name//_/-}"
        case "$name" in
            torch | torchvision | torchaudio) continue ;;
            triton | pytorch-triton* | nvidia-* | cuda-*) continue ;;
            jupyterhub | batchspawner) continue ;;
        esac
        printf '%s\n' "$line"
    done <"$REQUIREMENTS"
}

# The build backend of pyproject.toml ("setuptools>=64"): pip needs its wheel to
# install the workshop with `pip install --no-index --find-links wheelhouse -e .`.
build_requirements() {
    sed -n 's/^requires *= *\[\(.*\)\]/\1/p' "$ROOT/pyproject.toml" \
        | tr -d '" ' | tr ',' '\n'
}

# The interpreter that runs pip. pip evaluates environment markers for the Python it
# runs on, not for --python-version: pip on 3.12 building for 3.10 leaves out tomli
# and exceptiongroup (needed below 3.11 only), so a newer one is refused; an older
# one only adds a few wheels the node will not use (typing_extensions), so it warns.
choose_pip_python() {
    local candidate version
    if [[ -n "${WHEELHOUSE_PYTHON:-}" ]]; then
        RUNNER="$WHEELHOUSE_PYTHON"
        version="$(pip_python_version "$RUNNER")" \
            || die "WHEELHOUSE_PYTHON='$RUNNER' does not run, or has no pip.
HINT: WHEELHOUSE_PYTHON=/path/to/python$PY (one with pip), or leave it unset"
    else
        # The first that runs, unless a later one is exactly PY.
        RUNNER="" version=""
        local found
        for candidate in "python$PY" "$ROOT/.venv/bin/python" python3; do
            found="$(pip_python_version "$candidate")" || continue
            if [[ -z "$RUNNER" || "$found" == "$PY" ]]; then
                RUNNER="$candidate" version="$found"
            fi
            [[ "$found" == "$PY" ]] && break
        done
        [[ -n "$RUNNER" ]] || die "no Python with pip found to run pip download.
HINT: make setup (creates .venv), or WHEELHOUSE_PYTHON=/path/to/python3"
    fi
    say "pip runs on $RUNNER (Python $version)"
    [[ "$version" == "$PY" ]] && return
    if [[ "$(printf '%s\n' "$version" "$PY" | sort -V | tail -1)" == "$version" ]]; then
        die "pip on Python $version resolves for $version, not PY=$PY: packages that
  only Python $PY needs (backports such as tomli and exceptiongroup) would be missing.
HINT: run pip on a Python $PY: WHEELHOUSE_PYTHON=/path/to/python$PY"
    fi
    say "note: pip on Python $version adds a few wheels only $version needs;"
    say "  the node ignores them. Exact: WHEELHOUSE_PYTHON=/path/to/python$PY"
}

# ---- running pip ---------------------------------------------------------------

# Prints a command as one line a shell can run again.
show() {
    local quoted=() arg
    for arg in "$@"; do quoted+=("$(printf '%q' "$arg")"); done
    printf '  %s\n' "${quoted[*]}"
}

download() {
    local log
    log="$(mktemp)"
    # pipefail makes the pipeline fail with pip; tee keeps pip's progress on screen.
    if ! "${DOWNLOAD[@]}" 2>&1 | tee "$log"; then
        local missing
        missing="$(sed -n 's/.*No matching distribution found for //p' "$log" | head -1)"
        rm -f "$log"
        [[ -n "$missing" ]] || die "pip download failed (above).
HINT: is PyPI reachable? pip config list shows the index this pip uses."
        die "no wheel of $missing for Python $PY on $PLATFORM (pip above).
HINT: PLATFORM must name the node's glibc (ldd --version); the pinned numpy,
  scikit-learn and pillow have x86_64 wheels for glibc 2.28 or newer only
  (PLATFORM=manylinux_2_28_x86_64). Check too that PY is the node's Python."
    fi
    rm -f "$log"
}

# Fails if anything of the torch family came in as a dependency after all.
check_no_torch() {
    local found
    local family='^(torch|torchvision|torchaudio|triton|pytorch_triton|nvidia_|cuda_)[-_]'
    found="$(find "$DEST" -maxdepth 1 -name '*.whl' -printf '%f\n' \
        | grep -Ei "$family" || true)"
    [[ -z "$found" ]] || die "the wheelhouse holds torch or CUDA wheels:
$found
HINT: a requirement pulls in torch; remove them and find it: pip download --no-deps"
}

print_instructions() {
    local wheels megabytes
    wheels="$(find "$DEST" -maxdepth 1 -name '*.whl' | wc -l)"
    megabytes="$(du -sm "$DEST" | cut -f1)"
    say "done: $wheels wheels, $megabytes MB in $DEST"
    cat <<EOF

Copy it to the cluster, next to the project (the workshop wheel is in it too):
  rsync -a wheelhouse/ CLUSTER:PATH/scaling-pytorch-hpc/wheelhouse/

On the node, with no internet, in the project folder:
(a) a venv on top of the site's torch module (the module's torch is used, not installed)
  module load pytorch                  # its Python must be $PY
  python workshop/instructor/site_env.py --apply
  #   (makes .venv as the module's Python needs: python -m venv --system-site-packages
  #   misses the module's torch where that Python is itself a venv; without --apply
  #   it only says what it found and prints the lines)
  .venv/bin/pip install --no-index --find-links wheelhouse -r wheelhouse/requirements-offline.txt
  .venv/bin/pip install --no-index --find-links wheelhouse --no-deps -e .
  #   (-e . is built with setuptools from the wheelhouse: hence --find-links)
  .venv/bin/jupyter lab notebooks
  # without the source tree: site_env.py from the workshop's wheel for the second
  # line, and the workshop's wheel instead of -e . in the fourth:
  python -m zipfile -e wheelhouse/scaling_pytorch_hpc-*.whl workshop-wheel
  python workshop-wheel/workshop/instructor/site_env.py --apply
  .venv/bin/pip install --no-index --find-links wheelhouse --no-deps scaling-pytorch-hpc
(b) no venv: the packages into a folder, found through PYTHONPATH
  module load pytorch
  python -m pip install --no-index --find-links wheelhouse --target jupyter-pkgs -r wheelhouse/requirements-offline.txt
  export PYTHONPATH="\$PWD:\$PWD/jupyter-pkgs" JUPYTER_PATH="\$PWD/jupyter-pkgs/share/jupyter"
  export JUPYTERLAB_DIR="\$PWD/jupyter-pkgs/share/jupyter/lab"
  python -m jupyterlab notebooks       # PYTHONPATH absolute: kernels start in notebooks/
EOF
}

main() {
    case "${1:-}" in
        "") ;;
        --dry-run) DRY_RUN=1 ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument '$1'.
HINT: bash scripts/wheelhouse.sh [--dry-run]   (PY and PLATFORM come from the environment)" ;;
    esac
    [[ -z "$DRY_RUN" || "$DRY_RUN" == 0 ]] && DRY_RUN=""

    if [[ -z "${PY:-}" ]]; then
        PY="$(pip_python_version "$ROOT/.venv/bin/python" || pip_python_version python3)" \
            || die "no Python found to take the version from.
HINT: name the node's Python: make wheelhouse PY=3.12"
    fi
    PLATFORM="${PLATFORM:-$DEFAULT_PLATFORM}"
    check_py
    expand_platform
    say "for Python $PY on $PLATFORM (accepts ${PLATFORMS[-1]} to ${PLATFORMS[0]})"
    choose_pip_python

    local requirements builds
    mapfile -t requirements < <(offline_requirements)
    mapfile -t builds < <(build_requirements)
    ((${#builds[@]} > 0)) || die "no [build-system] requires found in pyproject.toml."

    DOWNLOAD=("$RUNNER" -m pip download --only-binary=:all:
        --python-version "$PY" --implementation cp)
    local tag
    for tag in "${PLATFORMS[@]}"; do DOWNLOAD+=(--platform "$tag"); done
    DOWNLOAD+=(--dest "$DEST" -r "$OFFLINE_REQUIREMENTS" "${builds[@]}")
    local build_wheel=("$RUNNER" -m pip wheel --no-deps --wheel-dir "$DEST" "$ROOT")

    if [[ -n "$DRY_RUN" ]]; then
        say "dry run: would write $OFFLINE_REQUIREMENTS:"
        printf '  %s\n' "${requirements[@]}"
        say "and run:"
        show "${DOWNLOAD[@]}"
        show "${build_wheel[@]}"
        return
    fi

    local start=$SECONDS
    mkdir -p "$DEST"
    {
        echo "# Written by scripts/wheelhouse.sh from requirements.txt: every pin but torch,"
        echo "# torchvision and CUDA libraries, which the node's PyTorch module provides."
        printf '%s\n' "${requirements[@]}"
    } >"$OFFLINE_REQUIREMENTS"
    say "downloading ${#requirements[@]} pinned packages and their dependencies"
    show "${DOWNLOAD[@]}"
    download
    say "building the workshop's own wheel"
    show "${build_wheel[@]}"
    # setuptools builds in build/ at the project root; remove it when this run made
    # it, since files left in build/lib would go into the next wheel.
    local had_build=""
    [[ -e "$ROOT/build" ]] && had_build=1
    "${build_wheel[@]}" || die "pip wheel of the workshop package failed (above)."
    [[ -n "$had_build" ]] || rm -rf "$ROOT/build"
    check_no_torch
    say "took $((SECONDS - start)) s"
    print_instructions
}

# Run, unless sourced (the tests source it to call print_instructions).
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
