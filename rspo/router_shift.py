"""The compact old-router cache and the router-shift ratio gamma computed against it (paper Sec.
"Measuring Router Drift via a Router-Shift Ratio"). With r = softmax over ALL E experts of a layer's
router logits and e_old[l, k] the K experts the OLD router selected for a token at MoE layer l:

    d[l]  = 1/K sum_k | log r_new[l](e_old[l,k]) - log r_old[l](e_old[l,k]) |    Eq. (5, drift_layer)
    Delta = 1/L sum_l d[l]           (L = number of MoE layers)                  Eq. (6, drift_token)
    gamma = exp(-Delta)  in (0, 1]                                               Eq. (7, router_shift_ratio)

Finding the routers, capturing their logits and controlling routing are rspo.router's.

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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

__all__ = ["OldRouterCache", "router_shift_ratio"]


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
        trainer passes reused pinned host buffers, rspo.train.row_cache.HostBuffers)."""
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
