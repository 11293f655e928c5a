"""The study-level sections of a preset (configs/<name>.yaml) as typed sections: the run grid and its
families, the regimes, the per-task overlays, the data sources, the MLflow experiment, the job
resources, and ``PresetSpec``, the whole file. Each setting's type, default, constraints and
description are stated once, on its field (rspo.constraints.setting); ``preset_schema`` builds
workflow/schemas/preset.schema.yaml whole from them (scripts/preset_schema.py writes it, a test
fails while it is out of date). The sections of one RL run are rspo.config's, the evaluation's
rspo.eval_config's, the pretraining's rspo.pretrain_config's.

rspo.grid expands the grid from these sections (``grid_family``, ``build_regime``); rspo.preset
answers the rest (seeds, threads, resources, sources) from them. The resources' defaults differ per
rule kind (rspo.plan.DEFAULT_RESOURCES): a field left unset here (None) takes its kind's.
It imports nothing heavy: the workflow reads it at plan time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rspo.config import build_checked, rl_schema
from rspo.constraints import REQUIRED, Section, section_schema, setting
from rspo.eval_config import eval_schema
from rspo.method import ALGOS, ConfigError
from rspo.pretrain_config import ArchConfig, PretrainConfig

__all__ = [
    "BaseModelPin",
    "GRID_FAMILIES",
    "GRID_ROUTING_MODES",
    "METHODS",
    "GridConfig",
    "JobResources",
    "PresetSpec",
    "REGIMES",
    "Regime",
    "build_regime",
    "grid_family",
    "preset_schema",
]

GRID_FAMILIES = ("plugin", "gamma_min", "stop_gradient", "routing", "main")
REGIME_FAMILIES = ("plugin", "gamma_min", "stop_gradient", "routing")  # the Countdown families
# Regimes beyond the natural one (none is in the paper). Each is a preset section of one shape
# (rspo.grid.regime_families): the Countdown families it names, trained again with its `rl` overlay (and
# its `grid` overlay of those families' settings); runs named ``<regime>-<run>``, families
# ``<regime>_<family>``, figures ``<figure>_<regime>``, labels ending in `` [<regime>]``.
REGIMES: dict[str, str] = {
    "stress": "router drift as the controlled variable",
    "mismatch": "train-inference mismatch as the controlled variable: the engine in another precision",
}
# What `default_families:` may name: a grid family (built in the natural regime and in each regime whose
# `families` lists it) or one regime's family (`mismatch_routing`: only there)
DEFAULT_FAMILIES = (*GRID_FAMILIES, *(f"{r}_{f}" for r in REGIMES for f in REGIME_FAMILIES))
# Rows of the routing family: the paper's (Fig. 8 / App. D) and beyond it R3, TIS, RS+TIS and the
# algorithm alone (none); rspo.grid.BEYOND_PAPER_ROWS says what each beyond-paper row trains.
GRID_ROUTING_MODES = ("none", "freeze", "logit_replay", "index_replay", "rollout_replay", "tis", "rs+tis")
METHODS = (*ALGOS, *(f"{a}+rs" for a in ALGOS))  # Table 1's rows: an algorithm, with RS or without


# ----------------------------------------------------------------------------- the grid


@dataclass(frozen=True)
class PluginGrid(Section):
    """Figs. 1, 4, 6, 7: every algorithm with and without router-shift weighting."""

    algos: tuple[str, ...] = setting(tuple(ALGOS), choices=ALGOS, noun="algorithm", nonempty=True)
    """Algorithms trained."""
    router_shift: tuple[bool, ...] = setting((False, True), nonempty=True)
    """RS off, on, or both."""


@dataclass(frozen=True)
class GammaMinGrid(Section):
    """Fig. 3: the gamma_min sweep, RS on."""

    algo: str = setting("gmpo", choices=ALGOS, noun="algorithm")
    """Algorithm of the sweep."""
    values: tuple[float, ...] = setting((0.2, 0.5, 0.8), gt=0, le=1, nonempty=True)
    """gamma_min values (each in (0, 1])."""


@dataclass(frozen=True)
class StopGradientGrid(Section):
    """Fig. 5 / Appendix B: RS with and without the gradient through gamma."""

    algo: str = setting("gmpo", choices=ALGOS, noun="algorithm")
    """Algorithm of the pair."""


@dataclass(frozen=True)
class RoutingGrid(Section):
    """Fig. 8 / Appendix D (freeze, logit replay, index replay) beside RSPO; beyond the paper, R3
    (rollout_replay), TIS (tis), RS+TIS (rs+tis) and the algorithm alone (none, the baseline of a
    mismatch regime)."""

    algo: str = setting("gmpo", choices=ALGOS, noun="algorithm")
    """Algorithm of every row."""
    modes: tuple[str, ...] = setting(
        ("freeze", "logit_replay", "index_replay"), choices=GRID_ROUTING_MODES, noun="routing mode", nonempty=True
    )
    """Rows beside RSPO: none, freeze, logit_replay, index_replay, rollout_replay (R3), tis, rs+tis."""


@dataclass(frozen=True)
class MainGrid(Section):
    """Table 1 / Fig. 2: the math and code methods."""

    tasks: tuple[str, ...] = setting((), choices=("math", "code"), noun="task")
    """Tasks trained (each needs its `tasks.<task>` overlay)."""
    methods: tuple[str, ...] = setting(
        ("grpo", "gspo", "gmpo", "gmpo+rs"), choices=METHODS, noun="method", nonempty=True
    )
    """Methods: <algo> or <algo>+rs."""


@dataclass(frozen=True)
class GridConfig(Section):
    """Which runs the paper's figures and tables need (rspo.grid.expand_grid); a family is built where
    the preset names it."""

    plugin: PluginGrid | None = None
    """Figs. 1, 4, 6, 7 (algos x router_shift)."""
    gamma_min: GammaMinGrid | None = None
    """Fig. 3 (gamma_min sweep, RS on)."""
    stop_gradient: StopGradientGrid | None = None
    """Fig. 5 / Appendix B (gradient through gamma)."""
    routing: RoutingGrid | None = None
    """Fig. 8 / Appendix D (routing controls beside RSPO)."""
    main: MainGrid | None = None
    """Table 1 / Fig. 2 (math and code methods)."""


_GRID_FAMILY_CLASSES = {
    "plugin": PluginGrid,
    "gamma_min": GammaMinGrid,
    "stop_gradient": StopGradientGrid,
    "routing": RoutingGrid,
    "main": MainGrid,
}


def grid_family(name: str, data: dict[str, Any] | None, prefix: str = "grid") -> Any:
    """The typed settings of one grid family (its defaults where the mapping sets none), checked."""
    return build_checked(_GRID_FAMILY_CLASSES[name], data, f"{prefix}.{name}")


@dataclass(frozen=True)
class Regime(Section):
    """A regime beyond the natural one (REGIMES; not in the paper): the Countdown grid
    families listed in `families` trained again with the `rl` overlay."""

    rl: dict[str, Any] = setting(REQUIRED, ref="rl")
    """The overlay of `rl` this regime's runs train with (non-empty)."""
    families: tuple[str, ...] = setting(REQUIRED, choices=REGIME_FAMILIES, noun="family", nonempty=True)
    """The Countdown grid families trained again."""
    grid: dict[str, Any] | None = setting(None, ref="grid")
    """An overlay of the preset's grid families for this regime (each a mapping)."""
    seeds: tuple[int, ...] | None = setting(None, ge=0, nonempty=True)
    """The seeds of this regime's runs, where they differ from the preset's (those of the plan's seeds that
    are listed here)."""
    default_target: bool = True
    """false: the default target leaves this regime out; --config full=true builds it, and so does a selection
    naming the regime's own family (stress_plugin)."""
    note: str = ""
    """Why the regime exists (free text)."""

    def checks(self, prefix: str) -> None:
        if not self.rl:
            raise ConfigError(f"{prefix}.rl: expected a non-empty overlay of the rl section")


