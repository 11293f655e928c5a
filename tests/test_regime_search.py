"""rspo.report.regime_search: a preset that names its regime search (`regime_trials:`) gets the rows
of every gate no trial met read "not testable: no regime found on the searched axes (...)", with the
reason and the count of trials ("GRPO collapses on MoE": "not reproduced" where the search saw GRPO
never collapse alone); rows of a gate that was met, equivalence rows and the other claims are judged
as before. Also the round-4 record the small preset names: no trial met any gate."""

import json
import tarfile
from pathlib import Path

import pytest

from rspo.archive import own_preset
from rspo.config import load_preset
from rspo.plan import Plan
from rspo.preset import Preset
from rspo.regime_gates import read_trials, search_outcome
from rspo.report import claims
from rspo.report.rule import NOT_REPRODUCED, NOT_TESTABLE

ROOT = Path(__file__).resolve().parents[1]
EARLIER = ROOT / "docs" / "results" / "small-3seed"
SEC3 = {"grpo-collapses", "gamma-falls", "gclip-rises", "kl-volatile", "clip-volatile", "rs-kl-vol", "rspo-kl-vol"}


def _run(algo, seed, collapse=None, gain=0.0):
    return {
        "algo": algo,
        "seed": seed,
        "collapsed": collapse is not None,
        "collapse_step": collapse,
        "learn_gain": gain,
        "pre_gamma": 0.97,
        "pre_under_gmin": 0.02,
    }


def _record(path: Path, grpo_meets: bool) -> Path:
    """Two trials: in t1 every X learns and collapses late, GMPO too (Sec. 3 fails on g2); GRPO's
    frozen-router runs (a trial of their own) collapse unless ``grpo_meets``."""
    spec = {"grpo": [0, 1, 2], "gspo": [0, 1, 2], "gmpo": [0, 1, 2]}
    t1 = {
        "name": "t1",
        "base": "b",
        "steps": 150,
        "set": ["optim.router_lr_mult=110"],
        "runs_spec": spec,
        "runs": [_run(a, s, collapse=60, gain=0.05) for a in spec for s in range(3)],
    }
    frozen = {**t1, "name": "t1-freeze", "runs_spec": {"grpo+freeze": [0, 1, 2]}}
    frozen["runs"] = [_run("grpo+freeze", s, collapse=None if grpo_meets else 30) for s in range(3)]
    path.write_text("\n".join(json.dumps(t) for t in (t1, frozen)) + "\n")
    return path


def _sweep(record: Path) -> Path:
    """A sweep file whose committed record is ``record`` (its folder, `record:`), with the trials its lines
    ran (their ``runs_spec``): what a preset's `regime_trials:` names. A record that is not there gets a
    sweep file of one trial."""
    import yaml

    rows = [json.loads(line) for line in record.read_text().splitlines()] if record.is_file() else []
    trials = [
        {"name": r["name"], "base": r["base"], "steps": r["steps"], "set": r["set"], "runs": r["runs_spec"]}
        for r in rows
    ] or [{"name": "t", "base": "b", "steps": 10, "runs": {"grpo": [0]}}]
    sweep = record.parent.with_name(f"{record.parent.name}-sweep.yaml")
    spec = {"preset": "configs/small.yaml", "work": str(record.parent / "work"), "record": str(record.parent)}
    sweep.write_text(yaml.safe_dump({**spec, "bases": {"b": {}}, "trials": trials}))
    return sweep


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("earlier")
    manifest = json.loads((EARLIER / "archive.json").read_text())
    with tarfile.open(EARLIER / "runs.tar.xz") as tar:
        tar.extractall(tmp, filter="data")
    preset = load_preset(own_preset(EARLIER, manifest["preset"]))
    return manifest, preset, tmp


def _rows(earlier, record: Path | None):
    manifest, preset, tmp = earlier
    data = dict(preset, regime_trials=str(_sweep(record))) if record else preset
    plan = Plan(data, seeds=manifest["seeds"], families=manifest["families"])
    rows = claims.collect(plan, tmp / "eval", tmp / "runs", tmp / "bench.json")
    return {(r.claim.key, r.claim.measure, r.regime, r.kind): r for r in rows}


