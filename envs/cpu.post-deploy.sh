#!/usr/bin/env bash
# Run by Snakemake after it creates this conda environment (--sdm conda), in the workflow's working
# directory (the repository root): evalplus without its own requirements (they pull LLM SDKs),
# hash-checked against its lock, exactly as `make venv` installs it.
set -euo pipefail
python -m pip install --no-deps --require-hashes -r envs/locks/evalplus.txt