def build_regime(name: str, data: Any) -> Regime:
    """The typed `<name>:` regime section, checked (a ConfigError names the key)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: expected a mapping with `rl` (an overlay of the rl section) and `families`")
    return build_checked(Regime, data, name)


# ----------------------------------------------------------------------------- data, tracking, jobs


@dataclass(frozen=True)
class PrepareSource(Section):
    source: str | None = setting(None, nonempty=True)
    """hub, fallback, or a JSONL path (unset: hub where the task has a hub model, else fallback)."""


@dataclass(frozen=True)
class Prepare(Section):
    math: PrepareSource = field(default_factory=PrepareSource)
    """Source of `rspo prepare math`."""
    code: PrepareSource = field(default_factory=PrepareSource)
    """Source of `rspo prepare code`."""


@dataclass(frozen=True)
class TaskOverlays(Section):
    math: dict[str, Any] | None = setting(None, ref="rl")
    """Overlay on `rl` of the math runs."""
    code: dict[str, Any] | None = setting(None, ref="rl")
    """Overlay on `rl` of the code runs."""


@dataclass(frozen=True)
class Mlflow(Section):
    experiment: str | None = setting(None, nonempty=True)
    """MLflow experiment (one per preset; unset: rspo-<preset>)."""


@dataclass(frozen=True)
class JobResources(Section):
    """One rule kind's job resources; a field left unset takes the kind's default (rspo.plan.DEFAULT_RESOURCES)."""

    threads: int | None = setting(None, ge=1)
    """CPU threads (= torch threads; unset for pretrain/train/evaluate/bench: the preset's threads)."""
    mem_mb: int | None = setting(None, ge=1)
    """Memory in MB."""
    runtime: int | None = setting(None, ge=1)
    """Time limit in minutes."""
    gpu: int | None = setting(None, ge=0)
    """GPUs per job."""
    cpus_per_gpu: int | None = setting(None, ge=1)
    """SLURM's --cpus-per-gpu."""
    processes: int | None = setting(None, ge=1)
    """Data-parallel processes per job (torchrun; train jobs only)."""

    def given(self) -> dict[str, Any]:
        """The fields the preset sets."""
        return {k: v for k, v in vars(self).items() if v is not None}


@dataclass(frozen=True)
class Resources(Section):
    data: JobResources = setting(JobResources(), ref="resources")
    """Data generation and preparation jobs."""
    pretrain: JobResources = setting(JobResources(), ref="resources")
    """Pretraining jobs."""
    train: JobResources = setting(JobResources(), ref="resources")
    """RL training jobs."""
    evaluate: JobResources = setting(JobResources(), ref="resources")
    """Evaluation jobs."""
    bench: JobResources = setting(JobResources(), ref="resources")
    """Benchmark jobs."""
    report: JobResources = setting(JobResources(), ref="resources")
    """Tables, figures and claims."""


@dataclass(frozen=True)
class BaseModelPin(Section):
    """A committed Countdown base model that the study starts from instead of pretraining it here
    (rspo.base_pin): pretraining is not bit-identical between CPUs, so a study run in pieces on several
    machines needs one base. Every train job from it checks the weights' sha256; `make base` rebuilds
    and re-pins it."""

    path: str = setting(REQUIRED, nonempty=True)
    """The base's folder (the output of `rspo pretrain`), relative to the repository root (the
    folder above configs/) or absolute."""
    sha256: str = setting(REQUIRED, pattern=r"^[0-9a-f]{64}$")
    """sha256 of the folder's model.safetensors."""


# ----------------------------------------------------------------------------- the whole file


@dataclass(frozen=True)
class PresetSpec(Section):
    """A study preset (configs/<name>.yaml). Every mapping is closed (additionalProperties: false), so
    a misspelt key stops the workflow before any job starts, with the key in the message. This schema
    is generated from the frozen dataclasses of rspo/study_config.py, rspo/config.py,
    rspo/eval_config.py, rspo/pretrain_config.py and rspo.data.countdown (their types, constraints and
    docstrings: scripts/preset_schema.py; tests/test_presets.py checks the file is up to date); the
    dataclasses add the cross-field checks."""

    preset: str = setting(REQUIRED, pattern=r"^[A-Za-z0-9_.-]+$")
    """Name of the preset; results go to results/<preset>/ (the file's name)."""
    rl: dict[str, Any] = setting(REQUIRED, ref="rl")
    """Sections of one RL run (rspo.config.TrainConfig)."""
    seeds: tuple[int, ...] = setting((0,), ge=0, nonempty=True)
    """RL seeds; every grid run is trained once per seed."""
    threads: int = setting(1, ge=1)
    """Default torch threads (= Snakemake threads) of pretrain/train/evaluate/bench jobs."""
    mlflow: Mlflow = field(default_factory=Mlflow)
    """MLflow settings."""
    countdown: dict[str, Any] | None = setting(None, ref="countdown")
    """Countdown generator (rspo.data.countdown.CountdownConfig)."""
    pretrain: PretrainConfig | None = None
    """SFT pretraining of the small MoE on Countdown (rspo pretrain)."""
    base_model: BaseModelPin | None = None
    """The committed Countdown base (path and sha256) the study starts from instead of pretraining
    (`make base` rebuilds it from `pretrain:`); unset: pretrained by the workflow."""
    regime_trials: str | tuple[str, ...] | None = setting(None, nonempty=True)
    """The sweep files of the search for a regime in which the paper's Sec. 3 and plug-in claims can
    be tested (configs/sweeps/*.yaml, one path or a list, in the order the rounds ran; relative to the
    repository root or absolute), whose committed records the claims table reads (each file's
    ``record:`` folder: trials.jsonl, every line a trial of that file, with steps.tar.xz where its
    trials have a router-lr schedule): where none of their trials met a registered gate, it reads the
    rows that gate guards as "not testable: no regime found on the searched axes (...)"
    (rspo.report.regime_search); unset: no row is guarded."""
    grid: dict[str, Any] | None = setting(None, ref="grid")
    """Which runs the paper's figures and tables need (rspo.grid.expand_grid)."""
    default_families: tuple[str, ...] | None = setting(None, choices=DEFAULT_FAMILIES, noun="grid family")
    """Grid families the default target builds, in the natural regime and (those also listed in a regime's
    families) in each regime, and regime families (`mismatch_routing`) built in that regime only; the rest
    of the grid is built with --config full=true (unset: the whole grid)."""
    stress: dict[str, Any] | None = setting(None, ref="regime")
    """The stress regime (not in the paper): router drift as the controlled variable (e.g.
    optim.router_lr_mult); run names prefixed stress-, figures <figure>_stress."""
    mismatch: dict[str, Any] | None = setting(None, ref="regime")
    """The mismatch regime (not in the paper): an engine in another precision than the trainer
    (rollout.dtype), with routing rows such as none, rollout_replay, tis, rs+tis; run names prefixed
    mismatch-, figures <figure>_mismatch."""
    tasks: TaskOverlays = field(default_factory=TaskOverlays)
    """Per-task overlays on `rl` for the `main` grid family."""
    prepare: Prepare = field(default_factory=Prepare)
    """Data source of `rspo prepare <task>`: hub, fallback or a JSONL path."""
    eval: dict[str, Any] | None = setting(None, ref="eval")
    """Settings of `rspo evaluate <family>` (flags of that command override them)."""
    resources: Resources = field(default_factory=Resources)
    """Job resources per rule kind (defaults: rspo.plan.DEFAULT_RESOURCES)."""
    primary_claims: tuple[str, ...] | None = setting(None, nonempty=True)
    """The claims table's pre-registered primary family: claim keys of rspo.report.claim_registry, each
    judged on its one primary row and Holm-corrected together (a listed row that is missing or not
    testable counts with p = 1); unset: every claim's primary row. Name it before the runs it judges."""

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of a top-level setting (``default("seeds")`` -> (0,))."""
        f = cls.__dataclass_fields__[name]
        return f.default if f.default_factory is dataclasses.MISSING else f.default_factory()


def preset_schema(countdown: type) -> dict[str, Any]:
    """The JSON schema of a preset file (workflow/schemas/preset.schema.yaml), whole: the root from
    ``PresetSpec``, the sections that several keys follow (an overlay of `rl`, a regime, the
    architecture, a job's resources) and the Countdown generator's (``countdown``: its section,
    rspo.data.countdown.CountdownConfig, on the data floor above this one) under ``$defs``."""
    root = section_schema(PresetSpec)
    doc = " ".join((PresetSpec.__doc__ or "").split())
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "description": doc,
        **root,
        "$defs": {
            "rl": rl_schema(),
            "eval": eval_schema(),
            "countdown": section_schema(countdown),
            "grid": section_schema(GridConfig),
            "regime": section_schema(Regime),
            "arch": section_schema(ArchConfig),
            "resources": section_schema(JobResources),
        },
    }
