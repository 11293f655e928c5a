"""Router machinery of RSPO: find the routers, capture their logits, cache the old router
compactly, compute the router-shift ratio gamma (these two: rspo.router_shift, re-exported here),
and control routing (freeze / replay).

Paper: "Towards Stable and Effective Reinforcement Learning for Mixture-of-Experts", Sec.
"Measuring Router Drift via a Router-Shift Ratio" and Appendix "Alternative router
stabilization strategies". With r = softmax over ALL E experts of a layer's router logits and
e_old[l, k] the K experts the OLD router selected for a token at MoE layer l:

    d[l]  = 1/K sum_k | log r_new[l](e_old[l,k]) - log r_old[l](e_old[l,k]) |    Eq. (5, drift_layer)
    Delta = 1/L sum_l d[l]           (L = number of MoE layers)                  Eq. (6, drift_token)
    gamma = exp(-Delta)  in (0, 1]                                               Eq. (7, router_shift_ratio)

Supported models (transformers 5.23): causal LMs whose decoder blocks carry a router at
``model.model.layers[i].mlp.gate``, namely Qwen2MoeForCausalLM, Qwen3MoeForCausalLM,
MixtralForCausalLM and OlmoeForCausalLM. Their gates are ``*TopKRouter`` modules with one
parameter ``weight`` (E, H) returning ``(router_logits, router_scores, router_indices)``:

    logits  = F.linear(h.reshape(-1, H), weight)                  # (N, E), N = B*T, model dtype
    probs   = softmax(logits, fp32)                               # (N, E)
    scores, indices = topk(probs, K)                              # (N, K)
    scores /= scores.sum(-1)         Qwen2/Qwen3/OLMoE: only if config.norm_topk_prob; Mixtral: always
    scores  = scores.to(logits.dtype)   Qwen2/Qwen3/OLMoE only; Mixtral keeps fp32 scores

Qwen2-MoE and Qwen3-MoE may have dense layers (``mlp_only_layers``, ``decoder_sparse_step``);
those have no router and are skipped (L counts MoE layers only). Any other model raises a
ValueError naming its class and listing the supported ones.

Control point: a forward hook on ``mlp.gate`` registered with ``prepend=True`` that returns a
replacement ``(logits, scores, indices)`` tuple. The MoE block consumes the replacement, and
transformers' ``output_router_logits`` recorder (a later, non-prepended hook on the same
module) reports the logits actually used. All hooks live in context managers that remove their
handles on exit, also when the body raises.

Routing modes (``RoutingMode``), applied around the UPDATE forward only:
- none: nothing.
- freeze: every router parameter (``mlp.gate.weight``) gets requires_grad False, restored on exit.
  Only the router that picks experts is frozen: Qwen2-MoE's ``shared_expert_gate`` (a sigmoid
  scalar gate on the always-on shared expert, not a router) stays trainable. Optimizers skip
  parameters whose ``.grad`` is None, so keep ``zero_grad(set_to_none=True)`` (the default).
- logit_replay: the router output is replaced by the cached OLD logits (fp32 cache, cast to the
  model's logits dtype, exact for fp32/bf16/fp16 models) and scores/indices are recomputed from
  them exactly as the architecture does, so selection and weights follow the old router and
  the router gets no gradient.
- index_replay (verl's R2, GSPO's routing replay): the old top-K indices are forced; the scores
  are the CURRENT router's probabilities (softmax over all experts, fp32) gathered on them, then
  renormalised and cast exactly as the architecture does (renormalise only if norm_topk_prob;
  Mixtral always), so the router keeps its gradient.
The cache passed to ``routing_control`` must describe exactly the batch being forwarded
(``cache[rows]``); a token-count mismatch raises. With gradient checkpointing, call
``backward()`` inside the ``routing_control`` block: the recomputed forward then sees the same
(stateless) replay hooks.

The compact old-router cache (``OldRouterCache``, 3 bytes per token, layer and k) and the
router-shift ratio computed against it (``router_shift_ratio``, Eqs. 5-7) are in rspo.router_shift,
re-exported here.

Implementation details (not deviations from the paper's equations):
- The old top-K experts are the ones the old forward actually used (the trainer's old pass reads
  the gate's own ``router_indices`` through ``capture_router_logits``); ``OldRouterCache.from_logits`` without indices
  recomputes them as the routers do (topk of the fp32 softmax), which gives the same experts.
- ``capture_router_logits`` concatenates the calls of several forwards per layer along N.
  Gradient checkpointing (non-reentrant, transformers' default) recomputes each layer in the
  backward pass and requires the recomputation to save exactly the tensors the forward saved.
  The raw capture runs its own ``F.linear`` inside the layer, so its hooks must stay in place
  through ``backward()`` (as ``routing_control``'s do): call ``RouterCapture.stop()`` after the
  forward, then backward inside the block. The hooks then still compute (the recomputation
  saves what the forward saved, and the captured logits keep their gradient through the
  recomputed graph) but record nothing, so the recomputed forward is not recorded a second time.
  Reentrant checkpointing is not supported: it would cut the captured logits off the graph.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from rspo.router_shift import OldRouterCache, router_shift_ratio

Tensor = torch.Tensor

__all__ = [
    "SUPPORTED_MODELS",
    "RouterSpec",
    "moe_gates",
    "router_spec",
    "RouterCapture",
    "capture_router_logits",
    "OldRouterCache",
    "router_shift_ratio",
    "RoutingMode",
    "routing_control",
    "route_from_logits",
]


# --------------------------------------------------------------------------------------------
# Supported architectures
# --------------------------------------------------------------------------------------------


class _RouterKind(NamedTuple):
    """How one architecture's ``*TopKRouter.forward`` turns logits into (scores, indices)."""

    arch: str  # short name, as in tests/tiny_moe.py
    causal_lm: str  # the causal-LM class users load
    module: str  # transformers module defining the router class
    router_cls: str  # the router class at model.model.layers[i].mlp.gate
    always_renorm: bool  # Mixtral renormalises the top-K probabilities regardless of config
    scores_in_logits_dtype: bool  # Qwen2/Qwen3/OLMoE cast the scores back to the logits dtype


