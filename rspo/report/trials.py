"""The regime search's tables, from a trials record (the JSON lines `rspo sweep` writes): one row per
trial (``table``: setting, base accuracy, GMPO's gains, GRPO's drift, collapses, the RLVR diagnostics,
time and machine), round 4's plug-in gate P(X) per trial and algorithm (``gate_table``) and round 5's
gates L(X) and D, read from the runs' per-step metrics (``drift_gate_table``). The gates themselves are
rspo.regime_gates'; `rspo sweep` writes these tables beside its bases table (rspo.sweep.write_tables).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rspo.regime_gates import drift_outcomes, plugin_outcomes
from rspo.run_record import Steps

EARLIER_MACHINE = "Intel Xeon (AVX-512), 2 cores"
"""Trials recorded before rows named their machine ran on this one (the first round)."""


def _fmt_gain(g: tuple[float, float, int]) -> str:
    m, sd, n = g
    return f"{100 * m:+.1f}" + (f" ± {100 * sd:.1f}" if n > 1 else "") + f" (n={n})"


def _collapse_steps(v: dict[str, Any]) -> str:
    """`` (41, –, 57)``: each seed's collapse step (– never), for trials recorded with them."""
    steps = v.get("collapse_steps")
    if not steps or not v["collapsed"]:
        return ""
    return " (" + ", ".join("–" if x is None else str(x) for x in steps) + ")"


def _first_last(v: dict[str, Any] | None, name: str, fmt: str) -> str:
    if not v or v.get(f"{name}_first") is None:
        return "-"
    return f"{format(v[name + '_first'], fmt)} → {format(v[name + '_last'], fmt)}"


