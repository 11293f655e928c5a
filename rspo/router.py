"""Router machinery of RSPO: find the routers, capture their logits, cache the old router
compactly, compute the router-shift ratio gamma, and control routing (freeze / replay).

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

Compact old-router cache (``OldRouterCache``), laid out (L, B, T, K):
- indices: uint8 when E <= 256, int16 when E <= 32768 (int32 beyond): 1 byte per entry here;
- old log-probabilities log r_old(e_old) = log_softmax(logits, fp32) on those indices, stored in
  fp16 (default) or bf16: 2 bytes per entry.
That is 3 bytes per (token, layer, k). Example, the paper's Qwen3-30B-A3B setting (L=48, K=8,
E=128, ~1.05M tokens per step): 1.05e6 * 48 * 8 * 3 B ~= 1.13 GiB (the paper reports ~1.5 GiB
with 16-bit indices, i.e. 4 bytes per entry). The optional full old logits for logit replay,
(L, B, T, E) in fp32, cost 4*E bytes per (token, layer), i.e. 4*E/K more bytes per entry:
64 B per entry, ~24 GiB, in that same setting. Caches can live on the CPU; ``router_shift_ratio`` and
the replay hooks move the (small) slices they need to the logits' device.

Implementation details (not deviations from the paper's equations):
- Precision of the cached old log-probs. Storing them in fp16 while the new ones are fp32 would
  make gamma != 1 on-policy (fp16 rounding noise ~5e-4 relative). ``router_shift_ratio`` therefore
  rounds the NEW log-probs to the cache dtype with a straight-through estimator,
      lp_new_st = lp_new + (lp_new.to(dt).float() - lp_new).detach()
  (value = rounded, gradient = identity), so identical weights give gamma == 1 exactly and
  gradients still flow for the no-stop-gradient ablation. Off-policy, the remaining error is the
  cache dtype's rounding of each log-prob (|error| <= ulp, e.g. <= 2^-10 for |log r| in [1, 2)
  in fp16). Before the cast both sides are clamped to the dtype's finite range (fp16 >= -65504)
  so that a vanishing probability does not become -inf. The tests check it against the same
  formula in plain fp32 without any rounding (``tests/router_reference.py``).
- The paper stores the old top-K routing PROBABILITIES in FP16; we store their logarithms,
  which keep full relative precision for small probabilities (fp16 probabilities lose
  precision below ~6e-5 and underflow below ~6e-8).
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

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
# Compact old-router cache
# --------------------------------------------------------------------------------------------


def _index_dtype(num_experts: int) -> torch.dtype:
    if num_experts <= 256:
        return torch.uint8
    if num_experts <= 2**15:
        return torch.int16
    return torch.int32


_LOGP_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _round_to(x: Tensor, dtype: torch.dtype) -> Tensor:
    """x (fp32) clamped to dtype's finite range and cast to dtype."""
    return x.clamp_min(torch.finfo(dtype).min).to(dtype)


