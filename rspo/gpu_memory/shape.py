"""The shape of the model a preset's runs train, read from its config.json: what the memory plan's
formulas need (rspo.gpu_memory.plan). Parameter counts are exact (the model built on PyTorch's meta
device, nothing allocated); the config comes from the fetched hub folder, the copy this package
ships for the presets' hub models (rspo/model_configs/), or the preset's ``pretrain.model`` for a
model pretrained here.

Building a model on the meta device costs seconds (transformers' import and the model's init), and
every Snakemake start of a GPU preset plans its memory (every SLURM job re-reads the Snakefile), so
the shape of a config.json file is kept on disk (``shape_cache_dir``: ``$RSPO_CACHE_DIR``, else
``$XDG_CACHE_HOME/rspo`` or ``~/.cache/rspo``), keyed by the file's content, the model's name,
transformers' version and this module's source; a preset's own pretrained model is built each time
(its vocabulary comes from this package's tokenizer)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from rspo.preset import Preset

CONFIG_DIR = Path(__file__).resolve().parents[1] / "model_configs"


class PlanError(ValueError):
    """The plan cannot be made (unknown GPU, model config not found); the message says why."""


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    moe_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    top_k: int
    moe_inter: int
    shared_inter: int
    vocab: int
    qk_norm: bool
    params: int
    """Every parameter."""
    layer_params: int
    """The largest decoder layer's parameters."""
    root_params: int
    """Parameters outside the decoder layers (embeddings, final norm, LM head)."""
    ckpt_bytes: int
    """Bytes per parameter of the checkpoint's own dtype (what every rank reads at start)."""
    largest_param: int = 0
    """Elements of the largest parameter tensor (the optimizer steps one tensor at a time)."""

    def layer_activation_elems(self) -> int:
        """Elements autograd keeps per token for one MoE decoder layer (see the module docstring)."""
        H, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = 2 * H + 2 * (q + kv) + kv + q + 2 * self.heads  # norm in/out, q/k/v (rotated), output, lse
        if self.qk_norm:
            attn += q + kv  # q_norm / k_norm outputs
        router = 3 * self.experts + 6 * self.top_k  # logits, fp32 probabilities, chosen weights and indices
        experts = self.top_k * (3 * H + 4 * self.moe_inter)  # gathered input, gate/up, act, product, output
        shared = (2 * H + 4 * self.shared_inter) if self.shared_inter else 0
        return attn + 2 * H + router + experts + shared  # + the post-attention norm's input and output

    def kv_bytes_per_token(self, c: int, tp: int) -> int:
        """KV cache per token on one GPU of an engine over ``tp`` GPUs (KV heads split, or replicated
        when there are fewer heads than GPUs)."""
        return 2 * self.layers * max(1, math.ceil(self.kv_heads / tp)) * self.head_dim * c


def shape_from_config(name: str, config, ckpt_bytes: int) -> ModelShape:
    import warnings

    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")  # an empty shared expert
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    layers = model.model.layers
    layer_params = max(sum(p.numel() for p in layer.parameters()) for layer in layers)
    params = sum(p.numel() for p in model.parameters())
    in_layers = sum(p.numel() for layer in layers for p in layer.parameters())
    experts = getattr(config, "num_experts", None) or config.num_local_experts
    sparse = [i for i, layer in enumerate(layers) if getattr(getattr(layer, "mlp", None), "gate", None) is not None]
    return ModelShape(
        name=name,
        layers=len(layers),
        moe_layers=len(sparse),
        hidden=config.hidden_size,
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        experts=int(experts),
        top_k=int(config.num_experts_per_tok),
        moe_inter=int(getattr(config, "moe_intermediate_size", None) or config.intermediate_size),
        shared_inter=int(getattr(config, "shared_expert_intermediate_size", 0) or 0),
        vocab=config.vocab_size,
        qk_norm=config.model_type in ("qwen3_moe", "olmoe"),
        params=params,
        layer_params=layer_params,
        root_params=params - in_layers,
        ckpt_bytes=ckpt_bytes,
        largest_param=max(p.numel() for p in model.parameters()),
    )


def dtype_bytes(name: str | None) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}.get(str(name or "float32").replace("torch.", ""), 4)


def config_file(path: str, hub_dir: str) -> Path | None:
    """The config.json of a hub id (the fetched folder's, else the copy in rspo/model_configs) or of a
    local folder; None when there is none (a hub id not fetched, or a model pretrained here)."""
    from rspo.hub import is_hub_id, slug

    if path and is_hub_id(path):
        for f in (Path(hub_dir) / slug(path) / "config.json", CONFIG_DIR / f"{slug(path)}.json"):
            if f.is_file():
                return f
    elif path and Path(path, "config.json").is_file():
        return Path(path, "config.json")
    return None


def model_config(path: str, preset: Preset, task: str, hub_dir: str = "results/hub"):
    """(name, transformers config, checkpoint bytes per parameter) of the model a task's runs start
    from: a hub id (the fetched folder's config.json, else the copy in rspo/model_configs), a local
    folder, or the preset's pretrain.model for a model pretrained here."""
    from transformers import AutoConfig

    from rspo.hub import is_hub_id, slug

    f = config_file(path, hub_dir)
    if f is not None:
        data = json.loads(f.read_text())
        config = AutoConfig.for_model(**data) if is_hub_id(path) else AutoConfig.from_pretrained(path)
        return path, config, dtype_bytes(data.get("torch_dtype") or data.get("dtype"))
    if path and is_hub_id(path):
        raise PlanError(
            f"no config.json for {path}: fetch the model first (python -m rspo fetch-model --model {path} "
            f"--out {hub_dir}/{slug(path)}) or add its config.json to {CONFIG_DIR}"
        )
    # pretrained here: the preset's pretrain.model (math/code bases: with pretrain.text_model on top)
    from rspo.models import moe_config
    from rspo.tokenizer import build_tokenizer

    arch = preset.architecture(task)
    tok = build_tokenizer()
    config = moe_config(arch, len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    return f"pretrained here ({arch.arch})", config, 4


_SHAPES: dict[str, ModelShape] = {}


def shape_cache_dir() -> Path:
    base = os.environ.get("RSPO_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rspo"
    return Path(base) / "model_shapes"


def model_shape(path: str, preset: Preset, task: str, hub_dir: str = "results/hub") -> ModelShape:
    """The shape of the model a task's runs start from (see model_config; cached per config, and on
    disk per config.json file: see the module docstring)."""
    from importlib.metadata import version

    stored = None
    f = config_file(path, hub_dir)
    if f is not None:
        code = Path(__file__).read_text()  # this module's formulas: a change here is another shape
        digest = hashlib.sha256(json.dumps([path, f.read_text(), version("transformers"), code]).encode()).hexdigest()
        stored = shape_cache_dir() / f"{digest[:32]}.json"
        try:
            return ModelShape(**json.loads(stored.read_text()))
        except (OSError, ValueError, TypeError):
            pass  # not there yet, or unreadable: build it
    name, config, ckpt = model_config(path, preset, task, hub_dir)
    key = json.dumps([name, config.to_dict(), ckpt], sort_keys=True, default=str)
    if key not in _SHAPES:
        _SHAPES[key] = shape_from_config(name, config, ckpt)
    if stored is not None:
        try:  # written whole, then renamed: a concurrent reader sees the file complete or not at all
            stored.parent.mkdir(parents=True, exist_ok=True)
            tmp = stored.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(dataclasses.asdict(_SHAPES[key])))
            os.replace(tmp, stored)
        except OSError:
            pass  # a read-only home: the plan is made all the same
    return _SHAPES[key]
