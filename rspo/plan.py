"""The planner: which runs, data and models a preset and a target need.

One answer for everyone who asks: Snakemake (``Snakefile``, ``workflow/rules/*.smk``), the report
CLI (``python -m rspo report``) and the train/bench commands (``load_train_config``), so the figure
a rule plans is the figure the CLI draws and the run a job trains is the run the grid names.

- The run grid (rspo.grid): ``expand_grid`` names the runs of the preset's ``grid:`` and of its
  regimes; ``load_train_config`` resolves one named run into a ``TrainConfig``.
- ``Plan``: the runs of one preset (its default families, a named selection of families, or the
  whole grid with ``full``), the runs each paper figure and table draws, base models, data sources,
  job resources, and the deep validation of a preset before any job starts (``Plan.check``,
  ``validate_preset``).

It imports nothing heavy (no torch, no matplotlib): ``snakemake -n`` stays fast.

Choices that are ours, not the paper's (the paper index is in docs/design.md):
- fig1_reward and fig7_entropy plot the paper's four methods (GRPO, GSPO, GMPO and RSPO = GMPO+RS),
  not the +RS variants of GRPO/GSPO; fig4_plugin plots all six.
- In the paper Figs. 6 and 7 are drawn on Qwen3-30B-A3B (math). A preset with only a ``main`` grid
  family (paper_large_math, paper_large_code) therefore draws them from its ``main`` runs of the first
  task in ``grid.main.tasks``; presets with a ``plugin`` family use the Countdown runs.
- Fig. 3 in the paper is a Qwen3-30B-A3B math sweep; here it is built wherever the preset has a
  ``gamma_min`` grid family (the Countdown presets), because ``run_name`` names gamma_min runs
  without a task prefix and a large-preset sweep would re-train the gmpo+rs0.8 run of ``main``.
- table_countdown lists the base model and EVERY Countdown run of the preset (all families), as the
  issue asks; the paper has no such table (its Countdown results are curves only).
- table_efficiency (Sec. 5.5) is built in presets with a pretrained Countdown model (smoke, small,
  paper_small): ``rspo bench`` measures that model; it does not load hub models, so the large
  presets, where the paper measured Qwen3-30B-A3B, have no benchmark.
- The math/code data source of ``rspo prepare`` is the preset's ``prepare.<task>.source``; without
  it, ``fallback`` (offline synthetic prompts) when the task's base model is pretrained locally (the
  smoke preset) and ``hub`` when the base model is a hub id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rspo import config as rcfg
from rspo.config import TASKS, removed_reason
from rspo.grid import (
    CORRECTION_NAMES,
    REGIMES,
    Run,
    base_family,
    expand_grid,
    off_default_regimes,
    train_config,
)
from rspo.method import DEFAULT_GAMMA_MIN, OBJECTIVES, ConfigError
from rspo.preset import Preset
from rspo.study_config import grid_family

# ----------------------------------------------------------------------------- targets


# Which figure needs which grid family (paper index: docs/design.md).
FIGURE_FAMILIES: dict[str, tuple[str, ...]] = {
    "fig1_reward": ("plugin",),
    "fig3_gamma_min": ("gamma_min",),
    "fig4_plugin": ("plugin",),
    "fig5_stopgrad": ("stop_gradient",),
    "fig6_mechanism": ("mechanism",),
    "fig7_entropy": ("plugin",),
    "fig8_routing": ("routing",),
    "fig2_reward_large": ("main",),
    "table_main": ("main",),
    "table_countdown": ("plugin",),
    "fig9_mismatch": ("routing",),  # beyond the paper: drawn when the family has R3 / TIS rows
}

# regime figure -> (the figure it redraws, regime)
REGIME_FIGURES: dict[str, tuple[str, str]] = {
    f"{fig}_{regime}": (fig, regime)
    for regime in REGIMES
    for fig, fams in FIGURE_FAMILIES.items()
    if not fig.startswith("table") and "main" not in fams
}
for _fig, (_base, _regime) in REGIME_FIGURES.items():
    FIGURE_FAMILIES[_fig] = tuple(f"{_regime}_{f}" for f in FIGURE_FAMILIES[_base])

PAPER_FIGURES: tuple[str, ...] = (
    "fig1_reward",
    "fig2_reward_large",
    "fig3_gamma_min",
    "fig4_plugin",
    "fig5_stopgrad",
    "fig6_mechanism",
    "fig7_entropy",
    "fig8_routing",
)
# Beyond the paper: the train-inference mismatch of the routing family's runs (docs/mismatch.md).
EXTRA_FIGURES: tuple[str, ...] = ("fig9_mismatch",)
# The same Countdown figures drawn from a regime's runs (presets with that regime's section).
FIGURES: tuple[str, ...] = PAPER_FIGURES + EXTRA_FIGURES + tuple(REGIME_FIGURES)
TABLES: tuple[str, ...] = ("table_main", "table_countdown", "table_efficiency", "table_claims")
TARGETS: tuple[str, ...] = FIGURES + TABLES

# Which preset shape builds a target, for the error message when a preset cannot.
NEEDS: dict[str, str] = {
    "fig1_reward": "a `plugin` grid family",
    "fig2_reward_large": "a `main` grid family",
    "fig3_gamma_min": "a `gamma_min` grid family",
    "fig4_plugin": "a `plugin` grid family",
    "fig5_stopgrad": "a `stop_gradient` grid family",
    "fig6_mechanism": "a `plugin` or `main` grid family",
    "fig7_entropy": "a `plugin` or `main` grid family",
    "fig8_routing": "a `routing` grid family",
    "fig9_mismatch": "a `routing` grid family with rows beyond the paper (rollout_replay, tis, rs+tis)",
    "table_main": "a `main` grid family",
    "table_countdown": "Countdown runs",
    "table_efficiency": "a pretrained Countdown model (a `pretrain` section; `rspo bench` measures it)",
    "table_claims": "Countdown runs of the `plugin` family (and a pretrained model for the throughput claim)",
}
NEEDS.update(
    {f: f"a `{regime}` section whose families include the figure's family" for f, (_, regime) in REGIME_FIGURES.items()}
)


def paper_figure(figure: str) -> str:
    """The figure a target draws (fig4_plugin_stress -> fig4_plugin, fig9_mismatch_mismatch ->
    fig9_mismatch)."""
    return REGIME_FIGURES.get(figure, (figure, ""))[0]


def figure_regime(figure: str) -> str:
    """natural, or the regime whose runs a figure draws (fig4_plugin_stress -> stress)."""
    return REGIME_FIGURES.get(figure, ("", "natural"))[1]


# Job resources per rule kind; a preset's `resources.<kind>` mapping overrides any of these keys.
# threads None -> the preset's top-level `threads` (torch threads of a job).
RULE_KINDS: tuple[str, ...] = ("data", "pretrain", "train", "evaluate", "bench", "report")
DEFAULT_RESOURCES: dict[str, dict[str, Any]] = {
    "data": {"threads": 1, "mem_mb": 4000, "runtime": 60, "gpu": 0, "processes": 1},
    "pretrain": {"threads": None, "mem_mb": 4000, "runtime": 240, "gpu": 0, "processes": 1},
    "train": {"threads": None, "mem_mb": 4000, "runtime": 480, "gpu": 0, "processes": 1},
    "evaluate": {"threads": None, "mem_mb": 4000, "runtime": 120, "gpu": 0, "processes": 1},
    "bench": {"threads": None, "mem_mb": 4000, "runtime": 60, "gpu": 0, "processes": 1},
    "report": {"threads": 1, "mem_mb": 2000, "runtime": 15, "gpu": 0, "processes": 1},
}
RESOURCE_KEYS = ("threads", "mem_mb", "runtime", "gpu", "cpus_per_gpu", "processes")


def method_label(run: Run, default_gamma: float = DEFAULT_GAMMA_MIN) -> str:
    """Paper-style legend/table label: GRPO, GSPO+RS, RSPO (GMPO+RS), Router freeze, ...; a
    regime's runs end in " [<regime>]" (" [stress]")."""
    label = _method_label(run, default_gamma)
    return label if run.regime == "natural" else f"{label} [{run.regime}]"


