"""Countdown generation: ``CountdownConfig`` (the presets' ``countdown:`` mapping), the split
targets, and the seeded generator that writes ``{split}.jsonl`` and ``meta.json`` (streams per
chunk, so the output does not depend on the number of worker processes; see the package
docstring, rspo.data.countdown, for how it follows Qin et al. and where it deviates)."""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing as mp
import os
import random
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rspo.config import ConfigError, check_type
from rspo.constraints import Section, setting
from rspo.data.countdown.solver import first_solution, fits_int64, solvable_rows
from rspo.data.countdown.traces import HEURISTICS, make_record
from rspo.jsonl import write_atomic

SPLITS = ("train", "val", "val_target")
CHUNK = 1000
"""Problems per random stream and per multiprocessing task (changing it changes the data)."""
MAX_DRAWS = 20_000
"""Rejection-sampling budget (candidate draws) per problem before giving up with an error."""
ROW_CAP = 1 << 18
"""Largest candidate batch per rejection round (rows of n numbers)."""
_SEED_TAG = 0x5C0D  # mixes the task into every SeedSequence
MAX_REDRAWS = 10_000
"""Redraws of a `val` problem whose solution occurs in train before giving up."""


@dataclass(frozen=True)
class CountdownConfig(Section):
    """Generation parameters (the YAML presets' top-level `countdown:` mapping; its schema is
    generated from this class: scripts/preset_schema.py)."""

    num_numbers: int = setting(4, ge=2, le=5)
    """Numbers per problem (Qin et al.: 4; CPU presets: 3)."""
    max_number: int = setting(99, ge=1)
    """Numbers are drawn uniformly from 1..max_number (Qin et al.: 1..99)."""
    min_target: int = setting(10, ge=1)
    """Smallest target (Qin et al.: 10)."""
    max_target: int = setting(100, ge=1)
    """Largest target (Qin et al.: 100)."""
    train_size: int = setting(500_000, ge=0)
    """Problems in split `train` (Qin et al.: 500,000)."""
    val_size: int = setting(1000, ge=0)
    """Problems in split `val`: train targets, no solution shared with train (Qin et al.: 1,000)."""
    val_target_size: int = setting(1000, ge=0)
    """Problems in split `val_target`: held-out targets only (Qin et al.: 1,000)."""
    heldout_target_frac: float = setting(0.1, ge=0, lt=1)
    """Fraction of the targets held out for `val_target` (Qin et al.: 10%, `len // 10`)."""
    seed: int = setting(4, ge=0)
    """Random seed (Qin et al.'s gen_task.sh: 4)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # built from flags or a preset's mapping: the types first
            check_type(f"countdown.{f.name}", getattr(self, f.name), float if f.type == "float" else int)
        self.validate("countdown")

    def checks(self, prefix: str) -> None:
        frac = self.heldout_target_frac
        if self.min_target > self.max_target:
            raise ConfigError(f"{prefix}: min_target ({self.min_target}) > max_target ({self.max_target})")
        train_t, held_t = split_targets(self)
        if self.val_target_size > 0 and not held_t:
            raise ConfigError(
                f"{prefix}: heldout_target_frac={frac} holds out no target of "
                f"{self.min_target}..{self.max_target}, but val_target_size={self.val_target_size}"
            )
        if (self.train_size > 0 or self.val_size > 0) and not train_t:
            raise ConfigError(
                f"{prefix}: heldout_target_frac={frac} leaves no training target in "
                f"{self.min_target}..{self.max_target}"
            )


def split_targets(cfg: CountdownConfig) -> tuple[list[int], list[int]]:
    """(train/val targets, held-out val_target targets): shuffled by seed, first frac held out."""
    targets = list(range(cfg.min_target, cfg.max_target + 1))
    random.Random(cfg.seed).shuffle(targets)
    n_held = int(len(targets) * cfg.heldout_target_frac)
    return targets[n_held:], targets[:n_held]


def _chunk_rng(seed: int, split: str, chunk: int) -> np.random.Generator:
    """The random stream of one chunk of a split (independent of workers and chunk order)."""
    return np.random.default_rng(np.random.SeedSequence([_SEED_TAG, seed, SPLITS.index(split), chunk]))


def _draw_problems(
    rng: np.random.Generator,
    targets: np.ndarray,
    count: int,
    n: int,
    max_number: int,
    vectorised: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """`count` problems: a uniform target each, then numbers redrawn until solvable.

    Rejection sampling in rounds: each unresolved problem draws `k` candidate tuples
    (k = 8, 32, 128, ...), and takes the FIRST solvable one in its own draw order, which is
    exactly sequential rejection sampling (uniform over the solvable tuples for its target).
    Returns target (count,) and nums (count, n).
    """
    tgt = targets[rng.integers(0, len(targets), size=count)]
    nums = np.zeros((count, n), dtype=np.int64)
    pending = np.arange(count)
    k, drawn = 8, 0
    while pending.size:
        if drawn >= MAX_DRAWS:
            bad = sorted({int(t) for t in tgt[pending]})
            raise ValueError(
                f"countdown: no solvable problem for target(s) {bad[:10]} with {n} numbers in "
                f"1..{max_number} after {drawn} draws; widen max_number or the target range"
            )
        k = min(k, MAX_DRAWS - drawn, max(8, ROW_CAP // pending.size))
        cand = rng.integers(1, max_number + 1, size=(pending.size, k, n), dtype=np.int64)
        ok = solvable_rows(cand.reshape(-1, n), np.repeat(tgt[pending], k), vectorised)
        ok = ok.reshape(pending.size, k)  # (P, k)
        has = ok.any(axis=1)
        first = ok.argmax(axis=1)
        nums[pending[has]] = cand[has, first[has]]
        pending = pending[~has]
        drawn += k
        k *= 4
    return tgt, nums


def _gen_chunk(args: tuple) -> list[dict]:
    """The records of one chunk of a split, from the chunk's own random stream."""
    seed, split, chunk, count, targets, n, max_number, traces, exclude = args
    rng = _chunk_rng(seed, split, chunk)
    targets = np.asarray(targets, dtype=np.int64)
    vec = fits_int64(n, max_number, int(targets.max()))
    tgt, nums = _draw_problems(rng, targets, count, n, max_number, vec)
    sols = [first_solution(int(t), row.tolist()) for t, row in zip(tgt, nums, strict=True)]
    # val: a problem whose solution occurs in train is redrawn (new target and numbers).
    redo = [i for i, sol in enumerate(sols) if ",".join(sol) in exclude]
    tries = 0
    while redo:
        tries += 1
        if tries > MAX_REDRAWS:
            raise ValueError(
                f"countdown: could not draw {split} problems whose solution is not in train "
                f"after {MAX_REDRAWS} redraws; the problem space is too small"
            )
        t2, n2 = _draw_problems(rng, targets, len(redo), n, max_number, vec)
        for q, i in enumerate(redo):
            tgt[i], nums[i] = t2[q], n2[q]
            sols[i] = first_solution(int(t2[q]), n2[q].tolist())
        redo = [i for i in redo if ",".join(sols[i]) in exclude]
    heur = rng.integers(0, len(HEURISTICS), size=count)
    out = []
    for t, row, sol, h in zip(tgt.tolist(), nums.tolist(), sols, heur.tolist(), strict=True):
        if traces:
            out.append(make_record(t, row, sol, HEURISTICS[h]))
        else:
            out.append({"nums": row, "target": t, "solution": sol, "heuristic": HEURISTICS[h]})
    return out


