"""rspo.report.claims: the catalogue (one primary row per claim, named before the runs), the
diagnosis claims computed from runs' metrics, and the earlier 3-seed study's runs judged again by
today's rule: every row's verdict, and why each that moved did (docs/small_study.md lists them)."""

import json
import math
import tarfile
from pathlib import Path

import pytest

from rspo.archive import own_preset
from rspo.config import load_preset
from rspo.plan import Plan
from rspo.report import claims
from rspo.report.rule import IMMATERIAL, NOT_TESTABLE, SUPPORTED

ROOT = Path(__file__).resolve().parents[1]
EARLIER = ROOT / "docs" / "results" / "small"


def test_every_claim_has_one_primary_row_named_before_the_runs():
    catalogue = claims.paper_claims(0.8, 150) + claims.mismatch_claims(0.8)
    assert {c.key for c in catalogue} == set(claims.PRIMARY)
    for key, (measure, regime) in claims.PRIMARY.items():
        assert [c.measure for c in catalogue if c.key == key].count(measure) == 1, key
        assert regime in ("natural", "mismatch", "benchmark", claims.SEC3)
    # the plug-in and collapse claims are judged on the paper's own Countdown outcome, the training reward
    assert {claims.PRIMARY[k][0] for k in ("rs-grpo", "rs-gspo", "rs-gmpo")} == {"reward"}
    assert claims.PRIMARY["grpo-collapses"][0] == "reward_drop"
    assert claims.primary_regime("gamma-falls", ["natural"]) == "natural"
    assert claims.primary_regime("gamma-falls", ["natural", claims.SEC3]) == claims.SEC3
    assert claims.effect_text(catalogue[0]) == "train reward best-to-final drop (pts): grpo - gmpo"


def _metrics_file(path, rows):
    path.write_text("".join(json.dumps({"step": i + 1, **r}) + "\n" for i, r in enumerate(rows)))
    return path


def test_the_diagnosis_claims_come_from_the_runs_metrics(tmp_path):
    """Five GRPO seeds whose γ falls below 0.95 and whose ppo_kl swings wider late; the +RS runs
    (GRPO+RS, and RSPO, which the plugin family brings as Fig. 6's pair) are calm: every diagnosis
    row is testable (GRPO drifts) and supported."""
    preset = {
        "preset": "t",
        "seeds": [0, 1, 2, 3, 4],
        "rl": {"algorithm": {"gamma_min": 0.8}, "schedule": {"total_steps": 40}},
        "grid": {"plugin": {"algos": ["grpo", "gmpo"], "router_shift": [False, True]}},
    }
    plan = Plan(preset)
    runs = tmp_path / "runs"
    for name, r in plan.runs.items():
        (runs / name).mkdir(parents=True)
        rows = []
        drifts = r.algo == "grpo" and not r.router_shift
        for i in range(40):
            swing = (1 if i % 2 else -1) * (1e-3 * (1 + 0.05 * r.seed) if not drifts else (4e-3 if i >= 32 else 1e-3))
            rows.append(
                {
                    "critic/score/mean": 0.4 + 0.002 * i,
                    "router/shift_ratio_mean": 1.0 - (2e-3 * i * (1 + 0.1 * r.seed) if drifts else 0.0),
                    "router/shift_clipfrac": (5e-4 * i if drifts else 0.0),
                    "actor/ppo_kl": 0.01 + swing,
                    "actor/pg_clipfrac": 0.02 + swing,
                }
            )
        _metrics_file(runs / name / "metrics.jsonl", rows)
        (runs / name / "final.json").write_text(json.dumps({"collapsed": False, "collapse_step": None, "steps": 40}))
        (tmp_path / "eval" / name).mkdir(parents=True)
        split = {"accuracy": 0.5, "n": 4, "scores": [1.0, 0.0, 1.0, 0.0]}
        (tmp_path / "eval" / name / "countdown.json").write_text(
            json.dumps({"splits": {"val": split, "val_target": split}})
        )
    rows = {(r.claim.key, r.claim.measure): r for r in claims.collect(plan, tmp_path / "eval", runs, None)}
    keys = {"gamma-falls", "gclip-rises", "kl-volatile", "clip-volatile", "rs-kl-vol", "rspo-kl-vol"}
    got = {k: r for (k, _), r in rows.items() if k in keys}
    assert set(got) == keys
    for key in keys:
        assert got[key].verdict == SUPPORTED and got[key].primary, (key, got[key])
    assert got["gamma-falls"].mean == pytest.approx(100 * 2e-3 * 1.2)
    assert got["gamma-falls"].mde > 0 and got["gamma-falls"].n == 5


