#!/usr/bin/env bash
# Run every test and notebook as a GPU node without internet runs them, on this
# machine: the node's python3 is a site's virtual environment with torch (2.11 on
# Python 3.12), the workshop's other packages come from the wheelhouse installed with
# pip --target (docs/install.md, "Offline install on a compute node", form (b)), and
# nothing of what setup.sh installs on a workshop machine is there: no Open MPI, no
# Slurm or munge, no shellcheck, no Chromium; no ssh either, no root, no network.
#
#   make test-site                    # or: bash scripts/test_site.sh
#   make test-site PYTEST_ARGS="-x -k lab"
#   SITE_PYTHON=/path/to/python3.12 make test-site
#
# It builds, in .site/ (ignored by git; rm -rf .site to start over):
#   venv/     the site's python3: a venv of Python 3.12 with torch 2.11.0 from PyPI
#             (a CUDA build, which runs on CPU), torchvision 0.26.0, numpy, scipy,
#             scikit-learn, matplotlib and pillow (the versions of the wheelhouse);
#             kept while its stamp matches. About 3 GB, downloaded once.
#   python/   as root, when the test user cannot read that Python 3.12 (pyenv's
#             lives in /root): a copy of it, which the venv is made from
#   target/   the wheelhouse (make wheelhouse PY=3.12, reused while up to date)
#             installed with pip --no-index --target, as on the node
#   project/  a copy of this checkout's files (git ls-files, without .venv): there
#             `make test` finds no .venv and python3 complete, and sets nothing up
#   farm/     links to the system's programs but those above, for hiding them
#   real/     where the system's folders are mounted for the farm's links, with
#             links to /usr's other folders (gcc finds its cc1plus through them)
#   home/, out/  the test user's home; the log and junit XML of the run
# Then `make test` runs in project/ with PATH=venv/bin:<system folders>,
# PYTHONPATH=project:target, JUPYTER_PATH and JUPYTERLAB_DIR in target. Run as root
# (this workshop's containers), it runs as the system user workshop-site (made if
# missing) in its own mount namespace, where /usr/bin and /usr/sbin show the farm,
# and network namespace, with only loopback up. Not root, or where namespaces are
# refused: the farm is put on PATH instead (programs named by their full path stay
# visible), and it says so. It ends with the Python, torch, the counts and the time;
# the exit status is that of `make test` there.
#
# The notebooks run with --nbval-lax: every cell must run without an error, as on the
# node, but outputs are not compared with the stored ones, which were recorded with
# the pinned torch, a private Slurm and Open MPI (torch 2.11 trains to other digits,
# its gloo has no all_to_all, and without Slurm a cell says so).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SITE="$ROOT/.site"
SITE_TORCH="2.11.0"
SITE_TORCHVISION="0.26.0"  # the one built for torch 2.11
SITE_PY="3.12"
SITE_USER="workshop-site"
WHEELHOUSE="$ROOT/wheelhouse"
PYTEST_ARGS="${PYTEST_ARGS:-}"
# setup.sh's system packages (and ssh/rsh, which the node lacked too), by name: the
# farm leaves these out. Not "stat", the coreutils program.
HIDDEN='^(mpi.*|orte.*|ompi.*|oshmem.*|oshrun|shmem.*|s(acct|acctmgr|alloc|attach|batch|bcast|cancel|control|diag|h5util|info|prio|queue|report|run|share|stat|trigger|view)|slurm.*|munged?|unmunge|remunge|mungekey|shellcheck|chrom(e|ium).*|ssh.*|scp|sftp|rsh|rcp|rlogin)$'
SYSTEM_DIRS=(/usr/local/sbin /usr/local/bin /usr/sbin /usr/bin)

say() { printf '[test-site] %s\n' "$*"; }
die() { printf '[test-site] ERROR: %s\n' "$*" >&2; exit 1; }

# ---- the site's Python 3.12 -------------------------------------------------------