_EXCLUDE: frozenset[str] = frozenset()


def _init_worker(exclude: frozenset[str]) -> None:
    global _EXCLUDE
    _EXCLUDE = exclude


def _gen_chunk_worker(args: tuple) -> list[dict]:
    return _gen_chunk((*args, _EXCLUDE))


def iter_split(
    cfg: CountdownConfig,
    split: str,
    size: int,
    targets: Sequence[int],
    workers: int = 1,
    exclude: Iterable[str] = (),
    traces: bool = True,
) -> Iterator[dict]:
    """Yield `size` records of `split` (targets from `targets`), chunk by chunk, in order.

    Problems whose solution string ("a+b=c,...") is in `exclude` are redrawn. Deterministic
    in (cfg.seed, num_numbers, max_number, split, size, targets, exclude); independent of
    `workers`. With traces=False the records hold only nums, target, solution, heuristic
    (the traces are pure functions of these: `dfs_search_path`, `optimal_path`).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    if size == 0:
        return
    if not targets:
        raise ValueError(f"countdown: split {split} has no targets")
    excl = frozenset(exclude)
    tasks = [
        (cfg.seed, split, c, min(CHUNK, size - c * CHUNK), list(targets), cfg.num_numbers, cfg.max_number, traces)
        for c in range(math.ceil(size / CHUNK))
    ]
    if workers <= 1 or len(tasks) == 1:
        for t in tasks:
            yield from _gen_chunk((*t, excl))
        return
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ctx.Pool(min(workers, len(tasks)), initializer=_init_worker, initargs=(excl,)) as pool:
        for chunk in pool.imap(_gen_chunk_worker, tasks, chunksize=1):
            yield from chunk


def generate_split(
    cfg: CountdownConfig,
    split: str,
    size: int,
    targets: Sequence[int],
    workers: int = 1,
    exclude: Iterable[str] = (),
    traces: bool = True,
) -> list[dict]:
    """`iter_split` as a list."""
    return list(iter_split(cfg, split, size, targets, workers, exclude, traces))


def generate(
    cfg: CountdownConfig,
    out_dir: str | os.PathLike,
    workers: int = 1,
    traces: bool = True,
    progress: bool = False,
) -> dict:
    """Generate all splits into `out_dir` ({split}.jsonl, then meta.json); returns the meta dict.

    Records are streamed to disk chunk by chunk (a 500k-record train split with traces is
    ~5 GB). meta.json is removed first and written last, so its presence means complete.
    `progress` shows a bar (terminal) or log lines per split (rspo.progress).
    """
    from rspo.progress import Progress

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "meta.json"
    if meta_path.exists():
        meta_path.unlink()  # a stale meta.json must not vouch for files being rewritten
    train_t, held_t = split_targets(cfg)
    plan = (
        ("train", cfg.train_size, train_t),
        ("val", cfg.val_size, train_t),
        ("val_target", cfg.val_target_size, held_t),
    )
    train_solutions: set[str] = set()
    counts: dict[str, int] = {}
    timings: dict[str, float] = {}
    for split, size, targets in plan:
        t0 = time.perf_counter()
        exclude = train_solutions if split == "val" else ()
        counts[split] = 0

        def lines(split=split, size=size, targets=targets, exclude=exclude, bar=None):
            for rec in iter_split(cfg, split, size, targets, workers, exclude, traces):
                if split == "train":
                    train_solutions.add(",".join(rec["solution"]))
                counts[split] += 1
                bar.update(counts[split])
                yield json.dumps(rec) + "\n"

        with Progress(f"generate {split}", size, unit="record", quiet=not progress) as bar:
            write_atomic(out / f"{split}.jsonl", lines(bar=bar))
        timings[split] = time.perf_counter() - t0
    meta = {
        "task": "countdown",
        "config": dataclasses.asdict(cfg),
        "traces": traces,
        "counts": counts,
        "train_targets": sorted(train_t),
        "val_target_targets": sorted(held_t),
        "files": {s: f"{s}.jsonl" for s in SPLITS},
        "generation_seconds": {k: round(v, 3) for k, v in timings.items()},
        "workers": workers,
    }
    write_atomic(meta_path, json.dumps(meta, indent=2) + "\n")
    return meta