_KINDS: tuple[_RouterKind, ...] = (
    _RouterKind(
        "qwen2_moe",
        "Qwen2MoeForCausalLM",
        "transformers.models.qwen2_moe.modeling_qwen2_moe",
        "Qwen2MoeTopKRouter",
        always_renorm=False,
        scores_in_logits_dtype=True,
    ),
    _RouterKind(
        "qwen3_moe",
        "Qwen3MoeForCausalLM",
        "transformers.models.qwen3_moe.modeling_qwen3_moe",
        "Qwen3MoeTopKRouter",
        always_renorm=False,
        scores_in_logits_dtype=True,
    ),
    _RouterKind(
        "mixtral",
        "MixtralForCausalLM",
        "transformers.models.mixtral.modeling_mixtral",
        "MixtralTopKRouter",
        always_renorm=True,
        scores_in_logits_dtype=False,
    ),
    _RouterKind(
        "olmoe",
        "OlmoeForCausalLM",
        "transformers.models.olmoe.modeling_olmoe",
        "OlmoeTopKRouter",
        always_renorm=False,
        scores_in_logits_dtype=True,
    ),
)

SUPPORTED_MODELS: tuple[str, ...] = tuple(k.causal_lm for k in _KINDS)


def _router_classes() -> list[tuple[type, _RouterKind]]:
    out = []
    for kind in _KINDS:
        cls = getattr(importlib.import_module(kind.module), kind.router_cls)
        out.append((cls, kind))
    return out


def _kind_of(module: Any) -> _RouterKind | None:
    for cls, kind in _router_classes():
        # exact class: a subclass could override forward() with different routing
        if type(module) is cls:
            return kind
    return None


def _unsupported(model: Any, why: str) -> ValueError:
    return ValueError(
        f"{type(model).__name__} is not a supported MoE causal LM ({why}); supported: "
        f"{', '.join(SUPPORTED_MODELS)} (routers at model.model.layers[i].mlp.gate)"
    )


