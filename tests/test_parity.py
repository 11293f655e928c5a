"""rspo.parity: TRL's GRPOTrainer trained with the preset's natural setting mapped onto GRPOConfig,
evaluated like the study's runs (needs the optional `bench` extra, TRL; skipped without it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_moe import make_train_assets

ROOT = Path(__file__).resolve().parents[1]


def test_the_preset_maps_onto_trl_with_the_same_work_per_step():
    pytest.importorskip("trl", reason="TRL is the optional `bench` extra (pip install -e '.[bench]')")
    from rspo.grid import load_train_config
    from rspo.parity import trl_grpo_args

    cfg = load_train_config(ROOT / "configs" / "small.yaml", "grpo-s0")
    args = trl_grpo_args(cfg, Path("/tmp/x"), generations=150, lr=cfg.optim.lr, warmup=cfg.optim.warmup_steps, seed=1)
    G, sc = cfg.rollout.group_size, cfg.schedule
    assert args.num_generations == G == 8
    assert args.per_device_train_batch_size == sc.mini_batch_prompts * G  # one update = one of our mini-batches
    assert args.steps_per_generation == sc.prompts_per_step // sc.mini_batch_prompts == 4
    assert args.max_steps == 150 * 4 and args.learning_rate == cfg.optim.lr and args.warmup_steps == 10
    assert args.lr_scheduler_type == "constant_with_warmup"
    assert (args.beta, args.epsilon, args.loss_type, args.router_aux_loss_coef) == (0.0, 0.2, "grpo", 0.0)
    assert args.temperature == cfg.rollout.temperature and args.max_completion_length == cfg.rollout.max_new_tokens


def tiny_parity(tmp_path, trainer: str):
    """Two generations of `rspo parity` on the smoke preset and a tiny base -> (summary, out)."""
    pytest.importorskip("trl", reason="TRL is the optional `bench` extra (pip install -e '.[bench]')")
    from rspo.parity import run_parity

    assets = make_train_assets(tmp_path / "assets")
    out = tmp_path / f"{trainer}-s0"
    overrides = ["schedule.total_steps=2", "rollout.max_new_tokens=6"]
    s = run_parity(
        str(ROOT / "configs" / "smoke.yaml"),
        str(assets / "base"),
        str(assets / "data"),
        str(out),
        overrides=overrides,
        trainer=trainer,
    )
    return s, out


@pytest.mark.slow
def test_parity_trains_with_trl_and_evaluates_like_the_study(tmp_path):
    s, out = tiny_parity(tmp_path, "trl-grpo")
    assert set(s["final_accuracy"]) == set(s["base_accuracy"]) == {"val", "val_target"}
    saved = json.loads((out / "parity.json").read_text())
    assert saved["generations"] == 2 and saved["trainer"] == "trl.GRPOTrainer" and len(saved["log"]) == 2
    assert "frac_reward_zero_std" in saved["log"][0]
    assert json.loads((out / "countdown.json").read_text())["splits"]["val"]["n"] == 8
    assert (out / "final" / "model.safetensors").is_file()


def test_rspo_through_trl_maps_the_same_work_with_gmpos_clip_and_the_presets_rs():
    pytest.importorskip("trl", reason="TRL is the optional `bench` extra (pip install -e '.[bench]')")
    from rspo.grid import load_train_config
    from rspo.integrations.trl import RSPOConfig
    from rspo.parity import RUN_OVERRIDES, trl_grpo_args, trl_rspo_args

    cfg = load_train_config(ROOT / "configs" / "small.yaml", None, RUN_OVERRIDES["trl-rspo"])
    kw = dict(generations=150, lr=cfg.optim.lr, warmup=cfg.optim.warmup_steps, seed=1)
    rs, grpo = trl_rspo_args(cfg, Path("/tmp/x"), **kw), trl_grpo_args(cfg, Path("/tmp/x"), **kw)
    assert isinstance(rs, RSPOConfig)
    assert (rs.epsilon, rs.epsilon_high, rs.gamma_min, rs.stop_gradient) == (0.4, 0.4, 0.8, True)
    same = ("per_device_train_batch_size", "num_generations", "steps_per_generation", "max_steps", "learning_rate")
    assert all(getattr(rs, k) == getattr(grpo, k) for k in same + ("temperature", "max_completion_length", "beta"))
    assert rs.steps_per_generation > rs.gradient_accumulation_steps  # off-policy updates: RS has work to do


@pytest.mark.slow
def test_parity_trains_rspo_through_trl_and_logs_the_router_metrics(tmp_path):
    s, out = tiny_parity(tmp_path, "trl-rspo")
    saved = json.loads((out / "parity.json").read_text())
    assert saved["trainer"].startswith("rspo.integrations.trl.RSPOTrainer") and len(saved["log"]) == 2
    assert saved["run_overrides"] == ["algorithm.algo=gmpo", "algorithm.router_shift=true"]
    for row in saved["log"]:
        assert 0.0 < row["router/shift_ratio_mean"] <= 1.0 and 0.0 <= row["router/shift_clipfrac"] <= 1.0
    assert set(s["final_accuracy"]) == {"val", "val_target"}
