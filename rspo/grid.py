"""The run grid: which RL runs a preset names, and the config of each.

``expand_grid`` turns the preset's ``grid:`` mapping (and each regime's section, ``stress:`` and
``mismatch:``, see ``REGIMES``) into named runs (``run_name``: ``gmpo-rs0.8-s0``, ``grpo-s1``,
``mismatch-gmpo-tis-s0``, ...); a run several figures need is one run, trained once.
``load_train_config`` resolves one named run into a ``TrainConfig`` (rspo.config holds the
dataclasses and their validation). Which of these runs a target needs is rspo.plan's question.

It imports nothing heavy (no torch): ``snakemake -n`` stays fast.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rspo import config as rcfg
from rspo.config import TrainConfig
from rspo.method import DEFAULT_GAMMA_MIN, ConfigError
from rspo.preset import Preset
from rspo.study_config import GRID_FAMILIES, build_regime, grid_family


def _err(key: str, msg: str) -> ConfigError:
    return ConfigError(f"{key}: {msg}")


def run_name(
    algo: str,
    router_shift: bool = False,
    gamma_min: float = DEFAULT_GAMMA_MIN,
    stop_gradient: bool = True,
    routing: str = "none",
    seed: int = 0,
    correction: str = "none",
    rollout_dtype: str = "",
) -> str:
    """Canonical run name: `gmpo-rs0.8-s0`, `grpo-s1`, `gmpo-rs0.8-nosg-s0`, `gmpo-freeze-s0`,
    `gmpo-rolloutreplay-s0` (R3), `gmpo-rs0.8-tis-s0` (a rollout correction: tis, icepop, seqtis, mis),
    `gmpo-fp8-s0` (an engine in another precision than the trainer's; in the grid a regime's prefix,
    `mismatch-`, says that instead)."""
    parts = [algo]
    if router_shift:
        parts.append(f"rs{gamma_min:g}")
        if not stop_gradient:
            parts.append("nosg")
    if routing != "none":
        parts.append(routing.replace("_", ""))
    if correction != "none":
        parts.append(CORRECTION_NAMES[correction])
    if rollout_dtype:
        parts.append(rollout_dtype)
    parts.append(f"s{seed}")
    return "-".join(parts)


# Short names of the rollout corrections (rspo.losses.rollout_correction), in run names and labels.
CORRECTION_NAMES = {
    "token_truncate": "tis",
    "token_mask": "icepop",
    "sequence_truncate": "seqtis",
    "sequence_mask": "mis",
}
# The routing family's rows beyond the paper (docs/mismatch.md): mode -> (routing, RS, correction).
BEYOND_PAPER_ROWS = {
    "rollout_replay": ("rollout_replay", False, "none"),
    "tis": ("none", False, "token_truncate"),
    "rs+tis": ("none", True, "token_truncate"),
}


# Regimes beyond the natural one (none is in the paper). Each is a preset section of one shape
# (``regime_families``): the Countdown families it names, trained again with its `rl` overlay (and
# its `grid` overlay of those families' settings); runs named ``<regime>-<run>``, families
# ``<regime>_<family>``, figures ``<figure>_<regime>``, labels ending in `` [<regime>]``.
REGIMES: dict[str, str] = {
    "stress": "router drift as the controlled variable",
    "mismatch": "train-inference mismatch as the controlled variable: the engine in another precision",
}


def expand_grid(preset: Preset, seeds: list[int] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Grid families -> {run name: algorithm overrides (+ seed)}.

    Returns {family: {name: {"algorithm": {...}, "seed": s}}}; the same name in several
    families is the same run (trained once). Families: plugin (algos x router_shift: Figs. 1,
    4, 6, 7), gamma_min (Fig. 3), stop_gradient (Fig. 5), routing (Fig. 8), and mechanism (the
    GRPO and RSPO runs of the plugin family, Fig. 6), and main (Table 1 / Fig. 2: for each task
    in `grid.main.tasks`, the methods in `grid.main.methods` such as "gmpo+rs"; the run config is
    `rl` overlaid with the preset's `tasks.<task>` mapping, and the run name starts with the task).
    """
    grid = preset.grid()
    if not isinstance(grid, dict):
        raise _err("grid", "expected a mapping")
    unknown = sorted(set(grid) - set(GRID_FAMILIES))
    if unknown:
        raise _err(f"grid.{unknown[0]}", f"unknown grid family; valid ones are {sorted(GRID_FAMILIES)}")
    seeds = preset.seeds if seeds is None else list(seeds)
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise _err("seeds", f"expected a non-empty list of integers, got {seeds!r}")
    default_gamma = preset.rl().algorithm.gamma_min

    def spec(
        algo: str,
        seed: int,
        rs: bool = False,
        gmin: float = default_gamma,
        sg: bool = True,
        routing: str = "none",
        task: str = "",
        correction: str = "none",
    ) -> tuple[str, dict[str, Any]]:
        algo_over = {"algo": algo, "router_shift": rs, "gamma_min": gmin, "stop_gradient": sg, "routing": routing}
        if correction != "none":  # left out otherwise: the runs named before corrections existed keep their config
            algo_over["rollout_correction"] = correction
        name = run_name(algo, rs, gmin, sg, routing, seed, correction)
        if task:
            return f"{task}-{name}", {"algorithm": algo_over, "seed": seed, "task": task}
        return name, {"algorithm": algo_over, "seed": seed}

    families: dict[str, dict[str, dict[str, Any]]] = {}
    if "plugin" in grid:
        g = grid_family("plugin", grid["plugin"])
        fam = {}
        for seed in seeds:
            for algo in g.algos:
                for rs in g.router_shift:
                    name, ov = spec(algo, seed, rs=rs)
                    fam[name] = ov
        families["plugin"] = fam
        mech = {}
        for seed in seeds:
            for algo, rs in (("grpo", False), ("gmpo", True)):
                name, ov = spec(algo, seed, rs=rs)
                mech[name] = ov
        families["mechanism"] = mech
    if "gamma_min" in grid:
        g = grid_family("gamma_min", grid["gamma_min"])
        families["gamma_min"] = dict(spec(g.algo, seed, rs=True, gmin=v) for seed in seeds for v in g.values)
    if "stop_gradient" in grid:
        g = grid_family("stop_gradient", grid["stop_gradient"])
        fam = {}
        for seed in seeds:
            for sg in (True, False):
                name, ov = spec(g.algo, seed, rs=True, sg=sg)
                fam[name] = ov
        families["stop_gradient"] = fam
    if "routing" in grid:
        g = grid_family("routing", grid["routing"])
        fam = {}
        for seed in seeds:
            name, ov = spec(g.algo, seed, rs=True)  # RSPO, the reference
            fam[name] = ov
            for mode in g.modes:
                if mode == "none":  # the algorithm alone (no RS, no routing control): the mismatch baseline
                    name, ov = spec(g.algo, seed)
                elif mode in BEYOND_PAPER_ROWS:  # R3, TIS, RS+TIS (beyond the paper)
                    routing, rs, corr = BEYOND_PAPER_ROWS[mode]
                    name, ov = spec(g.algo, seed, rs=rs, routing=routing, correction=corr)
                else:
                    name, ov = spec(g.algo, seed, routing=mode)
                fam[name] = ov
        families["routing"] = fam
    for regime in REGIMES:
        if preset.has(regime):
            families.update(regime_families(preset, families, regime, seeds))
    if "main" in grid:
        g = grid_family("main", grid["main"])
        tasks = preset.task_overlays
        fam = {}
        for task in g.tasks:
            if task not in tasks:
                raise _err("grid.main.tasks", f"task {task!r} needs a `tasks.{task}` mapping in the preset")
            for seed in seeds:
                for method in g.methods:  # <algo> or <algo>+rs
                    algo, _, plus = method.partition("+")
                    name, ov = spec(algo, seed, rs=plus == "rs", task=task)
                    fam[name] = ov
        families["main"] = fam
    return families


