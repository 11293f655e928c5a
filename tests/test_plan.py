"""The regimes (stress, mismatch) of rspo.grid and rspo.plan's run selections: names, overlays,
figures, digests."""

import copy
from pathlib import Path

import pytest
import yaml

from rspo.config import ConfigError
from rspo.grid import expand_grid, load_train_config
from rspo.plan import FIGURES, REGIME_FIGURES, Plan, figure_regime, paper_figure, preset_digest, validate_preset
from rspo.preset import Preset

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "configs" / "small.yaml"
SCHEMA = ROOT / "workflow" / "schemas" / "preset.schema.yaml"

MISMATCH_METHODS = ["gmpo-rs0.8", "gmpo", "gmpo-rolloutreplay", "gmpo-tis", "gmpo-rs0.8-tis"]


def small() -> dict:
    return yaml.safe_load(SMALL.read_text())


def test_small_mismatch_regime_runs_the_routing_rows_beyond_the_paper_under_an_fp8_engine():
    plan = Plan(small(), families=["plugin", "mismatch_routing"])
    names = [n for n in plan.runs if n.startswith("mismatch-")]
    assert names == [f"mismatch-{m}-s{s}" for s in plan.seeds for m in MISMATCH_METHODS]
    assert plan.figure_runs("fig9_mismatch_mismatch") == names == plan.figure_runs("fig8_routing_mismatch")
    assert not plan.available("fig9_mismatch")  # the natural routing family has no R3 / TIS rows
    assert plan.label("mismatch-gmpo-s0") == "GMPO [mismatch]"
    assert plan.label("mismatch-gmpo-rolloutreplay-s1").endswith("[beyond the paper] [mismatch]")
    r3 = load_train_config(SMALL, "mismatch-gmpo-rolloutreplay-s1")
    assert (r3.rollout.dtype, r3.schedule.total_steps, r3.schedule.val_every) == ("fp8", 60, 30)
    assert (r3.algorithm.routing, r3.algorithm.router_shift, r3.seed) == ("rollout_replay", False, 1)
    rstis = load_train_config(SMALL, "mismatch-gmpo-rs0.8-tis-s2")
    assert rstis.algorithm.router_shift and rstis.algorithm.rollout_correction == "token_truncate"
    base = load_train_config(SMALL, "mismatch-gmpo-s0")
    assert base.algorithm.routing == "none" and base.algorithm.rollout_correction == "none"
    # the natural regime is untouched by the regime's overlays: its runs keep their config
    natural = load_train_config(SMALL, "gmpo-s0")
    assert natural.rollout.dtype != "fp8" and natural.schedule.total_steps == 150
    assert base.fingerprint() != natural.fingerprint()


def test_the_default_selection_is_the_studys_design_and_leaves_the_stress_regime_to_full():
    """The small study's design (configs/small.yaml's default_families): the natural plugin and
    stop-gradient families and the mismatch regime's routing family, every seed; the stress regime
    (default_target: false) and the natural routing family only with --config full=true or a selection
    that names them."""
    preset = small()
    default, full = Plan(preset), Plan(preset, full=True)
    assert preset["default_families"] == ["plugin", "stop_gradient", "mismatch_routing"]
    assert set(default.families) == {"plugin", "mechanism", "stop_gradient", "mismatch_routing"}
    assert len(default.runs) == 60 == 6 * 5 + 5 + 5 * 5 and default.seeds == [0, 1, 2, 3, 4]
    assert {f"gmpo-rs0.8-nosg-s{s}" for s in range(5)} <= set(default.runs)
    assert {f"mismatch-{m}-s4" for m in MISMATCH_METHODS} <= set(default.runs)
    assert default.available("fig9_mismatch_mismatch") and not default.available("fig8_routing")
    # a grid family name selects it in every regime that repeats it, a regime's family only there;
    # the stress regime says default_target: false, so a grid family's name leaves it out
    assert preset["stress"]["default_target"] is False
    assert not any(n.startswith("stress-") for n in default.runs) and "stress-grpo-s0" in full.runs
    plugin = Plan(preset, families=["plugin"])
    assert not any(n.startswith(("mismatch-", "stress-")) for n in plugin.runs)
    # a piece of the study: the same design for some seeds
    piece = Plan(preset, seeds=[2, 3])
    assert set(piece.families) == set(default.families) and {r.seed for r in piece.runs.values()} == {2, 3}
    assert len(piece.runs) == 24
    routing = Plan(preset, families=["routing"])
    assert {"routing", "mismatch_routing"} <= set(routing.families) and "stress_routing" not in routing.families
    assert "stress_routing" in Plan(preset, families=["routing", "stress_routing"]).families
    preset_on = copy.deepcopy(preset)
    preset_on["stress"]["default_target"] = True
    assert {
        "plugin",
        "mechanism",
        "stop_gradient",
        "stress_plugin",
        "stress_mechanism",
        "stress_stop_gradient",
        "mismatch_routing",
    } == set(Plan(preset_on).families)
    only = Plan(preset, families=["mismatch_routing"])
    assert set(only.families) == {"mismatch_routing"}
    stress = Plan(preset, families=["stress_plugin"])
    assert set(stress.families) == {"stress_plugin", "stress_mechanism"}
    assert only.cli_args == ["--families", "mismatch_routing"] and full.cli_args == ["--full"]
    assert default.cli_args == []
    with pytest.raises(ConfigError, match=r"families: 'routnig' is not a grid family"):
        Plan(preset, families=["routnig"])


