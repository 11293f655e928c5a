"""rspo.config: strict parsing, validation errors naming the key, the run grid."""

from pathlib import Path

import pytest
import yaml

from rspo.config import (
    ConfigError,
    TrainConfig,
    load_preset,
    train_config_from_dict,
)
from rspo.grid import Run, all_runs, expand_grid, load_train_config
from rspo.preset import Preset

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted((ROOT / "configs").glob("*.yaml"))


def test_defaults_are_valid_and_flatten():
    cfg = TrainConfig()
    flat = cfg.flat_params()
    assert flat["algorithm/gamma_min"] == "0.8"
    assert flat["rollout/group_size"] == "8"
    assert all("@" not in k for k in flat)


@pytest.mark.parametrize(
    "rl, key",
    [
        ({"algorithm": {"gamma_min": 1.5}}, "rl.algorithm.gamma_min"),
        ({"algorithm": {"gamma_min": 0.0}}, "rl.algorithm.gamma_min"),
        ({"algorithm": {"algo": "ppo"}}, "rl.algorithm.algo"),
        ({"algorithm": {"routing": "replay"}}, "rl.algorithm.routing"),
        ({"algorithm": {"gama_min": 0.5}}, "rl.algorithm.gama_min"),
        ({"algorithm": {"router_shift": "yes"}}, "rl.algorithm.router_shift"),
        ({"schedule": {"prompts_per_step": 10, "mini_batch_prompts": 4}}, "rl.schedule.mini_batch_prompts"),
        ({"schedule": {"total_steps": 1.5}}, "rl.schedule.total_steps"),
        ({"rollout": {"group_size": 1}}, "rl.rollout.group_size"),
        ({"rollout": {"backend": "sglang"}}, "rl.rollout.backend"),
        ({"optim": {"lr": -1}}, "rl.optim.lr"),
        ({"optimizer": {}}, "rl.optimizer"),
        ({"data": {"task": "chess"}}, "rl.data.task"),
    ],
)
def test_bad_values_name_the_key(rl, key):
    with pytest.raises(ConfigError) as e:
        train_config_from_dict(rl)
    assert str(e.value).startswith(key)


def test_int_accepted_for_float_and_not_bool_for_int():
    cfg = train_config_from_dict({"optim": {"lr": 1}})
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    with pytest.raises(ConfigError, match="rl.schedule.total_steps"):
        train_config_from_dict({"schedule": {"total_steps": True}})


def test_configs_are_frozen():
    cfg = TrainConfig()
    with pytest.raises(Exception):  # noqa: B017 (dataclasses.FrozenInstanceError)
        cfg.algorithm.gamma_min = 0.5  # type: ignore[misc]


def test_run_names():
    assert Run("gmpo", router_shift=True, gamma_min=0.8).name == "gmpo-rs0.8-s0"
    assert Run("grpo", seed=2).name == "grpo-s2"
    assert Run("gmpo", router_shift=True, stop_gradient=False).name == "gmpo-rs0.8-nosg-s0"
    assert Run("gmpo", routing="index_replay").name == "gmpo-indexreplay-s0"
    assert Run("gmpo", rollout_correction="token_truncate", router_shift=True).name == "gmpo-rs0.8-tis-s0"
    assert Run("gmpo", rollout_dtype="fp8").name == "gmpo-fp8-s0"
    assert Run("gmpo", task="math", main=True, router_shift=True).name == "math-gmpo-rs0.8-s0"
    assert Run("grpo", regime="stress", seed=1).name == "stress-grpo-s1" and Run("grpo", seed=3).method == "grpo"


def test_a_run_is_written_onto_rl_once_and_its_config_is_a_lookup():
    from rspo.grid import find_run, train_config

    preset = Preset.load(ROOT / "configs" / "small.yaml")
    run = find_run(preset, "stress-gmpo-rs0.8-s1")
    assert run == Run("gmpo", 1, router_shift=True, regime="stress", gamma_min=preset.rl().algorithm.gamma_min)
    rl = run.rl_section(preset)
    assert rl["algorithm"]["router_shift"] is True and rl["optim"]["router_lr_mult"] == 300
    assert "rollout_correction" not in rl["algorithm"]  # a run without one keeps the preset's
    assert train_config(preset, run) == load_train_config(ROOT / "configs" / "small.yaml", run.name)
    # a seed outside the preset's list (--config seeds=[...]) is found among that seed's runs
    assert find_run(preset, "gmpo-rs0.8-s9").seed == 9