def _gates_with_kinds(model: Any) -> list[tuple[int, nn.Module, _RouterKind]]:
    """[(decoder layer index, gate module, kind)] for the MoE layers, in layer order."""
    root = model
    # unwrap torch.compile (`_orig_mod`) and DDP-style wrappers (`module`)
    for _ in range(4):
        if hasattr(root, "model"):
            break
        inner = getattr(root, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            inner = getattr(root, "module", None)
        if not isinstance(inner, nn.Module):
            break
        root = inner
    if not isinstance(root, nn.Module):
        raise _unsupported(model, "not an nn.Module")
    layers = getattr(getattr(root, "model", None), "layers", None)
    if not isinstance(layers, (nn.ModuleList, list, tuple)):
        raise _unsupported(model, "no decoder layers at model.model.layers")
    found: list[tuple[int, nn.Module, _RouterKind]] = []
    for i, layer in enumerate(layers):
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if gate is None:
            continue  # dense layer (e.g. Qwen2/3-MoE mlp_only_layers) or not an MoE block
        kind = _kind_of(gate)
        if kind is None:
            raise _unsupported(model, f"layer {i} has a router of unsupported class {type(gate).__name__}")
        found.append((i, gate, kind))
    if not found:
        raise _unsupported(model, "no router found at model.model.layers[i].mlp.gate")
    if len({k.arch for _, _, k in found}) != 1:
        raise _unsupported(model, "routers of several architectures in one model")
    return found


def moe_gates(model: nn.Module) -> list[nn.Module]:
    """The router modules (``model.model.layers[i].mlp.gate``) of the MoE layers, in layer order.

    Raises ValueError naming the model class and listing the supported ones when the model has
    no supported router.
    """
    return [g for _, g, _ in _gates_with_kinds(model)]


@dataclass(frozen=True)
class RouterSpec:
    """Routing facts of a supported MoE model."""

    arch: str
    """Architecture short name: qwen2_moe, qwen3_moe, mixtral or olmoe."""
    num_experts: int
    """E, routed experts per MoE layer."""
    top_k: int
    """K, experts selected per token and layer."""
    norm_topk_prob: bool
    """Whether the top-K probabilities are renormalised to sum 1 (always True for Mixtral)."""
    moe_layers: tuple[int, ...]
    """Decoder-layer indices that are MoE layers (have a router), in order."""

    @property
    def num_moe_layers(self) -> int:
        """L, the number of MoE layers."""
        return len(self.moe_layers)


def router_spec(model: nn.Module) -> RouterSpec:
    """num_experts, top_k, norm_topk_prob and the MoE layer indices of ``model``."""
    found = _gates_with_kinds(model)
    _, gate, kind = found[0]
    specs = {(int(g.num_experts), int(g.top_k), kind.always_renorm or bool(g.norm_topk_prob)) for _, g, _ in found}
    if len(specs) != 1:
        raise ValueError(f"{type(model).__name__}: routers differ across layers: {sorted(specs)}")
    num_experts, top_k, renorm = specs.pop()
    return RouterSpec(
        arch=kind.arch,
        num_experts=num_experts,
        top_k=top_k,
        norm_topk_prob=renorm,
        moe_layers=tuple(i for i, _, _ in found),
    )


def _renorm(gate: nn.Module, kind: _RouterKind) -> bool:
    return kind.always_renorm or bool(gate.norm_topk_prob)


def route_from_logits(
    logits: Tensor,
    top_k: int,
    *,
    renorm: bool,
    scores_in_logits_dtype: bool = True,
    indices: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(logits, scores, indices) exactly as the supported ``*TopKRouter.forward`` computes them.

    logits (N, E). With ``indices`` (N, K) given, the experts are forced and the scores are the
    probabilities gathered on them (index replay); otherwise indices = topk(probs, top_k).
    """
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)  # (N, E) fp32, over ALL experts
    if indices is None:
        top_value, indices = torch.topk(probs, top_k, dim=-1)  # (N, K)
    else:
        indices = indices.to(device=logits.device, dtype=torch.long)
        top_value = probs.gather(-1, indices)  # (N, K)
    if renorm:
        top_value = top_value / top_value.sum(dim=-1, keepdim=True)
    if scores_in_logits_dtype:
        top_value = top_value.to(logits.dtype)
    return logits, top_value, indices


# --------------------------------------------------------------------------------------------
# Capture
# --------------------------------------------------------------------------------------------


@dataclass
class RouterCapture:
    """Router outputs recorded by ``capture_router_logits``, one entry per MoE layer in order."""

    num_layers: int
    _logits: list[list[Tensor]] = field(default_factory=list, repr=False)
    _indices: list[list[Tensor]] = field(default_factory=list, repr=False)
    recording: bool = True
    """False after ``stop()``: the hooks still run (and compute) but record nothing."""

    def __post_init__(self) -> None:
        self.clear()

    def stop(self) -> None:
        """Stop recording; the hooks stay until the block exits, so a gradient-checkpointing
        recomputation in ``backward()`` runs the same ops as the recorded forward."""
        self.recording = False

    def clear(self) -> None:
        """Forget everything recorded so far."""
        self._logits = [[] for _ in range(self.num_layers)]
        self._indices = [[] for _ in range(self.num_layers)]

    @staticmethod
    def _joined(per_layer: list[list[Tensor]]) -> list[Tensor]:
        if any(len(calls) == 0 for calls in per_layer):
            raise RuntimeError(
                "no forward pass was recorded for some MoE layer; run the model inside the capture_router_logits block"
            )
        return [calls[0] if len(calls) == 1 else torch.cat(calls, dim=0) for calls in per_layer]

    @property
    def num_calls(self) -> int:
        """Number of recorded forwards (calls of the first MoE layer's router)."""
        return len(self._logits[0]) if self._logits else 0

    @property
    def logits(self) -> list[Tensor]:
        """Router logits per MoE layer, (N, E) with N = B*T rows in (batch, time) order; several
        forwards are concatenated along N. They keep their autograd graph unless detached."""
        return self._joined(self._logits)

    @property
    def indices(self) -> list[Tensor]:
        """Top-K expert indices the MoE blocks used, per MoE layer, (N, K) int64."""
        return self._joined(self._indices)

    @property
    def logits_per_call(self) -> list[list[Tensor]]:
        """Per MoE layer, the logits of each recorded forward separately, in call order."""
        return [list(calls) for calls in self._logits]

    @property
    def indices_per_call(self) -> list[list[Tensor]]:
        """Per MoE layer, the expert indices of each recorded forward separately, in call order."""
        return [list(calls) for calls in self._indices]


@contextlib.contextmanager
def capture_router_logits(model: nn.Module, *, detach: bool = False, raw: bool = False) -> Iterator[RouterCapture]:
    """Record the router logits of every forward run inside the block.

    Yields a ``RouterCapture``; ``.logits[l]`` is the (B*T, E) raw (pre-softmax) logit tensor of
    MoE layer l, in layer order, with its graph (so gamma can be differentiated) unless
    ``detach``. By default the logits are those the MoE block used (after any routing_control
    replacement, e.g. the old logits under logit replay). ``raw=True`` records the router's own
    computation instead, F.linear(h, gate.weight) recomputed from the gate's input (identical to
    the gate's output, one extra (N, H) x (H, E) matmul per layer), whatever hooks do to the output.
    Hook handles are removed on exit, also on exceptions.
    """
    found = _gates_with_kinds(model)
    cap = RouterCapture(num_layers=len(found))
    handles = []
    try:
        for pos, (_, gate, _) in enumerate(found):
            if raw:

                def pre_hook(module, args, _pos=pos):
                    h = args[0]
                    # computed even when not recording: a checkpoint recomputation must save the same tensors
                    logits = F.linear(h.reshape(-1, module.weight.shape[1]), module.weight)
                    if cap.recording:
                        cap._logits[_pos].append(logits.detach() if detach else logits)

                def idx_hook(module, args, output, _pos=pos):
                    if cap.recording:
                        cap._indices[_pos].append(output[2])

                handles.append(gate.register_forward_pre_hook(pre_hook))
                handles.append(gate.register_forward_hook(idx_hook))
            else:

                def hook(module, args, output, _pos=pos):
                    if cap.recording:
                        cap._logits[_pos].append(output[0].detach() if detach else output[0])
                        cap._indices[_pos].append(output[2])

                handles.append(gate.register_forward_hook(hook))
        yield cap
    finally:
        for h in handles:
            h.remove()


# --------------------------------------------------------------------------------------------
# Routing control: none / freeze / logit replay / index replay
# --------------------------------------------------------------------------------------------


class RoutingMode(str, Enum):  # noqa: UP042 (a StrEnum would change str() and format() of the members)
    """How routing is constrained in the update forward (paper appendix, alternatives to RS)."""

    NONE = "none"
    FREEZE = "freeze"
    LOGIT_REPLAY = "logit_replay"
    INDEX_REPLAY = "index_replay"
    ROLLOUT_REPLAY = "rollout_replay"
    """R3 (beyond the paper): index replay of the experts the rollout ENGINE used, in the old pass and
    the updates (the trainer feeds the engine's routing as the cache; the hook is index replay's)."""


def routing_agreement(engine: Tensor, trainer: Tensor, valid: Tensor) -> tuple[int, int]:
    """(agreeing, compared) (position, MoE layer) pairs whose top-K expert SETS are equal in two
    routings of the same rows: ``engine`` and ``trainer`` (L, B, T, K), ``valid`` (B, T) positions to
    compare (forwarded by both)."""
    same = (engine.long().sort(dim=-1).values == trainer.long().sort(dim=-1).values).all(dim=-1)  # (L, B, T)
    valid = valid.bool().to(same.device).expand_as(same)
    return int((same & valid).sum()), int(valid.sum())


@contextlib.contextmanager
def routing_control(model: nn.Module, mode: RoutingMode | str, cache: OldRouterCache | None = None) -> Iterator[None]:
    """Apply a routing mode to the forwards (and gradient-checkpoint recomputations) in the block.

    ``cache`` (replay modes only) must hold exactly the rows of the batch forwarded, i.e.
    ``cache[rows]``; logit replay needs a cache built with ``keep_logits=True``. Hooks and
    requires_grad flags are restored on exit, also on exceptions.
    """
    try:
        mode = RoutingMode(mode)
    except ValueError:
        raise ValueError(f"unknown routing mode {mode!r}; expected one of {[m.value for m in RoutingMode]}") from None
    found = _gates_with_kinds(model)
    if mode is RoutingMode.NONE:
        yield
        return
    if mode is RoutingMode.FREEZE:
        saved = [(p, p.requires_grad) for _, gate, _ in found for p in gate.parameters()]
        try:
            for p, _ in saved:
                p.requires_grad_(False)
            yield
        finally:
            for p, flag in saved:
                p.requires_grad_(flag)
        return

    # replay modes
    if cache is None:
        raise ValueError(f"routing mode {mode.value} needs the OldRouterCache rows of this batch")
    if cache.num_layers != len(found):
        raise ValueError(f"cache has {cache.num_layers} MoE layers, the model {len(found)}")
    if mode is RoutingMode.LOGIT_REPLAY and cache.logits is None:
        raise ValueError("logit replay needs the old logits: build the cache with keep_logits=True")
    B, T = cache.batch_shape
    handles = []

    def make_hook(pos: int, gate: nn.Module, kind: _RouterKind):
        renorm = _renorm(gate, kind)
        top_k = int(gate.top_k)

        def hook(module, args, output):
            logits = output[0]  # (N, E) the current router's logits
            if logits.shape[0] != B * T:
                raise ValueError(
                    f"{mode.value}: the forward routes {logits.shape[0]} tokens but the "
                    f"cache holds B*T = {B}*{T}; pass cache[rows] of exactly this batch"
                )
            if mode is RoutingMode.LOGIT_REPLAY:
                old = cache.logits[pos].reshape(B * T, -1).to(logits.device, logits.dtype)  # (N, E)
                return route_from_logits(old, top_k, renorm=renorm, scores_in_logits_dtype=kind.scores_in_logits_dtype)
            idx = cache.indices[pos].reshape(B * T, -1)  # (N, K) old experts
            return route_from_logits(
                logits, top_k, renorm=renorm, scores_in_logits_dtype=kind.scores_in_logits_dtype, indices=idx
            )

        return hook

    try:
        for pos, (_, gate, kind) in enumerate(found):
            handles.append(gate.register_forward_hook(make_hook(pos, gate, kind), prepend=True))
        yield
    finally:
        for h in handles:
            h.remove()
