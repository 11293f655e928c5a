"""Seeds and counter-based random numbers: every random draw of a run is a pure function of
(seed, step, index, ...), so a resumed or data-parallel run draws what a single uninterrupted
process draws.

- ``derive_seed(*parts)``: a 31-bit seed from integers (FNV-1a style), used for the trainer's
  per-step prompt sampling, mini-batch order and rollout seeds.
- ``row_seed(seed, row)``: the seed of one response row's sampling stream.
- ``uniform_noise(row_seeds, position, width)``: uniforms in (0, 1) keyed by (row seed,
  position, column), computed with integer tensor ops (a 32-bit mixing hash), so sampling needs
  no ``torch.Generator`` per row and a row's draws do not depend on which rows share the batch.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def derive_seed(*parts: int) -> int:
    """Deterministic 31-bit seed from (seed, step, index, ...) (FNV-1a style)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (int(p) & 0xFFFFFFFFFFFF)) * 1099511628211) % (1 << 64)
    return h % (1 << 31)


def row_seed(seed: int, row: int) -> int:
    """Seed of one response row's sampling stream (31 bits)."""
    return derive_seed(seed, row, 0x5EED)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit mixing hash (xorshift-multiply; constants from the hash-prospector
    search, both < 2^31 so that every product of int64 tensors stays below 2^63)."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & _M32
    return x ^ (x >> 15)


def uniform_noise(row_seeds: torch.Tensor, position: int, width: int) -> torch.Tensor:
    """Uniforms in the open interval (0, 1) for every (row, column) at one position.  (B,) -> (B, width)

    u[b, v] = f(row_seeds[b], position, v) for a fixed hash f: 23 random bits per draw, the
    values (k + 0.5) / 2^23, exact in float32 (so neither 0 nor 1 occurs).
    """
    device = row_seeds.device
    key = _mix32((row_seeds.long() & _M32) ^ _mix32(torch.tensor(position & _M32, device=device)))  # (B,)
    cols = torch.arange(width, device=device, dtype=torch.long)  # (V,)
    h = _mix32(_mix32(key[:, None] ^ cols[None, :]) ^ key[:, None])  # (B, V)
    return ((h >> 9).float() + 0.5) * (1.0 / (1 << 23))
