# distlab: thin wrappers over the nox sessions (noxfile.py), the distlab CLI and docker/*.sh.
# `make help` lists every target. Nothing here re-implements what they do.

PYTHON ?= python3
BOOTSTRAP := .bootstrap
NOX := $(BOOTSTRAP)/bin/nox
DISTLAB := .nox/env/bin/distlab
NOX_VERSION := 2026.10.20

# make lab-NAME: GPUS=N GPUs (one rank each), or NP=N ranks on the CPU; in the image
# (RUNTIME=container, the default, with ENGINE=docker, the default, or podman) or on this host
# (RUNTIME=local). docker/run-lab.sh lists every setting (BACKEND, LAB_ARGS, IMAGE, DATA_DIR,
# RESULTS_DIR, ENGINE_ARGS, ...) and holds the defaults: empty here means "the default", so that
# `make image-test` can still pick whichever engine answers.
RUNTIME ?=
ENGINE ?=
GPUS ?=
NP ?=
BACKEND ?=
LAB_ARGS ?=
TEST_ARGS ?=
# `make -n lab-NAME` shows the full docker command: the scripts run with DRY_RUN=1 (hence `+`).
DRY_RUN ?= $(if $(findstring n,$(firstword -$(MAKEFLAGS))),1)
export RUNTIME ENGINE GPUS NP BACKEND LAB_ARGS DRY_RUN

.DEFAULT_GOAL := help
.PHONY: help setup test lint grade grade-smoke grade-gpu gpu-acceptance gpu-offline gpu-wheels gpu-proxy gpu-proxy-tests doctor data calibrate bench-train bench-allreduce bench-verdict slurm verify-deploy \
        image image-cpu image-test gradescope-test gpu clean

help: ## list every target with one line
	@grep -hE '^[a-zA-Z_%-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  %-18s %s\n", $$1, $$2}'

$(NOX):
	$(PYTHON) -m venv $(BOOTSTRAP)
	$(BOOTSTRAP)/bin/pip install --quiet nox==$(NOX_VERSION)

setup: $(NOX) ## install everything (torch, MPI, Horovod built from source, distlab) into .nox/env
	$(NOX) -s env

test: $(NOX) ## run the test suite (what CI runs; pytest options in TEST_ARGS)
	$(NOX) -s tests -- $(TEST_ARGS)

lint: $(NOX) ## ruff, mypy (the harness's types), hadolint, actionlint, shellcheck
	$(NOX) -s lint

grade: $(NOX) ## the main job on the CPU: every lab at world sizes 1 and 2 (ddp, horovod at 2 against the baseline at 1; ddp also at 4), graded
	$(NOX) -s grade

grade-smoke: $(NOX) ## seconds-long labs at world sizes 1 and 2, graded against the cpu-smoke profile (CI)
	$(NOX) -s grade -- --profile cpu-smoke --world-sizes 1,2

grade-gpu: ## grade the labs on this host's GPUs in the GPU image (GPUS, PROFILE, WORLD_SIZES, RUNTIME)
	+@MAKE='$(MAKE)' docker/run-lab.sh grade

gpu-acceptance: $(NOX) ## on a fresh GPU host: every lab on NCCL, benchmarks, calibrate and grade; one archive
	$(NOX) -s gpu-acceptance

gpu-wheels: $(NOX) ## wheels for an offline GPU host (Python 3.12): then make gpu-offline there
	$(NOX) -s gpu-wheels

gpu-offline: ## on the borrowed GPU machine (no network, no nox): docker/gpu-acceptance.sh, OUT=folder for the results
	docker/gpu-acceptance.sh $(if $(OUT),--out $(OUT))

gpu-proxy: $(NOX) ## the one-GPU acceptance on that machine's software, on the CPUs, offline (Python 3.12, torch 2.11; slow)
	$(NOX) -s gpu-proxy

gpu-proxy-tests: $(NOX) ## the GPU-path tests on that machine's software (no MPI, no Horovod; TEST_ARGS to choose)
	$(NOX) -s gpu-proxy-tests -- $(TEST_ARGS)

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

slurm: $(NOX) ## a real two-node Slurm on this host (root, Debian packages): the templates and grade --slurm submitted
	$(NOX) -s slurm

verify-deploy: $(NOX) ## every place users run it, one after the other (GPU proxy, Gradescope container, k8s, Slurm; up to 90 min)
	$(NOX) -s verify-deploy

bench-verdict: $(NOX) ## the DDP lab, its twice-slower mutant and the all-reduce bench judged at 0 to 16 busy processes
	$(NOX) -s "bench(what='verdict')"

lab-%: ## run one lab: GPUS=N GPUs or NP=N CPU ranks, in the image or RUNTIME=local (make lab-ddp GPUS=2)
	+@MAKE='$(MAKE)' docker/run-lab.sh lab $*

image: ## build the GPU image distlab:gpu on NGC PyTorch (ENGINE, BASE, EXTRA_CA)
	+@docker/build-image.sh gpu

image-cpu: ## build the CPU image distlab:cpu (ENGINE, BASE, TORCH_INDEX_URL, EXTRA_CA)
	+@docker/build-image.sh cpu

image-test: $(NOX) ## build the CPU image and run the check and DDP labs in it (slow; installs podman if needed)
	$(NOX) -s image

gradescope-test: $(NOX) ## the Gradescope bundle in a Gradescope-like container with its limits (slow; builds a 7 GB image)
	$(NOX) -s gradescope

gpu: $(NOX) ## on a GPU host, in the GPU image: the GPU acceptance (every lab, calibrate, grade) on GPUS
	$(NOX) -s gpu

clean: ## remove the environments (results/ and data/ are kept)
	rm -rf .nox $(BOOTSTRAP)
