# distlab: thin wrappers over the nox sessions (noxfile.py) and the distlab CLI.
# `make help` lists every target. Nothing here re-implements what nox or distlab do.

PYTHON ?= python3
BOOTSTRAP := .bootstrap
NOX := $(BOOTSTRAP)/bin/nox
DISTLAB := .nox/env/bin/distlab
NOX_VERSION := 2026.10.20

GPUS ?= 1
LAB_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help setup test lint grade doctor data calibrate bench-train bench-allreduce clean

help: ## list every target with one line
	@grep -hE '^[a-zA-Z_%-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  %-18s %s\n", $$1, $$2}'

$(NOX):
	$(PYTHON) -m venv $(BOOTSTRAP)
	$(BOOTSTRAP)/bin/pip install --quiet nox==$(NOX_VERSION)

setup: $(NOX) ## install everything (torch, MPI, Horovod built from source, distlab) into .nox/env
	$(NOX) -s env

test: $(NOX) ## run the test suite (what CI runs)
	$(NOX) -s tests

lint: $(NOX) ## ruff, hadolint, actionlint, shellcheck
	$(NOX) -s lint

grade: $(NOX) ## the main job on the CPU: every lab at world sizes 1, 2, 4, graded
	$(NOX) -s grade

doctor: $(NOX) ## what this host offers and which labs it can run
	$(NOX) -s doctor

data: setup ## download CIFAR-10 into ./data (needs internet)
	$(DISTLAB) data --data-dir data

calibrate: $(NOX) ## measure this host and write a profile (PROFILE=name)
	$(NOX) -s calibrate -- --profile $(PROFILE)

bench-train: $(NOX) ## training-path benchmark: baseline vs in-memory loop, DDP/Horovod vs baseline
	$(NOX) -s "bench(what='train')"

bench-allreduce: $(NOX) ## allreduce_bench vs the tightest plain loop of each library
	$(NOX) -s "bench(what='allreduce')"

lab-%: setup ## run one lab locally with GPUS=N ranks (e.g. make lab-ddp GPUS=2)
	$(DISTLAB) run $* --world-size $(GPUS) -- $(LAB_ARGS)

clean: ## remove the environments (results/ and data/ are kept)
	rm -rf .nox $(BOOTSTRAP)
