"""rspo.preset: one object answers what the commands ask of a preset, with the dataclasses' defaults
and the overlays merged the way a training run merges them."""

from pathlib import Path

import pytest
import yaml

from rspo.config import ConfigError, DataConfig, RolloutConfig, ScheduleConfig
from rspo.data.countdown.generator import SPLITS
from rspo.grid import load_train_config
from rspo.preset import COUNTDOWN_EVAL_SPLITS, Preset
from rspo.pretrain_config import ArchConfig, PretrainConfig
from rspo.study_config import PresetSpec
from rspo.tracking import experiment_name

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"


def test_settings_a_preset_leaves_out_are_the_dataclasses_defaults():
    p = Preset({"preset": "tiny", "rl": {"model": {"dtype": "bfloat16"}}})
    cfg = p.rl()
    assert cfg.model.dtype == "bfloat16" and cfg.preset == "tiny"
    assert cfg.data.prompt_format == DataConfig().prompt_format
    assert cfg.rollout.backend == RolloutConfig().backend
    assert cfg.schedule.total_steps == ScheduleConfig().total_steps
    assert p.countdown_splits == list(COUNTDOWN_EVAL_SPLITS) == list(SPLITS[1:])  # the held-out splits


def test_a_task_and_a_regime_overlay_the_rl_section_as_a_run_does():
    p = Preset.load(SMOKE)
    assert p.name == "smoke"
    math = p.rl("math")
    assert math.data.task == "math" and math.data.template == "chat" and math.data.enable_thinking is True
    assert math.schedule.total_steps == 1 and math.optim == p.rl().optim  # the rest is rl's
    assert p.rl("countdown") == p.rl()  # no `tasks.countdown`: rl as it is
    stress = p.rl(regime="stress")
    assert stress.optim.router_lr_mult == 10.0 and stress.schedule == p.rl().schedule
    # the runs of the grid resolve through the same merge (rspo.grid.load_train_config)
    runs = (("math-grpo-s0", "math", None), ("stress-grpo-s0", None, "stress"), ("grpo-s0", None, None))
    for run, task, regime in runs:
        cfg, ref = load_train_config(SMOKE, run), p.rl(task, regime)
        for section in ("model", "data", "rollout", "optim", "schedule", "tracking"):
            assert getattr(cfg, section) == getattr(ref, section), (run, section)
    with pytest.raises(ConfigError, match="mismatch.rl"):
        p.rl(regime="mismatch")  # the smoke preset has no mismatch regime


def test_values_are_copies_and_names_fall_back_to_the_file(tmp_path):
    data = yaml.safe_load(SMOKE.read_text())
    p = Preset(data)
    p.rl_section("math")["data"]["task"] = "code"
    p.section("pretrain")["model"]["num_experts"] = 999
    assert data == yaml.safe_load(SMOKE.read_text())  # nothing a caller changes reaches the preset
    assert set(p.evaluated) == {"countdown", "math", "code"}
    with pytest.raises(ConfigError, match="eval.nothing: unknown evaluation family"):
        p.evaluation("nothing")
    del data["preset"]
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump(data))
    assert Preset.load(f).name == "mine" and Preset(data).name == "preset"
    with pytest.raises(ConfigError, match="a mapping"):
        Preset([1, 2])


def test_the_architecture_of_a_model_pretrained_here():
    pre = {"model": {"num_experts": 4, "max_position_embeddings": 256}, "text_model": {"max_position_embeddings": 1024}}
    p = Preset({"preset": "x", "pretrain": pre})
    assert p.architecture("countdown") == ArchConfig(num_experts=4, max_position_embeddings=256)
    assert p.architecture("math") == p.architecture("code") == ArchConfig(num_experts=4, max_position_embeddings=1024)
    assert Preset({}).architecture("math") == ArchConfig() and Preset({}).pretraining() == PretrainConfig()
    bad = Preset({"preset": "x", "pretrain": {**pre, "text_model": {"top_k": 5}}})
    with pytest.raises(ConfigError, match=r"pretrain.text_model.top_k: larger than num_experts \(5 > 4\)"):
        bad.pretraining()
    with pytest.raises(ConfigError, match=r"pretrain.text_model.experts: unknown key"):
        Preset({"pretrain": {"text_model": {"experts": 5}}}).architecture("math")


def test_settings_the_preset_leaves_out_are_the_sections_defaults():
    p = Preset({"preset": "x", "resources": {"train": {"gpu": 1}}, "prepare": {"math": {"source": "hub"}}})
    assert p.seeds == list(PresetSpec.default("seeds")) == [0] and p.threads == PresetSpec.default("threads") == 1
    assert p.default_families is None and p.mlflow_experiment == ""
    assert p.resources("train") == {"gpu": 1} and p.resources("data") == {}
    assert p.prepare_source("math") == "hub" and p.prepare_source("code") == ""
    with pytest.raises(ConfigError, match=r"resources.train.gpu: must be >= 0, got -1"):
        Preset({"resources": {"train": {"gpu": -1}}}).resources("train")
    with pytest.raises(ConfigError, match=r"resources.train.gpus: unknown key"):
        Preset({"resources": {"train": {"gpus": 1}}}).resources("train")


def test_the_mlflow_experiment(monkeypatch):
    monkeypatch.delenv("RSPO_MLFLOW_EXPERIMENT", raising=False)
    assert experiment_name(Preset({"preset": "a"})) == "rspo-a"
    assert experiment_name(Preset({"preset": "a"}), "mine") == "mine"
    assert experiment_name(Preset({"preset": "a", "mlflow": {"experiment": "study"}}), "mine") == "study"
    monkeypatch.setenv("RSPO_MLFLOW_EXPERIMENT", "shipped")
    assert experiment_name(Preset({"preset": "a", "mlflow": {"experiment": "study"}})) == "shipped"


def test_no_module_reads_a_preset_mapping_but_the_preset_object():
    """What a command needs of a preset it asks rspo.preset.Preset: no `preset.get(...)` or
    `preset[...]` (nor through `.data`) anywhere else in the package or the workflow's rules."""
    import re

    reads = re.compile(r"\bpreset(\.data)?(\.get\(|\[)")
    files = [*(ROOT / "rspo").rglob("*.py"), *(ROOT / "workflow").rglob("*.smk"), ROOT / "Snakefile"]
    found = [
        f"{f.relative_to(ROOT)}:{i}: {line.strip()}"
        for f in files
        if f.name != "preset.py" or f.parent.name != "rspo"
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if reads.search(line)
    ]
    assert not found, found
