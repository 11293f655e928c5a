"""rspo.pretrain_config: the pretraining and architecture settings typed once; `rspo pretrain --set`
overrides land in them and a bad one is refused naming its key; the transformers config is built from
the typed architecture."""

from pathlib import Path

import pytest
import yaml

from rspo.config import ConfigError
from rspo.preset import Preset
from rspo.pretrain import pretrain_settings
from rspo.pretrain_config import ArchConfig, PretrainConfig, build_arch

ROOT = Path(__file__).resolve().parents[1]


def test_overrides_land_in_the_typed_section_and_the_rest_keeps_its_defaults():
    preset = Preset(yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text()))
    p = pretrain_settings(preset, ["examples=640", "model.num_experts=2", "text_model.max_position_embeddings=512"])
    assert isinstance(p, PretrainConfig) and p.examples == 640 and p.model.num_experts == 2
    assert p.architecture("countdown").max_position_embeddings != 512
    assert p.architecture("math").max_position_embeddings == 512 and p.architecture("math").num_experts == 2
    assert p.vocab_size == PretrainConfig().vocab_size  # smoke sets none: the field's default
    assert pretrain_settings(Preset({}), []) == PretrainConfig()


@pytest.mark.parametrize(
    "override,message",
    [
        ("bogus=1", r"pretrain.bogus: unknown key; valid keys are \['batch_size'"),
        ("model.experts=4", r"pretrain.model.experts: unknown key"),
        ("format.x=1", r"pretrain.format: expected a string, got dict"),
        ("examples=0", r"pretrain.examples: must be >= 1, got 0"),
        ("lr=0", r"pretrain.lr: must be > 0, got 0"),
        ("examples=1.5", r"pretrain.examples: expected an integer"),
        ("solution=some", r"pretrain.solution: unknown solution 'some'; choose one of \['first', 'any'\]"),
        ("model.top_k=9", r"pretrain.model.top_k: larger than num_experts \(9 > 8\)"),
        ("text_model.norm_topk_prob=true", r"pretrain.text_model.norm_topk_prob: with top-1 routing"),
        ("model.arch=mixtral", r"pretrain.model.arch: unknown architecture 'mixtral'"),
    ],
)
def test_a_bad_override_names_its_key(override, message):
    with pytest.raises(ConfigError, match=message):
        pretrain_settings(Preset({}), [override])


def test_a_solution_drawn_among_many_needs_the_steps_format():
    with pytest.raises(ConfigError, match="pretrain.solution: `any` needs format `steps`"):
        pretrain_settings(Preset({}), ["solution=any", "format=optimal_path"])
    assert pretrain_settings(Preset({}), ["solution=any"]).solution == "any"


def test_the_transformers_config_follows_the_typed_architecture():
    pytest.importorskip("transformers")
    from rspo.models import moe_config

    base = moe_config(ArchConfig(), 100, 1, 2, 0)
    assert (base.hidden_size, base.num_hidden_layers, base.num_experts, base.num_experts_per_tok) == (128, 4, 8, 1)
    assert base.num_key_value_heads == base.num_attention_heads == 4  # unset: no grouping
    assert base.shared_expert_intermediate_size == 0 and type(base).__name__ == "Qwen2MoeConfig"
    q3 = moe_config(
        {"arch": "qwen3_moe", "num_kv_heads": 2, "head_dim": 16, "top_k": 2, "norm_topk_prob": True}, 100, 1, 2, 0
    )
    assert type(q3).__name__ == "Qwen3MoeConfig" and (q3.num_key_value_heads, q3.head_dim) == (2, 16)
    assert (
        moe_config(build_arch({"num_layers": 2}), 100, 1, 2, 0).to_dict()
        == moe_config({"num_layers": 2}, 100, 1, 2, 0).to_dict()
    )
    with pytest.raises(ConfigError, match="pretrain.model.num_layers: must be >= 1, got 0"):
        moe_config({"num_layers": 0}, 100, 1, 2, 0)
