# Scaling PyTorch on HPC: the two commands are
#
#   make lab     set up .venv, then open the workshop in JupyterLab
#   make test    set up .venv, then run every test, notebooks included
#
# (make test-fast: the unit tests alone, in about two minutes, for the inner loop.)
#
# Where there is no .venv and python3 already has everything (a site's torch module
# plus pip install, or pip install --target with PYTHONPATH), both use python3 and
# set nothing up.
#
# Extra options: make lab LAB_ARGS="--no-browser --port=8890"
#                make test PYTEST_ARGS="-x -k launch"
#                make wheelhouse PY=3.12 PLATFORM=manylinux_2_28_x86_64 (DRY_RUN=1)

SHELL := /bin/bash
VENV := .venv
# Not named PYTHON: that is the interpreter setup.sh builds .venv with
# (PYTHON=python3.12 make setup), which a Makefile variable of that name would replace.
VENV_PYTHON := $(VENV)/bin/python
NOTEBOOKS := notebooks
LAB_ARGS ?=
PYTEST_ARGS ?=
# make wheelhouse: the node's Python (X.Y) and platform tag; empty means the script's
# defaults (.venv's Python; manylinux_2_28_x86_64). DRY_RUN=1 prints, downloads nothing.
PY ?=
PLATFORM ?=
DRY_RUN ?=

.DEFAULT_GOAL := help
.PHONY: help setup environment lab test test-fast test-notebooks test-cpus test-site lint \
	wheelhouse clean check-node portal portal-stop record record-table bench-board

help:
	@echo "make lab    set up .venv, then open the workshop in JupyterLab"
	@echo "            (extra options: LAB_ARGS=\"--no-browser --port=8890\")"
	@echo "make test   set up .venv, then run every test, notebooks included"
	@echo "            (no .venv, and python3 has everything: both use it, no set-up)"
	@echo "make test-fast  the unit tests alone, for the inner loop: no *_integration.py"
	@echo "            file (ranks, kernels, jobs, the browser), no notebook"
	@echo "make setup  create or update .venv only (scripts/setup.sh)"
	@echo "make test-notebooks  only the notebooks, compared with their stored outputs"
	@echo "            exactly as make test compares them"
	@echo "make test-cpus  make test-notebooks as other machines run it: this CPU, AVX2,"
	@echo "            no SIMD, one thread (scripts/test_cpus.sh; CPU_SETTINGS=\"omp1\")"
	@echo "make test-site  the suite as on a GPU node: torch 2.11 on Python 3.12, the"
	@echo "            wheelhouse installed with pip --target, no system packages"
	@echo "            (in .site/; scripts/test_site.sh)"
	@echo "make record  record the notebooks' stored outputs: each run whole in one"
	@echo "            fresh kernel on a quiet machine (NOTEBOOK=01 or a path: one;"
	@echo "            RECORD_ARGS=--busy-ok: write when busy, marked; scripts/record.py)"
	@echo "make record-table  docs/notebooks.md's table of times, from the recordings"
	@echo "make lint   ruff check"
	@echo "make check-node  the instructor's check of a GPU node, the day before class"
	@echo "            (extra options: CHECK_ARGS=\"--quick --json check.json\")"
	@echo "make wheelhouse  wheels of every package but torch in wheelhouse/, for a"
	@echo "            node with no internet (PY=3.12 PLATFORM=manylinux_2_28_x86_64,"
	@echo "            or e.g. manylinux_2_28_aarch64; DRY_RUN=1 only prints)"
	@echo "make portal  a private JupyterHub whose learners' servers are Slurm jobs on"
	@echo "            the private two-node cluster, on 127.0.0.1 (as root; PORTAL_ARGS="
	@echo "            \"--learners 6 --folder DIR\"); make portal-stop stops it all"
	@echo "make bench-board  the class board under 100 learners posting every second,"
	@echo "            on a hub of its own (BENCH_ARGS=\"--seconds 60 --json board.json\")"
	@echo "make clean  remove .venv"

setup:
	bash scripts/setup.sh

