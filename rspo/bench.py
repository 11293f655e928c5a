"""`python -m rspo bench`: throughput and memory of RSPO vs GMPO (paper Sec. 5.5), side by side.

On the preset's Countdown model (its pretrained base when it exists, else a random model of the
same architecture: routing cost does not depend on the weights), measured in ONE process, the
configurations alternating step by step so that machine noise hits them alike:

- ``gmpo``: plain GMPO with router diagnostics OFF (no router cache, no capture): the baseline
  the paper's 79.2% refers to;
- ``gmpo+rs``: RSPO (old pass builds the compact router cache, every update computes gamma);
- ``gmpo+diag``: GMPO with the router diagnostics every run of this suite logs.

Printed: a table of per-phase wall times, update-phase tokens/s, rollout tokens/s, cache bytes,
and as the LAST line one JSON object with at least ``rs_throughput_ratio`` (update tokens/s of
gmpo+rs / gmpo, the median of its per-round ratios, RATIO_DEFINITION; paper 0.792, target >= 0.95),
``router_cache_bytes_per_token_layer_k`` (paper's
implementation: 4, target <= 3) and ``rollout_tokens_per_s`` (hf backend).
Run it alone: two torch jobs on these 2 cores slow each other down ~50x.

``--data-parallel N`` adds a second table: the same RSPO run launched through ``rspo train`` in
one process with all threads and under torchrun with N FSDP2 processes sharing them (gloo on
CPU), median per-phase step times, and the largest difference between the two runs' per-step
training rewards and losses (they should agree: rollouts are seeded per row).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

CONFIGS = {
    "gmpo": dict(algorithm={"algo": "gmpo", "router_shift": False}, tracking={"router_diagnostics": False}),
    "gmpo+rs": dict(algorithm={"algo": "gmpo", "router_shift": True}, tracking={"router_diagnostics": True}),
    "gmpo+diag": dict(algorithm={"algo": "gmpo", "router_shift": False}, tracking={"router_diagnostics": True}),
}
PHASES = ("perf/rollout_s", "perf/reward_s", "perf/old_pass_s", "perf/update_s", "perf/step_s")


RATIO_DEFINITION = (
    "median of the per-round ratios (both contenders measured in the same round of the alternation), "
    "quartiles over the rounds in the *spread entry; ratio_of_medians: the earlier headline, for comparison"
)
"""Every ratio `rspo bench` and `rspo speed` report is this one statistic: a round pairs the two
contenders in one machine state, so the per-round ratio cancels what drifts between rounds (another
job, the CPU's clock), which a ratio of two medians taken over different rounds does not; its median
is the headline and its quartiles the spread, so headline and spread can never disagree."""


def ratio_spread(ratios: list[float]) -> dict[str, float]:
    """The median and quartiles of per-round ratios (one per round of an alternation: the same
    machine state for both contenders), so that a reader tells machine noise from a change. The
    median is every headline ratio (RATIO_DEFINITION)."""
    if not ratios:
        raise ValueError("no rounds measured")
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return {"median": median, "q1": q1, "q3": q3, "rounds": len(ratios)}


def spread_text(s: dict[str, float]) -> str:
    return f"per round: median {s['median']:.3f}, quartiles {s['q1']:.3f}-{s['q3']:.3f} over {s['rounds']}"


def prepare_inputs(preset_path: str, model: str | None, data: str | None, work: Path, threads: int):
    from rspo.data.countdown import CountdownConfig, generate
    from rspo.models import build_model, save_checkpoint
    from rspo.preset import Preset
    from rspo.tokenizer import build_tokenizer, tokenizer_fingerprint

    spec = Preset.load(preset_path)
    preset, name = spec.data, spec.name
    root = Path(__file__).resolve().parents[1] / "results" / name
    data_dir = Path(data) if data else root / "data" / "countdown"
    if not (data_dir / "train.jsonl").is_file():
        cd = dict(spec.section("countdown") or {})
        cd.update(train_size=2000, val_size=10, val_target_size=10)
        data_dir = work / "data"
        generate(CountdownConfig(**cd), data_dir)
    model_dir = Path(model) if model else root / "models" / "base"
    source = "pretrained"
    if not (model_dir / "config.json").is_file():
        tok = build_tokenizer()
        m = build_model(spec.architecture("countdown"), tok, seed=0)
        model_dir = work / "model"
        save_checkpoint(m, tok, model_dir, meta={"tokenizer_fingerprint": tokenizer_fingerprint(tok)})
        source = "random-init (no pretrained base found)"
    return preset, name, data_dir, model_dir, source


def run_bench(
    preset_path: str,
    *,
    model: str | None = None,
    data: str | None = None,
    steps: int = 8,
    threads: int = 2,
    out: str | None = None,
    data_parallel: int = 0,
    quiet: bool = False,
) -> dict[str, Any]:
    from rspo.grid import load_train_config
    from rspo.models import set_threads
    from rspo.progress import Progress
    from rspo.train.trainer import Trainer

    set_threads(threads)
    with tempfile.TemporaryDirectory(prefix="rspo-bench-") as tmp:
        work = Path(tmp)
        preset, name, data_dir, model_dir, source = prepare_inputs(preset_path, model, data, work, threads)
        trainers = {}
        for label, ov in CONFIGS.items():
            overrides = [
                f"model.path={json.dumps(str(model_dir))}",
                f"data.train_path={json.dumps(str(data_dir / 'train.jsonl'))}",
                "data.val_paths={}",
                f"model.threads={threads}",
                "schedule.ckpt_every=0",
            ]
            for sec, kv in ov.items():
                for k, v in kv.items():
                    overrides.append(f"{sec}.{k}={json.dumps(v)}")
            cfg = load_train_config(preset_path, None, overrides)
            trainers[label] = Trainer(cfg, work / label)
        samples: dict[str, list[dict[str, float]]] = {k: [] for k in CONFIGS}
        progress = Progress("bench", total=steps + 1, unit="round", quiet=quiet, every=1)
        for tr in trainers.values():  # warm-up step each (allocations, first-call overheads)
            tr.train_step()
        progress.update(1)
        for i in range(steps):
            for label, tr in trainers.items():
                samples[label].append(tr.train_step())
            progress.update(i + 2, {k: f"{samples[k][-1]['perf/step_s']:.3f}s" for k in CONFIGS})
        progress.close()
        dp_result, dp_lines = None, []
        if data_parallel > 1:
            dp_result, dp_lines = run_dp_bench(
                preset_path, model_dir, data_dir, work, nproc=data_parallel, steps=steps, threads=threads
            )
    med = {label: {k: statistics.median(s[k] for s in rows) for k in rows[0]} for label, rows in samples.items()}
    cfg = trainers["gmpo+rs"].cfg
    spec = trainers["gmpo+rs"].policy.spec
    base_tps = med["gmpo"]["perf/tokens_per_s"]
    result = {
        "preset": name,
        "model": source,
        "moe_layers": spec.num_moe_layers,
        "experts": spec.num_experts,
        "top_k": spec.top_k,
        "steps_measured": steps,
        "threads": threads,
        "responses_per_step": cfg.schedule.prompts_per_step * cfg.rollout.group_size,
        "updates_per_step": cfg.schedule.prompts_per_step // cfg.schedule.mini_batch_prompts,
        # one ratio per round of the alternation (the same machine state for both): the claims
        # table's confidence interval of the throughput claim is over these
        "rs_throughput_ratio_per_step": [
            a["perf/tokens_per_s"] / b["perf/tokens_per_s"] for a, b in zip(samples["gmpo+rs"], samples["gmpo"])
        ],
        "diag_throughput_ratio_per_step": [
            a["perf/tokens_per_s"] / b["perf/tokens_per_s"] for a, b in zip(samples["gmpo+diag"], samples["gmpo"])
        ],
        "router_cache_bytes_per_token_layer_k": med["gmpo+rs"]["router/cache_bytes_per_entry"],
        "router_cache_bytes_per_step": med["gmpo+rs"]["router/cache_bytes"],
        "rollout_tokens_per_s": statistics.median([med[k]["perf/rollout_tokens_per_s"] for k in CONFIGS]),
        "update_tokens_per_s": {k: med[k]["perf/tokens_per_s"] for k in CONFIGS},
        "phase_seconds": {k: {p.split("/")[1]: med[k][p] for p in PHASES} for k in CONFIGS},
    }
    lines = [
        f"rspo bench  preset={name}  model={source}  L={spec.num_moe_layers} E={spec.num_experts} "
        f"K={spec.top_k}  threads={threads}  median of {steps} steps",
        f"{'config':<11}" + "".join(f"{p.split('/')[1]:>12}" for p in PHASES) + f"{'upd tok/s':>12}{'ratio':>8}",
    ]
    for k in CONFIGS:
        row = med[k]
        lines.append(
            f"{k:<11}"
            + "".join(f"{row[p]:>12.3f}" for p in PHASES)
            + f"{row['perf/tokens_per_s']:>12.0f}{row['perf/tokens_per_s'] / base_tps:>8.3f}"
        )
    lines.append(
        f"router cache: {result['router_cache_bytes_per_token_layer_k']:.2f} bytes per (token, layer, k) "
        f"(paper's implementation: 4), {result['router_cache_bytes_per_step'] / 1024:.1f} KiB per step"
    )
    result["ratio_definition"] = RATIO_DEFINITION
    result["ratio_of_medians"] = {}
    for key, text, config in (("rs", "gmpo+rs / gmpo", "gmpo+rs"), ("diag", "gmpo+diag / gmpo", "gmpo+diag")):
        spread = ratio_spread(result[f"{key}_throughput_ratio_per_step"])
        result[f"{key}_throughput_ratio"] = spread["median"]
        result[f"{key}_throughput_ratio_spread"] = spread
        result["ratio_of_medians"][f"{key}_throughput_ratio"] = med[config]["perf/tokens_per_s"] / base_tps
        lines.append(f"{text} update tokens/s {spread['median']:.3f} ({spread_text(spread)})")
    lines.append(f"rollout (hf): {result['rollout_tokens_per_s']:.0f} tokens/s")
    if dp_result is not None:
        result["data_parallel"] = dp_result
        lines += [""] + dp_lines
    print("\n".join(lines))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return result


def run_dp_bench(
    preset_path: str, model_dir: Path, data_dir: Path, work: Path, *, nproc: int, steps: int, threads: int
) -> tuple[dict[str, Any], list[str]]:
    """RSPO steps through the real CLI: 1 process x threads vs nproc torchrun processes."""
    import os
    import subprocess

    from rspo.run_record import GAMMA, PG_LOSS, REWARD, Steps
    from rspo.subcommand import rspo_argv

    sets = {
        "algorithm.algo": "gmpo",
        "algorithm.router_shift": "true",
        "schedule.total_steps": str(steps + 1),
        "schedule.val_every": "0",
        "schedule.ckpt_every": "0",
        "data.val_paths": "{}",
    }
    rows: dict[str, dict[str, float]] = {}
    curves: dict[str, list[dict[str, float]]] = {}
    for n in (1, nproc):
        label = f"{n} x {max(1, threads // n)} threads"
        out = work / f"dp{n}"
        cmd = rspo_argv(
            "train",
            preset=preset_path,
            base_model=model_dir,
            train_data=data_dir / "train.jsonl",
            out=out,
            threads=threads,
            no_mlflow=True,
            sets=[f"{k}={v}" for k, v in sets.items()],
            launcher=["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n)] if n > 1 else [],
        )
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        t0 = time.perf_counter()
        proc = subprocess.run(
            cmd, env=dict(env, OMP_NUM_THREADS=str(max(1, threads // n))), capture_output=True, text=True
        )
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"data-parallel bench ({label}) failed:\n{proc.stderr[-3000:]}")
        metrics = list(Steps.parse(out / "metrics.jsonl").rows.values())
        curves[label] = metrics
        timed = metrics[1:]  # the first step warms up
        rows[label] = {p: statistics.median(m[p] for m in timed) for p in PHASES}
        rows[label]["perf/tokens_per_s"] = statistics.median(m["perf/tokens_per_s"] for m in timed)
        rows[label]["wall_s"] = wall
    one, many = curves.values()
    diff = {k: max(abs(a[k] - b[k]) for a, b in zip(one, many)) for k in (REWARD, PG_LOSS, GAMMA)}
    labels = list(rows)
    result = {
        "processes": nproc,
        "steps_measured": steps,
        "rows": rows,
        "max_abs_diff": diff,
        "step_speedup": rows[labels[0]]["perf/step_s"] / rows[labels[1]]["perf/step_s"],
    }
    lines = [
        f"data parallel (rspo train, RSPO, median of {steps} steps after 1 warm-up; gloo on CPU)",
        f"{'launch':<20}" + "".join(f"{p.split('/')[1]:>12}" for p in PHASES) + f"{'upd tok/s':>12}{'wall s':>9}",
    ]
    for label, row in rows.items():
        lines.append(
            f"{label:<20}"
            + "".join(f"{row[p]:>12.3f}" for p in PHASES)
            + f"{row['perf/tokens_per_s']:>12.0f}{row['wall_s']:>9.1f}"
        )
    lines.append("max |1 process - N processes| per step: " + ", ".join(f"{k} {v:.2g}" for k, v in diff.items()))
    return result, lines
