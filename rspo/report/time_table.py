"""Where a study's hours go: each run's time account (``final.json``'s ``time_account``,
rspo.train.time_account) as one row, and their sum, for `rspo report time`."""

from __future__ import annotations

from pathlib import Path

from rspo.run_record import RunRecord
from rspo.train.time_account import PARTS

COLUMNS = (*PARTS, "wall")


def run_accounts(runs_dir: str | Path) -> dict[str, dict]:
    """{run: its time account} of every finished run under ``runs_dir`` that records one."""
    out = {}
    for final in sorted(Path(runs_dir).glob("*/final.json")):
        account = RunRecord.open(final.parent).time_account
        if account:
            out[final.parent.name] = account
    return out


def time_rows(accounts: dict[str, dict]) -> list[tuple[str, list[float]]]:
    """One row per run (seconds per part, then the wall time) and their sum, last."""
    rows = [(name, [float(a.get(c, 0.0)) for c in COLUMNS]) for name, a in accounts.items()]
    if rows:
        rows.append(("sum", [sum(r[1][i] for r in rows) for i in range(len(COLUMNS))]))
    return rows


def format_time_table(accounts: dict[str, dict]) -> str:
    """A Markdown table: seconds per part per run, the sum, and each part's share of the summed wall."""
    rows = time_rows(accounts)
    if not rows:
        return "no run with a time account (final.json's time_account) here"
    head = "| run | " + " | ".join(COLUMNS) + " | non-step share |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    steps = [i for i, c in enumerate(COLUMNS) if c.startswith("step_")]
    for name, values in rows:
        wall = values[-1]
        share = 1 - sum(values[i] for i in steps) / wall if wall > 0 else float("nan")
        lines.append(f"| {name} | " + " | ".join(f"{v:.1f}" for v in values) + f" | {share:.1%} |")
    total = rows[-1][1]
    shares = ", ".join(f"{c} {v / total[-1]:.1%}" for c, v in zip(COLUMNS[:-1], total[:-1]) if total[-1] > 0 and v > 0)
    lines.append("")
    lines.append(f"Share of the summed wall time ({total[-1] / 3600:.2f} h of run-slots): {shares}")
    return "\n".join(lines)
