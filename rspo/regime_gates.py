"""The registered gates of the regime search, and what a trials record says about them.

The search for a regime in which the paper's Sec. 3 and plug-in claims can be tested at this scale
(configs/sweeps/small.yaml, rounds 3 and 4) judges non-RS trial runs by two gates, each written in
the sweep file before its runs:

- the Sec. 3 gate (round 3's g1-g3): GRPO collapses after step ``GATE_LATE`` in at least
  ``GATE_SEEDS`` of its seeds (g1), GMPO collapses in none (g2), GMPO with a frozen router collapses
  in none (g3; not run in every trial);
- the plug-in gate P(X) (round 4), for X in GRPO, GSPO, GMPO: X learns first, its best
  ``WINDOW``-step training-reward window at least ``GATE_LEARN`` above its first in every seed (p1);
  then collapses after step ``GATE_LATE`` in at least ``GATE_SEEDS`` seeds (p2); X with a frozen router
  collapses in none (p3; run only where p1, p2 and p4 hold); and RS would act on its drift over the
  steps before its collapse (p4; rspo.run_record.rs_acts: mean router-shift ratio at most 0.99 or at
  least 1% of the response tokens under gamma_min). p1 is round 4's registered criterion, not the
  study's "learned" (rspo.run_record): round 4's record keeps each run's gain, not its steps.

Round 5 (configs/sweeps/small-round5.yaml) asks for drift that starts after the policy learned, with
a noise-calibrated learn test L1 (``LEARN_MIN``: a flat series passes it with probability <= 5% per seed):

- the learn-then-drift gate L(X), for X at seeds 0-4 and X+freeze at seeds 0-2, the router's lr x1
  until step S, then raised: X learned by S (L1) with held-out at S at least the base's minus
  ``HELDOUT_DROP`` (L2), in every seed; X collapses after S in at least ``DRIFT_SEEDS`` seeds (L3); X+freeze
  collapses in none (L4); RS would act after S, the claims table's rule over the steps after S and
  before the collapse (L5);
- the build-up gate D (the router's lr rising from step 0): GRPO learned by step ``BUILDUP_S`` (D0) and
  collapses after it in at least ``GATE_SEEDS`` of 3 seeds (D1); GMPO (D2) and GMPO+freeze (D3) never.

Their measures are read from each run's per-step metrics (``drift_measures``), which round 5's record
ships (steps.tar.xz), so every gate outcome can be recomputed from the steps.

``gate_measures`` is what `rspo sweep` records of each run for P(X); ``plugin_gate`` and ``sec3_gate``
judge one trial; ``search_outcome`` reads a whole trials record (the JSON lines `rspo sweep` writes)
and says, per gate, how many trials it judged and which met it. The claims table reads that outcome
for a preset that names its search (`regime_trials:`): where no trial met a gate and the preset has
no regime chosen by it, the rows that gate guards read "not testable: no regime found on the searched axes"
(rspo.report.claims).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rspo.jsonl import iter_jsonl
from rspo.run_record import REWARD, Steps, learn_bar, learn_gain, noise_sd, onset, rs_acts, val_score

WINDOW = 10  # steps averaged at the start and at the end of a run

GATE_LEARN = 0.02  # p1: best window >= first window + 2 points (the claims table's margin for a drop)
GATE_LATE = 40  # g1, p2: a collapse after this step ...
GATE_SEEDS = 2  # ... in at least this many of the seeds
PLUGIN_ALGOS = ("grpo", "gspo", "gmpo")

LEARN_BEFORE = 20  # L1: the mean reward of the steps S-19..S against the first FIRST_STEPS'
LEARN_MIN = learn_bar(LEARN_BEFORE)  # 0.048: "learned" (rspo.run_record), a flat series passes with 5% per seed
HELDOUT_DROP = 0.02  # L2: held-out at S at least the base's minus this
DRIFT_SEEDS = 3  # L3: collapses after S in at least this many of the 5 seeds
BUILDUP_S = 100  # D: the learn-first step of the build-up trials


def gate_measures(steps: Steps, collapse_step: int | None) -> dict[str, float]:
    """What the plug-in gate P(X) reads from one run: ``learn_gain``, its best ``WINDOW``-step
    sliding mean training reward minus its first window's (p1); ``pre_gamma``, the mean per-step
    router-shift ratio, and ``pre_under_gmin``, the mean per-step share of tokens under gamma_min,
    over the steps before its collapse (all steps where it does not collapse; its first step where
    it collapsed on it) (p4)."""
    first, reward = steps.series(REWARD)
    windows = [statistics.mean(reward[i : i + WINDOW]) for i in range(max(1, len(reward) - WINDOW + 1))]
    gamma, under = steps.rs_activity(until=collapse_step)
    if math.isnan(gamma):  # collapsed on its first step
        gamma, under = steps.rs_activity(until=first[0] + 1)
    return {"learn_gain": max(windows) - windows[0], "pre_gamma": gamma, "pre_under_gmin": under}


def _late(runs: list[dict[str, Any]]) -> int:
    return _after(runs, GATE_LATE)


def plugin_gate(runs: list[dict[str, Any]], freeze: list[dict[str, Any]] | None) -> dict[str, Any]:
    """P(X) for one algorithm's runs of a setting (``freeze``: X+freeze's runs of the same setting,
    None when not run): each criterion's value and verdict, and the outcome ("meets", "fails: p1, p2",
    or "pending p3" when p1, p2 and p4 hold and the frozen-router runs are still to come)."""
    gamma = statistics.mean(r["pre_gamma"] for r in runs)
    under = statistics.mean(r["pre_under_gmin"] for r in runs)
    verdict = {
        "p1": all(r["learn_gain"] >= GATE_LEARN for r in runs),
        "p2": _late(runs) >= GATE_SEEDS,
        "p4": rs_acts(gamma, under),
        "p3": None if freeze is None else not any(r["collapsed"] for r in freeze),
    }
    failed = [k for k in ("p1", "p2", "p3", "p4") if verdict[k] is False]
    outcome = f"fails: {', '.join(failed)}" if failed else "pending p3" if verdict["p3"] is None else "meets"
    return {
        **verdict,
        "learn_gain": [r["learn_gain"] for r in runs],
        "collapse_steps": [onset(r) for r in runs],
        "pre_gamma": gamma,
        "pre_under_gmin": under,
        "freeze_collapsed": None if freeze is None else sum(r["collapsed"] for r in freeze),
        "freeze_n": None if freeze is None else len(freeze),
        "outcome": outcome,
    }


def sec3_gate(grpo: list[dict[str, Any]], gmpo: list[dict[str, Any]], freeze: list[dict[str, Any]] | None) -> str:
    """Round 3's gate on one setting's GRPO, GMPO and GMPO+freeze runs (None: not run): "meets",
    "fails: g1, g2" or "pending g3" (g1 and g2 hold, the frozen-router runs still to come)."""
    verdict = {
        "g1": _late(grpo) >= GATE_SEEDS,
        "g2": not any(r["collapsed"] for r in gmpo),
        "g3": None if freeze is None else not any(r["collapsed"] for r in freeze),
    }
    failed = [k for k, v in verdict.items() if v is False]
    return f"fails: {', '.join(failed)}" if failed else "pending g3" if verdict["g3"] is None else "meets"


def _same_setting(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("base", "steps", "set"))


def _runs(rows: list[dict[str, Any]], trial: dict[str, Any], method: str) -> list[dict[str, Any]]:
    """``method``'s runs of ``trial``'s setting, from every trial of the record with the same base,
    steps and setting (X+freeze may be added as a trial of its own)."""
    return [r for u in rows if _same_setting(u, trial) for r in u["runs"] if r["algo"] == method]


def plugin_outcomes(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str, dict[str, Any]]]:
    """(trial, X, P(X)) for every trial of the record whose runs carry the gate's measures and whose
    router lr has no schedule, and every algorithm X it ran without a routing mode or RS, in the
    record's order."""
    out = []
    for t in rows:
        if not t["runs"] or "learn_gain" not in t["runs"][0] or router_lr_change(t) is not None:
            continue  # (a scheduled trial is judged by round 5's gates: drift_outcomes)
        for algo in [a for a in t.get("runs_spec", {}) if "+" not in a]:
            runs = [r for r in t["runs"] if r["algo"] == algo]
            frozen = _runs(rows, t, f"{algo}+freeze")
            out.append((t, algo, plugin_gate(runs, frozen or None)))
    return out