def _method_label(run: Run, default_gamma: float) -> str:
    base = OBJECTIVES[run.algo].label
    if run.routing != "none":
        label = {
            "freeze": "Router freeze",
            "logit_replay": "Logit replay",
            "index_replay": "Index replay",
            "rollout_replay": "R3 rollout replay",
        }[run.routing]
        return f"{label} ({base})" + (" [beyond the paper]" if run.routing == "rollout_replay" else "")
    if run.rollout_correction != "none":
        corr = CORRECTION_NAMES[run.rollout_correction].upper()
        return f"{base}{'+RS' if run.router_shift else ''}+{corr} [beyond the paper]"
    if not run.router_shift:
        return base
    label = "RSPO (GMPO+RS)" if run.algo == "gmpo" else f"{base}+RS"
    extra = []
    if abs(run.gamma_min - default_gamma) > 1e-12:
        extra.append(f"γmin={run.gamma_min:g}")
    if not run.stop_gradient:
        extra.append("no stop-grad")
    return label + (f", {', '.join(extra)}" if extra else "")


# Preset sections a kind of job never reads for its outputs. Each job carries a digest of the
# rest (``preset_digest``), so Snakemake reruns what an edit can change and nothing else; a run
# archive records the report kind's digest (rspo.archive).
_SELECTION = {"grid", "default_families", *REGIMES}  # which RL runs exist: read by train and report jobs only
_JUDGING = {"primary_claims", "regime_trials"}  # how the claims table judges the runs: report jobs only
NOT_READ: dict[str, set[str]] = {
    "data": {"rl", "eval", "resources", "mlflow", "seeds", "threads", "base_model", *_SELECTION, *_JUDGING},
    "pretrain": {"rl", "eval", "resources", "mlflow", "seeds", "threads", *_SELECTION, *_JUDGING},
    "evaluate": {"resources", "mlflow", "seeds", "threads", *_SELECTION, *_JUDGING},
    "bench": {"eval", "resources", "mlflow", "seeds", "threads", *_SELECTION, *_JUDGING},
    "report": {"resources", "mlflow", "threads", "base_model"},  # an archive records its base's digest itself
}


