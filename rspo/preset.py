"""A preset (``configs/<name>.yaml``) as one object: what a command asks of it, answered in one place.

    preset = Preset.load("configs/small.yaml")
    preset.name                          # "small" (the file's `preset:`, else its stem)
    preset.rl()                          # the training config of the preset's `rl:` (a TrainConfig)
    preset.rl("math")                    # ... with the task's overlay (`tasks.math`) merged in
    preset.rl("countdown", "mismatch")   # ... and a regime's (`mismatch.rl`)
    preset.evaluation("countdown")       # the settings of `eval.countdown` (a CountdownEval)
    preset.countdown_splits              # the Countdown splits evaluated (eval.countdown.splits)
    preset.pretraining()                 # the `pretrain:` section (a PretrainConfig)
    preset.architecture("math")          # the architecture of a task's model pretrained here
    preset.resources("train")            # `resources.train`: the settings it gives (rspo.plan adds defaults)
    preset.base_pin                      # `base_model:` (path, sha256) of a committed base, or None
    preset.regime_trials                 # `regime_trials:`, the regime search's sweep files (Paths), or ()
    preset.regime_records()              # their committed records (trials.jsonl Paths), each checked

The defaults of the training settings are the dataclasses' of ``rspo.config`` (a value a command
needs from `rl:` is read from ``rl(...)``, never from the YAML with a default of its own), and the
overlays are merged the way a training run merges them (``rspo.grid.load_train_config`` builds its
run's config from ``rl_section``). The other sections are typed too (rspo.study_config,
rspo.pretrain_config, rspo.eval_config), their defaults stated there once. The grid's sections
(`grid:`, the regimes, `tasks:`) are handed out as written, to be merged the way a run merges them:
rspo.grid types, expands and checks them (``grid_family``, ``build_regime``). Nothing else in
the package reads a preset's mapping (``data``: the schema's validation and the digests of
rspo.plan take it whole); tests/test_preset.py greps for it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from rspo import config as rcfg
from rspo.config import ConfigError, TrainConfig, build_checked
from rspo.eval_config import COUNTDOWN_EVAL_SPLITS, build_eval
from rspo.pretrain_config import ArchConfig, PretrainConfig, build_pretrain
from rspo.study_config import BaseModelPin, Mlflow, Prepare, PresetSpec, Resources

__all__ = ["COUNTDOWN_EVAL_SPLITS", "Preset", "deep_update"]


def deep_update(base: dict[str, Any], extra: dict[str, Any]) -> None:
    """Merge ``extra`` into ``base`` in place, mapping by mapping (an overlay's value wins)."""
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            deep_update(base[k], v)
        else:
            base[k] = v


class Preset:
    """One loaded preset; ``data`` is its mapping as read from the YAML (not to be changed)."""

    def __init__(self, data: dict[str, Any], path: str | Path | None = None):
        if not isinstance(data, dict):
            raise ConfigError(f"a preset must be a mapping, got {type(data).__name__}")
        self.data = data
        self.path = Path(path) if path is not None else None

    @classmethod
    def load(cls, path: str | Path) -> Preset:
        """Read a preset file (clear errors for a missing file, bad YAML, a non-mapping)."""
        return cls(rcfg.load_preset(path), path)

    @property
    def name(self) -> str:
        """The preset's `preset:` name, else its file's stem, else "preset"."""
        if "preset" in self.data:
            return str(self.data["preset"])
        return self.path.stem if self.path is not None else "preset"

    @property
    def seeds(self) -> list[int]:
        """The preset's `seeds:` (PresetSpec's default where unset); checked where the grid is expanded
        (rspo.grid)."""
        return list(self.data.get("seeds", PresetSpec.default("seeds")))

    @property
    def default_families(self) -> list[str] | None:
        """The grid families its default target builds (`default_families:`); None: all of them."""
        fams = self.data.get("default_families", PresetSpec.default("default_families"))
        return None if fams is None else list(fams)

    @property
    def primary_claims(self) -> list[str] | None:
        """The claims table's pre-registered primary family (`primary_claims:`); None: every claim's."""
        keys = self.data.get("primary_claims", PresetSpec.default("primary_claims"))
        return None if keys is None else list(keys)

    def grid(self) -> Any:
        """The `grid:` section as written (a copy; {} when absent); rspo.grid expands and checks it."""
        return copy.deepcopy(self.data.get("grid") or {})

    def section(self, name: str) -> Any:
        """A top-level section as written (a copy; None when absent): a regime's (rspo.grid checks it)."""
        return copy.deepcopy(self.data.get(name))

    def has(self, name: str) -> bool:
        """Whether the preset has a top-level section ``name``."""
        return name in self.data

    def with_grid(self, grid: dict[str, Any], drop: tuple[str, ...] = ()) -> Preset:
        """The same preset with another `grid:` and without the sections in ``drop``."""
        data = {k: v for k, v in self.data.items() if k not in drop}
        return Preset({**data, "grid": grid}, self.path)

    @property
    def task_overlays(self) -> dict[str, Any]:
        """`tasks:`: task name -> its overlay of the rl section, as written (a copy)."""
        return copy.deepcopy(dict(self.data.get("tasks") or {}))

    @property
    def base_pin(self) -> BaseModelPin | None:
        """`base_model:`, the committed Countdown base the study starts from (None: pretrained here)."""
        return self._typed("base_model", BaseModelPin) if self.data.get("base_model") is not None else None

    @property
    def root(self) -> Path:
        """The folder a preset's relative paths start from: the repository root, the nearest folder
        above the preset file that holds a Snakefile and configs/ (for configs/<name>.yaml, and for an
        archive's copy of it under docs/results/<name>/); else the one above the preset file's folder;
        the working directory for a preset without a file."""
        if self.path is None:
            return Path.cwd()
        here = self.path.resolve().parent
        for folder in (here, *here.parents):
            if (folder / "Snakefile").is_file() and (folder / "configs").is_dir():
                return folder
        return here.parent

    @property
    def regime_trials(self) -> tuple[Path, ...]:
        """`regime_trials:`, the sweep files of the regime search (one path or a list, in the order the
        rounds ran; a relative path starts at ``root``); () when unset."""
        value = self.data.get("regime_trials")
        if value is None:
            return ()
        paths = [Path(str(v)) for v in ([value] if isinstance(value, str) else value)]
        return tuple(p if p.is_absolute() else self.root / p for p in paths)

    def regime_records(self) -> tuple[Path, ...]:
        """The committed records of `regime_trials:` (each sweep file's ``record:``, its trials.jsonl), in
        the same order, each checked to hold trials of its file (rspo.sweep_file); a ConfigError names
        the sweep file and what is wrong (no such file, no ``record:``, no record there, a line of
        another search)."""
        from rspo.jsonl import iter_jsonl
        from rspo.sweep_file import load_sweep

        key = f"{self.path or self.name}: regime_trials"
        records = []
        for sweep in self.regime_trials:
            try:
                spec = load_sweep(sweep)
            except ConfigError as e:  # its message names the file
                raise ConfigError(f"{key}: {e}") from None
            try:
                record = spec.record_file(self.root)
                if not record.is_file():
                    raise ConfigError(f"record: {record.parent} holds no trials.jsonl (its committed record)")
                spec.check_record([row for _, row in iter_jsonl(record)], record)
            except ValueError as e:  # a ConfigError, or a record line that is not a JSON object
                raise ConfigError(f"{key}: {sweep}: {e}") from None
            records.append(record)
        return tuple(records)

    @property
    def pretrains(self) -> bool:
        """Whether the preset pretrains its Countdown model here (a `pretrain:` section)."""
        return bool(self.data.get("pretrain"))

    def prepare_source(self, task: str) -> str:
        """`prepare.<task>.source` (hub | fallback | a path); "" when not set (rspo.plan decides)."""
        return getattr(self._typed("prepare", Prepare), task).source or ""

    def resources(self, kind: str) -> dict[str, Any]:
        """The settings `resources.<kind>` gives ({} when none; checked, rspo.study_config.JobResources);
        rspo.plan fills in the kind's defaults."""
        return getattr(self._typed("resources", Resources), kind).given()

    @property
    def threads(self) -> int:
        """`threads:`: each job's CPU threads where `resources` does not say (PresetSpec's default)."""
        return int(self.data.get("threads", PresetSpec.default("threads")))

    @property
    def mlflow_experiment(self) -> str:
        """The preset's `mlflow.experiment`; "" when not set (rspo.tracking.experiment_name)."""
        return self._typed("mlflow", Mlflow).experiment or ""

    def _typed(self, name: str, cls: type) -> Any:
        """The top-level section ``name`` as its dataclass ``cls`` (defaults where unset), checked."""
        return build_checked(cls, copy.deepcopy(self.data.get(name)), name)

    # --------------------------------------------------------------------- training

    def rl_section(self, task: str | None = None, regime: str | None = None) -> dict[str, Any]:
        """The `rl:` mapping of a run (a deep copy): the preset's `rl:`, then the task's overlay
        (`tasks.<task>`, where the preset has one), then the regime's (`<regime>.rl`)."""
        rl = copy.deepcopy(self.data.get("rl") or {})
        overlay = (self.data.get("tasks") or {}).get(task) if task else None
        if overlay:
            deep_update(rl, copy.deepcopy(overlay))
        if regime:
            if not isinstance(self.data.get(regime), dict) or "rl" not in self.data[regime]:
                raise ConfigError(f"{regime}.rl: the preset has no `{regime}:` section with an `rl:` overlay")
            deep_update(rl, copy.deepcopy(self.data[regime]["rl"]))
        return rl

    def rl(self, task: str | None = None, regime: str | None = None) -> TrainConfig:
        """The training config of the preset's `rl:` with the task's and the regime's overlays,
        every setting the preset leaves out at its default (rspo.config)."""
        return rcfg.train_config_from_dict(self.rl_section(task, regime), preset=self.name)

    # --------------------------------------------------------------------- evaluation, pretraining

    def evaluation(self, family: str, overrides: dict[str, Any] | None = None):
        """The typed settings of `eval.<family>` (rspo.eval_config: CountdownEval, MathEval,
        CodeEval; its defaults where the preset sets none), ``overrides`` (a command's flags) on
        top, checked: a ConfigError names the key."""
        return build_eval(family, copy.deepcopy((self.data.get("eval") or {}).get(family)), overrides)

    @property
    def evaluated(self) -> list[str]:
        """The families the preset's `eval:` section sets (countdown, math, code)."""
        return list(self.data.get("eval") or {})

    @property
    def countdown_splits(self) -> list[str]:
        """The Countdown splits an evaluation scores and the tables report."""
        return list(self.evaluation("countdown").splits)

    def pretraining(self) -> PretrainConfig:
        """The `pretrain:` section, typed (rspo.pretrain_config; its defaults where the preset sets none)."""
        return build_pretrain(copy.deepcopy(self.data.get("pretrain")))

    def architecture(self, task: str) -> ArchConfig:
        """The architecture of the model pretrained here for a task: `pretrain.model`, and for math and
        code `pretrain.text_model` on top (PretrainConfig.architecture)."""
        return self.pretraining().architecture(task)