def sec3_outcomes(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """(trial, Sec. 3 gate outcome) for every trial of the record that ran both GRPO and GMPO with an
    unscheduled router lr."""
    out = []
    for t in rows:
        grpo = [r for r in t["runs"] if r["algo"] == "grpo"]
        gmpo = [r for r in t["runs"] if r["algo"] == "gmpo"]
        if grpo and gmpo and router_lr_change(t) is None:  # a scheduled trial is judged by gate D
            out.append((t, sec3_gate(grpo, gmpo, _runs(rows, t, "gmpo+freeze") or None)))
    return out


class TrialsError(ValueError):
    pass


def read_trials(path: str | Path) -> list[dict[str, Any]]:
    """The trial rows of a record (one JSON object per line, rspo.jsonl), checked."""
    p = Path(path)
    if not p.is_file():
        raise TrialsError(f"regime trials {p}: no such file")
    try:
        lines = list(iter_jsonl(p))
    except ValueError as e:  # a line that is not JSON, or not an object
        raise TrialsError(f"regime trials {e}") from None
    for i, row in lines:
        if not isinstance(row.get("runs"), list) or "name" not in row:
            raise TrialsError(f"regime trials {p}, line {i}: not a trial row (needs 'name' and a list 'runs')")
    rows = [row for _, row in lines]
    if not rows:
        raise TrialsError(f"regime trials {p}: no trials")
    return rows


@dataclass(frozen=True)
class GateSearch:
    """What a search found for one gate: the trials it judged and those that met it."""

    gate: str
    """"P(grpo)", "P(gspo)", "P(gmpo)" or "Sec. 3 (g1-g3)"."""
    judged: tuple[str, ...]
    met: tuple[str, ...]

    @property
    def found(self) -> bool:
        return bool(self.met)


def search_outcome(
    rows: list[dict[str, Any]], steps_of: Callable[[str, str, int], Steps] | None = None
) -> dict[str, GateSearch]:
    """Per gate ("sec3", "grpo", "gspo", "gmpo"), the trials that judged it and those that met it; a
    trial still "pending" its frozen-router runs has not met it. Round 5's scheduled trials count too
    (``steps_of``: their runs' per-step metrics, ``steps_in_pack``): L(X) for X's gate, D for Sec. 3's;
    a record with scheduled trials and no ``steps_of`` is refused."""
    if steps_of is None and any(router_lr_change(t) is not None for t in rows):
        raise TrialsError("the record has round 5's scheduled trials: their gates need the runs' steps (steps.tar.xz)")
    drift = drift_outcomes(rows, steps_of) if steps_of is not None else []
    plugin = plugin_outcomes(rows)
    judged = {
        "sec3": [("Sec. 3 (g1-g3)", t, o) for t, o in sec3_outcomes(rows)]
        + [("D", t, g["outcome"]) for t, gate, _, g in drift if gate == "D"],
        **{
            algo: [(f"P({algo})", t, g["outcome"]) for t, x, g in plugin if x == algo]
            + [(f"L({algo})", t, g["outcome"]) for t, gate, x, g in drift if gate == "L" and x == algo]
            for algo in PLUGIN_ALGOS
        },
    }
    default = {"sec3": "Sec. 3 (g1-g3)", **{a: f"P({a})" for a in PLUGIN_ALGOS}}
    return {
        key: GateSearch(
            " / ".join(dict.fromkeys(name for name, _, _ in found)) or default[key],
            tuple(t["name"] for _, t, _ in found),
            tuple(t["name"] for _, t, o in found if o == "meets"),
        )
        for key, found in judged.items()
    }


def trial_folder(name: str, folder: str) -> bool:
    """Whether a run folder's trial part ``<name>-<12 hex>`` (rspo sweep's) belongs to trial ``name``."""
    head, _, key = folder.rpartition("-")
    return head == name and len(key) == 12 and all(c in "0123456789abcdef" for c in key)


def steps_in_pack(path: str | Path) -> Callable[[str, str, int], Steps]:
    """(trial name, method, seed) -> that run's per-step metrics, from a record's steps.tar.xz (rspo
    sweep's pack_steps), read once."""
    import tarfile

    path = Path(path)
    if not path.is_file():
        raise TrialsError(f"{path}: no such file (the per-step metrics of the record's runs)")
    with tarfile.open(path) as tf:
        texts = {m.name: tf.extractfile(m).read().decode() for m in tf.getmembers() if m.name.endswith("metrics.jsonl")}

    def steps_of(name: str, method: str, seed: int) -> Steps:
        found = [
            n for n in texts if n.endswith(f"/{method}-s{seed}/metrics.jsonl") and trial_folder(name, n.split("/")[0])
        ]
        if len(found) != 1:
            raise TrialsError(f"{path}: {len(found)} metrics.jsonl for {name} {method} seed {seed}, expected one")
        return Steps.from_text(texts[found[0]], f"{path}:{found[0]}")

    return steps_of


def record_steps(record: Path) -> Callable[[str, str, int], Steps] | None:
    """The per-step metrics of a record's runs (its steps.tar.xz beside it), or None where it has none."""
    pack = Path(record).parent / "steps.tar.xz"
    return steps_in_pack(pack) if pack.is_file() else None


# ----------------------------------------------------------------------------- round 5: drift after learning


def drift_measures(steps: Steps, start: int, collapse_step: int | None) -> dict[str, Any]:
    """What round 5's gates read from one run's per-step metrics, for drift that starts after step
    ``start``: ``learn``, rspo.run_record's learn gain of the window of steps start-19..start (L1, D0);
    ``noise``, the per-step reward noise over steps 1..start; ``heldout_base`` and ``heldout_at_s``, the
    greedy held-out score at steps 0 and ``start`` (None where not validated); ``post_gamma`` and
    ``post_under``, the mean per-step router-shift ratio and share of tokens under gamma_min over the
    steps after ``start`` and before the collapse (L5; None where there are none)."""
    reward = steps.values(REWARD)
    if len(reward) < start or start < LEARN_BEFORE:
        raise ValueError(
            f"drift_measures: {len(reward)} training steps, need at least start = {start} >= {LEARN_BEFORE}"
        )
    val = steps.at(val_score())
    gamma, under = steps.rs_activity(after=start, until=collapse_step)
    return {
        "learn": learn_gain(reward, reward[start - LEARN_BEFORE : start]),
        "noise": noise_sd(reward[:start]),
        "heldout_base": val.get(0),
        "heldout_at_s": val.get(start),
        "post_gamma": None if math.isnan(gamma) else gamma,
        "post_under": None if math.isnan(under) else under,
    }


def _after(runs: list[dict[str, Any]], start: int) -> int:
    """How many of the runs collapsed after step ``start``."""
    return sum((onset(r) or 0) > start for r in runs)


def _outcome(verdict: dict[str, bool | None], pending: str) -> str:
    failed = [k for k, v in verdict.items() if v is False]
    return f"fails: {', '.join(failed)}" if failed else f"pending {pending}" if None in verdict.values() else "meets"


def learn_then_drift_gate(
    runs: list[dict[str, Any]], freeze: list[dict[str, Any]] | None, start: int
) -> dict[str, Any]:
    """L(X) on X's runs (each with ``drift_measures`` and collapsed / collapse_step) and X+freeze's
    (None: not run yet): each criterion's verdict and values, and the outcome ("meets", "fails: L1, L3",
    "pending L4")."""
    post = [r for r in runs if r["post_gamma"] is not None]
    gamma = statistics.mean(r["post_gamma"] for r in post) if post else None
    under = statistics.mean(r["post_under"] for r in post) if post else None
    verdict = {
        "L1": all(r["learn"] >= LEARN_MIN for r in runs),
        "L2": all(
            r["heldout_at_s"] is not None and r["heldout_at_s"] >= r["heldout_base"] - HELDOUT_DROP for r in runs
        ),
        "L3": _after(runs, start) >= DRIFT_SEEDS,
        "L4": None if freeze is None else not any(r["collapsed"] for r in freeze),
        "L5": gamma is not None and rs_acts(gamma, under),
    }
    return {
        **verdict,
        "outcome": _outcome(verdict, "L4"),
        "learn": [r["learn"] for r in runs],
        "noise": max(r["noise"] for r in runs),
        "heldout": [(r["heldout_base"], r["heldout_at_s"]) for r in runs],
        "collapse_steps": [onset(r) for r in runs],
        "post_gamma": gamma,
        "post_under": under,
        "freeze_collapsed": None if freeze is None else sum(r["collapsed"] for r in freeze),
        "freeze_n": None if freeze is None else len(freeze),
    }


def buildup_gate(
    grpo: list[dict[str, Any]], gmpo: list[dict[str, Any]], freeze: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """D on the build-up trials' runs (``drift_measures`` at ``BUILDUP_S``): verdicts and outcome."""
    verdict = {
        "D0": all(r["learn"] >= LEARN_MIN for r in grpo),
        "D1": _after(grpo, BUILDUP_S) >= GATE_SEEDS,
        "D2": not any(r["collapsed"] for r in gmpo),
        "D3": None if freeze is None else not any(r["collapsed"] for r in freeze),
    }
    return {
        **verdict,
        "outcome": _outcome(verdict, "D3"),
        "learn": [r["learn"] for r in grpo],
        "collapse_steps": [onset(r) for r in grpo],
        "gmpo_collapsed": sum(r["collapsed"] for r in gmpo),
    }


def router_lr_change(trial: dict[str, Any]) -> tuple[int, int] | None:
    """The (start, end) of a trial's router-lr schedule (its ``optim.router_lr_change=[a, b]`` setting), or None."""
    value = _settings(trial).get("optim.router_lr_change")
    if value is None:
        return None
    start, end = json.loads(value)
    return int(start), int(end)


def drift_outcomes(
    rows: list[dict[str, Any]], steps_of: Callable[[str, str, int], Steps]
) -> list[tuple[dict[str, Any], str, str, dict[str, Any]]]:
    """(trial, gate "L" or "D", X, result) for every trial of the record whose router-lr schedule is a
    step (L(X) for each X it ran without a routing mode, S = the step) or a rise (D, S = BUILDUP_S),
    its runs' measures read from their per-step metrics: ``steps_of(trial name, method, seed)``. A
    frozen-router trial of the same setting is read for L4 / D3, not judged itself."""

    def measured(trial: dict[str, Any], method: str, start: int) -> list[dict[str, Any]]:
        out = []
        for u in rows:
            if _same_setting(u, trial):
                for r in u["runs"]:
                    if r["algo"] == method:
                        steps = steps_of(u["name"], method, r["seed"])
                        out.append({**r, **drift_measures(steps, start, onset(r))})
        return out

    out = []
    for t in rows:
        change = router_lr_change(t)
        algos = [a for a in t.get("runs_spec", {}) if "+" not in a]
        if change is None or not algos:
            continue
        start = change[0] if change[0] == change[1] else BUILDUP_S
        if not LEARN_BEFORE <= start < t["steps"]:  # too short a trial to learn first and drift after
            why = f"not judged: S = {start} needs {LEARN_BEFORE} <= S < the trial's {t['steps']} steps"
            out.append((t, "L" if change[0] == change[1] else "D", algos[0], {"outcome": why}))
            continue
        if change[0] == change[1]:  # a step: learn, then drift
            for algo in algos:
                freeze = measured(t, f"{algo}+freeze", change[0])
                out.append(
                    (t, "L", algo, learn_then_drift_gate(measured(t, algo, change[0]), freeze or None, change[0]))
                )
        elif "grpo" in algos:  # a rise: drift that builds up
            freeze = measured(t, "gmpo+freeze", BUILDUP_S)
            result = buildup_gate(measured(t, "grpo", BUILDUP_S), measured(t, "gmpo", BUILDUP_S), freeze or None)
            out.append((t, "D", "grpo", result))
    return out


def _settings(trial: dict[str, Any]) -> dict[str, str]:
    """A trial's ``set`` overrides, key -> value text."""
    pairs = (item.split("=", 1) for item in trial.get("set", []) if "=" in item)
    return {key.strip(): value for key, value in pairs}


def searched_axes(rows: list[dict[str, Any]]) -> str:
    """The axes a record's trials searched, in words, from their settings: the router-lr multipliers
    from step 0, the router-lr schedules, the off-policy settings (mini-batch prompts, epochs), the
    bases; e.g. "router lr from step 0 ×1, ×110-×200; mini-batches of 2, 4 prompts; 2 bases"."""
    mults, schedules, mini, epochs = set(), set(), set(), set()
    for t in rows:
        s = _settings(t)
        if "optim.router_lr_mult_final" in s:
            start, end = router_lr_change(t) or (0, 0)
            final = float(s["optim.router_lr_mult_final"])
            schedules.add(
                f"×1 until step {start}, then ×{final:g}" if start == end else f"×1 → ×{final:g} by step {end}"
            )
        else:
            mults.add(float(s.get("optim.router_lr_mult", 1)))
        if "schedule.mini_batch_prompts" in s:
            mini.add(int(s["schedule.mini_batch_prompts"]))
        if "schedule.ppo_epochs" in s:
            epochs.add(int(s["schedule.ppo_epochs"]))
    raised = sorted(x for x in mults if x > 1)
    parts = []
    if mults:
        lead = ["×1"] if 1.0 in mults else []
        span = [f"×{raised[0]:g}" + (f"-×{raised[-1]:g}" if len(raised) > 1 else "")] if raised else []
        parts.append("router lr from step 0 " + ", ".join(lead + span))
    if schedules:
        parts.append("router lr " + "; ".join(sorted(schedules)))
    if mini:
        parts.append("mini-batches of " + ", ".join(str(x) for x in sorted(mini)) + " prompts")
    if epochs:
        parts.append(", ".join(str(x) for x in sorted(epochs)) + " epochs per step")
    bases = {t.get("base") for t in rows}
    parts.append(f"{len(bases)} base" + ("s" if len(bases) != 1 else ""))
    return "; ".join(parts)


def collapse_order(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Which of GRPO and GMPO collapsed first, seed pair by seed pair, over the record's trials that ran
    both at the same seeds: counts of "grpo" first, "gmpo" first, "tie", "neither"; ``trials`` such
    trials, ``grpo_alone`` those in which GRPO collapsed in some seed while GMPO collapsed in none (the
    paper's Sec. 3 picture)."""
    counts = {"grpo": 0, "gmpo": 0, "tie": 0, "neither": 0}
    trials = alone = 0
    for t in rows:
        grpo = {r["seed"]: r for r in t["runs"] if r["algo"] == "grpo"}
        gmpo = {r["seed"]: r for r in t["runs"] if r["algo"] == "gmpo"}
        seeds = sorted(set(grpo) & set(gmpo))
        if not seeds:
            continue
        trials += 1
        for s in seeds:
            a, b = onset(grpo[s]), onset(gmpo[s])
            first = (
                "neither"
                if a is None and b is None
                else "grpo"
                if b is None or (a is not None and a < b)
                else "gmpo"
                if a is None or b < a
                else "tie"
            )
            counts[first] += 1
        alone += any(onset(grpo[s]) is not None for s in seeds) and all(onset(gmpo[s]) is None for s in seeds)
    return {**counts, "trials": trials, "grpo_alone": alone}
