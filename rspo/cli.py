"""`python -m rspo <command> ...`: the command-line interface that Snakemake rules call.

Each command lives in `rspo/commands/` as `main(argv: list[str]) -> int` with its own argparse
parser; this file only dispatches, importing the module lazily so that `python -m rspo --help`
stays fast and a command's heavy imports are paid only when used.
"""

from __future__ import annotations

import importlib
import sys

# command -> "module:function"; `evaluate` takes a second word (the benchmark family).
COMMANDS: dict[str, str] = {
    "generate": "rspo.commands.data:generate_main",
    "tokenizer": "rspo.commands.tokenizer:main",
    "pretrain": "rspo.commands.pretrain:main",
    "train": "rspo.commands.train:main",
    "base": "rspo.commands.base:main",
    "launch": "rspo.commands.launch:main",
    "evaluate": "rspo.commands.evaluate:main",
    "prepare": "rspo.commands.data:prepare_main",
    "report": "rspo.commands.report:main",
    "bench": "rspo.commands.bench:main",
    "speed": "rspo.commands.speed:main",
    "parity": "rspo.commands.parity:main",
    "sweep": "rspo.commands.sweep:main",
    "archive": "rspo.commands.archive:main",
    "fetch-model": "rspo.commands.fetch_model:main",
    "fetch-data": "rspo.commands.fetch_data:main",
    "plan-memory": "rspo.commands.plan_memory:main",
    "preflight": "rspo.commands.preflight:main",
    "mlflow-init": "rspo.commands.mlflow:init_main",
    "mlflow-sync": "rspo.commands.mlflow:sync_main",
    "mlflow-ui": "rspo.commands.mlflow:ui_main",
}

HELP = """usage: python -m rspo <command> [args...]

commands:
  generate     generate Countdown splits (JSONL)
  tokenizer    build the Countdown tokenizer
  pretrain     SFT-pretrain a small MoE on Countdown
  train        one RL run (GRPO / GSPO / GMPO, +RS, ablations)
  base         install, check or re-pin the committed base model a preset pins
  launch       a command in N data-parallel processes under torchrun (exit 75 kept for a time-limit stop)
  evaluate     evaluate a checkpoint: countdown | math | code
  prepare      prepare math / code training data (DeepScaleR, code mix)
  report       build a paper table or figure from run outputs
  bench        throughput / memory benchmark (prints a table + one JSON line)
  speed        RL step vs TRL's GRPOTrainer, plain training and generate (needs the bench extra)
  parity       TRL's GRPOTrainer on the same base, prompts and verifier (an outside anchor for GRPO)
  sweep        run regime-choosing trials from a sweep file and write the trial table
  archive      pack a preset's run files into a checksummed archive, check or unpack one
  fetch-model  fetch a hub model once into a local folder (offline: from the hub cache)
  fetch-data   fetch a task's hub data (training source, code benchmarks) once into a local folder
  plan-memory  what a preset's runs hold per GPU in each phase, against a GPU's memory
  preflight    a preset's real training step on one node, cut to a few layers, measured per phase
  mlflow-init  create the MLflow store and experiment once, before jobs start
  mlflow-sync  record in the MLflow store what the result files hold and the store lacks
  mlflow-ui    `mlflow ui` on a preset's store; prints the address of its runs table

`python -m rspo <command> --help` describes a command's arguments.
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(HELP)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"rspo: unknown command {name!r}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module_name, func_name = COMMANDS[name].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(rest) or 0)