# The Python that runs the lab and the tests: .venv's where there is one (setup.sh
# keeps it up to date, or leaves it alone when it was made another way). Else
# python3, when it already has everything (`scripts/setup.sh --check` says what that
# means): then nothing is set up. Else setup.sh creates .venv. FOUND_PYTHON is
# "PATH Python X.Y.Z, torch V" for such a python3, or empty; it is worked out once,
# and only by the targets that use it.
FOUND_PYTHON = $(eval FOUND_PYTHON := $$(if $$(wildcard $(VENV)),,$$(shell \
	bash scripts/setup.sh --check python3 2>/dev/null)))$(FOUND_PYTHON)
RUN_PYTHON = $(or $(firstword $(FOUND_PYTHON)),$(VENV_PYTHON))

FOUND_MESSAGE = make: no $(VENV), and python3 has everything the workshop needs \
	($(wordlist 2,99,$(FOUND_PYTHON))): using $(RUN_PYTHON), no set-up

environment:
	$(if $(FOUND_PYTHON),@echo "$(FOUND_MESSAGE)",bash scripts/setup.sh)

# JupyterLab refuses to run as root unless told; containers often run as root.
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root,)

# JupyterLab's defaults as a class wants them (scripts/lab-settings/overrides.json): no
# "receive official Jupyter news?" prompt over the corner of every page, no update check.
LAB_SETTINGS = --LabApp.app_settings_dir="$(CURDIR)/scripts/lab-settings"
# The server's root is the project, so that the notebooks' links to ../docs/ open;
# the page opens on $(NOTEBOOKS)/.
LAB_TREE = --ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/$(NOTEBOOKS)

lab: environment
	$(RUN_PYTHON) -m jupyterlab --ip=127.0.0.1 $(LAB_SETTINGS) $(LAB_TREE) $(ROOT_ARGS) $(LAB_ARGS)

# Every notebook under $(NOTEBOOKS)/ is run by nbval and its outputs compared with
# the stored ones, after tests/nbval_sanitize.cfg replaces times, ports, PIDs and
# addresses. pytest's exit code 5 means nothing was collected: a failure here.
# --durations=20: every run ends with its 20 slowest tests; every test's time is in
# test-artifacts/junit.xml.
NBVAL = --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
# TEST_WORKERS pytest-xdist workers share the files (tests/conftest.py says how: the
# files that use the run's one Slurm cluster and make lab go to one worker together,
# each notebook to one worker). On 2 cores, 3 workers keep both cores busy while a
# test waits (on a Slurm job, a timeout): about 17 minutes with 2, 15 with 3
# (docs/benchmarks.md). TEST_WORKERS=1, or a Python without pytest-xdist (it is in
# requirements.txt, not in the test extra): one process.
TEST_WORKERS ?= 3
XDIST = $(if $(filter-out 0 1,$(TEST_WORKERS)),$(if $(shell $(RUN_PYTHON) -c \
	'import xdist' 2>/dev/null && echo yes),-n $(TEST_WORKERS) --dist loadfile))
PYTEST = $(RUN_PYTHON) -m pytest --timeout=600 --durations=20 $(XDIST) $(NBVAL) \
	--junitxml=test-artifacts/junit.xml tests/ $(NOTEBOOKS)/ $(PYTEST_ARGS)

# Every rank the suite starts (spawn, torchrun, srun, mpirun), every kernel and every
# `python -m workshop` is a fresh Python that imports the package (about 160 modules). Where
# PYTHONDONTWRITEBYTECODE is set, as on the machines CI runs on, each compiled them
# again: about 0.3 s of CPU a start. Compiled once here, they only read the bytecode
# (a checkout that cannot be written loses only that).
COMPILE = $(RUN_PYTHON) -m compileall -q workshop > /dev/null 2>&1 || true

# The suite keeps more processes busy than there are cores (three workers on two).
# OpenMP's threads, by default, spin for a while after each parallel region waiting
# for the next; on a full machine that spinning takes CPU from the others' work
# (docs/benchmarks.md: a part of the suite used 506 CPU-seconds spinning, 369
# passive). PASSIVE makes them sleep instead. It changes no result: the numbers
# depend on how many threads, not on how they wait. An OMP_WAIT_POLICY already set
# is kept.
WAIT_POLICY = export OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE}

# The tests and the recordings never write to the record of the lessons kept for
# whoever runs them (~/.local/share/scaling-pytorch-hpc/progress.json): the
# notebooks' kernels and the checks they run keep nothing.
NO_PROGRESS = export WORKSHOP_PROGRESS=off

