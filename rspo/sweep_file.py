"""A regime search's sweep file, typed (no torch): ``load_sweep(path)`` -> ``SweepFile``, every mistake a
ConfigError that names its key, like a preset's sections (rspo.constraints).

    preset: configs/small.yaml          # the preset whose rl: section each trial overrides
    work: results/sweeps/small-round5   # where the workflow's trial jobs write (rspo.sweep)
    record: docs/results/trials/small-round5   # where its record is committed (a preset's regime_trials)
    val_every: 20                       # greedy validation every this many steps ...
    val_size: 200                       # ... on the first this many `val` problems
    bases:                              # pretrained bases by name: pretrain overrides of the preset,
      4L-180k: {examples: 180000}       #   {pinned: true} (the preset's own base), or a base pretrained
      kept: {committed: DIR, sha256: HEX, examples: 180000}   # once and committed (its digest checked)
    trials:
      - name: r5a-x150-at100
        base: 4L-180k
        steps: 230
        set: [optim.router_lr_mult_final=150, "optim.router_lr_change=[100, 100]"]
        runs: {grpo: [0, 1, 2, 3, 4], gmpo+freeze: [0, 1, 2]}   # method -> seeds
        note: why this trial, written before it ran

A method is ``<algo>[+rs][+<routing mode>]`` (``method_sets``: its `rspo train` overrides). Deviation
from the preset's grid: a trial's methods keep this grammar, not the grid's run names (``gmpo-freeze``),
because the committed records (rounds 3-5) name their runs by it and the gate code reads them so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rspo.config import ConfigError, build_checked
from rspo.constraints import REQUIRED, Section, setting


def method_sets(method: str) -> list[str]:
    """A trial's method -> its ``--set`` overrides: ``<algo>`` with optional ``+rs`` and
    ``+<routing mode>`` (``gmpo``, ``grpo+rs``, ``gmpo+freeze``)."""
    from rspo.method import ALGOS, ROUTING_MODES

    algo, *plus = method.split("+")
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r}; choose one of {list(ALGOS)}")
    unknown = [p for p in plus if p != "rs" and p not in ROUTING_MODES]
    if unknown or len(set(plus)) != len(plus) or len([p for p in plus if p != "rs"]) > 1:
        raise ValueError(f"expected <algo>[+rs][+<routing mode>] with a mode of {list(ROUTING_MODES)}, got {method!r}")
    routing = next((p for p in plus if p != "rs"), "none")
    return [
        f"algorithm.algo={algo}",
        f"algorithm.router_shift={'true' if 'rs' in plus else 'false'}",
        f"algorithm.routing={routing}",
    ]


@dataclass(frozen=True, eq=False)  # a trial is itself (its runs are a mapping): compared by identity
class Trial(Section):
    name: str = setting(REQUIRED, nonempty=True)
    base: str = setting(REQUIRED, nonempty=True)
    """A base of the file's ``bases``."""
    steps: int = setting(REQUIRED, ge=1)
    runs: dict[str, tuple[int, ...]] = setting(REQUIRED, nonempty=True)
    """Method -> seeds."""
    set: tuple[str, ...] = ()
    """Overrides of the preset's ``rl:`` (``optim.router_lr_mult=150``), as `rspo train --set` takes them."""
    note: str = ""

    def checks(self, prefix: str) -> None:
        for method, seeds in self.runs.items():
            try:
                method_sets(method)
            except ValueError as e:
                raise ConfigError(f"{prefix}.runs.{method}: {e}") from None
            if not seeds:
                raise ConfigError(f"{prefix}.runs.{method}: no seeds")
        bad = [x for x in self.set if "=" not in x]
        if bad:
            raise ConfigError(f"{prefix}.set: {bad[0]!r} is not KEY=VALUE")

    def methods(self) -> list[tuple[str, int]]:
        """(method, seed) of every run of the trial, in the file's order."""
        return [(method, seed) for method, seeds in self.runs.items() for seed in seeds]

    def record(self) -> dict[str, Any]:
        """What a record's line keeps of the trial's definition."""
        return {"name": self.name, "base": self.base, "steps": self.steps, "set": list(self.set), "note": self.note}