def test_small_grid_trains_shared_runs_once():
    preset = load_preset(ROOT / "configs" / "small.yaml")
    fams = expand_grid(Preset(preset))
    runs = all_runs(Preset(preset))
    # the RSPO run serves Figs. 1/4 (plugin), 3 (gamma 0.8), 5 (stop-grad), 6, 8
    for fam in ("plugin", "gamma_min", "stop_gradient", "routing", "mechanism"):
        assert "gmpo-rs0.8-s0" in fams[fam]
    seeds = preset["seeds"]

    def regime_seeds(regime, asked):  # a regime's own `seeds` keeps only those of the asked seeds
        return [s for s in asked if s in preset[regime].get("seeds", asked)]

    # natural and stress regimes, and the mismatch regime's routing family (GMPO, RSPO, R3, TIS, RS+TIS)
    def count(asked):
        return 12 * len(asked) + 12 * len(regime_seeds("stress", asked)) + 5 * len(regime_seeds("mismatch", asked))

    assert len(preset["stress"]["seeds"]) < len(seeds)  # the stress regime runs fewer seeds (its comment says why)
    assert len(runs) == count(seeds)
    from rspo.plan import Plan

    assert Plan(preset, seeds=[0], full=True).figure_runs("fig6_mechanism") == ["grpo-s0", "gmpo-rs0.8-s0"]
    assert Plan(preset, seeds=[0], full=True).figure_runs("fig6_mechanism_stress") == [
        "stress-grpo-s0",
        "stress-gmpo-rs0.8-s0",
    ]
    four_seeds = all_runs(Preset(preset), seeds=[0, 1, 2, 3])
    assert len(four_seeds) == count([0, 1, 2, 3])


def test_load_train_config_applies_grid_and_overrides(tmp_path):
    cfg = load_train_config(
        ROOT / "configs" / "small.yaml", "gmpo-rs0.5-s0", ["optim.lr=0.001", "schedule.total_steps=3"]
    )
    assert cfg.algorithm.algo == "gmpo" and cfg.algorithm.router_shift and cfg.algorithm.gamma_min == 0.5
    assert cfg.optim.lr == 0.001 and cfg.schedule.total_steps == 3
    assert cfg.run_name == "gmpo-rs0.5-s0" and cfg.preset == "small"
    other = load_train_config(ROOT / "configs" / "small.yaml", "gmpo-rs0.8-s0")
    assert other.fingerprint() != cfg.fingerprint()
    with pytest.raises(ConfigError, match="run"):
        load_train_config(ROOT / "configs" / "small.yaml", "nope-s0")
    with pytest.raises(ConfigError, match="rl.algorithm.gamma_min"):
        load_train_config(ROOT / "configs" / "small.yaml", None, ["algorithm.gamma_min=2"])


def test_task_runs_overlay_the_task_section():
    cfg = load_train_config(ROOT / "configs" / "smoke.yaml", "code-gmpo-rs0.8-s0")
    assert cfg.data.task == "code" and cfg.algorithm.router_shift


