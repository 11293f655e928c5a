# Two commands do all the set-up on a fresh machine:
#   make main   -> installs .venv, runs the small Countdown preset end to end (tables + figures)
#   make test   -> installs .venv, runs the test suite (what CI runs: .ci/run)
# and: make figures (every committed table and figure from the shipped run archive, no training),
# make mlflow-ui (the study's runs in MLflow, from the archive right after a clone), make test-fast
# (the suite without the slow and slurm tests), make lint.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PRESET ?= small
CORES ?= all

.PHONY: venv sandbox test test-fast main main-full figures smoke bench lint mlflow-ui readme-tables clean-venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU torch from local disk first, so nothing else can pull a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,evalplus]'
	$(BIN)/pip install --quiet --no-deps evalplus==0.3.1
	touch $(STAMP)

# bubblewrap for the code-reward sandbox (a quiet no-op when present or when not root).
sandbox:
	@bash scripts/install_sandbox.sh

test: venv sandbox
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests

# everything but the end-to-end (`slow`) and SLURM (`slurm`) tests; meant to stay under 5 minutes
test-fast: venv sandbox
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "not slow and not slurm" tests

main: venv sandbox
	$(BIN)/snakemake --cores $(CORES) --config preset=$(PRESET)

# the whole grid of a preset that names default_families (reuses what `make main` trained)
main-full: venv sandbox
	$(BIN)/snakemake --cores $(CORES) --config preset=$(PRESET) full=true

# Every table and figure of docs/results/$(PRESET) rebuilt from its shipped run archive
# (docs/results/$(PRESET)/archive.json + runs.tar.xz) into results/$(PRESET)/: no pretrain, train or
# evaluate job (rspo/archive.py). ARCHIVE=docs/results/small-full FULL=true for the whole grid.
ARCHIVE ?= docs/results/$(PRESET)
FULL ?= false
figures: venv
	$(BIN)/snakemake --cores $(CORES) --config preset=$(PRESET) archive=$(ARCHIVE) full=$(FULL)

smoke: venv sandbox
	$(BIN)/snakemake --cores $(CORES) --config preset=smoke

# Sec. 5.5 (RSPO vs GMPO) and the speed benchmark against TRL, plain training and generate, on
# the preset's pretrained model (trained first if missing); installs the optional TRL extra.
bench: venv
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/snakemake --cores $(CORES) --config preset=$(PRESET) --forcerun bench bench_speed -- \
		results/$(PRESET)/bench.json results/$(PRESET)/speed.json

# ruff (lint + format check) on the Python code, snakefmt on the workflow, Snakemake's own linter;
# settings in pyproject.toml ([tool.ruff], [tool.snakefmt])
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakefmt --check .
	$(BIN)/snakemake --lint

# mlflow ui on results/$(PRESET)/mlflow/mlflow.db; prints the address of the runs table. Right
# after a clone (no results/$(PRESET)/runs yet) the shipped run archive is loaded first: make figures,
# then mlflow-sync records every run, evaluation and the report run in the store.
mlflow-ui: venv
	test -d results/$(PRESET)/runs || $(MAKE) figures
	$(BIN)/python -m rspo mlflow-sync --preset $(PRESET)
	$(BIN)/python -m rspo mlflow-ui --preset $(PRESET)

# the README's result tables from the committed table files (tests/test_readme.py checks them)
readme-tables: venv
	$(BIN)/python scripts/readme_tables.py

clean-venv:
	rm -rf $(VENV)
