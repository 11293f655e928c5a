"""How well `rspo plan-memory` holds: its old-pass and update totals per GPU (without the engine)
against rspo.memory_sim's measurement of the same configuration (torch's FSDP2 memory tracker on fake
tensors for several ranks; real tensors in one process). Prints a Markdown table and a JSON line.

    python scripts/memory_plan_check.py                 # the table of docs/cluster.md
    python scripts/memory_plan_check.py --quick         # two configurations (tests/test_memory_plan.py)

Each configuration runs in a fresh process (the fake process group is process-wide)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (label, model, layers, world, tokens, row, chunk, checkpointing) -- the first eight configurations
# measured the plan's constants (rspo/memory_plan.py); the others were not used for them.
FULL = [
    ("fit", "qwen3-30b", 2, 8, 9216, 9216, 1024, True),
    ("fit", "qwen3-30b", 8, 8, 18432, 9216, 1024, True),
    ("fit", "qwen3-30b", 8, 8, 9216, 9216, 0, True),
    ("fit", "qwen3-30b", 8, 8, 18432, 9216, 1024, False),
    ("held out", "qwen3-30b", 6, 8, 13824, 4608, 2048, True),
    ("held out", "qwen3-30b", 12, 8, 9216, 9216, 512, True),
    ("held out", "qwen3-30b", 6, 4, 9216, 9216, 0, False),
    ("held out", "qwen3-30b", 48, 8, 9216, 9216, 1024, True),
    ("held out", "paper-small", 4, 1, 16384, 8192, 0, False),
    ("held out", "paper-small", 4, 1, 16384, 8192, 0, True),
]
QUICK = [FULL[4]]  # fake tensors only: seconds (one-process rows run real tensors: minutes)


def model_config(name: str, layers: int):
    from transformers import AutoConfig

    if name == "qwen3-30b":
        data = json.loads((ROOT / "rspo" / "model_configs" / "Qwen--Qwen3-30B-A3B.json").read_text())
        data["num_hidden_layers"] = layers
        return AutoConfig.for_model(**data)
    from rspo.config import load_preset
    from rspo.models import moe_config
    from rspo.tokenizer import build_tokenizer

    arch = dict(load_preset(ROOT / "configs" / "paper_small.yaml")["pretrain"]["model"], num_layers=layers)
    tok = build_tokenizer()
    return moe_config(arch, len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)


def settings(name: str, world: int, tokens: int, row: int, chunk: int, checkpointing: bool):
    """A TrainConfig and preset of the paper preset the model belongs to, with these settings."""
    from rspo.config import load_preset
    from rspo.plan import load_train_config

    preset_file = ROOT / "configs" / ("paper_large_math.yaml" if name == "qwen3-30b" else "paper_small.yaml")
    run = "math-gmpo-rs0.8-s0" if name == "qwen3-30b" else "gmpo-rs0.8-s0"
    cfg = load_train_config(preset_file, run)
    prompt = min(1024, row // 2)
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, path="", logits_chunk_tokens=chunk, gradient_checkpointing=checkpointing),
        data=dataclasses.replace(cfg.data, max_prompt_tokens=prompt),
        rollout=dataclasses.replace(
            cfg.rollout, backend="hf", max_new_tokens=row - prompt, tensor_parallel_size=1, vllm_sleep=False
        ),
        schedule=dataclasses.replace(cfg.schedule, max_tokens_per_micro_batch=tokens),
    )
    preset = load_preset(preset_file)
    preset["resources"] = {**(preset.get("resources") or {}), "train": {"processes": world, "gpu": world}}
    return cfg, preset


def one(args: list[str]) -> dict:
    name, layers, world, tokens, row, chunk, ckpt = args[0], *map(int, args[1:6]), args[6] == "1"
    from rspo.memory_plan import GIB, _shape_from_config, plan_run
    from rspo.memory_sim import simulate

    config = model_config(name, layers)
    cfg, preset = settings(name, world, tokens, row, chunk, ckpt)
    shape = _shape_from_config(name, config, 2)
    plan = {ph.name: ph.total / GIB for ph in plan_run(cfg, preset, shape, 80.0, "x").phases}
    out = {}
    for phase in ("old pass", "update"):
        sim = simulate(cfg, config, world, tokens, row, phase.replace(" pass", ""))
        est = max(plan[phase], plan["optimizer step"]) if phase == "update" else plan[phase]
        out[phase] = {"plan_gib": round(est, 2), "sim_gib": round(sim, 2), "error": round(est / sim - 1, 3)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--one", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return 0
    rows = []
    head = (
        "| configurations | model | layers | ranks | tokens | chunk | checkpointing | phase | plan GiB | measured GiB |"
    )
    print(head + " error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, name, layers, world, tokens, row, chunk, ckpt in QUICK if args.quick else FULL:
        cmd = [sys.executable, __file__, "--one", name, str(layers), str(world), str(tokens), str(row), str(chunk)]
        cmd.append("1" if ckpt else "0")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode:
            raise SystemExit(proc.stderr[-3000:])
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        for phase, r in res.items():
            rows.append(
                {
                    "label": label,
                    "model": name,
                    "layers": layers,
                    "world": world,
                    "tokens": tokens,
                    "chunk": chunk,
                    "checkpointing": ckpt,
                    "phase": phase,
                    **r,
                }
            )
            cols = [label, name, layers, world, tokens, chunk or "whole", "yes" if ckpt else "no", phase]
            print("| " + " | ".join(map(str, cols)) + f" | {r['plan_gib']} | {r['sim_gib']} | {r['error']:+.1%} |")
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