@dataclass(frozen=True, eq=False)
class OldRouterCache:
    """Old router state per (MoE layer, sequence, position), laid out (L, B, T, .).

    Memory: ``indices`` 1 byte (E <= 256) or 2 bytes (E <= 32768) and ``logp`` 2 bytes (fp16 /
    bf16) per (token, layer, k), i.e. 3 bytes per entry by default; the optional ``logits``
    (only for logit replay) add 4*E bytes per (token, layer), 4*E/K per entry. ``cache[rows]``
    (rows over B: index tensor, list, slice, int or bool mask; or ``cache[rows, cols]`` with
    cols over T) selects a mini-batch; ``.to(device)`` moves it.
    """

    indices: Tensor
    """(L, B, T, K) old top-K expert indices, uint8 / int16 / int32."""
    logp: Tensor
    """(L, B, T, K) log r_old(e_old) = log_softmax over all experts (fp32), stored fp16 / bf16."""
    num_experts: int
    """E, experts per MoE layer."""
    logits: Tensor | None = None
    """(L, B, T, E) fp32 old router logits, only when built with keep_logits=True."""

    def __post_init__(self) -> None:
        if self.indices.dim() != 4 or self.logp.shape != self.indices.shape:
            raise ValueError(
                f"indices and logp must both be (L, B, T, K); got {tuple(self.indices.shape)} "
                f"and {tuple(self.logp.shape)}"
            )
        if self.indices.dtype != _index_dtype(self.num_experts):
            raise ValueError(
                f"indices dtype {self.indices.dtype} != {_index_dtype(self.num_experts)} for {self.num_experts} experts"
            )
        if self.logp.dtype not in _LOGP_DTYPES:
            raise ValueError(f"logp dtype {self.logp.dtype} not in {_LOGP_DTYPES}")
        if self.logits is not None:
            if self.logits.shape != (*self.indices.shape[:3], self.num_experts):
                raise ValueError(
                    f"logits must be (L, B, T, E) = {(*self.indices.shape[:3], self.num_experts)}; "
                    f"got {tuple(self.logits.shape)}"
                )
            if self.logits.dtype != torch.float32:
                raise ValueError(f"logits must be float32, got {self.logits.dtype}")

    # ---- construction -----------------------------------------------------------------------

    @classmethod
    def from_logits(
        cls,
        logits_list: Sequence[Tensor],
        top_k: int,
        batch_shape: tuple[int, int],
        *,
        indices_list: Sequence[Tensor] | None = None,
        logp_dtype: torch.dtype = torch.float16,
        keep_logits: bool = False,
    ) -> OldRouterCache:
        """Build the cache from the old forward's router logits.

        logits_list: one (N = B*T, E) tensor per MoE layer (as captured), rows in (batch, time)
        order. indices_list: the (N, K) experts the old forward used (default: topk of the fp32
        softmax, as the routers compute it). logp_dtype: fp16 (default) or bf16 (fp32 allowed for
        checks). keep_logits: also keep the (L, B, T, E) fp32 logits, needed for logit replay.
        """
        if len(logits_list) == 0:
            raise ValueError("logits_list is empty: need one (B*T, E) tensor per MoE layer")
        if logp_dtype not in _LOGP_DTYPES:
            raise ValueError(f"logp_dtype must be one of {_LOGP_DTYPES}, got {logp_dtype}")
        B, T = (int(s) for s in batch_shape)
        num_experts = int(logits_list[0].shape[-1])
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k={top_k} must be in [1, num_experts={num_experts}]")
        if indices_list is not None and len(indices_list) != len(logits_list):
            raise ValueError(f"indices_list has {len(indices_list)} layers, logits_list {len(logits_list)}")
        idx_dtype = _index_dtype(num_experts)
        idx_out, logp_out, logits_out = [], [], []
        with torch.no_grad():
            for l, lg in enumerate(logits_list):
                if lg.dim() != 2 or lg.shape != (B * T, num_experts):
                    raise ValueError(
                        f"layer {l}: router logits must be (B*T, E) = {(B * T, num_experts)}; got {tuple(lg.shape)}"
                    )
                lg32 = lg.detach().float()  # (N, E)
                if indices_list is None:
                    idx = torch.topk(F.softmax(lg32, dim=-1), top_k, dim=-1).indices  # (N, K)
                else:
                    idx = indices_list[l].detach().to(lg.device, torch.long)
                    if idx.shape != (B * T, top_k):
                        raise ValueError(
                            f"layer {l}: indices must be (B*T, K) = {(B * T, top_k)}; got {tuple(idx.shape)}"
                        )
                logp = F.log_softmax(lg32, dim=-1).gather(-1, idx)  # (N, K) fp32, over ALL experts
                idx_out.append(idx.to(idx_dtype).view(B, T, top_k))
                logp_out.append(_round_to(logp, logp_dtype).view(B, T, top_k))
                if keep_logits:
                    logits_out.append(lg32.view(B, T, num_experts))
        return cls(
            indices=torch.stack(idx_out),  # (L, B, T, K)
            logp=torch.stack(logp_out),  # (L, B, T, K)
            num_experts=num_experts,
            logits=torch.stack(logits_out) if keep_logits else None,  # (L, B, T, E)
        )

    @classmethod
    def cat(cls, caches: Sequence[OldRouterCache]) -> OldRouterCache:
        """Concatenate caches of consecutive micro-batches along B (same L, T, K, E, dtypes)."""
        if not caches:
            raise ValueError("no caches to concatenate")
        first = caches[0]
        for c in caches[1:]:
            if (c.num_layers, c.batch_shape[1], c.top_k, c.num_experts, c.logp.dtype, c.logits is None) != (
                first.num_layers,
                first.batch_shape[1],
                first.top_k,
                first.num_experts,
                first.logp.dtype,
                first.logits is None,
            ):
                raise ValueError(
                    "caches differ in layers, T, K, experts, dtype or kept logits; "
                    "pad the micro-batches to a common length first"
                )
        return cls(
            indices=torch.cat([c.indices for c in caches], dim=1),
            logp=torch.cat([c.logp for c in caches], dim=1),
            num_experts=first.num_experts,
            logits=None if first.logits is None else torch.cat([c.logits for c in caches], dim=1),
        )

    # ---- shape and memory -------------------------------------------------------------------

    @property
    def num_layers(self) -> int:
        return int(self.indices.shape[0])

    @property
    def batch_shape(self) -> tuple[int, int]:
        """(B, T)."""
        return int(self.indices.shape[1]), int(self.indices.shape[2])

    @property
    def top_k(self) -> int:
        return int(self.indices.shape[3])

    @property
    def device(self) -> torch.device:
        return self.indices.device

    @property
    def nbytes(self) -> int:
        """Bytes held by the cache's tensors (logits included when kept)."""
        n = self.indices.numel() * self.indices.element_size() + self.logp.numel() * self.logp.element_size()
        if self.logits is not None:
            n += self.logits.numel() * self.logits.element_size()
        return n

    @property
    def bytes_per_entry(self) -> float:
        """nbytes per (token, layer, k): 3.0 for uint8 indices + fp16 log-probs without logits."""
        return self.nbytes / max(1, self.indices.numel())

    # ---- selection and movement -------------------------------------------------------------

    def __getitem__(self, key: Any) -> OldRouterCache:
        if isinstance(key, tuple) and len(key) != 2:
            raise ValueError(f"cache[rows] or cache[rows, cols] expected, got {len(key)} indices")
        rows, cols = key if isinstance(key, tuple) else (key, slice(None))

        def norm(k: Any) -> Any:
            if isinstance(k, int):
                return slice(k, k + 1 if k != -1 else None)  # keep the dimension
            if isinstance(k, slice):
                return k
            k = torch.as_tensor(k)
            return k.to(self.device)

        rows, cols = norm(rows), norm(cols)

        def sel(t: Tensor | None) -> Tensor | None:
            if t is None:
                return None
            return t[:, rows][:, :, cols]

        return OldRouterCache(
            indices=sel(self.indices), logp=sel(self.logp), num_experts=self.num_experts, logits=sel(self.logits)
        )

    @classmethod
    def zeros(
        cls,
        num_layers: int,
        batch_shape: tuple[int, int],
        top_k: int,
        num_experts: int,
        *,
        logp_dtype: torch.dtype = torch.float16,
        keep_logits: bool = False,
        device: torch.device | str = "cpu",
        alloc=None,
    ) -> OldRouterCache:
        """An all-zero cache of the given shape, filled row by row with ``assign``. ``alloc(name,
        shape, dtype)``: where the zeroed tensors come from (default: new ones on ``device``; the
        trainer passes reused pinned host buffers, rspo.train.memory.HostBuffers)."""
        B, T = batch_shape
        shape = (num_layers, B, T, top_k)
        if alloc is None:

            def alloc(_name, size, dtype):
                return torch.zeros(size, dtype=dtype, device=device)

        return cls(
            indices=alloc("indices", shape, _index_dtype(num_experts)),
            logp=alloc("logp", shape, logp_dtype),
            num_experts=num_experts,
            logits=alloc("logits", (num_layers, B, T, num_experts), torch.float32) if keep_logits else None,
        )

    def assign(self, rows: Tensor, part: OldRouterCache) -> None:
        """Write ``part`` (the cache of ``rows``, same T) into these rows, in place."""
        if part.batch_shape != (len(rows), self.batch_shape[1]) or (part.logits is None) != (self.logits is None):
            raise ValueError(
                f"cannot assign a cache of shape {part.batch_shape} to {len(rows)} rows of width {self.batch_shape[1]}"
            )
        rows = rows.to(self.device)
        self.indices[:, rows] = part.indices.to(self.device)
        self.logp[:, rows] = part.logp.to(self.device)
        if self.logits is not None:
            self.logits[:, rows] = part.logits.to(self.device)

    def pad_columns(self, start: int, width: int) -> OldRouterCache:
        """The cache placed at columns [start, start + T) of a zero cache T' = ``width`` wide, for
        micro-batches forwarded on a trimmed column window of the batch layout."""
        L, (B, T) = self.num_layers, self.batch_shape
        if start < 0 or start + T > width:
            raise ValueError(f"columns [{start}, {start + T}) do not fit in width {width}")

        def pad(t: Tensor | None) -> Tensor | None:
            if t is None:
                return None
            out = t.new_zeros((L, B, width, t.shape[-1]))
            out[:, :, start : start + T] = t
            return out

        return OldRouterCache(
            indices=pad(self.indices), logp=pad(self.logp), num_experts=self.num_experts, logits=pad(self.logits)
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> OldRouterCache:
        """The cache on ``device`` (dtypes unchanged)."""
        return OldRouterCache(
            indices=self.indices.to(device, non_blocking=non_blocking),
            logp=self.logp.to(device, non_blocking=non_blocking),
            num_experts=self.num_experts,
            logits=None if self.logits is None else self.logits.to(device, non_blocking=non_blocking),
        )


# --------------------------------------------------------------------------------------------
# Router-shift ratio
# --------------------------------------------------------------------------------------------


def router_shift_ratio(
    cache: OldRouterCache, new_router_logits: Sequence[Tensor], *, straight_through: bool = True
) -> Tensor:
    """gamma (B, T) of Eq. (7, router_shift_ratio) from the compact cache and the new router logits.

    cache: the OldRouterCache rows of this batch, (L, B, T, K). new_router_logits: one
    (B*T, E) or (B, T, E) tensor per MoE layer (e.g. ``capture.logits`` of the update forward).
    The result is differentiable w.r.t. the new logits (detach it, or take the floor-and-stop-
    gradient in the loss, for RSPO proper). With ``straight_through`` (default) the new log-probs
    are rounded to the cache's dtype in value only, so identical weights give gamma == 1 exactly.
    """
    L, (B, T), K, E = cache.num_layers, cache.batch_shape, cache.top_k, cache.num_experts
    if len(new_router_logits) != L:
        raise ValueError(f"got router logits of {len(new_router_logits)} layers, the cache has {L} MoE layers")
    dt = cache.logp.dtype
    delta_sum = None
    for l, lg in enumerate(new_router_logits):
        if lg.shape not in ((B * T, E), (B, T, E)):
            raise ValueError(
                f"layer {l}: new router logits must be (B*T, E) or (B, T, E) with "
                f"B={B}, T={T}, E={E}; got {tuple(lg.shape)}"
            )
        lg = lg.reshape(B * T, E).float()  # (N, E)
        idx = cache.indices[l].reshape(B * T, K).to(lg.device, torch.long)  # (N, K) e_old[l, k]
        old = cache.logp[l].reshape(B * T, K).to(lg.device).float()  # (N, K) log r_old(e_old)
        new = F.log_softmax(lg, dim=-1).gather(-1, idx)  # (N, K) log r_new(e_old), softmax over ALL
        if straight_through and dt != torch.float32:
            # value rounded to the cache dtype, gradient = identity (see module docstring)
            new = new + (_round_to(new, dt).float() - new).detach()
        d = (new - old).abs().mean(dim=-1)  # (N,)  Eq. (5, drift_layer)
        delta_sum = d if delta_sum is None else delta_sum + d
    delta = delta_sum / L  # (N,)  Eq. (6, drift_token)
    return torch.exp(-delta).view(B, T)  # (B, T)  Eq. (7, router_shift_ratio)


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