@dataclass(frozen=True)
class SweepFile(Section):
    preset: str = setting(REQUIRED, nonempty=True)
    work: str = setting(REQUIRED, nonempty=True)
    bases: dict[str, dict[str, Any] | None] = setting(REQUIRED, nonempty=True)
    """Base name -> pretrain overrides, ``{pinned: true}`` or ``{committed: DIR, sha256: HEX, ...}``."""
    trials: tuple[Trial, ...] = setting(REQUIRED, nonempty=True)
    val_every: int = setting(10, ge=1)
    val_size: int = setting(200, ge=1)
    record: str | None = setting(None, nonempty=True)
    """The folder of this search's committed record (``trials.jsonl``, ``trials.md`` and, where its trials
    have a router-lr schedule, ``steps.tar.xz``), relative to the repository root: what the claims table
    reads where a preset's ``regime_trials:`` names this file. `make trials` writes the record under
    ``work``; committing it is copying it here. Unset: the file has no committed record, and no preset
    may name it."""

    def checks(self, prefix: str) -> None:
        for name, over in self.bases.items():
            over = over or {}
            if over.get("pinned") and set(over) != {"pinned"}:
                raise ConfigError(f"bases.{name}: a pinned base (the preset's base_model) takes no pretrain overrides")
            if "committed" in over and "sha256" not in over:
                raise ConfigError(f"bases.{name}: a committed base names its weights' sha256 (committed, sha256)")
        for i, t in enumerate(self.trials):
            t.validate(f"trials[{i}]")
        first: dict[str, Trial] = {}
        for i, t in enumerate(self.trials):  # a name again adds runs to the same setting (more seeds)
            seen = first.setdefault(t.name, t)
            if (seen.base, seen.steps, seen.set) != (t.base, t.steps, t.set):
                raise ConfigError(f"trials[{i}]: {t.name!r} is named before with another base, steps or set")
        for i, t in enumerate(self.trials):
            if t.base not in self.bases:
                raise ConfigError(f"trials[{i}].base: {t.base!r} is not one of {sorted(self.bases)}")

    def base(self, name: str) -> dict[str, Any]:
        return self.bases[name] or {}

    def trial(self, name: str) -> Trial:
        """The trial of this name (the first entry: a later one with the name has the same setting)."""
        found = [t for t in self.trials if t.name == name]
        if not found:
            raise ConfigError(f"no trial {name!r}; the file's trials are {[t.name for t in self.trials]}")
        return found[0]

    def record_file(self, root: Path) -> Path:
        """The committed record's ``trials.jsonl`` (``record`` relative to ``root``, the repository root)."""
        if self.record is None:
            raise ConfigError("record: unset (the folder of the search's committed record)")
        folder = Path(self.record)
        return (folder if folder.is_absolute() else root / folder) / "trials.jsonl"

    def check_record(self, rows: list[dict[str, Any]], where: str | Path) -> None:
        """Every line of a record (``rows``, read from ``where``) is a trial of this file, with the base,
        steps and setting the file gives it: a record of another search is refused, naming the line."""
        names = {t.name for t in self.trials}
        for i, row in enumerate(rows, 1):
            name = row.get("name")
            if name not in names:
                raise ConfigError(f"{where}, line {i}: trial {name!r} is not one of the sweep file's {sorted(names)}")
            t = self.trial(name)
            ran = (row.get("base"), row.get("steps"), list(row.get("set") or []))
            if ran != (t.base, t.steps, list(t.set)):
                raise ConfigError(
                    f"{where}, line {i}: trial {name!r} ran base {ran[0]!r}, {ran[1]} steps, set {ran[2]}; "
                    f"the sweep file gives base {t.base!r}, {t.steps} steps, set {list(t.set)}"
                )

    def lines(self) -> list[str]:
        """The record's line names, one per entry in the file's order: ``<position>-<name>``."""
        return [f"{i:02d}-{t.name}" for i, t in enumerate(self.trials)]


def load_sweep(path: str | Path) -> SweepFile:
    """The sweep file at ``path``, typed and checked (a ConfigError naming the file and the key)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file not found: {path}")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a sweep must be a mapping")
    trials = data.get("trials")
    if isinstance(trials, list):  # each trial a section of its own, so that its key is named
        for i, t in enumerate(trials):
            if not isinstance(t, dict):
                raise ConfigError(f"{path}: trials[{i}]: expected a mapping")
    try:
        return build_checked(SweepFile, data, "")
    except ConfigError as e:
        raise ConfigError(f"{path}: {str(e).lstrip('.')}") from None