def test_rows_of_a_gate_no_trial_met_read_not_testable_at_this_scale(earlier, tmp_path):
    before = _rows(earlier, None)
    (tmp_path / "r").mkdir()
    after = _rows(earlier, _record(tmp_path / "r" / "trials.jsonl", grpo_meets=True))
    assert before.keys() == after.keys()
    guarded = {k for k in after if k[3] == "verdict" and (k[0] in SEC3 or k[0] in ("rs-gspo", "rs-gmpo"))}
    assert {k[2] for k in guarded} == {"natural", "stress", "mismatch"} and len(guarded) > 10
    for k, r in after.items():
        if k in guarded and k[0] == "grpo-collapses":  # measured by the search: GMPO fell with GRPO every time
            assert r.verdict == NOT_REPRODUCED and r.est == before[k].est, r
            assert r.verdict_text.startswith(
                "not reproduced: on the searched axes (router lr from step 0 ×110; 1 base; trials.jsonl in "
            )
            tail = (
                "in none of the 1 trials that ran GRPO and GMPO did GRPO collapse while GMPO did not; GMPO "
                "collapsed first in 0 of 3 seed pairs, GRPO in 0"
            )
            own = f"; in this regime also {before[k].why}" if before[k].verdict == NOT_TESTABLE else ""
            assert r.why.endswith(tail + own)
        elif k in guarded:
            assert r.verdict == NOT_TESTABLE and r.verdict_text.startswith(
                "not testable: no regime found on the searched axes (router lr from step 0 ×110; 1 base) in which"
            )
            assert r.why.count("trials.jsonl in ") == 1  # the record it read
            if k[0] in SEC3:
                assert "GRPO collapses late and GMPO does not (Sec. 3 (g1-g3) met by none of the 1 regime" in r.why
            else:
                x = k[0].removeprefix("rs-").upper()
                assert (
                    f"RS acts and {x} learns first, then collapses late (P({x.lower()}) met by none of the 1" in r.why
                )
            if before[k].verdict == NOT_TESTABLE:  # the regime's own reason follows
                assert r.why.endswith(f"; in this regime also {before[k].why}")
            else:  # the measured effect stays on the row
                assert r.mean == before[k].mean and r.n == before[k].n
            if r.primary:
                assert r.p_holm == 1.0 and r.test == ""
        else:  # P(grpo) was met (t1 with its frozen control): RS-stabilises-GRPO rows as before
            assert r.verdict_text == before[k].verdict_text, k


def test_a_met_gate_guards_nothing_and_a_missing_or_foreign_record_is_named(earlier, tmp_path):
    """A sweep file without its record, or whose record holds a trial it does not define (another name,
    other steps), is refused naming the preset key, the file and the line."""
    from rspo.config import ConfigError

    (tmp_path / "r").mkdir()
    record = _record(tmp_path / "r" / "trials.jsonl", grpo_meets=False)
    after = _rows(earlier, record)
    assert after[("rs-grpo", "reward", "stress", "verdict")].verdict == NOT_TESTABLE  # GRPO+freeze collapsed
    with pytest.raises(ConfigError, match=r"regime_trials: .*absent holds no trials.jsonl"):
        _rows(earlier, tmp_path / "absent" / "trials.jsonl")
    sweep = _sweep(record)
    record.write_text(record.read_text().replace('"steps": 150', '"steps": 120', 1))
    plan = Plan(dict(earlier[1], regime_trials=str(sweep)), seeds=earlier[0]["seeds"])
    with pytest.raises(ConfigError, match=r"trials.jsonl, line 1: trial 't1' ran base 'b', 120 steps"):
        plan.spec.regime_records()
    record.write_text(record.read_text().replace('"name": "t1"', '"name": "t9"', 1))
    with pytest.raises(ConfigError, match=r"line 1: trial 't9' is not one of the sweep file's \['t1', 't1-freeze'\]"):
        plan.spec.regime_records()
    sweep.write_text(sweep.read_text().replace("record:", "recorded:"))
    with pytest.raises(ConfigError, match="recorded"):
        plan.spec.regime_records()


