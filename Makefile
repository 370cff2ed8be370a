# Scaling PyTorch on HPC: the two commands are
#
#   make lab     set up .venv, then open the workshop in JupyterLab
#   make test    set up .venv, then run every test, notebooks included
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
.PHONY: help setup lab test lint wheelhouse clean check-node

help:
	@echo "make lab    set up .venv, then open the workshop in JupyterLab"
	@echo "            (extra options: LAB_ARGS=\"--no-browser --port=8890\")"
	@echo "make test   set up .venv, then run every test, notebooks included"
	@echo "make setup  create or update .venv only (scripts/setup.sh)"
	@echo "make lint   ruff check"
	@echo "make check-node  the instructor's check of a GPU node, the day before class"
	@echo "            (extra options: CHECK_ARGS=\"--quick --json check.json\")"
	@echo "make wheelhouse  wheels of every package but torch in wheelhouse/, for a"
	@echo "            node with no internet (PY=3.12 PLATFORM=manylinux_2_28_x86_64,"
	@echo "            or e.g. manylinux_2_28_aarch64; DRY_RUN=1 only prints)"
	@echo "make clean  remove .venv"

setup:
	bash scripts/setup.sh

# JupyterLab refuses to run as root unless told; containers often run as root.
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: setup
	$(VENV)/bin/jupyter lab --ip=127.0.0.1 $(ROOT_ARGS) $(LAB_ARGS) $(NOTEBOOKS)

# Every notebook under $(NOTEBOOKS)/ is run by nbval and its outputs compared with
# the stored ones, after tests/nbval_sanitize.cfg replaces times, ports, PIDs and
# addresses. pytest's exit code 5 means nothing was collected: a failure here.
PYTEST := $(VENV_PYTHON) -m pytest --timeout=600 \
	--nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
	tests/ $(NOTEBOOKS)/ $(PYTEST_ARGS)

test: setup
	@echo "$(PYTEST)"
	@rc=0; $(PYTEST) || rc=$$?; \
	if [[ $$rc -eq 5 ]]; then \
		echo "make test: FAILED: pytest collected no tests (exit code 5)" >&2; \
	fi; \
	exit $$rc

# The node check runs in whatever environment the class will use: .venv's python
# where there is one, else python3 (on a cluster: the site's torch module plus
# pip install -e ".[lab,test]"), so it does not run setup first.
CHECK_ARGS ?=
CHECK_PYTHON := $(if $(wildcard $(VENV_PYTHON)),$(VENV_PYTHON),python3)

check-node:
	$(CHECK_PYTHON) -m workshop check $(CHECK_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

# Wheels for an offline compute node (scripts/wheelhouse.sh); needs no .venv.
wheelhouse:
	PY="$(PY)" PLATFORM="$(PLATFORM)" DRY_RUN="$(DRY_RUN)" bash scripts/wheelhouse.sh

clean:
	rm -rf $(VENV)
