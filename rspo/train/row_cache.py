"""Where the old-router cache of a step's rows lives.

The old-router cache (``RowCache``): the compact cache (rspo.router.OldRouterCache, 3 bytes per
token, layer and k) for the rows this rank reads, on the CPU (in host buffers pinned once next to a
GPU and reused every step: ``HostBuffers``); each
micro-batch's slice moves to the device when it is used. Under torchrun with one PPO epoch a rank
reads only the rows it updates, which are the rows its old pass computed, so it holds 1/world of
the step's rows and nothing is exchanged; with more epochs every rank needs every row, and the
cache is summed over the ranks one layer at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch

from rspo.phase_memory import host_allocation
from rspo.router import OldRouterCache


class HostBuffers:
    """Host buffers allocated once and reused by every step's old-router cache.

    Next to a GPU they are pinned (page-locked), so the cache's slices copy to the device without a
    staging copy. Pinning locks the pages (about 1.3 GB per rank and step at the paper's sizes), so
    the buffers are pinned once: the first request of a name reserves ``headroom`` times its size
    (the trainer passes the longest row the run can have over this step's), and a buffer is
    allocated again only when a request exceeds it. ``zeros(name, shape, dtype)`` returns a zeroed
    view of the buffer called ``name``."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.flat: dict[str, torch.Tensor] = {}
        self.allocations = 0  # how many buffers were allocated, hence pinned (tests read it)

    def zeros(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, headroom: float = 1.0) -> torch.Tensor:
        n = math.prod(shape)
        buf = self.flat.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype:
            with host_allocation():
                buf = torch.empty(max(n, int(n * headroom)), dtype=dtype, pin_memory=self.pin)
            self.flat[name] = buf
            self.allocations += 1
        view = buf[:n].view(shape)
        view.zero_()
        return view

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.flat.values())


@dataclass
class RowCache:
    """An OldRouterCache of some rows of the step batch, indexed by the batch's own row numbers.

    ``slot[row]`` is the cache row of batch row ``row`` (-1: not held here). ``cache[rows]``,
    ``cache[rows, cols]``, ``assign(rows, part)`` take batch rows, as OldRouterCache's own do."""

    cache: OldRouterCache
    slot: torch.Tensor

    @classmethod
    def zeros(
        cls,
        rows: torch.Tensor,
        batch_rows: int,
        width: int,
        num_layers: int,
        top_k: int,
        num_experts: int,
        *,
        keep_logits: bool,
        buffers: HostBuffers | None = None,
        max_width: int = 0,
    ) -> RowCache:
        """Zeros for ``rows`` of a step batch of ``batch_rows`` x ``width``; in ``buffers`` (reused,
        pinned next to a GPU; sized for rows of ``max_width`` the first time) when given, else new
        CPU tensors."""
        slot = torch.full((batch_rows,), -1, dtype=torch.long)
        slot[rows] = torch.arange(len(rows))
        cache = OldRouterCache.zeros(
            num_layers,
            (len(rows), width),
            top_k,
            num_experts,
            keep_logits=keep_logits,
            device="cpu",
            alloc=None if buffers is None else partial(buffers.zeros, headroom=max(1.0, max_width / width)),
        )
        return cls(cache, slot)

    def _slots(self, rows: torch.Tensor) -> torch.Tensor:
        s = self.slot[rows.cpu()]
        if bool((s < 0).any()):
            raise IndexError("the old-router cache does not hold these rows on this rank")
        return s

    def __getitem__(self, key) -> OldRouterCache:
        if isinstance(key, tuple):
            rows, cols = key
            return self.cache[self._slots(rows), cols]
        return self.cache[self._slots(key)]

    def assign(self, rows: torch.Tensor, part: OldRouterCache) -> None:
        self.cache.assign(self._slots(rows), part)

    @property
    def nbytes(self) -> int:
        return self.cache.nbytes

    @property
    def bytes_per_entry(self) -> float:
        return self.cache.bytes_per_entry

    def all_reduce(self, dist) -> None:
        """Sum over the ranks (each row was written by one rank, zeros elsewhere), a layer at a
        time, so a GPU collective moves one layer's slice, not the whole cache."""
        for t in (self.cache.indices, self.cache.logp, self.cache.logits):
            if t is not None:
                for layer in range(t.shape[0]):
                    dist.all_reduce_sum_(t[layer])
