"""The claims a regime search guards: where the registered search found no regime in which a claim
can be tested at this scale, its rows read "not testable at this scale".

The Sec. 3 claims (GRPO collapses on MoE; the router-drift trends and volatilities of Sec. 3.3 and
Fig. 6) need a regime in which router drift builds up, GRPO collapses late and GMPO does not: the
Sec. 3 gate. "RS stabilises X as a plug-in" needs a regime in which RS acts and X learns first, then
collapses late: the plug-in gate P(X). Both gates were written in configs/sweeps/small.yaml before
their trials ran (rspo.regime_gates judges them). A preset names the record of its search
(`regime_trials:`); for each gate that no trial of that record met, every verdict row of the claims
it guards, in every regime of the table, becomes "not testable" with the reason and the count of
trials that judged the gate (the row keeps its measured effect and interval for the reader; a
regime's own reason, e.g. "RS inactive", follows). Equivalence rows (RS harmless where it does not
act) and checks are not guarded: they ask another question. Where a gate was met, the search chose a
regime (`drift`) and its rows are judged there as usual.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rspo.regime_gates import GateSearch, read_trials, search_outcome
from rspo.report.rule import NOT_TESTABLE, Row

PLUGIN_GATES = {"rs-grpo": "grpo", "rs-gspo": "gspo", "rs-gmpo": "gmpo"}
"""Claim key -> the algorithm X of its plug-in gate P(X)."""


def reason(gate: str, g: GateSearch, record: Path) -> str:
    """Why a row the gate guards is not testable: no trial of ``record`` met it."""
    found = (
        f"{g.gate} met by none of the {len(g.judged)} regime trials that judged it"
        if g.judged
        else f"{g.gate} judged by no regime trial"
    )
    if gate == "sec3":
        what = "router drift builds up, GRPO collapses late and GMPO does not"
    else:
        what = f"RS acts and {gate.upper()} learns first, then collapses late"
    return f"at this scale: no regime found in which {what} ({found}; {record.name} in {record.parent.name})"


def guard(rows: list[Row], record: Path, sec3_keys: frozenset[str]) -> list[Row]:
    """``rows`` with every verdict row of a gate that no trial of ``record`` met made not testable
    (the module docstring); ``sec3_keys``: the claims the Sec. 3 gate guards."""
    search = search_outcome(read_trials(record))
    out = []
    for r in rows:
        gate = "sec3" if r.claim.key in sec3_keys else PLUGIN_GATES.get(r.claim.key)
        if r.kind != "verdict" or gate is None or search[gate].found:
            out.append(r)
            continue
        why = reason(gate, search[gate], record)
        if r.verdict == NOT_TESTABLE and r.why:
            why += f"; in this regime also {r.why}"
        out.append(replace(r, verdict=NOT_TESTABLE, why=why))
    return out