def test_bad_preset_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_preset(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rl: [1, 2\n")
    with pytest.raises(ConfigError, match="YAML"):
        load_preset(bad)
    bad.write_text(yaml.safe_dump({"grid": {"plugins": {}}}))
    with pytest.raises(ConfigError, match="grid.plugins"):
        expand_grid(Preset.load(bad))


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_every_preset_resolves_every_run(path):
    preset = load_preset(path)
    for name in all_runs(Preset(preset)):
        cfg = load_train_config(path, name)
        assert cfg.run_name == name


def test_override_values_are_yaml_and_scientific_floats():
    from rspo.config import parse_override

    assert parse_override("optim.lr=1e-4") == ("optim.lr", 1e-4)
    assert parse_override("algorithm.router_shift=true") == ("algorithm.router_shift", True)
    assert parse_override("rollout.backend=vllm") == ("rollout.backend", "vllm")
    assert parse_override("data.val_paths={}") == ("data.val_paths", {})


def test_top_p_below_one_is_refused_for_training():
    from rspo.config import ConfigError, train_config_from_dict

    with pytest.raises(ConfigError, match="rl.rollout.top_p: must be 1.0"):
        train_config_from_dict({"rollout": {"top_p": 0.9}})


@pytest.mark.parametrize("value", [0, 0.0, 1.5, -1])
def test_gamma_min_out_of_range_is_one_clear_error(value):
    from rspo.config import check_gamma_min
    from rspo.grid import expand_grid

    with pytest.raises(ConfigError, match=r"^rl\.algorithm\.gamma_min: must lie in \(0, 1\], got "):
        train_config_from_dict({"algorithm": {"gamma_min": value}})
    with pytest.raises(ConfigError, match=r"^gamma_min: must lie in \(0, 1\]"):
        check_gamma_min(value)
    preset = {"rl": {}, "grid": {"gamma_min": {"values": [0.5, value]}}}
    with pytest.raises(ConfigError, match=r"^grid\.gamma_min\.values\[1\]: must lie in \(0, 1\]"):
        expand_grid(Preset(preset))
    assert check_gamma_min(1) == 1.0 and check_gamma_min(0.8) == 0.8


def test_the_router_shift_term_refuses_gamma_min_with_the_same_check():
    torch = pytest.importorskip("torch")
    from rspo.losses import router_shift_log_weight

    with pytest.raises(ValueError, match=r"^gamma_min: must lie in \(0, 1\], got 1.5"):
        router_shift_log_weight(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool), gamma_min=1.5)


def test_prompt_template_settings_are_checked_and_keep_earlier_runs_identity():
    import hashlib
    import json

    from rspo.config import ADDED_LATER, EXECUTION_ONLY, REMOVED

    # every setting added later at the value runs had before it existed
    earlier = [f"{key}={json.dumps(value)}" for key, value in ADDED_LATER.items()]
    cfg = load_train_config(ROOT / "configs" / "small.yaml", "gmpo-rs0.8-s0", earlier)
    assert (cfg.data.template, cfg.data.enable_thinking) == ("auto", None)
    assert {"data.template", "data.enable_thinking"} <= set(ADDED_LATER)
    # a run configured before these settings existed (and while the removed ones did) has the same
    # fingerprint as before
    d = cfg.to_dict()
    for key in EXECUTION_ONLY + tuple(ADDED_LATER):
        section, name = key.split(".")
        d[section].pop(name, None)
    for key, (value, _) in REMOVED.items():
        section, name = key.split(".")
        d[section][name] = value
    assert cfg.fingerprint() == hashlib.sha256(json.dumps(d, sort_keys=True, default=list).encode()).hexdigest()[:16]
    chat = load_train_config(ROOT / "configs" / "small.yaml", "gmpo-rs0.8-s0", [*earlier, "data.enable_thinking=true"])
    assert chat.fingerprint() != cfg.fingerprint()
    with pytest.raises(ConfigError, match="rl.data.template: unknown template 'jinja'"):
        load_train_config(ROOT / "configs" / "small.yaml", "gmpo-rs0.8-s0", ["data.template=jinja"])
    with pytest.raises(ConfigError, match="rl.data.template: 'chatml' is not a math template"):
        load_train_config(ROOT / "configs" / "small.yaml", "gmpo-rs0.8-s0", ["data.task=math", "data.template=chatml"])
    with pytest.raises(ConfigError, match="rl.data.enable_thinking"):
        load_train_config(ROOT / "configs" / "small.yaml", "gmpo-rs0.8-s0", ["data.enable_thinking=maybe"])


# the shipped archives: runs, and how many were configured while the removed settings existed
FINGERPRINTED = {"small": (60, 0), "small-3seed": (51, 36)}  # the 5-seed study; the earlier 3-seed one


@pytest.mark.parametrize("archive", sorted(FINGERPRINTED))
def test_every_committed_run_keeps_its_fingerprint(archive):
    """A shipped study's runs (docs/results/<archive>/runs.tar.xz: each run.json with the fingerprint
    its job recorded, beside its config.json) get the same fingerprint from today's TrainConfig, with
    the settings added since at the value those runs had (ADDED_LATER) and the removed ones gone:
    a run's fingerprint stays its identity across versions of the code."""
    import json
    import tarfile

    from rspo.config import ADDED_LATER, REMOVED, train_config_from_dict

    checked = legacy = 0
    with tarfile.open(ROOT / "docs" / "results" / archive / "runs.tar.xz") as tf:
        files = {m.name: m for m in tf.getmembers() if m.isfile()}
        for name in sorted(n for n in files if n.endswith("/run.json")):
            info = json.load(tf.extractfile(files[name]))
            config = json.load(tf.extractfile(files[name.replace("/run.json", "/config.json")]))
            seed, preset, run = config.pop("seed"), config.pop("preset"), config.pop("run_name")
            for key in REMOVED:
                section, field_name = key.split(".")
                if field_name in config[section]:  # a run configured while the setting existed
                    config[section].pop(field_name)
                    legacy += 1
            for key, value in ADDED_LATER.items():  # a run configured before the setting existed
                section, field_name = key.split(".")
                config[section].setdefault(field_name, value)
            cfg = train_config_from_dict(config, seed=seed, preset=preset, run_name=run)
            assert cfg.fingerprint() == info["fingerprint"], name
            checked += 1
    # the 3-seed study: 36 runs of make main (configured while the removed settings existed) and the
    # mismatch regime's 15; the 5-seed study: 30 natural and 25 mismatch runs, configured after
    runs, configured_before = FINGERPRINTED[archive]
    assert checked == runs and legacy == configured_before * len(REMOVED)


@pytest.mark.parametrize("key", ["algorithm.kl_coef", "tracking.log_every"])
def test_a_preset_that_sets_a_removed_setting_is_told_it_was_removed(key, tmp_path):
    from rspo.plan import validate_preset

    section, name = key.split(".")
    with pytest.raises(ConfigError, match=rf"rl.{key}: removed \(.*\); delete it from the preset"):
        load_train_config(ROOT / "configs" / "small.yaml", "gmpo-rs0.8-s0", [f"{key}=1"])
    preset = yaml.safe_load((ROOT / "configs" / "small.yaml").read_text())
    preset["rl"].setdefault(section, {})[name] = 0
    with pytest.raises(ConfigError, match=rf"^small.yaml: rl.{key}: removed \("):
        validate_preset(preset, ROOT / "workflow" / "schemas" / "preset.schema.yaml", where="small.yaml")


def test_a_run_named_by_its_overrides_carries_every_grid_setting_it_differs_by():
    """`rspo train --set ...` without --run-name names the run from its config: the correction, the
    engine's precision and the routing mode are in the name, so two runs that differ in any of them
    never share an MLflow run name (a TIS run was once named like the plain run, gmpo-s0)."""
    small = ROOT / "configs" / "small.yaml"
    variants = {
        "plain": [],
        "tis": ["algorithm.rollout_correction=token_truncate"],
        "icepop": ["algorithm.rollout_correction=token_mask"],
        "fp8": ["rollout.dtype=fp8"],
        "bf16": ["rollout.dtype=bfloat16"],
        "freeze": ["algorithm.routing=freeze"],
        "r3": ["algorithm.routing=rollout_replay"],
        "rs": ["algorithm.router_shift=true"],
        "rs-tis-fp8": [
            "algorithm.router_shift=true",
            "algorithm.rollout_correction=token_truncate",
            "rollout.dtype=fp8",
        ],
    }
    names = {k: load_train_config(small, None, ["algorithm.algo=gmpo", *v]).run_name for k, v in variants.items()}
    assert len(set(names.values())) == len(names), names
    assert names["plain"] == "gmpo-s0" and names["tis"] == "gmpo-tis-s0" and names["fp8"] == "gmpo-fp8-s0"
    assert names["rs-tis-fp8"] == "gmpo-rs0.8-tis-fp8-s0"
    # the grid's names are unchanged: its regime prefix says what the engine's precision is
    assert load_train_config(small, "gmpo-rs0.8-s0").run_name == "gmpo-rs0.8-s0"


def test_router_lr_schedule_is_checked():
    """A schedule whose end precedes its start, or that has no multiplier to change to, is refused by
    name; a YAML list is read as the (start, end) pair."""
    from rspo.config import train_config_from_dict

    with pytest.raises(ConfigError, match=r"rl\.optim\.router_lr_change: end 10 is before start 80"):
        train_config_from_dict({"optim": {"router_lr_mult_final": 150, "router_lr_change": [80, 10]}})
    with pytest.raises(ConfigError, match=r"rl\.optim\.router_lr_change: .*without router_lr_mult_final"):
        train_config_from_dict({"optim": {"router_lr_change": [80, 80]}})
    with pytest.raises(ConfigError, match=r"rl\.optim\.router_lr_mult_final"):
        train_config_from_dict({"optim": {"router_lr_mult_final": 0}})
    cfg = train_config_from_dict({"optim": {"router_lr_mult_final": 150, "router_lr_change": [80, 80]}})
    assert cfg.optim.router_lr_change == (80, 80)