# Prints "3.12" for an interpreter that runs; fails otherwise.
python_version() {
    "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}

# Sets BASE_PYTHON to a Python $SITE_PY (the interpreter itself, not a pyenv shim or
# a venv's link), or stops with how to get one.
find_python() {
    local candidate
    if [[ -n "${SITE_PYTHON:-}" ]]; then
        [[ "$(python_version "$SITE_PYTHON")" == "$SITE_PY" ]] \
            || die "SITE_PYTHON=$SITE_PYTHON does not run, or is not Python $SITE_PY.
HINT: SITE_PYTHON=/path/to/python$SITE_PY make test-site"
        candidate="$SITE_PYTHON"
    else
        local candidates=("python$SITE_PY")
        if command -v pyenv >/dev/null 2>&1; then
            candidates+=("$(pyenv root)/versions/$SITE_PY"*/bin/"python$SITE_PY")
        fi
        for candidate in "${candidates[@]}" ""; do
            [[ -n "$candidate" ]] || die "no Python $SITE_PY found (the GPU node's is $SITE_PY).
HINT: install one, then run this again: pyenv install $SITE_PY, or (Ubuntu 24.04)
  apt install python$SITE_PY python$SITE_PY-venv, or uv python install $SITE_PY; name it
  if it is not on PATH: SITE_PYTHON=/path/to/python$SITE_PY make test-site"
            [[ "$(python_version "$candidate")" == "$SITE_PY" ]] && break
        done
    fi
    BASE_PYTHON="$("$candidate" -c 'import sys; print(sys._base_executable)')"
}

# Runs "$@" as the test user (as root), else as this user.
as_user() {
    if [[ -n "$RUN_AS" ]]; then
        runuser -u "$RUN_AS" -- "$@"
    else
        "$@"
    fi
}

# As root, the tests run as $SITE_USER: made here if missing.
choose_user() {
    RUN_AS=""
    if [[ "$(id -u)" -ne 0 ]]; then
        say "running as $(id -un), not root: the tests run as this user"
        return
    fi
    if ! id -u "$SITE_USER" >/dev/null 2>&1; then
        say "creating the system user $SITE_USER for the tests (useradd --system)"
        useradd --system --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin "$SITE_USER" \
            || die "useradd $SITE_USER failed (above).
HINT: create it by hand (useradd --system $SITE_USER), or run make test-site as a
  user without privileges."
    fi
    RUN_AS="$SITE_USER"
    as_user test -x "$SITE" || die "$SITE_USER cannot reach $SITE: a folder above it
  is private (ls -ld each of them).
HINT: clone the project where other users can read it (not under /root), or run
  make test-site as a user without privileges."
}

# The test user may not read BASE_PYTHON (pyenv's Python in /root): then the venv is
# made from a copy of it in .site/python, whose shared libpython LD_LIBRARY_PATH finds
# (the binary's RUNPATH still names the original folder).
readable_python() {
    LIBRARY_PATH=""
    if [[ -z "$RUN_AS" ]] || as_user "$BASE_PYTHON" -c pass 2>/dev/null; then
        return
    fi
    local prefix copy="$SITE/python"
    prefix="$("$BASE_PYTHON" -c 'import sys; print(sys.base_prefix)')"
    if [[ ! -x "$copy/bin/python$SITE_PY" || "$(cat "$copy/.source" 2>/dev/null)" != "$prefix" ]]; then
        say "$SITE_USER cannot read $prefix: copying it to $copy"
        rm -rf "$copy"
        cp -a "$prefix" "$copy"
        printf '%s\n' "$prefix" >"$copy/.source"
    fi
    BASE_PYTHON="$copy/bin/python$SITE_PY"
    [[ -e "$copy/lib/libpython$SITE_PY.so.1.0" ]] && LIBRARY_PATH="$copy/lib"
    export LD_LIBRARY_PATH="$LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# Prints the version of NAME's wheel for Python $SITE_PY in the wheelhouse.
wheel_version() {
    local wheel
    wheel="$(find "$WHEELHOUSE" -maxdepth 1 -iname "$1-*-cp${SITE_PY/./}-*.whl" \
        -printf '%f\n' | sort -V | tail -1)"
    [[ -n "$wheel" ]] || die "no $1 wheel for Python $SITE_PY in $WHEELHOUSE."
    wheel="${wheel#*-}"
    printf '%s\n' "${wheel%%-*}"
}

# The site's venv: torch, torchvision (the node's cifar10 tests ran, which need it)
# and what the node had beside them, at the wheelhouse's versions (the same as
# requirements.txt's pins, where it has them).
make_site_venv() {
    local venv="$SITE/venv" stamp="$SITE/venv/.test-site-stamp" packages want
    packages=("torch==$SITE_TORCH" "torchvision==$SITE_TORCHVISION")
    local name
    for name in numpy scipy scikit_learn matplotlib pillow; do
        packages+=("${name//_/-}==$(wheel_version "$name")")
    done
    want="$BASE_PYTHON ${packages[*]}"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        say "site venv: up to date ($venv: ${packages[*]})"
        return
    fi
    say "site venv: creating $venv with $BASE_PYTHON and ${packages[*]}"
    say "  (torch $SITE_TORCH and its CUDA libraries: about 3 GB the first time)"
    rm -rf "$venv"
    "$BASE_PYTHON" -m venv "$venv"
    # Our own pins in place of any constraint file this machine's pip names.
    printf '%s\n' "${packages[@]}" >"$SITE/constraints.txt"
    PIP_CONSTRAINT="$SITE/constraints.txt" PIP_PROGRESS_BAR=off \
        "$venv/bin/python" -m pip install --quiet "${packages[@]}" \
        || die "pip install into the site venv failed (above).
HINT: is PyPI reachable? torch $SITE_TORCH needs Python $SITE_PY on x86_64 Linux."
    printf '%s\n' "$want" >"$stamp"
}

# ---- the wheelhouse and the --target install -----------------------------------

wheelhouse() {
    local stamp="$SITE/wheelhouse.stamp" want
    want="$(cat "$ROOT/requirements.txt" "$ROOT/pyproject.toml" \
        "$ROOT/scripts/wheelhouse.sh" | sha256sum | cut -d' ' -f1) $SITE_PY"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" \
        && -f "$WHEELHOUSE/requirements-offline.txt" ]]; then
        say "wheelhouse: up to date ($WHEELHOUSE)"
        return
    fi
    say "wheelhouse: make wheelhouse PY=$SITE_PY"
    make --no-print-directory -C "$ROOT" wheelhouse PY="$SITE_PY" >"$SITE/wheelhouse.log" \
        2>&1 || die "make wheelhouse PY=$SITE_PY failed; see $SITE/wheelhouse.log"
    printf '%s\n' "$want" >"$stamp"
}

install_target() {
    local target="$SITE/target" stamp="$SITE/target.stamp" want
    want="$(cat "$WHEELHOUSE/requirements-offline.txt" \
        <(find "$WHEELHOUSE" -maxdepth 1 -name '*.whl' -printf '%f\n' | sort) \
        | sha256sum | cut -d' ' -f1) $BASE_PYTHON"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        say "target: up to date ($target)"
        return
    fi
    say "target: the wheelhouse into $target, as docs/install.md's form (b):"
    local install=("$SITE/venv/bin/python" -m pip install --quiet --no-index
        --find-links "$WHEELHOUSE" --target "$target"
        -r "$WHEELHOUSE/requirements-offline.txt")
    say "  ${install[*]}"
    rm -rf "$target"
    local start=$SECONDS
    "${install[@]}" || die "pip install --target failed (above)."
    say "  took $((SECONDS - start)) s"
    printf '%s\n' "$want" >"$stamp"
}

# ---- the project, the hidden programs, the run ----------------------------------

copy_project() {
    local project="$SITE/project"
    git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1 || die "$ROOT is not a git
  checkout: the project is copied from git ls-files.
HINT: run it in a clone: git clone ... && cd ... && make test-site"
    rm -rf "$project"
    mkdir -p "$project"
    # Tracked and untracked files that git does not ignore, as they are now.
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done \
        | tar --null -T - -cf -) | tar -xf - -C "$project"
    say "project: a copy of the checkout in $project ($(find "$project" -type f | wc -l) files)"
}

# farm/NAME/: a link to every program of the system folder NAME names
# (usr-bin: /usr/bin) but the hidden ones. "mounted": the links go through
# real/usr/bin and so on, where each folder itself is mounted in the namespace (the
# farm is mounted over it); "direct": they point into the folder, for PATH.
#
# real/ stands for / as a node has it: beside real/usr/bin are links to /usr's
# other folders (lib, libexec, include, share, ...), and so for /usr/local. A
# program that finds its own files from where it really is finds them: gcc resolves
# its links to real/usr/bin/x86_64-linux-gnu-g++-12 and looks for its back end
# (cc1plus) in ../lib/gcc and its headers in ../include. Without these links g++ ran
# but could not compile ("g++: fatal error: cannot execute 'cc1plus'"), and neither
# could torch.compile's inductor, where a node with gcc can.
make_farm() {
    local how="$1" dir name program entry
    rm -rf "$SITE/farm" "$SITE/real"
    for dir in "${SYSTEM_DIRS[@]}"; do
        name="${dir#/}"
        name="${name//\//-}"
        mkdir -p "$SITE/farm/$name" "$SITE/real$dir"
        [[ -d "$dir" ]] || continue
        local through="$dir"
        [[ "$how" == mounted ]] && through="$SITE/real$dir"
        for program in "$dir"/*; do
            [[ -e "$program" || -L "$program" ]] || continue
            program="${program##*/}"
            [[ "$program" =~ $HIDDEN ]] && continue
            ln -s "$through/$program" "$SITE/farm/$name/$program"
        done
    done
    [[ "$how" == mounted ]] || return 0
    for dir in /usr /usr/local; do
        for entry in "$dir"/*; do
            [[ -e "$entry" && ! -e "$SITE/real$entry" ]] || continue
            ln -s "$entry" "$SITE/real$entry"
        done
    done
}

# Sets ISOLATION to "namespaces" (mount and network), "mount" (mount only) or "path".
choose_isolation() {
    ISOLATION=path
    if [[ "$(id -u)" -ne 0 ]] || ! command -v unshare >/dev/null 2>&1; then
        say "isolation: not root, so no namespaces: the hidden programs are left off"
        say "  PATH only (tests that name /usr/bin/chromium see it), and the network stays"
        return
    fi
    if unshare --mount --net --propagation private true 2>/dev/null; then
        ISOLATION=namespaces
        say "isolation: own mount and network namespaces (loopback only); /usr/bin and"
        say "  /usr/sbin show no MPI, Slurm, munge, shellcheck, Chromium or ssh"
    elif unshare --mount --propagation private true 2>/dev/null; then
        ISOLATION=mount
        say "isolation: own mount namespace; a network namespace is not permitted here"
        say "  (unshare --net refused), so the network stays visible"
    else
        say "isolation: unshare is not permitted here: the hidden programs are left off"
        say "  PATH only, and the network stays visible"
    fi
}

# .site/hosts: /etc/hosts with loopback's IPv6 names. In the network namespace no
# DNS server answers, so a reverse lookup that /etc/hosts cannot answer fails
# (EAI_AGAIN) where a node's DNS would say "no such name" at once: c10d looks up each
# client of its store (::ffff:127.0.0.1 on a dual-stack socket) and warns on every
# rank ("The hostname of the client socket cannot be retrieved. err=-3"), which
# changes what the ranks print. A node's /etc/hosts names ::1 too.
hosts_file() {
    cp /etc/hosts "$SITE/hosts"
    local address
    for address in ::1 ::ffff:127.0.0.1; do
        awk -v a="$address" '$1 == a { found = 1 } END { exit !found }' /etc/hosts \
            || printf '%s localhost\n' "$address" >>"$SITE/hosts"
    done
}

# The command the test user runs, in the project copy, as one bash -c string.
suite_command() {
    local junit="$SITE/out/junit.xml"
    printf 'cd %q && make --no-print-directory test PYTEST_ARGS=%q' "$SITE/project" \
        "--nbval-lax $PYTEST_ARGS --junitxml=$junit -p no:cacheprovider"
}

run_suite() {
    local system_path="/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
    if [[ "$ISOLATION" == path ]]; then
        local name farm_path=""
        for name in usr-local-bin usr-bin usr-local-sbin usr-sbin; do
            farm_path+="$SITE/farm/$name:"
        done
        system_path="${farm_path%:}"
    fi
    mkdir -p "$SITE/home" "$SITE/out"
    rm -f "$SITE/out/junit.xml"
    [[ -n "$RUN_AS" ]] && chown -R "$RUN_AS" "$SITE/project" "$SITE/home" "$SITE/out"
    local environment=(
        HOME="$SITE/home" USER="${RUN_AS:-$(id -un)}" LOGNAME="${RUN_AS:-$(id -un)}"
        LANG=C.UTF-8 TERM=dumb
        PATH="$SITE/venv/bin:$system_path" VIRTUAL_ENV="$SITE/venv"
        PYTHONPATH="$SITE/project:$SITE/target"
        JUPYTER_PATH="$SITE/target/share/jupyter"
        JUPYTERLAB_DIR="$SITE/target/share/jupyter/lab"
    )
    [[ -n "$LIBRARY_PATH" ]] && environment+=(LD_LIBRARY_PATH="$LIBRARY_PATH")
    local user_command=(env -i "${environment[@]}" bash -c "$(suite_command)")
    [[ -n "$RUN_AS" ]] && user_command=(runuser -u "$RUN_AS" -- "${user_command[@]}")
    local quoted
    quoted="$(printf '%q ' "${user_command[@]}")"
    say "the suite: $(suite_command)"
    say "  log: $SITE/out/test.log"
    local rc=0
    case "$ISOLATION" in
        namespaces | mount)
            # Each system folder is mounted at real/usr/bin and so on, then the farm
            # over it.
            local hide="" dir name
            for dir in "${SYSTEM_DIRS[@]}"; do
                [[ -d "$dir" ]] || continue
                name="${dir#/}"
                name="${name//\//-}"
                hide+="mount --bind $dir $SITE/real$dir"$'\n'
                hide+="mount --bind $SITE/farm/$name $dir"$'\n'
            done
            local net=()
            if [[ "$ISOLATION" == namespaces ]]; then
                net=(--net)
                hosts_file
                hide="ip link set lo up"$'\n'"mount --bind $SITE/hosts /etc/hosts"$'\n'"$hide"
            fi
            unshare --mount "${net[@]}" --propagation private -- \
                bash -ec "${hide}exec $quoted" 2>&1 | tee "$SITE/out/test.log" || rc=$?
            ;;
        *) "${user_command[@]}" 2>&1 | tee "$SITE/out/test.log" || rc=$? ;;
    esac
    return "$rc"
}

# Python, torch, the counts of the junit XML and the time, on one screen.
report() {
    local rc="$1" seconds="$2"
    local versions
    versions="$(PYTHONPATH="$SITE/target" "$SITE/venv/bin/python" -c '
import sys, torch
print("Python %d.%d.%d" % sys.version_info[:3], "| torch", torch.__version__)')"
    echo
    say "done: $versions | $ISOLATION | as ${RUN_AS:-$(id -un)}"
    if [[ -f "$SITE/out/junit.xml" ]]; then
        "$SITE/venv/bin/python" - "$SITE/out/junit.xml" "$seconds" <<'EOF'
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
count = {k: sum(int(s.get(k, 0)) for s in suites)
         for k in ("tests", "failures", "errors", "skipped")}
passed = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
minutes, seconds = divmod(int(float(sys.argv[2])), 60)
print(f"[test-site] {passed} passed, {count['failures']} failed, "
      f"{count['skipped']} skipped, {count['errors']} errors, "
      f"of {count['tests']}, in {minutes} min {seconds} s")
# nbval's one message, made plain: did the cell raise, or print other than stored?
NOTEBOOK = {"Cell execution caused an exception": "raised an exception",
            "Cell outputs differ": "its output differs from the stored one"}
for suite in suites:
    for case in suite.iter("testcase"):
        for kind in ("failure", "error"):
            for found in case.findall(kind):
                name = f"{case.get('classname')}::{case.get('name')}"
                message = " ".join((found.get("message") or "").splitlines()[:1])
                for said, plain in NOTEBOOK.items():
                    if said in (found.text or ""):
                        message = plain
                print(f"[test-site]   {kind.upper()}: {name}: {message[:160]}")
EOF
    else
        say "no junit XML: the suite did not run to the end (exit status $rc);"
        say "  see $SITE/out/test.log"
    fi
    say "exit status $rc"
}

main() {
    case "${1:-}" in
        "") ;;
        -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1'.
HINT: make test-site, or PYTEST_ARGS=\"-x -k lab\" bash scripts/test_site.sh" ;;
    esac
    umask 022  # all it builds is read by the test user
    local start=$SECONDS
    mkdir -p "$SITE"
    find_python
    # One run at a time: a second would remove the first one's project copy.
    exec 9>"$SITE/.lock"
    flock -n 9 || die "another make test-site is running in $SITE."
    choose_user
    readable_python
    say "site Python: $BASE_PYTHON"
    wheelhouse
    make_site_venv
    install_target
    copy_project
    choose_isolation
    if [[ "$ISOLATION" == path ]]; then
        make_farm direct
    else
        make_farm mounted
    fi
    local suite_start=$SECONDS rc=0
    run_suite || rc=$?
    say "set-up took $((suite_start - start)) s, the suite $((SECONDS - suite_start)) s"
    report "$rc" "$((SECONDS - suite_start))"
    return "$rc"
}

main "$@"
