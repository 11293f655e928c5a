"""The claims a regime search guards: where the registered search found no regime in which a claim
can be tested, its rows read "not testable: no regime found on the searched axes (...)", naming them.

The Sec. 3 claims (GRPO collapses on MoE; the router-drift trends and volatilities of Sec. 3.3 and
Fig. 6) need a regime in which router drift builds up, GRPO collapses late and GMPO does not: the
Sec. 3 gate. "RS stabilises X as a plug-in" needs a regime in which RS acts and X learns first, then
collapses late: the plug-in gate P(X). Both gates were written in configs/sweeps/small.yaml before
their trials ran (rspo.regime_gates judges them). A preset names the sweep files of its search
(`regime_trials:`), whose committed records (each file's ``record:``) are read here; for each gate
that no trial of those records met, every verdict row of the claims
it guards, in every regime of the table, becomes "not testable" with the reason and the count of
trials that judged the gate (the row keeps its measured effect and interval for the reader; a
regime's own reason, e.g. "RS inactive", follows). "GRPO collapses on MoE" is measured by the search
itself (which of GRPO and GMPO collapses first in each seed pair): where no trial met the Sec. 3 gate
and in no trial did GRPO collapse while GMPO survived every seed, its rows read "not reproduced on the
searched axes" with the axes (from the trials' settings) and the seed pairs' count. Equivalence rows
(RS harmless where it does not act) and checks are not guarded: they ask another question. Where a
gate was met, its rows are judged as usual; a regime the search finds enters the preset schema
(rspo.study_config.REGIMES) and the claims' entries name it (rspo.report.claim_registry), never by a
silent fallback. A row's gate is its claim entry's ``gate``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rspo.regime_gates import (
    GateSearch,
    collapse_order,
    read_trials,
    record_steps,
    search_outcome,
    searched_axes,
)
from rspo.report.claim_registry import CLAIMS
from rspo.report.rule import NOT_REPRODUCED, NOT_TESTABLE, Row

NOT_REPRODUCIBLE = {"grpo-collapses"}
"""Claims whose effect the search measures itself (which of GRPO and GMPO collapses first): where no
trial met the Sec. 3 gate and GRPO never collapsed alone, they read "not reproduced", not "not testable"."""


def not_reproduced(rows: list[dict], where: str) -> str | None:
    """Why "GRPO collapses on MoE" is not reproduced on the axes of the records' trials ``rows`` (``where``:
    the records, in words); None when it may be: some trial had GRPO collapse while GMPO did not, or no
    trial ran both."""
    order = collapse_order(rows)
    if not order["trials"] or order["grpo_alone"]:
        return None
    pairs = sum(order[k] for k in ("grpo", "gmpo", "tie", "neither"))
    return (
        f"on the searched axes ({searched_axes(rows)}; {where}): in none of the "
        f"{order['trials']} trials that ran GRPO and GMPO did GRPO collapse while GMPO did not; GMPO "
        f"collapsed first in {order['gmpo']} of {pairs} seed pairs, GRPO in {order['grpo']}"
    )


def reason(gate: str, g: GateSearch, where: str, axes: str) -> str:
    """Why a row the gate guards is not testable: no trial of the records (``where``, which searched
    ``axes``) met it."""
    found = (
        f"{g.gate} met by none of the {len(g.judged)} regime trials that judged it"
        if g.judged
        else f"{g.gate} judged by no regime trial"
    )
    if gate == "sec3":
        what = "router drift builds up, GRPO collapses late and GMPO does not"
    else:
        what = f"RS acts and {gate.upper()} learns first, then collapses late"
    return f"no regime found on the searched axes ({axes}) in which {what} ({found}; {where})"


def searches(records: tuple[Path, ...]) -> tuple[dict[str, GateSearch], list[dict], str]:
    """What the records of a search found, gate by gate (the gates each record's trials judged, their
    trials and the ones that met them, joined over the records), all their trials, and the records in
    words ("trials.jsonl in small-round4, trials.jsonl in small-round5")."""
    found: dict[str, GateSearch] = {}
    rows: list[dict] = []
    for record in records:
        trials = read_trials(record)
        rows += trials
        for key, g in search_outcome(trials, record_steps(record)).items():
            seen = found.get(key)
            if seen is None:
                found[key] = g
                continue
            names = [seen.gate] + [n for n in g.gate.split(" / ") if n not in seen.gate.split(" / ") and g.judged]
            found[key] = GateSearch(" / ".join(names), seen.judged + g.judged, seen.met + g.met)
    return found, rows, ", ".join(f"{r.name} in {r.parent.name}" for r in records)


def guard(rows: list[Row], records: tuple[Path, ...]) -> list[Row]:
    """``rows`` with every verdict row of a gate that no trial of ``records`` met made not testable
    (the module docstring); a row's gate is its claim's (rspo.report.claim_registry)."""
    search, trials, where = searches(records)
    gone = not_reproduced(trials, where)
    axes = searched_axes(trials)
    out = []
    for r in rows:
        entry = CLAIMS.get(r.claim.key)
        gate = entry.gate if entry else ""
        if r.kind != "verdict" or not gate or search[gate].found:
            out.append(r)
            continue
        also = f"; in this regime also {r.why}" if r.verdict == NOT_TESTABLE and r.why else ""
        if gone and r.claim.key in NOT_REPRODUCIBLE:
            out.append(replace(r, verdict=NOT_REPRODUCED, why=gone + also))
        else:
            out.append(replace(r, verdict=NOT_TESTABLE, why=reason(gate, search[gate], where, axes) + also))
    return out