def regime_families(
    preset: Preset, families: dict[str, dict[str, dict[str, Any]]], regime: str, seeds: list[int]
) -> dict[str, dict[str, dict[str, Any]]]:
    """A regime (REGIMES): the Countdown families named in ``<regime>.families``, again, with the
    ``<regime>.rl`` overlay (a router learning-rate multiplier, an engine precision) and run names
    prefixed ``<regime>-``; an optional ``<regime>.grid`` overlays those families' grid settings
    (e.g. other routing modes); an optional ``<regime>.seeds`` keeps only those of ``seeds`` (a regime
    whose outcomes need another number of seeds than the natural one's). Family ``<regime>_<name>``;
    the mechanism pair follows plugin. ``<regime>.default_target: false`` keeps the regime out of the
    default target (``off_default_regimes``; rspo.plan.Plan reads it)."""
    st = build_regime(regime, preset.section(regime))
    own = seeds if st.seeds is None else st.seeds
    source = families
    if st.grid:
        grid = preset.grid()
        for fam, over in st.grid.items():
            if fam not in grid or fam == "main" or not isinstance(over, dict):
                raise _err(f"{regime}.grid.{fam}", f"expected a mapping overlaying grid.{fam} of this preset")
            grid[fam] = {**(grid[fam] or {}), **over}
        source = expand_grid(preset.with_grid(grid, drop=tuple(REGIMES)), seeds)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for fam in st.families:
        if fam not in source or fam in ("main", "mechanism"):
            raise _err(
                f"{regime}.families",
                f"{fam!r} is not a Countdown grid family of this preset "
                f"(have: {sorted(f for f in source if f not in ('main', 'mechanism'))})",
            )
        for name in [fam] + (["mechanism"] if fam == "plugin" else []):
            out[f"{regime}_{name}"] = {
                f"{regime}-{run}": {**ov, "regime": regime} for run, ov in source[name].items() if ov["seed"] in own
            }
    return out


