"""`rspo train` runs in one process or under torchrun (gloo), for the data-parallel and checkpoint
tests: both go through the real CLI (tests/dist_worker.py swaps in a dense test reward)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_moe import train_args

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "dist_worker.py"
# metrics that measure the machine (time, memory per phase), not what the run computed
MEASURED = ("perf/", "memory/")


def env(**extra):
    out = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    out.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra)
    return out


def launcher(nproc: int) -> list[str]:
    if nproc == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]


def train(
    assets,
    out,
    nproc,
    *extra,
    algo=("algorithm.algo=gmpo", "algorithm.router_shift=true"),
    mlflow=None,
    check=True,
    timeout=600,
    **env_extra,
):
    """Three steps of `rspo train` (ckpt every step) on the assets of tiny_moe.make_train_assets."""
    sets = [
        *algo,
        "rollout.max_new_tokens=10",
        "optim.lr=3e-2",
        "schedule.total_steps=3",
        "schedule.micro_batch_size=4",
        "schedule.val_every=3",
        "schedule.val_size=7",
        "schedule.ppo_epochs=2",
        "schedule.keep_checkpoints=3",
        *extra,
    ]
    args = train_args(assets, out, ROOT / "configs" / "smoke.yaml", *sets, threads=nproc)
    if mlflow is None:
        args.append("--no-mlflow")
    e = env(**({"MLFLOW_TRACKING_URI": mlflow} if mlflow else {}), **env_extra)
    proc = subprocess.run(
        [*launcher(nproc), str(WORKER), *args], env=e, capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def metrics(out: Path) -> list[dict]:
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(MEASURED)} for r in rows]


def weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


# Metrics whose value is float32 rounding itself when engine and trainer agree: chi2 is e^(2r) - 1
# over ratios r equal to 0 up to rounding (|value| ~ 1e-6; chi2_seq sums r over a response first),
# so the order of a reduction moves it by about its own size (one process vs two ranks on a 2-core
# EPYC: -1.01e-6 vs +0.33e-6 at step 3 of the rollout-replay run). 1e-5 is still far below any
# mismatch they are read for (the FP8 engine's k3 KL alone is 8e-4 to 5e-3).
NEAR_ZERO = {"rollout_corr/chi2_seq": 1e-5, "rollout_corr/chi2_token": 1e-5}


# Shares of a count over a threshold: a token whose gamma is at gamma_min, whose ratio is clipped,
# masked or outside the ratio band, a (position, MoE layer) whose experts differ. Two runs that sum in
# another order (ranks or one process, other micro-batches, chunked logits, another CPU's kernels)
# move the continuous value under each item by rounding, so an item lying at its threshold can fall
# on either side: one token of 320 at gamma_min moved router/shift_clipfrac from 0.453125 to 0.45625
# on an Intel Xeon's AVX-512 kernels, where AVX2 and the default kernels agreed. A share is therefore
# compared within one unit of its denominator (`count_unit`), and the continuous value under it
# (router/shift_ratio_mean, actor/ppo_kl, the rollout_corr KLs, the weights) at the run's tolerance.
TOKEN_SHARES = ("router/shift_clipfrac", "rollout_corr/zeroed_frac", "rollout_corr/ratio_outside_frac")


def count_unit(key: str, row: dict, config: dict) -> float | None:
    """What one item moves the share ``key`` of a step's metrics ``row`` by, in a run of ``config``
    (its config.json); None for a metric that is not a share of a count over a threshold.

    A token share's denominator is the step's response tokens, N = response_length/mean x the
    responses of a step (a share merged over epochs or micro-batches weighted by tokens moves by at
    most 1/N when one token crosses); actor/pg_clipfrac counts responses for an objective that clips
    whole sequences (rspo.method's clip_unit); routing agreement is over (position, MoE layer) pairs,
    at least N of them, so 1/N is one position flipping in every layer."""
    from rspo.method import OBJECTIVES

    responses = config["schedule"]["prompts_per_step"] * config["rollout"]["group_size"]
    tokens = max(round(row.get("response_length/mean", 0.0) * responses), 1)
    if key == "actor/pg_clipfrac":
        return 1 / (responses if OBJECTIVES[config["algorithm"]["algo"]].clip_unit == "sequence" else tokens)
    if key in TOKEN_SHARES or key == "rollout_corr/routing_agreement":
        return 1 / tokens
    return None


def assert_same_metrics(
    ra: list[dict], rb: list[dict], config: dict, rel: float = 1e-4, ignore: tuple[str, ...] = ()
) -> None:
    """Two runs' metric rows (of a run of ``config``) step by step: the same keys, every value within
    ``rel`` (abs 1e-6, NEAR_ZERO's) but those in ``ignore``, a share of a count over a threshold
    within one unit of its denominator (`count_unit`)."""
    assert [r["step"] for r in ra] == [r["step"] for r in rb]
    for x, y in zip(ra, rb):
        assert x.keys() == y.keys(), (x["step"], set(x) ^ set(y))
        for k in set(x) - set(ignore):
            unit = count_unit(k, x, config)
            if unit is not None:
                assert abs(x[k] - y[k]) <= unit * (1 + 1e-9), (x["step"], k, x[k], y[k], f"one unit: {unit:.3g}")
                continue
            near = NEAR_ZERO.get(k, 1e-6)
            assert x[k] == pytest.approx(y[k], rel=rel, abs=near), (x["step"], k, x[k], y[k])


def assert_same_run(
    a: Path,
    b: Path,
    rel: float = 1e-4,
    atol: float = 2e-4,
    ignore: tuple[str, ...] = (),
    steps: tuple[int, ...] = (0, 1, 2, 3),
) -> None:
    """Metrics of ``steps`` as `assert_same_metrics` compares them, final weights within (rtol 1e-3,
    ``atol``)."""
    ra, rb = metrics(a), metrics(b)
    assert [r["step"] for r in ra] == list(steps)
    assert_same_metrics(ra, rb, json.loads((a / "config.json").read_text()), rel=rel, ignore=ignore)
    # weights move by ~0.2 at this learning rate; reduction-order noise through Adam leaves ~3e-5
    assert_weights_close(weights(a / "final"), weights(b / "final"), rtol=1e-3, atol=atol)


OUTLIER_SHARE = 1e-3  # of all weight elements
OUTLIER_FACTOR = 10.0  # x the tolerance


def assert_weights_close(wa: dict[str, torch.Tensor], wb: dict[str, torch.Tensor], *, rtol: float, atol: float) -> None:
    """Two runs' final weights agree within (``rtol``, ``atol``), but for isolated elements.

    Why isolated elements may differ more: Adam divides each gradient element by the root of its
    own running square, so an element whose gradient sums to almost nothing (the contributions of
    a step's tokens cancelling to within their float rounding) takes lr-sized steps whose direction
    is set by that rounding: two runs that sum in another order (another micro-batch split, a
    recomputed forward, another rank count, or the same code on another CPU's kernels) can move
    that element apart by up to 2 x lr per update, while every other element agrees to rounding.
    Measured: on AVX2 the largest such difference is ~3e-5, below the tolerance; with torch's
    kernels forced onto their non-vectorised path (``ATEN_CPU_CAPABILITY=default``) one element of
    an expert's gate projection of 1,024 moved 3.1e-4 apart (its neighbours ~1e-5). So at most
    ``OUTLIER_SHARE`` of all elements may exceed the tolerance, and none by more than
    ``OUTLIER_FACTOR`` times it. A wrong gradient (a token routed differently, a missing term)
    moves whole rows of a tensor by a share of lr (3e-2 here) and fails both limits."""
    assert wa.keys() == wb.keys()
    total = sum(t.numel() for t in wa.values())
    over: list[tuple[str, int, float]] = []
    for k in wa:
        diff = (wa[k].double() - wb[k].double()).abs()
        tol = atol + rtol * wb[k].double().abs()
        bad = diff > tol
        assert not (diff > OUTLIER_FACTOR * tol).any(), (k, f"max |diff| {diff.max().item():.3g}")
        if bad.any():
            over.append((k, int(bad.sum()), float(diff[bad].max())))
    n = sum(c for _, c, _ in over)
    assert n <= OUTLIER_SHARE * total, f"{n} of {total} weight elements outside the tolerance: {over}"
