"""What changed between two claims tables of one preset, row by row (docs/small_study.md embeds it).

    python scripts/claims_changes.py EARLIER/table_claims.md LATER/table_claims.md [--out FILE] \
        [--labels EARLIER_NAME LATER_NAME]

Rows are matched by (claim, regime, effect): the claim's text names an equivalence row apart from
its superiority row, and the role is left out of the key because a preset's pre-registered primary
family may change between designs. Each row prints both tables' n, mean, interval and verdict (the
verdict's reason shortened to its first clause) and what moved; rows of one table only say so. The
numbers are copied from the tables, never recomputed: the tables are the record.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rspo.report.rule import MIN_SEEDS, NOT_TESTABLE, PROVISIONAL

KEY = ("Claim", "Regime", "Effect")


def parse(path: str | Path) -> list[dict[str, str]]:
    """The rows of a claims table (markdown, as rspo.report writes it), as column -> cell."""
    lines = Path(path).read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("| Claim |")), None)
    if start is None:
        raise ValueError(f"{path}: no claims table (no '| Claim |' header)")
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != len(header):
            raise ValueError(f"{path}: a row has {len(cells)} cells, the header {len(header)}: {line[:80]}")
        rows.append(dict(zip(header, cells)))
    keys = [tuple(r[k] for k in KEY) for r in rows]
    if len(keys) != len(set(keys)):
        raise ValueError(f"{path}: two rows share a (claim, regime, effect)")
    return rows


def verdict(text: str) -> str:
    """The verdict as rspo.report.rule.Row.verdict_text wrote it, its reason cut to the first clause:
    'not testable: RS inactive', 'inconclusive (provisional)'; a check keeps its outcome ('check:
    not supported')."""
    marker = f" ({PROVISIONAL}: n < {MIN_SEEDS})"
    head = text.replace(marker, "")
    word, _, reason = head.partition(": ")
    if word == NOT_TESTABLE:  # 'at this scale: no regime found ... (P(grpo) ...)' -> 'at this scale'
        head = f"{word}: {reason.split(' (')[0].split(': ')[0]}"
    elif word != "check":  # 'inconclusive: supported before Holm's correction ...' -> 'inconclusive'
        head = word
    return head + (f" ({PROVISIONAL})" if marker in text else "")


def cell(row: dict[str, str] | None) -> str:
    if row is None:
        return "–"
    estimate = "" if row["Mean"] == "–" else f"{row['Mean']} {row['95% CI'].replace(' *', '')}, "
    return f"n={row['n']}: {estimate}{verdict(row['Verdict'])}"


def moved(old: dict[str, str] | None, new: dict[str, str] | None, labels: tuple[str, str]) -> str:
    if old is None:
        return f"new in the {labels[1]} table"
    if new is None:
        return f"not in the {labels[1]} design"
    a, b = verdict(old["Verdict"]), verdict(new["Verdict"])
    return "same verdict" if a == b else f"{a} -> {b}"


def changes(earlier: str | Path, later: str | Path, labels: tuple[str, str] = ("3-seed", "5-seed")) -> str:
    """The markdown table: every row of either table, in the later table's order, then the rows only
    the earlier one has."""
    old = {tuple(r[k] for k in KEY): r for r in parse(earlier)}
    new = {tuple(r[k] for k in KEY): r for r in parse(later)}
    order = list(new) + [k for k in old if k not in new]
    out = [
        f"| Claim | Regime | Effect | {labels[0]} | {labels[1]} | what moved |",
        "|:---|:---|:---|:---|:---|:---|",
    ]
    same = 0
    for key in order:
        o, n = old.get(key), new.get(key)
        what = moved(o, n, labels)
        same += what == "same verdict"
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {cell(o)} | {cell(n)} | {what} |")
    out += [
        "",
        f"- Rows: {len(new)} in the {labels[1]} table, {len(old)} in the {labels[0]} table, {len(set(old) & set(new))} "
        f"in both; {same} of those keep their verdict.",
        f"- From `{earlier}` and `{later}` by `scripts/claims_changes.py`; each cell: n, mean [95% CI], "
        "verdict (its reason cut to the first clause).",
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("earlier")
    ap.add_argument("later")
    ap.add_argument("--out", help="write here instead of stdout")
    ap.add_argument(
        "--labels", nargs=2, default=("3-seed", "5-seed"), metavar=("EARLIER", "LATER"), help="the two tables' names"
    )
    args = ap.parse_args(argv)
    try:
        text = changes(args.earlier, args.later, tuple(args.labels))
    except (OSError, ValueError) as exc:
        print(f"claims_changes: {exc}", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
