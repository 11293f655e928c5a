"""A new loss is one registration (rspo.losses.register_policy_loss with its rspo.method.Objective):
a toy sequence-level loss, registered here and nowhere else, is accepted by the preset's grid, trains
through compute_policy_loss with its own default clip, has its clip fraction merged per response, and
reaches a figure (its registered colour) and a table (its registered label)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from test_report import write_fake_results

from rspo.commands.report import main as report_main
from rspo.losses import POLICY_LOSSES, compute_policy_loss, gspo_loss, register_policy_loss
from rspo.method import ALGOS, OBJECTIVES, Objective
from rspo.plan import Plan
from rspo.train.micro_batches import merge_micro_metrics

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def toy():
    facts = Objective("toy", "TOY", (0.1, 0.1), "sequence", 6)
    register_policy_loss("toy", facts)(lambda *a: gspo_loss(*a))
    yield facts
    del POLICY_LOSSES["toy"], OBJECTIVES["toy"]


def test_a_loss_needs_its_facts_and_one_name():
    with pytest.raises(ValueError, match="no facts registered"):
        register_policy_loss("nameless")
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("gmpo", Objective("gmpo", "GMPO", (0.4, 0.4), "token", 2))
    with pytest.raises(ValueError, match="clip_unit"):
        Objective("x", "X", (0.1, 0.1), "tokens", 6)
    assert "nameless" not in OBJECTIVES and "nameless" not in ALGOS


def test_a_registered_loss_trains_with_its_own_clip_and_clipfrac_unit(toy):
    assert "toy" in ALGOS and list(ALGOS)[-1] == "toy"
    lp = torch.tensor([[0.0, -0.5, -1.0], [-0.2, -0.2, 0.0]], requires_grad=True)
    old = torch.zeros(2, 3)
    adv, mask = torch.tensor([1.0, -1.0]), torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, m = compute_policy_loss("toy", lp, old, adv, mask)
    ref, m_ref = compute_policy_loss("gspo", lp, old, adv, mask, clip=toy.clip)
    assert loss.item() == ref.item() and m["actor/pg_clipfrac"] == m_ref["actor/pg_clipfrac"]
    # merged over micro-batches per response (its unit), not per token
    parts = {"actor/pg_clipfrac": [(1.0, 1, 100), (0.0, 3, 3)]}
    assert merge_micro_metrics(parts, "toy")["actor/pg_clipfrac"] == pytest.approx(0.25)
    assert merge_micro_metrics(parts, "gmpo")["actor/pg_clipfrac"] == pytest.approx(100 / 103)


def test_a_registered_loss_reaches_a_figure_and_a_table(toy, tmp_path):
    preset = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    preset["grid"]["plugin"]["algos"] = ["toy", "gmpo"]
    preset.pop("stress", None), preset.pop("mismatch", None)
    (tmp_path / "configs").mkdir()
    path = tmp_path / "configs" / "smoke.yaml"
    path.write_text(yaml.safe_dump(preset))
    plan = Plan.from_file(path)
    assert {"toy-s0", "toy-rs0.8-s0"} <= set(plan.runs), sorted(plan.runs)
    write_fake_results(tmp_path / "results", plan)
    out = tmp_path / "fig4_plugin.pdf"
    runs = str(tmp_path / "results" / "runs")
    assert report_main(["figure", "fig4_plugin", "--preset", str(path), "--runs-dir", runs, "--out", str(out)]) == 0
    assert out.read_bytes().startswith(b"%PDF")
    table = tmp_path / "table_countdown.md"
    args = ["table", "table_countdown", "--preset", str(path), "--out", str(table)]
    assert report_main([*args, "--eval-dir", str(tmp_path / "results" / "eval"), "--runs-dir", runs]) == 0
    assert any(line.startswith("| TOY |") for line in table.read_text().splitlines()), table.read_text()