def _judged(archive: Path, tmp: Path) -> list:
    manifest = json.loads((archive / "archive.json").read_text())
    with tarfile.open(archive / "runs.tar.xz") as tar:
        tar.extractall(tmp, filter="data")
    from rspo.archive import read_manifest

    name = manifest["preset"]
    preset = load_preset(own_preset(archive, name) or ROOT / "configs" / f"{name}.yaml")
    read_manifest(archive, preset)  # the preset the runs belong to
    plan = Plan(preset, seeds=manifest["seeds"], full=manifest["full"], families=manifest.get("families"))
    return claims.collect(
        plan, tmp / "eval", tmp / "runs", tmp / "bench.json" if (tmp / "bench.json").is_file() else None
    )


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    """The 3-seed study docs/results/small ships (until its 5-seed rerun) unpacked."""
    rows = _judged(EARLIER, tmp_path_factory.mktemp("earlier"))  # with the preset it was packed from
    assert {r.n for r in rows if r.regime != "benchmark"} <= {0, 3}  # its seeds 0-2
    return {(r.claim.key, r.claim.measure, r.regime): r for r in rows}


DRIFTLESS = (
    "not testable: no router drift to observe (GRPO's smallest mean γ 0.998 > 0.95, at most 0.11% of tokens under γmin)"
)
TOO_EARLY = "not testable: undefined measure (grpo s0: collapsed at step 10, 9 steps before it; a trend needs 10)"
P = " (provisional: n < 5)"
# The earlier table's rows judged again, as (claim, measure, regime): today's verdict. Measures new
# to the table (reward, reward_drop) have no earlier verdict; the others moved as commented.
EARLIER_VERDICTS = {
    ("grpo-collapses", "reward_drop", "natural"): "inconclusive" + P,
    ("grpo-collapses", "acc", "natural"): "inconclusive" + P,
    # was "not supported" (γ fall, γ-clip rise) / "inconclusive": γ never left 0.998, nothing to observe
    ("gamma-falls", "gamma_fall", "natural"): DRIFTLESS,
    ("gclip-rises", "gclip_rise", "natural"): DRIFTLESS,
    ("kl-volatile", "kl_vol_growth", "natural"): DRIFTLESS,
    ("clip-volatile", "clip_vol_growth", "natural"): DRIFTLESS,
    ("rs-kl-vol", "kl_vol", "natural"): DRIFTLESS,
    ("rspo-kl-vol", "kl_vol", "natural"): DRIFTLESS,
    ("rs-grpo", "reward", "natural"): "inconclusive" + P,
    ("rs-grpo", "acc", "natural"): "inconclusive" + P,
    ("rs-gspo", "reward", "natural"): "not supported" + P,
    ("rs-gspo", "acc", "natural"): "inconclusive" + P,
    ("rs-gmpo", "reward", "natural"): "inconclusive" + P,
    ("rs-gmpo", "acc", "natural"): "inconclusive" + P,
    ("grpo-collapses", "reward_drop", "stress"): "inconclusive" + P,
    ("grpo-collapses", "acc", "stress"): "not testable: both arms at the floor (0.5% and 0.0%)",
    # was "not supported" (γ rows, from a line through collapse and recovery) / "inconclusive" (the
    # pg_clipfrac row's -36.84 came from a -60 sentinel): each GRPO run collapsed before 10 steps of trend
    ("gamma-falls", "gamma_fall", "stress"): TOO_EARLY,
    ("gclip-rises", "gclip_rise", "stress"): TOO_EARLY,
    ("kl-volatile", "kl_vol_growth", "stress"): TOO_EARLY,
    ("clip-volatile", "clip_vol_growth", "stress"): TOO_EARLY,
    ("rs-kl-vol", "kl_vol", "stress"): TOO_EARLY,
    ("rspo-kl-vol", "kl_vol", "stress"): TOO_EARLY,
    ("rs-grpo", "reward", "stress"): "not testable: both arms at the floor (0.4% and 0.2%)",
    # was "not supported": both arms had collapsed to 0-0.1%, they cannot separate
    ("rs-grpo", "acc", "stress"): "not testable: both arms at the floor (0.1% and 0.0%)",
    ("rs-gspo", "reward", "stress"): "inconclusive" + P,
    ("rs-gspo", "acc", "stress"): "inconclusive" + P,
    ("rs-gmpo", "reward", "stress"): "inconclusive" + P,
    # was "inconclusive": both at the floor
    ("rs-gmpo", "acc", "stress"): "not testable: both arms at the floor (0.3% and 0.5%)",
    ("rs-gmpo", "reward", "mismatch"): "not supported" + P,
    # was "supported" with +0.25 [+0.25, +0.25]: three equal differences of 2 problems in 800; floored
    # at their McNemar noise the interval holds 0
    ("rs-gmpo", "acc", "mismatch"): "inconclusive" + P,
    ("r3-agreement", "agreement", "mismatch"): "supported" + P,
    # was "supported": its interval excludes 0 once floored, but as a primary row it does not survive
    # Holm's correction (p 0.045 > 0.025)
    ("r3-kl", "mismatch_kl", "mismatch"): "inconclusive: its interval excludes 0, but not after Holm's correction "
    "across the primary rows (p 0.045)" + P,
    ("r3-acc", "reward", "mismatch"): "not supported" + P,
    ("r3-acc", "acc", "mismatch"): "not supported" + P,
    ("tis-acc", "reward", "mismatch"): "inconclusive" + P,
    ("tis-acc", "acc", "mismatch"): "inconclusive" + P,
    ("rs-tis-acc", "reward", "mismatch"): "inconclusive" + P,
    ("rs-tis-acc", "acc", "mismatch"): "inconclusive" + P,
    ("throughput", "throughput", "benchmark"): "supported",
}