def test_regime_sections_are_checked_with_the_key_that_is_wrong():
    preset = small()
    validate_preset(preset, SCHEMA)
    bad = copy.deepcopy(preset)
    bad["mismatch"]["grid"] = {"main": {"tasks": ["math"]}}
    with pytest.raises(ConfigError, match=r"mismatch.grid.main: expected a mapping overlaying grid.main"):
        expand_grid(Preset(bad))
    bad = copy.deepcopy(preset)
    bad["mismatch"]["families"] = ["mechanism"]
    with pytest.raises(
        ConfigError,
        match=r"mismatch.families: unknown family 'mechanism'; choose one of \['plugin', 'gamma_min'",
    ):
        expand_grid(Preset(bad))
    bad = copy.deepcopy(preset)
    bad["mismatch"]["rl"] = {}
    with pytest.raises(ConfigError, match=r"mismatch.rl: expected a non-empty overlay"):
        expand_grid(Preset(bad))
    bad = copy.deepcopy(preset)
    bad["stress"]["default_target"] = "no"
    with pytest.raises(ConfigError, match=r"stress.default_target: expected true/false, got str 'no'"):
        expand_grid(Preset(bad))
    bad = copy.deepcopy(preset)
    bad["mismatch"]["extra"] = 1
    with pytest.raises(ConfigError, match=r"mismatch.extra: unknown key"):
        expand_grid(Preset(bad))
    with pytest.raises(ConfigError, match=r"mismatch.rl.rollout.dtype"):
        validate_preset({**preset, "mismatch": {**preset["mismatch"], "rl": {"rollout": {"dtype": "fp4"}}}}, SCHEMA)
    with pytest.raises(ConfigError, match=r"mismatch.grid.routing.modes\[0\]"):
        validate_preset({**preset, "mismatch": {**preset["mismatch"], "grid": {"routing": {"modes": ["r4"]}}}}, SCHEMA)


def test_a_regime_figure_names_the_figure_it_redraws_and_its_regime():
    assert paper_figure("fig9_mismatch_mismatch") == "fig9_mismatch" == paper_figure("fig9_mismatch")
    assert paper_figure("fig4_plugin_stress") == "fig4_plugin"
    assert figure_regime("fig9_mismatch_mismatch") == "mismatch" and figure_regime("fig9_mismatch") == "natural"
    assert figure_regime("fig8_routing_stress") == "stress"
    assert set(REGIME_FIGURES) <= set(FIGURES) and "fig2_reward_large_stress" not in FIGURES


def test_a_regime_section_changes_what_train_and_report_jobs_read_only():
    """Data, pretraining, evaluation and the benchmark never read which RL runs exist: adding a
    regime (or choosing other default families) must not rerun them."""
    preset = small()
    without = {k: v for k, v in preset.items() if k != "mismatch"}
    for kind in ("data", "pretrain", "evaluate", "bench"):
        assert preset_digest(preset, kind) == preset_digest(without, kind)
        assert preset_digest({**preset, "default_families": ["routing"]}, kind) == preset_digest(preset, kind)
        # nor how the claims table judges them (pieces of a study run before and after such a key agree)
        judging = {**preset, "primary_claims": ["throughput"], "regime_trials": "elsewhere.jsonl"}
        assert preset_digest(judging, kind) == preset_digest(preset, kind)
    assert preset_digest({**preset, "primary_claims": ["throughput"]}, "report") != preset_digest(preset, "report")
    assert preset_digest(preset, "report") != preset_digest(without, "report")
    # the eval section still counts for evaluation
    assert preset_digest({**preset, "eval": {}}, "evaluate") != preset_digest(preset, "evaluate")