def table(rows: list[dict[str, Any]]) -> str:
    cols = [
        "trial",
        "base",
        "setting",
        "steps",
        "base acc. (%)",
        "GMPO gain, final (pts)",
        "GMPO gain, best (pts)",
        "GRPO min mean γ",
        "GRPO max share γ<0.8",
        "max pg_clipfrac",
        "collapsed (step per seed)",
        "zero-var groups",
        "all correct / all wrong (last)",
        "distinct / group",
        "entropy",
        "s/step",
        "wall",
        "machine",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(["---"] * len(cols)) + "|"]
    for t in rows:
        per_algo = {a: v for a, v in t.items() if isinstance(v, dict) and "n" in v}
        g, r = per_algo.get("gmpo"), per_algo.get("grpo")
        d = g or r  # the diagnostics of GMPO's runs (GRPO's when the trial has no GMPO run)
        split = (
            f"{d['all_correct_last']:.2f} / {d['all_wrong_last']:.2f}"
            if d and d.get("all_correct_last") is not None
            else "-"
        )
        cells = [
            t["name"],
            t["base"],
            " ".join(t["set"]) or "(preset)",
            str(t["steps"]),
            f"{100 * t['base_acc']:.1f}",
            _fmt_gain(g["gain"]) if g else "-",
            _fmt_gain(g["best_gain"]) if g else "-",
            f"{r['min_gamma']:.4f}" if r else "-",
            f"{100 * r['max_gamma_clip']:.2f}%" if r else "-",
            f"{max(v['max_pg_clipfrac'] for v in per_algo.values()):.3f}",
            ", ".join(f"{a} {v['collapsed']}/{v['n']}{_collapse_steps(v)}" for a, v in per_algo.items()),
            _first_last(d, "zero_std", ".2f"),
            split,
            _first_last(d, "distinct", ".1f"),
            _first_last(d, "entropy", ".3f"),
            f"{d['step_s_first']:.2f}" if d and d.get("step_s_first") is not None else "-",
            f"{(t['wall_s'] + t['pretrain_wall_s']) / 60:.1f} min",
            t.get("machine", EARLIER_MACHINE),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _header(cols: list[str]) -> list[str]:
    return ["| " + " | ".join(cols) + " |", "|" + "|".join(["---"] * len(cols)) + "|"]


def mark(v: bool | None) -> str:
    """A criterion's verdict: ✓ holds, ✗ fails, – not judged yet."""
    return "–" if v is None else "✓" if v else "✗"


def _steps(steps: list[int | None]) -> str:
    """Collapse steps per seed, – where a seed never collapsed."""
    return ", ".join("–" if x is None else str(x) for x in steps)


def gate_table(rows: list[dict[str, Any]]) -> str:
    """One line per (trial, algorithm X) of the trials whose runs carry the gate's measures: P(X)'s
    criteria, each seed's values, and the outcome; X+freeze's runs are found in any trial with the
    same base, steps and setting."""
    cols = [
        "trial",
        "X",
        "p1 learns first: best − first window (pts, per seed)",
        "p2 collapse step per seed (late ≥ 2 of 3)",
        "p4 mean γ / share under γmin before collapse",
        "p3 X+freeze collapsed",
        "outcome",
        "wall",
        "machine",
    ]
    lines = _header(cols)
    for t, algo, g in plugin_outcomes(rows):
        cells = [
            t["name"],
            algo,
            f"{mark(g['p1'])} " + ", ".join(f"{100 * x:+.1f}" for x in g["learn_gain"]),
            f"{mark(g['p2'])} " + _steps(g["collapse_steps"]),
            f"{mark(g['p4'])} {g['pre_gamma']:.4f} / {100 * g['pre_under_gmin']:.2f}%",
            "not run" if g["p3"] is None else f"{mark(g['p3'])} {g['freeze_collapsed']}/{g['freeze_n']}",
            g["outcome"],
            f"{(t['wall_s'] + t['pretrain_wall_s']) / 60:.1f} min",
            t.get("machine", EARLIER_MACHINE),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def drift_gate_table(rows: list[dict[str, Any]], steps_of: Callable[[str, str, int], Steps]) -> str:
    """One line per (scheduled trial, gate): round 5's L(X) and D (rspo.regime_gates), each criterion's
    values per seed, read from the runs' per-step metrics."""
    from rspo.regime_gates import LEARN_MIN
    from rspo.run_record import NOISE_SD

    cols = [
        "trial",
        "gate",
        f"learned by S: reward S-19..S − 1-10 (pts, per seed; bar {100 * LEARN_MIN:.1f})",
        "held-out at 0 → S (%)",
        "collapse step per seed",
        "mean γ / share under γmin after S",
        "frozen control collapsed",
        "per-step SD ≤ S (max)",
        "outcome",
    ]
    lines = _header(cols)
    for t, gate, algo, g in drift_outcomes(rows, steps_of):
        name = f"L({algo})" if gate == "L" else "D"
        if "learn" not in g:  # not judged (too short)
            lines.append("| " + " | ".join([t["name"], name, *["–"] * 6, g["outcome"]]) + " |")
            continue
        steps = _steps(g["collapse_steps"])
        learn = ", ".join(f"{100 * x:+.1f}" for x in g["learn"])
        if gate == "L":
            held = ", ".join(
                "–" if b is None or s is None else f"{100 * b:.1f} → {100 * s:.1f}" for b, s in g["heldout"]
            )
            drift = "–" if g["post_gamma"] is None else f"{g['post_gamma']:.4f} / {100 * g['post_under']:.2f}%"
            cells = [
                name,
                f"{mark(g['L1'])} {learn}",
                f"{mark(g['L2'])} {held}",
                f"{mark(g['L3'])} {steps}",
                f"{mark(g['L5'])} {drift}",
                "not run" if g["L4"] is None else f"{mark(g['L4'])} {g['freeze_collapsed']}/{g['freeze_n']}",
                f"{100 * g['noise']:.1f}" + (" (above the bar's SD)" if g["noise"] > NOISE_SD else ""),
            ]
        else:
            cells = [
                "D",
                f"{mark(g['D0'])} {learn}",
                "–",
                f"{mark(g['D1'])} GRPO {steps}; {mark(g['D2'])} GMPO {g['gmpo_collapsed']} collapsed",
                "–",
                "not run" if g["D3"] is None else mark(g["D3"]),
                "–",
            ]
        lines.append("| " + " | ".join([t["name"], *cells, g["outcome"]]) + " |")
    return "\n".join(lines) + "\n"


def provenance_table(rows: list[dict[str, Any]]) -> str:
    """One line per trial: when its runs trained (first UTC start, last UTC end), the commits and the
    machines they ran from ("-" where a record predates the stamps)."""
    lines = _header(["trial", "UTC start", "UTC end", "commit", "machine"])
    for t in rows:
        cells = [t["name"], t.get("started_utc") or "-", t.get("ended_utc") or "-", t.get("commit") or "-"]
        lines.append("| " + " | ".join([*cells, t.get("machine", EARLIER_MACHINE)]) + " |")
    return "\n".join(lines) + "\n"