def off_default_regimes(preset: Preset) -> set[str]:
    """The regimes whose section says ``default_target: false``: built by the whole grid or when a
    selection names their own family (stress_plugin), never by a selection of grid families."""
    return {r for r in REGIMES if preset.has(r) and not build_regime(r, preset.section(r)).default_target}


def base_family(family: str) -> str:
    """The grid family a regime's family repeats (stress_plugin -> plugin)."""
    regime, _, rest = family.partition("_")
    return rest if regime in REGIMES and rest else family


def all_runs(preset: Preset, seeds: list[int] | None = None) -> dict[str, dict[str, Any]]:
    """Every distinct run of the grid, name -> overrides."""
    runs: dict[str, dict[str, Any]] = {}
    for fam in expand_grid(preset, seeds).values():
        runs.update(fam)
    return runs


def load_train_config(
    preset_path: str | Path, run: str | None = None, overrides: list[str] | None = None, seed: int | None = None
) -> TrainConfig:
    """Resolve one RL run: preset `rl:` + the named grid run's overrides + `key=value` overrides."""
    spec = Preset.load(preset_path)
    rl = spec.rl_section()
    run_seed = int(spec.seeds[0]) if seed is None else seed
    name = run or ""
    if run:
        runs = all_runs(spec)
        seed_suffix = run.rsplit("-s", 1)[-1]
        if run not in runs and seed_suffix.isdigit():  # a seed given with --config seeds=[...]
            runs = all_runs(spec, seeds=[int(seed_suffix)])
        if run not in runs:
            raise _err("run", f"{run!r} is not in the preset's grid; known runs: {sorted(runs)}")
        ov = runs[run]
        regime = ov.get("regime") if ov.get("regime") in REGIMES else None
        rl = spec.rl_section(ov.get("task"), regime)
        rl.setdefault("algorithm", {}).update(ov["algorithm"])
        run_seed = ov["seed"]
    for text in overrides or []:
        key, value = rcfg.parse_override(text)
        if key == "seed":
            run_seed = int(value)
            continue
        rcfg.set_by_path(rl, key.removeprefix("rl."), value)
    cfg = rcfg.train_config_from_dict(rl, seed=run_seed, preset=spec.name, run_name=name)
    if not name:
        a = cfg.algorithm
        cfg = dataclasses.replace(
            cfg,  # named by every grid setting it has: two runs that differ never share an MLflow name
            run_name=run_name(
                a.algo,
                a.router_shift,
                a.gamma_min,
                a.stop_gradient,
                a.routing,
                cfg.seed,
                a.rollout_correction,
                cfg.rollout.dtype,
            ),
        )
    return cfg