def preset_digest(preset: dict[str, Any], kind: str) -> str:
    """sha256 (16 hex digits) of the preset sections jobs of ``kind`` read."""
    import hashlib
    import json

    kept = {k: v for k, v in sorted(preset.items()) if k not in NOT_READ[kind]}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Plan:
    """The runs and targets of one preset (optionally with the seeds overridden)."""

    def __init__(
        self,
        preset: dict[str, Any],
        seeds: list[int] | None = None,
        full: bool = False,
        families: list[str] | None = None,
        path: str | Path | None = None,
    ):
        """``path``: the preset's file (where its relative paths start: rspo.preset.Preset.root).
        ``full``: the whole grid. Otherwise the preset's ``default_families``, or ``families``
        in their place: grid family names (``plugin``: in every regime) or a regime's family
        (``mismatch_routing``: only there)."""
        self.preset = preset
        self.spec = Preset(preset, path)
        self.name = self.spec.name if self.spec.has("preset") else ""
        self.seeds = self.spec.seeds if seeds is None else list(seeds)
        self.full = full
        self.selection = list(families) if families else None
        expanded = expand_grid(self.spec, self.seeds)
        if self.selection:
            known = sorted(set(expanded) | {base_family(k) for k in expanded})
            for fam in self.selection:
                if fam not in known:
                    raise ConfigError(f"families: {fam!r} is not a grid family of this preset; choose from {known}")
        default = self.selection or self.spec.default_families
        families = expanded
        if default is not None and not full:
            # the default target: the named families in each regime (the mechanism pair follows
            # plugin; <regime>_<name> follows <name>); `full` builds the rest of the grid too
            # a regime whose section says default_target: false only where its own family is named
            keep = set(default) | {k.removesuffix("plugin") + "mechanism" for k in default if k.endswith("plugin")}
            off = off_default_regimes(self.spec)
            families = {
                k: v
                for k, v in families.items()
                if k in keep or k == "main" or (base_family(k) in keep and k.partition("_")[0] not in off)
            }
        self.families = families
        runs = self.spec.rl()  # the typed `rl:` (its defaults where the preset sets none)
        self.default_task = runs.data.task
        self.default_gamma = runs.algorithm.gamma_min
        self.runs: dict[str, Run] = {name: run for fam in self.families.values() for name, run in fam.items()}
        self._grid_runs = {name: run for fam in expanded.values() for name, run in fam.items()}  # for check()

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_file(
        cls, path: str | Path, seeds: list[int] | None = None, full: bool = False, families: list[str] | None = None
    ) -> Plan:
        return cls(rcfg.load_preset(path), seeds, full, families, path)

    @property
    def cli_args(self) -> list[str]:
        """The report and archive commands' options that rebuild this plan's run selection."""
        if self.full:
            return ["--full"]
        return ["--families", *self.selection] if self.selection else []

    # ------------------------------------------------------------------ runs

    def family(self, name: str) -> list[str]:
        return list(self.families.get(name, {}))

    def runs_of_task(self, task: str) -> list[str]:
        return [n for n, r in self.runs.items() if r.task == task]

    @property
    def tasks(self) -> list[str]:
        """Every task that has runs, Countdown first."""
        seen = sorted({r.task for r in self.runs.values()}, key=lambda t: TASKS.index(t))
        return seen

    @property
    def main_tasks(self) -> list[str]:
        if "main" not in self.families:
            return []
        return list(grid_family("main", self.spec.grid().get("main")).tasks)

    def label(self, run: str) -> str:
        return method_label(self.runs[run], self.default_gamma)

    # ------------------------------------------------------------------ targets

    def figure_runs(self, figure: str) -> list[str]:
        """Runs a figure plots, in legend order; [] if the preset cannot build it."""
        if figure not in FIGURES:
            raise ValueError(f"unknown figure {figure!r}; choose one of {list(FIGURES)}")

        def paper_four(names: list[str]) -> list[str]:
            # GRPO, GSPO, GMPO and RSPO (= GMPO+RS): Figs. 1 and 7 of the paper.
            return [n for n in names if not self.runs[n].router_shift or self.runs[n].algo == "gmpo"]

        if paper_figure(figure) == "fig9_mismatch":  # the routing family, when it holds the rows beyond the paper
            names = self._family_runs(figure)
            beyond = any(
                self.runs[n].routing == "rollout_replay" or self.runs[n].rollout_correction != "none" for n in names
            )
            return names if beyond else []
        if figure in REGIME_FIGURES:
            names = self._family_runs(figure)
            return paper_four(names) if paper_figure(figure) in ("fig1_reward", "fig7_entropy") else names
        if figure in ("fig1_reward", "fig7_entropy", "fig6_mechanism") and "plugin" not in self.families:
            if figure == "fig1_reward" or not self.main_tasks:
                return []
            first = [n for n in self.family("main") if self.runs[n].task == self.main_tasks[0]]
            if figure == "fig6_mechanism":
                return [
                    n
                    for n in first
                    if (self.runs[n].algo, self.runs[n].router_shift) in (("grpo", False), ("gmpo", True))
                ]
            return paper_four(first)
        names = self._family_runs(figure)
        if figure in ("fig1_reward", "fig7_entropy"):
            names = paper_four(names)
        return names

    def _family_runs(self, figure: str) -> list[str]:
        """The runs of the planned grid families a figure draws (FIGURE_FAMILIES)."""
        names: list[str] = []
        for fam in FIGURE_FAMILIES.get(figure, ()):
            names += [n for n in self.families.get(fam, {}) if n not in names]
        return names

    def table_runs(self, table: str) -> dict[str, list[str]]:
        """Task -> runs a table lists (besides the base model); {} if the preset cannot build it."""
        if table == "table_countdown":
            runs = self.runs_of_task("countdown")
            return {"countdown": runs} if runs else {}
        if table == "table_main":
            return {t: [n for n in self.family("main") if self.runs[n].task == t] for t in self.main_tasks}
        if table == "table_efficiency":
            return {}
        if table == "table_claims":
            return {"countdown": self.runs_of_task("countdown")} if "plugin" in self.families else {}
        raise ValueError(f"unknown table {table!r}; choose one of {list(TABLES)}")

    def available(self, target: str) -> bool:
        if target in FIGURES:
            return bool(self.figure_runs(target))
        if target == "table_efficiency":
            return self.spec.pretrains
        if target == "table_claims":
            return bool(self.table_runs(target)) and self.spec.pretrains
        return bool(self.table_runs(target))

    def targets(self) -> list[str]:
        return [t for t in TARGETS if self.available(t)]

    # ------------------------------------------------------------------ models, data, resources

    def hub_model(self, task: str) -> str:
        """The hub id (or absolute folder) a task's runs start from; '' if pretrained here.

        Main-family runs are `rl` overlaid with `tasks.<task>` (load_train_config)."""
        return self.spec.rl(task if task in self.main_tasks else None).model.path

    def base_dir(self, task: str) -> str:
        """Relative folder of the locally pretrained base model of a task."""
        return "base" if task == "countdown" else f"base-{task}"

    def prepare_source(self, task: str) -> str:
        return self.spec.prepare_source(task) or ("hub" if self.hub_model(task) else "fallback")

    @property
    def uses_gpu(self) -> bool:
        backends = self.run_settings("rollout", "backend")
        gpus = any(self.resources(k)["gpu"] for k in RULE_KINDS)
        return "vllm" in backends or gpus

    def run_settings(self, section: str, key: str) -> set[Any]:
        """The values of ``<section>.<key>`` in the typed config of `rl:` and of `rl:` with each task
        overlay: what the runs of the preset use, e.g. the devices they train on."""
        return {getattr(getattr(self.spec.rl(task), section), key) for task in (None, *self.spec.task_overlays)}

    def resources(self, kind: str) -> dict[str, Any]:
        if kind not in DEFAULT_RESOURCES:
            raise ValueError(f"unknown rule kind {kind!r}; choose one of {list(DEFAULT_RESOURCES)}")
        res = dict(DEFAULT_RESOURCES[kind])
        res.update(self.spec.resources(kind))
        if res["threads"] is None:
            res["threads"] = self.spec.threads
        return res

    # ------------------------------------------------------------------ deep validation

    def check(self) -> None:
        """Resolve every run of the grid (this plan's seeds, every family) into a TrainConfig (raises
        ConfigError), from the expansion the plan already holds.

        The schema checks keys, types and ranges; this adds the cross-field checks of the
        dataclasses (mini-batch divides the batch, ...) and that every batch splits over the
        train jobs' data-parallel processes (resources.train.processes), before any job starts."""
        processes = int(self.resources("train")["processes"])
        for run in self._grid_runs.values():
            rcfg.check_world_size(train_config(self.spec, run), processes)


# ---------------------------------------------------------------------------- schema validation


def _key_path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def validate_preset(preset: dict[str, Any], schema_path: str | Path, where: str = "preset") -> None:
    """Check a preset against the JSON schema; raise ConfigError naming the first bad key.

    ``rl.algorithm.gamma_min: 1.5 is greater than the maximum of 1`` or
    ``rl.algorithm.foo: unknown key; valid keys are [...]``."""
    import jsonschema
    import yaml

    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = list(validator.iter_errors(preset))
    if not errors:
        return
    # Report the first offending key (in key order), and of its errors the most relevant one.
    first = min(errors, key=lambda e: [str(p) for p in e.absolute_path])
    err = jsonschema.exceptions.best_match([e for e in errors if list(e.absolute_path) == list(first.absolute_path)])
    path = list(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = sorted(err.schema.get("properties") or {})
        unknown = sorted(set(err.instance) - set(allowed))
        key = _key_path(path + unknown[:1])
        if (why := removed_reason(key)) is not None:
            raise ConfigError(f"{where}: {why}")
        raise ConfigError(f"{where}: {key}: unknown key; valid keys are {allowed}")
    raise ConfigError(f"{where}: {_key_path(path) or '(top level)'}: {err.message}")
