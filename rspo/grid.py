"""The run grid: which RL runs a preset names, and the config of each.

A run of the grid is one frozen ``Run`` (its grid keys: algorithm, RS, gamma_min, stop-gradient,
routing, rollout correction, rollout dtype, task, regime, seed); ``Run.name`` is the only namer
(``gmpo-rs0.8-s0``, ``grpo-s1``, ``mismatch-gmpo-tis-s0``, ...) and ``Run.rl_section`` the one place a
run is written onto the preset's `rl:`. ``expand_grid`` turns the preset's typed ``grid:`` (and each
regime's section, ``stress:`` and ``mismatch:``, see ``REGIMES``) into ``{family: {name: Run}}``; a run
several figures need is one run, trained once. ``train_config`` resolves a Run into a
``TrainConfig`` (rspo.config holds the dataclasses and their validation) and ``load_train_config``
looks a run up by name in one cached expansion. Which of these runs a target needs is rspo.plan's
question.

It imports nothing heavy (no torch): ``snakemake -n`` stays fast.
"""

from __future__ import annotations

import dataclasses
import re
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rspo import config as rcfg
from rspo.config import TrainConfig, build_checked
from rspo.method import DEFAULT_GAMMA_MIN, ConfigError
from rspo.preset import Preset
from rspo.study_config import REGIMES, GridConfig, build_regime


def _err(key: str, msg: str) -> ConfigError:
    return ConfigError(f"{key}: {msg}")


_SEED_SUFFIX = re.compile(r"-s\d+$")


@dataclass(frozen=True)
class Run:
    """One RL run of the grid: the grid keys that make it differ from the preset's `rl:`. Its identity
    is its name (``name``); ``rl_section`` writes it onto the preset's `rl:`."""

    algo: str
    seed: int = 0
    router_shift: bool = False
    gamma_min: float = DEFAULT_GAMMA_MIN
    stop_gradient: bool = True
    routing: str = "none"
    rollout_correction: str = "none"
    """Train-inference mismatch correction (beyond the paper; rspo.losses.rollout_correction)."""
    rollout_dtype: str = ""
    """An engine precision named in the run (a run outside the grid; a regime's prefix says it there)."""
    task: str = "countdown"
    main: bool = False
    """A Table 1 run (the `main` family): named ``<task>-...``, `rl` overlaid with `tasks.<task>`."""
    regime: str = "natural"
    """natural, or one of REGIMES (the preset's `<regime>` overlay; names prefixed `<regime>-`)."""

    @property
    def name(self) -> str:
        """`gmpo-rs0.8-s0`, `grpo-s1`, `gmpo-rs0.8-nosg-s0`, `gmpo-freeze-s0`, `gmpo-rolloutreplay-s0`
        (R3), `gmpo-rs0.8-tis-s0` (a rollout correction: tis, icepop, seqtis, mis), `gmpo-fp8-s0` (an
        engine in another precision), `math-gmpo-rs0.8-s0` (Table 1), `stress-grpo-s0` (a regime)."""
        parts = [self.algo]
        if self.router_shift:
            parts.append(f"rs{self.gamma_min:g}")
            if not self.stop_gradient:
                parts.append("nosg")
        if self.routing != "none":
            parts.append(self.routing.replace("_", ""))
        if self.rollout_correction != "none":
            parts.append(CORRECTION_NAMES[self.rollout_correction])
        if self.rollout_dtype:
            parts.append(self.rollout_dtype)
        parts.append(f"s{self.seed}")
        name = "-".join(parts)
        if self.main:
            name = f"{self.task}-{name}"
        return name if self.regime == "natural" else f"{self.regime}-{name}"

    @property
    def method(self) -> str:
        """The run name without its seed suffix: the unit tables and figures average over."""
        return _SEED_SUFFIX.sub("", self.name)

    def rl_section(self, preset: Preset) -> dict[str, Any]:
        """The run's `rl:` mapping: the preset's, the task's overlay (a Table 1 run), the regime's, then
        the run's algorithm keys (its rollout correction only where it has one: a run named before
        corrections existed keeps the preset's)."""
        rl = preset.rl_section(self.task if self.main else None, None if self.regime == "natural" else self.regime)
        algo = {
            "algo": self.algo,
            "router_shift": self.router_shift,
            "gamma_min": self.gamma_min,
            "stop_gradient": self.stop_gradient,
            "routing": self.routing,
        }
        if self.rollout_correction != "none":
            algo["rollout_correction"] = self.rollout_correction
        rl.setdefault("algorithm", {}).update(algo)
        return rl


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