def test_the_earlier_studys_runs_under_todays_rule(earlier):
    assert {k: r.verdict_text for k, r in earlier.items()} == EARLIER_VERDICTS
    row25 = earlier[("rs-gmpo", "acc", "mismatch")]
    assert row25.mean == pytest.approx(0.25) and row25.est.floored and row25.verdict not in (SUPPORTED,)
    assert (round(row25.est.low, 2), round(row25.est.high, 2)) == (-1.68, 2.18)
    for r in earlier.values():
        assert r.verdict == NOT_TESTABLE or r.est.high - r.est.low > 0  # no zero-width interval
        assert r.verdict != SUPPORTED or r.mean >= r.claim.margin  # nothing below its margin is supported
        assert r.verdict != IMMATERIAL or r.mean < r.claim.margin


def test_the_table_prints_role_mde_and_the_rule(earlier, tmp_path):
    rows = list(earlier.values())
    cells = dict(
        (f"{r.claim.key}/{r.claim.measure}/{r.regime}", c) for r, (_, c) in zip(rows, claims.format_rows(rows))
    )
    role, n, mean, ci, mde = 2, 4, 5, 6, 7
    row = cells["rs-gmpo/acc/mismatch"]
    assert row[role] == "exploratory" and row[n] == "3" and row[mean] == "+0.25"
    assert row[ci] == "[-1.68, +2.18] *" and float(row[mde]) > 2  # floored: marked; MDE above the margin
    assert cells["rs-gmpo/reward/natural"][role] == "primary"
    assert cells["gamma-falls/gamma_fall/natural"][mean] == "–" and cells["gamma-falls/gamma_fall/natural"][ci] == "–"
    summary = claims.summary(rows)["rows"]
    assert len(summary) == len(rows) and {"mde", "p_holm", "why", "provisional"} <= set(summary[0])


@pytest.mark.parametrize("archive", sorted(p.parent.name for p in (ROOT / "docs" / "results").glob("*/archive.json")))
def test_no_shipped_row_reads_more_than_its_data_say(archive, tmp_path):
    """Every row of the claims tables the shipped archives make: no zero-width interval, no sentinel
    value, nothing below its margin called supported, an MDE with every interval; a primary row per
    claim at most, every not-testable row with its reason."""
    rows = _judged(ROOT / "docs" / "results" / archive, tmp_path)
    assert rows
    for r in rows:
        if r.verdict == NOT_TESTABLE:
            assert r.why and math.isnan(r.mean)
            continue
        assert math.isfinite(r.mean) and abs(r.mean) < 1e3, r  # no -60 or other stand-in value
        if r.n >= 2:
            assert r.est.high - r.est.low > 0 and math.isfinite(r.mde), r
        assert r.verdict != SUPPORTED or r.mean >= r.claim.margin, r
    primaries = [r.claim.key for r in rows if r.primary]
    assert len(primaries) == len(set(primaries))