def test_the_small_presets_search_met_no_gate():
    """configs/small.yaml names rounds 3-4's sweep file, whose committed record is round 4's; no trial of
    it met the Sec. 3 gate or any P(X)."""
    preset = Preset.load(ROOT / "configs" / "small.yaml")
    assert preset.regime_trials[0] == ROOT / "configs" / "sweeps" / "small.yaml"
    record = preset.regime_records()[0]
    assert record == ROOT / "docs" / "results" / "trials" / "small-round4" / "trials.jsonl"
    out = search_outcome(read_trials(record))
    assert all(not g.found for g in out.values()), {k: g.met for k, g in out.items()}
    assert len(out["grpo"].judged) >= 9 and len(out["sec3"].judged) >= 9


def test_a_presets_relative_paths_start_at_the_repository_root_also_for_an_archives_copy(tmp_path):
    assert Preset.load(ROOT / "configs" / "small.yaml").root == ROOT
    assert Preset.load(own_preset(EARLIER, "small")).root == ROOT  # docs/results/small-3seed/small.yaml
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "p.yaml").write_text("preset: p\nrl: {}\n")
    assert Preset.load(tmp_path / "configs" / "p.yaml").root == tmp_path  # no Snakefile: the folder above


def test_grpo_collapses_is_not_reproduced_only_where_grpo_never_collapsed_alone(tmp_path):
    """The search measures "GRPO collapses on MoE" itself: it is not reproduced on the record's axes when
    no trial had GRPO collapse in some seed while GMPO collapsed in none; one such trial (however few its
    seeds) leaves the rows not testable. The round-4 record: GMPO first in 18 of 27 seed pairs."""
    from rspo.report.regime_search import not_reproduced

    both = [_run("grpo", s, collapse=60) for s in range(3)] + [_run("gmpo", s, collapse=40) for s in range(3)]
    t = {"name": "t", "base": "b", "steps": 150, "set": ["optim.router_lr_mult=150"], "runs": both}
    why = not_reproduced([t], "trials.jsonl in here")
    assert why.endswith("GMPO collapsed first in 3 of 3 seed pairs, GRPO in 0")
    alone = dict(t, runs=[_run("grpo", 0, collapse=60), _run("gmpo", 0)])
    assert not_reproduced([t, alone], "here") is None
    assert not_reproduced([dict(t, runs=[_run("grpo", 0, collapse=60)])], "here") is None
    record = ROOT / "docs" / "results" / "trials" / "small-round4" / "trials.jsonl"
    assert not_reproduced(read_trials(record), "trials.jsonl in small-round4") == (
        "on the searched axes (router lr from step 0 ×100-×200; mini-batches of 2, 4 prompts; 2 bases; "
        "trials.jsonl in small-round4): in none of the 9 trials that ran GRPO and GMPO did GRPO collapse while "
        "GMPO did not; GMPO collapsed first in 18 of 27 seed pairs, GRPO in 7"
    )