Families = dict[str, dict[str, Run]]


def expand_grid(preset: Preset, seeds: list[int] | None = None) -> Families:
    """Grid families -> {run name: Run}; the same name in several families is the same run (trained
    once). Families: plugin (algos x router_shift: Figs. 1, 4, 6, 7), gamma_min (Fig. 3),
    stop_gradient (Fig. 5), routing (Fig. 8), mechanism (the GRPO and RSPO runs of the plugin family,
    Fig. 6), each regime's families (``regime_families``), and main (Table 1 / Fig. 2: for each task in
    `grid.main.tasks`, the methods in `grid.main.methods` such as "gmpo+rs"; `rl` overlaid with the
    preset's `tasks.<task>` mapping, the run name starting with the task). The grid's settings are
    the typed sections of rspo.study_config (GridConfig), checked as they are built."""
    raw = preset.grid()  # a family named without settings takes its defaults
    grid = build_checked(
        GridConfig, {k: {} if v is None else v for k, v in raw.items()} if isinstance(raw, dict) else raw, "grid"
    )
    seeds = preset.seeds if seeds is None else list(seeds)
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise _err("seeds", f"expected a non-empty list of integers, got {seeds!r}")
    rl = preset.rl()
    base = Run("", gamma_min=rl.algorithm.gamma_min, task=rl.data.task)

    def run(algo: str, seed: int, **keys: Any) -> tuple[str, Run]:
        r = dataclasses.replace(base, algo=algo, seed=seed, **keys)
        return r.name, r

    families: Families = {}
    if grid.plugin is not None:
        g = grid.plugin
        families["plugin"] = dict(
            run(a, seed, router_shift=rs) for seed in seeds for a in g.algos for rs in g.router_shift
        )
        families["mechanism"] = dict(
            run(a, seed, router_shift=rs) for seed in seeds for a, rs in (("grpo", False), ("gmpo", True))
        )
    if grid.gamma_min is not None:
        g = grid.gamma_min
        families["gamma_min"] = dict(
            run(g.algo, seed, router_shift=True, gamma_min=v) for seed in seeds for v in g.values
        )
    if grid.stop_gradient is not None:
        g = grid.stop_gradient
        families["stop_gradient"] = dict(
            run(g.algo, seed, router_shift=True, stop_gradient=sg) for seed in seeds for sg in (True, False)
        )
    if grid.routing is not None:
        g = grid.routing
        fam = {}
        for seed in seeds:
            fam.update([run(g.algo, seed, router_shift=True)])  # RSPO, the reference
            for mode in g.modes:
                if mode == "none":  # the algorithm alone (no RS, no routing control): the mismatch baseline
                    fam.update([run(g.algo, seed)])
                elif mode in BEYOND_PAPER_ROWS:  # R3, TIS, RS+TIS (beyond the paper)
                    routing, rs, corr = BEYOND_PAPER_ROWS[mode]
                    fam.update([run(g.algo, seed, router_shift=rs, routing=routing, rollout_correction=corr)])
                else:
                    fam.update([run(g.algo, seed, routing=mode)])
        families["routing"] = fam
    for regime in REGIMES:
        if preset.has(regime):
            families.update(regime_families(preset, families, regime, seeds))
    if grid.main is not None:
        g = grid.main
        tasks = preset.task_overlays
        fam = {}
        for task in g.tasks:
            if task not in tasks:
                raise _err("grid.main.tasks", f"task {task!r} needs a `tasks.{task}` mapping in the preset")
            for seed in seeds:
                for method in g.methods:  # <algo> or <algo>+rs
                    algo, _, plus = method.partition("+")
                    fam.update([run(algo, seed, router_shift=plus == "rs", task=task, main=True)])
        families["main"] = fam
    return families


