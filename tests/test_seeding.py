"""rspo.seeding: derived seeds and counter-based uniforms (the rollout's sampling noise)."""

import math

import torch

from rspo.seeding import derive_seed, row_seed, uniform_noise


def test_derived_seeds_are_stable_31_bit_values():
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2) != derive_seed(0, 2, 1)
    seeds = {row_seed(s, r) for s in range(5) for r in range(200)}
    assert len(seeds) == 1000 and all(0 <= x < 2**31 for x in seeds)


def test_uniform_noise_is_keyed_by_row_seed_position_and_column_only():
    seeds = torch.tensor([row_seed(7, r) for r in range(64)])
    u = uniform_noise(seeds, 5, 33)
    assert u.shape == (64, 33) and u.dtype == torch.float32
    assert torch.equal(u, uniform_noise(seeds, 5, 33))  # deterministic
    assert torch.equal(u[10:20], uniform_noise(seeds[10:20], 5, 33))  # independent of the other rows
    assert torch.equal(u[:, :20], uniform_noise(seeds, 5, 20))  # and of the vocabulary width
    assert not torch.equal(u, uniform_noise(seeds, 6, 33))
    assert bool((u > 0).all() and (u < 1).all())


def test_uniform_noise_is_uniform_and_independent():
    """Chi-square of 64 bins (df 63) and correlations across rows, positions and columns; a
    Gumbel-max draw over equal logits is uniform over the categories."""
    seeds = torch.tensor([row_seed(1, r) for r in range(4096)])
    u = uniform_noise(seeds, 0, 64)
    v = uniform_noise(seeds, 1, 64)
    bound = 63 + 6 * math.sqrt(2 * 63)
    counts = torch.histc(u.flatten(), 64, 0, 1)
    expected = u.numel() / 64
    assert ((counts - expected) ** 2 / expected).sum() < bound
    for a, b in (
        (u.flatten(), v.flatten()),
        (u[:, :-1].flatten(), u[:, 1:].flatten()),
        (u[:-1].flatten(), u[1:].flatten()),
    ):
        assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1]) < 0.02
    draws = (-torch.log(-torch.log(u))).argmax(dim=1)
    counts = torch.bincount(draws, minlength=64).float()
    expected = len(draws) / 64
    assert ((counts - expected) ** 2 / expected).sum() < bound
