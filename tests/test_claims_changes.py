"""scripts/claims_changes.py: the row-by-row comparison of two claims tables that docs/small_study.md
embeds (docs/results/small/claims_vs_3seed.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from claims_changes import changes, main, parse, verdict  # noqa: E402

HEAD = (
    "**The paper's claims at small scale (small)**\n\n"
    "| Claim | Paper | Regime | Role | Effect | n | Mean | 95% CI | MDE | Margin | p (Holm) | Verdict |\n"
    "|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
)


def row(claim, regime, effect, n, mean, ci, text, role="primary"):
    return f"| {claim} | Sec. 5 | {regime} | {role} | {effect} | {n} | {mean} | {ci} | 1.0 | 1 | – | {text} |\n"


def table(tmp_path, name, *rows):
    path = tmp_path / name
    path.write_text(HEAD + "".join(rows) + "\n- a note\n")
    return path


def test_rows_are_matched_by_claim_regime_and_effect_whatever_their_role(tmp_path):
    old = table(
        tmp_path,
        "old.md",
        row(
            "R3 lowers the KL",
            "mismatch",
            "log2 KL",
            3,
            "+0.85",
            "[+0.44, +1.25]",
            "inconclusive: supported before Holm's correction (sup p 0.120) (provisional: n < 5)",
        ),
        row("RS stabilises GRPO", "natural", "reward", 0, "–", "–", "not testable: RS inactive (mean γ 0.9986)"),
        row("RS stabilises GRPO", "stress", "reward", 3, "–", "–", "not testable: both arms at the floor (0.4%)"),
    )
    new = table(
        tmp_path,
        "new.md",
        row(
            "RS stabilises GRPO",
            "natural",
            "reward",
            0,
            "–",
            "–",
            "not testable: at this scale: no regime "
            "found in which RS acts (P(grpo) met by none of the 9 regime trials); RS inactive",
        ),
        row("R3 lowers the KL", "mismatch", "log2 KL", 5, "+0.90", "[+0.50, +1.30] *", "supported", role="exploratory"),
        row("TIS improves GMPO", "mismatch", "reward", 5, "-0.10", "[-1.00, +0.80]", "inconclusive"),
    )
    lines = changes(old, new).splitlines()
    body = [line for line in lines[2:] if line.startswith("|")]
    assert [line.split(" | ")[0] for line in body] == [
        "| RS stabilises GRPO",  # the later table's order first
        "| R3 lowers the KL",
        "| TIS improves GMPO",
        "| RS stabilises GRPO",  # then what only the earlier table has
    ]
    assert body[0].endswith("| not testable: RS inactive -> not testable: at this scale |")
    assert "n=5: +0.90 [+0.50, +1.30], supported" in body[1]  # the floored-interval mark dropped
    assert body[1].endswith("| inconclusive (provisional) -> supported |")
    assert body[2].endswith("| – | n=5: -0.10 [-1.00, +0.80], inconclusive | new in the 5-seed table |")
    assert body[3].endswith("| not in the 5-seed design |") and "stress" in body[3]
    assert "Rows: 3 in the 5-seed table, 3 in the 3-seed table, 2 in both; 0 of those keep their verdict" in lines[-2]


def test_verdicts_are_cut_to_their_first_clause():
    assert verdict("inconclusive (provisional: n < 5)") == "inconclusive (provisional)"
    assert verdict("not testable: RS inactive (mean γ 0.9986, 0.00071% of tokens at γmin)") == (
        "not testable: RS inactive"
    )
    assert verdict("not testable: at this scale: no regime found in which ... (P(grpo) met by none)") == (
        "not testable: at this scale"
    )
    assert verdict("equivalent") == "equivalent"
    assert verdict("check holds") == "check holds"
    assert verdict("check: not supported (provisional: n < 5)") == "check: not supported (provisional)"


def test_a_file_without_a_claims_table_or_with_a_broken_row_is_refused(tmp_path, capsys):
    (tmp_path / "empty.md").write_text("# nothing here\n")
    with pytest.raises(ValueError, match="no claims table"):
        parse(tmp_path / "empty.md")
    broken = table(tmp_path, "broken.md", "| only | three | cells |\n")
    with pytest.raises(ValueError, match="a row has 3 cells, the header 12"):
        parse(broken)
    twice = table(tmp_path, "twice.md", *[row("A", "natural", "reward", 3, "+1", "[0, 2]", "inconclusive")] * 2)
    with pytest.raises(ValueError, match="two rows share"):
        parse(twice)
    assert main([str(tmp_path / "empty.md"), str(twice)]) == 2
    assert "no claims table" in capsys.readouterr().err


def test_the_committed_comparison_is_the_scripts_output_from_the_committed_tables(monkeypatch):
    """What docs/small_study.md embeds is rebuilt from the two shipped claims tables, not typed."""
    monkeypatch.chdir(ROOT)  # the footnote names the tables by their repository paths
    built = changes("docs/results/small-3seed/tables/table_claims.md", "docs/results/small/tables/table_claims.md")
    assert (ROOT / "docs" / "results" / "small" / "claims_vs_3seed.md").read_text() == built


def test_the_committed_list_of_issue_74s_verdict_changes_is_the_scripts_output(monkeypatch):
    """docs/results/small/claims_vs_2026-11-28.md lists every row whose verdict moved when the rule's
    words changed (issue 74) and the stop-gradient arm joined: rebuilt from the table as shipped before
    (claims_2026-11-28.md) and the table shipped now."""
    monkeypatch.chdir(ROOT)
    built = changes(
        "docs/results/small/claims_2026-11-28.md",
        "docs/results/small/tables/table_claims.md",
        ("2026-11-28", "2026-12-06"),
    )
    assert (ROOT / "docs" / "results" / "small" / "claims_vs_2026-11-28.md").read_text() == built
