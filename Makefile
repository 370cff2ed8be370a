# Scaling PyTorch on HPC: the two commands are
#
#   make lab     set up .venv, then open the workshop in JupyterLab
#   make test    set up .venv, then run every test, notebooks included
#
# Extra options: make lab LAB_ARGS="--no-browser --port=8890"
#                make test PYTEST_ARGS="-x -k launch"

SHELL := /bin/bash
VENV := .venv
PYTHON := $(VENV)/bin/python
NOTEBOOKS := notebooks
LAB_ARGS ?=
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help setup lab test lint clean

help:
	@echo "make lab    set up .venv, then open the workshop in JupyterLab"
	@echo "            (extra options: LAB_ARGS=\"--no-browser --port=8890\")"
	@echo "make test   set up .venv, then run every test, notebooks included"
	@echo "make setup  create or update .venv only (scripts/setup.sh)"
	@echo "make lint   ruff check"
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
PYTEST := $(PYTHON) -m pytest --timeout=600 \
	--nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
	tests/ $(NOTEBOOKS)/ $(PYTEST_ARGS)

test: setup
	@echo "$(PYTEST)"
	@rc=0; $(PYTEST) || rc=$$?; \
	if [[ $$rc -eq 5 ]]; then \
		echo "make test: FAILED: pytest collected no tests (exit code 5)" >&2; \
	fi; \
	exit $$rc

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV)