def regime_families(preset: Preset, families: Families, regime: str, seeds: list[int]) -> Families:
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
    out: Families = {}
    for fam in st.families:
        if fam not in source or fam in ("main", "mechanism"):
            raise _err(
                f"{regime}.families",
                f"{fam!r} is not a Countdown grid family of this preset "
                f"(have: {sorted(f for f in source if f not in ('main', 'mechanism'))})",
            )
        for name in [fam] + (["mechanism"] if fam == "plugin" else []):
            runs = (dataclasses.replace(r, regime=regime) for r in source[name].values() if r.seed in own)
            out[f"{regime}_{name}"] = {r.name: r for r in runs}
    return out


def off_default_regimes(preset: Preset) -> set[str]:
    """The regimes whose section says ``default_target: false``: built by the whole grid or when a
    selection names their own family (stress_plugin), never by a selection of grid families."""
    return {r for r in REGIMES if preset.has(r) and not build_regime(r, preset.section(r)).default_target}


def base_family(family: str) -> str:
    """The grid family a regime's family repeats (stress_plugin -> plugin)."""
    regime, _, rest = family.partition("_")
    return rest if regime in REGIMES and rest else family


def all_runs(preset: Preset, seeds: list[int] | None = None) -> dict[str, Run]:
    """Every distinct run of the grid, name -> Run."""
    runs: dict[str, Run] = {}
    for fam in expand_grid(preset, seeds).values():
        runs.update(fam)
    return runs


_EXPANSIONS: weakref.WeakKeyDictionary[Preset, dict[tuple[int, ...] | None, dict[str, Run]]] = (
    weakref.WeakKeyDictionary()
)


def _runs(preset: Preset, seeds: list[int] | None = None) -> dict[str, Run]:
    """The preset's runs (``all_runs``), expanded once per Preset object and seeds (a preset's mapping
    is not changed once loaded: rspo.preset)."""
    per_seeds = _EXPANSIONS.setdefault(preset, {})
    key = None if seeds is None else tuple(seeds)
    if key not in per_seeds:
        per_seeds[key] = all_runs(preset, seeds)
    return per_seeds[key]


def find_run(preset: Preset, name: str) -> Run:
    """The run of the preset's grid named ``name``; a seed outside the preset's list (a run of
    `--config seeds=[...]`) is found among that seed's runs. A ConfigError lists the known names."""
    runs = _runs(preset)
    seed_suffix = name.rsplit("-s", 1)[-1]
    if name not in runs and seed_suffix.isdigit():
        runs = {**runs, **_runs(preset, [int(seed_suffix)])}
    if name not in runs:
        raise _err("run", f"{name!r} is not in the preset's grid; known runs: {sorted(runs)}")
    return runs[name]


def train_config(preset: Preset, run: Run | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """A run's TrainConfig: the preset's `rl:` with the run written onto it (``Run.rl_section``), then
    ``key=value`` overrides (``seed=N`` sets the seed). Without a run: the preset's `rl:`, named by
    every grid setting it has, so two such runs that differ never share an MLflow name."""
    rl = run.rl_section(preset) if run is not None else preset.rl_section()
    seed = run.seed if run is not None else int(preset.seeds[0])
    for text in overrides or []:
        key, value = rcfg.parse_override(text)
        if key == "seed":
            seed = int(value)
            continue
        rcfg.set_by_path(rl, key.removeprefix("rl."), value)
    cfg = rcfg.train_config_from_dict(rl, seed=seed, preset=preset.name, run_name=run.name if run else "")
    if run is None:
        a = cfg.algorithm
        named = Run(
            a.algo,
            cfg.seed,
            a.router_shift,
            a.gamma_min,
            a.stop_gradient,
            a.routing,
            a.rollout_correction,
            cfg.rollout.dtype,
        )
        cfg = dataclasses.replace(cfg, run_name=named.name)
    return cfg


def load_train_config(
    preset: str | Path | Preset, run: str | None = None, overrides: list[str] | None = None
) -> TrainConfig:
    """Resolve one RL run: the preset (a file, or a Preset loaded once by the caller) + the named grid
    run (looked up in one cached expansion) + `key=value` overrides."""
    spec = preset if isinstance(preset, Preset) else Preset.load(preset)
    return train_config(spec, find_run(spec, run) if run else None, overrides)