def test_several_records_are_read_together_with_round_5s_steps(earlier, tmp_path):
    """`regime_trials:` may list the rounds' records: a gate is met when a trial of any record met it, the
    reason names every record and the axes of all their trials, and a record of scheduled trials is
    judged by round 5's gates from its steps.tar.xz (refused without it)."""
    from rspo.regime_gates import TrialsError
    from rspo.report.regime_search import searches
    from rspo.sweep import pack_steps

    (tmp_path / "r4").mkdir()
    round4 = _record(tmp_path / "r4" / "trials.jsonl", grpo_meets=False)
    work = tmp_path / "work"
    step = ["optim.router_lr_mult_final=150", "optim.router_lr_change=[100, 100]"]
    runs = []
    for algo, seeds in (("gmpo", range(5)), ("gmpo+freeze", range(3))):
        for s in seeds:
            folder = work / "runs" / f"r5-{'0' * 12}" / f"{algo}-s{s}"
            folder.mkdir(parents=True)
            falls = algo == "gmpo"
            rows = [{"step": 0, "val/val/score": 0.6}] + [
                {
                    "step": i,
                    "critic/score/mean": 0.5 if i <= 10 else (0.6 if i <= 140 or not falls else 0.1),
                    "router/shift_ratio_mean": 0.999 if i <= 100 else 0.98,
                    "router/shift_clipfrac": 0.0,
                    **({"val/val/score": 0.6} if i == 100 else {}),
                }
                for i in range(1, 231)
            ]
            (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            runs.append(_run(algo, s, collapse=145 if falls else None))
    r5 = {"name": "r5", "base": "b", "steps": 230, "set": step, "runs_spec": {"gmpo": [0, 1, 2, 3, 4]}}
    trials = [dict(r5, runs=[r for r in runs if r["algo"] == "gmpo"])]
    trials.append(
        dict(
            r5,
            name="r5-freeze",
            runs_spec={"gmpo+freeze": [0, 1, 2]},
            runs=[r for r in runs if r["algo"] == "gmpo+freeze"],
        )
    )
    (work / "runs" / f"r5-freeze-{'1' * 12}").mkdir()
    for s in range(3):
        (work / "runs" / f"r5-{'0' * 12}" / f"gmpo+freeze-s{s}").rename(
            work / "runs" / f"r5-freeze-{'1' * 12}" / f"gmpo+freeze-s{s}"
        )
    (tmp_path / "r5").mkdir()
    round5 = tmp_path / "r5" / "trials.jsonl"
    round5.write_text("".join(json.dumps(t) + "\n" for t in trials))
    with pytest.raises(TrialsError, match="scheduled trials: their gates need the runs' steps"):
        searches((round4, round5))
    pack_steps(work, tmp_path / "r5" / "steps.tar.xz")
    found, rows, where = searches((round4, round5))
    assert where == "trials.jsonl in r4, trials.jsonl in r5" and len(rows) == 4
    assert found["gmpo"].gate == "P(gmpo) / L(gmpo)" and found["gmpo"].judged == ("t1", "r5")
    assert found["gmpo"].met == ("r5",)  # learned by 100, collapsed at 145 in 5 of 5, control never, RS acts
    assert found["sec3"].judged == ("t1",) and not found["sec3"].found
    after = _rows(earlier, None)
    manifest, preset, tmp = earlier
    plan = Plan(
        dict(preset, regime_trials=[str(_sweep(round4)), str(_sweep(round5))]),
        seeds=manifest["seeds"],
        families=manifest["families"],
    )
    guarded = {
        (r.claim.key, r.claim.measure, r.regime, r.kind): r
        for r in claims.collect(plan, tmp / "eval", tmp / "runs", tmp / "bench.json")
    }
    assert (
        guarded[("rs-gmpo", "reward", "stress", "verdict")].verdict_text
        == after[("rs-gmpo", "reward", "stress", "verdict")].verdict_text
    )
    gspo = guarded[("rs-gspo", "reward", "stress", "verdict")]
    assert (
        gspo.verdict == NOT_TESTABLE
        and "(P(gspo) met by none of the 1 regime trials that judged it; trials.jsonl in r4, trials.jsonl in r5)"
        in gspo.why
    )


def test_round_5s_record_recomputes_its_gates_from_its_shipped_steps():
    """docs/results/trials/small-round5 ships every run's per-step metrics: its gate table is what the gates
    compute from them, and, as registered, no gate was met (L(X) failed on L1 by one seed, D on D0 and
    D2). The small preset reads both rounds' records."""
    from rspo.regime_gates import drift_outcomes, steps_in_pack
    from rspo.report.regime_search import searches
    from rspo.report.trials import drift_gate_table

    record = ROOT / "docs" / "results" / "trials" / "small-round5" / "trials.jsonl"
    rows, steps = read_trials(record), steps_in_pack(record.parent / "steps.tar.xz")
    assert drift_gate_table(rows, steps) in (record.parent / "trials.md").read_text()
    outcomes = {(t["name"], gate, x): g["outcome"] for t, gate, x, g in drift_outcomes(rows, steps)}
    assert outcomes == {
        ("r5a-x150-at100", "L", "grpo"): "fails: L1",
        ("r5a-x150-at100", "L", "gmpo"): "fails: L1",
        ("r5b-ramp-x150", "D", "grpo"): "fails: D0, D2",
    }
    assert all(t["commit"] and t["started_utc"] < t["ended_utc"] for t in rows)  # provenance of each trial
    found, _, where = searches(Preset.load(ROOT / "configs" / "small.yaml").regime_records())
    assert where == "trials.jsonl in small-round4, trials.jsonl in small-round5"
    assert not any(g.found for g in found.values())
