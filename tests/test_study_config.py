"""rspo.study_config: the study-level sections of a preset, typed once. A grid family's defaults are
its dataclass's, a regime is checked naming the key, and what the schema file says of them is what
the dataclasses say (the file is generated from them: tests/test_presets.py)."""

import pytest

from rspo.config import ConfigError
from rspo.grid import BEYOND_PAPER_ROWS, expand_grid
from rspo.method import ALGOS, ROUTING_MODES
from rspo.preset import Preset
from rspo.study_config import (
    GRID_ROUTING_MODES,
    METHODS,
    GammaMinGrid,
    MainGrid,
    PluginGrid,
    PresetSpec,
    RoutingGrid,
    build_regime,
    grid_family,
    preset_schema,
)


def test_a_family_named_without_settings_has_its_dataclass_defaults():
    assert grid_family("plugin", None) == PluginGrid() and PluginGrid().algos == ALGOS
    assert grid_family("gamma_min", {}) == GammaMinGrid() and GammaMinGrid().values == (0.2, 0.5, 0.8)
    assert grid_family("routing", {"algo": "grpo"}) == RoutingGrid(algo="grpo")
    grid = expand_grid(Preset({"rl": {}, "grid": {"gamma_min": {}, "routing": {}}}))
    assert sorted(grid["gamma_min"]) == ["gmpo-rs0.2-s0", "gmpo-rs0.5-s0", "gmpo-rs0.8-s0"]
    assert sorted(grid["routing"]) == ["gmpo-freeze-s0", "gmpo-indexreplay-s0", "gmpo-logitreplay-s0", "gmpo-rs0.8-s0"]


def test_the_routing_rows_and_methods_are_the_papers_and_those_beyond_it():
    assert set(GRID_ROUTING_MODES) == set(ROUTING_MODES) | set(BEYOND_PAPER_ROWS)
    assert set(METHODS) == {a for a in ALGOS} | {f"{a}+rs" for a in ALGOS} and MainGrid().tasks == ()


@pytest.mark.parametrize(
    "family,data,message",
    [
        ("plugin", {"algos": ["ppo"]}, r"grid.plugin.algos: unknown algorithm 'ppo'"),
        ("plugin", {"algos": []}, r"grid.plugin.algos: must not be empty"),
        ("gamma_min", {"values": [0.5, 1.5]}, r"grid.gamma_min.values\[1\]: must lie in \(0, 1\], got 1.5"),
        ("gamma_min", {"values": [0.5, 0.5]}, r"grid.gamma_min.values: lists an item twice"),
        ("routing", {"modes": ["r4"]}, r"grid.routing.modes: unknown routing mode 'r4'"),
        ("main", {"methods": ["gmpo+tis"]}, r"grid.main.methods: unknown method 'gmpo\+tis'"),
        ("stop_gradient", {"algo": "gmpo", "sg": False}, r"grid.stop_gradient.sg: unknown key"),
    ],
)
def test_a_bad_grid_family_names_its_key(family, data, message):
    with pytest.raises(ConfigError, match=message):
        grid_family(family, data)


def test_a_regime_is_checked_with_the_key_that_is_wrong():
    ok = build_regime("stress", {"rl": {"optim": {"router_lr_mult": 10}}, "families": ["plugin"]})
    assert ok.default_target is True and ok.seeds is None and ok.grid is None
    for data, message in [
        ([1], r"stress: expected a mapping with `rl`"),
        ({"families": ["plugin"]}, r"stress.rl: required"),
        ({"rl": {"x": 1}}, r"stress.families: required"),
        ({"rl": {}, "families": ["plugin"]}, r"stress.rl: expected a non-empty overlay"),
        ({"rl": {"x": 1}, "families": ["main"]}, r"stress.families: unknown family 'main'"),
        ({"rl": {"x": 1}, "families": ["plugin"], "seeds": []}, r"stress.seeds: must not be empty"),
        ({"rl": {"x": 1}, "families": ["plugin"], "seeds": [-1]}, r"stress.seeds\[0\]: must be >= 0, got -1"),
    ]:
        with pytest.raises(ConfigError, match=message):
            build_regime("stress", data)


def test_the_whole_files_schema_comes_from_the_sections():
    from rspo.data.countdown import CountdownConfig

    schema = preset_schema(CountdownConfig)
    assert schema["required"] == ["preset", "rl"] and schema["additionalProperties"] is False
    assert set(schema["properties"]) == set(PresetSpec.__dataclass_fields__)
    assert schema["properties"]["stress"]["$ref"] == schema["properties"]["mismatch"]["$ref"] == "#/$defs/regime"
    assert schema["$defs"]["regime"]["required"] == ["rl", "families"]
    assert PresetSpec.default("seeds") == (0,) and PresetSpec.default("threads") == 1


def test_default_families_may_name_a_regimes_family_and_regime_trials_its_sweep_files():
    """`default_families:` takes grid families and regime families (mismatch_routing: the small study's
    design); a misspelt one and an empty `regime_trials:` are refused with the key, by the schema."""
    from pathlib import Path

    import yaml

    from rspo.plan import validate_preset

    root = Path(__file__).resolve().parents[1]
    schema = root / "workflow" / "schemas" / "preset.schema.yaml"
    small = yaml.safe_load((root / "configs" / "small.yaml").read_text())
    validate_preset(dict(small, default_families=["plugin", "mismatch_routing", "stress_plugin"]), schema)
    with pytest.raises(ConfigError, match=r"default_families\[1\]: 'mismatch_plugn' is not one of"):
        validate_preset(dict(small, default_families=["plugin", "mismatch_plugn"]), schema)
    with pytest.raises(ConfigError, match="regime_trials"):
        validate_preset(dict(small, regime_trials=""), schema)