# $(1): the pytest command line; exit code 5 (nothing collected) is a failure.
run_pytest = @echo "$(1)"; $(COMPILE); $(WAIT_POLICY); $(NO_PROGRESS); rc=0; \
	$(1) || rc=$$?; \
	if [[ $$rc -eq 5 ]]; then \
		echo "make: FAILED: pytest collected no tests (exit code 5)" >&2; \
	fi; \
	exit $$rc

test: environment
	$(call run_pytest,$(PYTEST))

# The unit tests alone, for the inner loop: at most 3 minutes on 2 cores (about 2 when
# the machine is quiet). A test that starts ranks, a kernel, a Slurm job or a browser,
# or takes more than about a second, sits in a *_integration.py file beside the unit
# tests of its module (tests/bench/test_scaling_bench.py and
# test_scaling_bench_integration.py); make test runs both, and the notebooks.
FAST_PYTEST = $(RUN_PYTHON) -m pytest --timeout=600 --durations=10 $(XDIST) \
	--ignore-glob='*_integration.py' tests/ $(PYTEST_ARGS)

test-fast: environment
	$(call run_pytest,$(FAST_PYTEST))

# The notebooks alone, compared exactly as make test compares them.
test-notebooks: environment
	$(call run_pytest,$(RUN_PYTHON) -m pytest --timeout=600 $(NBVAL) $(NOTEBOOKS)/ \
		$(PYTEST_ARGS))

# make test-notebooks under other CPUs' settings, one after another (CPU_SETTINGS,
# CPU_BUSY=1: scripts/test_cpus.sh says).
test-cpus: environment
	PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/test_cpus.sh

# Each notebook executed top to bottom in one fresh kernel of the Python make test
# uses, with its environment, and written back with what it ran on, only if the
# machine was quiet before and during the run (scripts/record.py says what that
# means). NOTEBOOK=01 (a number, a name or a path) records one; RECORD_ARGS=--busy-ok
# writes on a busy machine too, marking the notebook busy. It then rewrites the
# table of docs/notebooks.md, which make record-table alone rewrites from the
# notebooks' metadata.
NOTEBOOK ?=
RECORD_ARGS ?=
record: environment
	@$(COMPILE); $(WAIT_POLICY); $(NO_PROGRESS); \
		$(RUN_PYTHON) scripts/record.py $(NOTEBOOK) $(RECORD_ARGS)

record-table: environment
	$(RUN_PYTHON) scripts/record.py --table --update-docs

# The node check runs in whatever environment the class will use: .venv's python
# where there is one, else python3 (on a cluster: the site's torch module plus
# pip install -e ".[lab,test]"), so it does not run setup first.
CHECK_ARGS ?=
CHECK_PYTHON := $(if $(wildcard $(VENV_PYTHON)),$(VENV_PYTHON),python3)

check-node:
	$(CHECK_PYTHON) -m workshop check-node $(CHECK_ARGS)

lint: environment
	$(RUN_PYTHON) -m ruff check .

# The suite as a GPU node without internet runs it (scripts/test_site.sh says how): a
# Python 3.12 venv with torch 2.11 plays the site's python3, the wheelhouse is
# installed with pip --target, and no system package is visible. All in .site/.
test-site:
	PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/test_site.sh

# Wheels for an offline compute node (scripts/wheelhouse.sh); needs no .venv.
wheelhouse:
	PY="$(PY)" PLATFORM="$(PLATFORM)" DRY_RUN="$(DRY_RUN)" bash scripts/wheelhouse.sh

clean:
	rm -rf $(VENV)

# The private cluster portal (workshop/instructor/portal.py, docs/portal.md): starts in
# the background and returns; portal-stop stops the hub, every learner's job, the
# cluster, and removes the learners it made.
PORTAL_ARGS ?=
portal: environment
	$(RUN_PYTHON) -m workshop portal start $(PORTAL_ARGS)

portal-stop:
	$(RUN_PYTHON) -m workshop portal stop $(PORTAL_ARGS)

# The class board's benchmark (workshop/instructor/board_bench.py, docs/benchmarks.md):
# a JupyterHub, its proxy and the board of its own in a folder it removes, 100
# simulated learners posting every second; needs no root and no Slurm.
BENCH_ARGS ?=
bench-board: environment
	$(RUN_PYTHON) -m workshop.instructor.board_bench $(BENCH_ARGS)
