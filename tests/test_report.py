"""Report figures and tables from small fake run files in the exact formats rspo writes
(metrics.jsonl, run.json, eval JSON, bench.json): byte-identical rebuilds, reference rows only in
the paper presets, numbers that match the inputs, clear errors on bad input."""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

import pytest

from rspo.commands.report import main as report_main
from rspo.plan import FIGURES, Plan
from rspo.report import reference as ref
from rspo.report import tables

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


# ---------------------------------------------------------------------------- fake run files


def _rng(name: str) -> random.Random:
    return random.Random(zlib.crc32(name.encode()))


def write_fake_run(runs_dir: Path, plan: Plan, name: str, steps: int = 6, val_every: int = 2) -> None:
    """metrics.jsonl (training lines every step, validation lines every val_every), run.json, final.json."""
    run = plan.runs[name]
    rng = _rng(name)
    d = runs_dir / name
    d.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(steps):
        lines.append(
            {
                "step": step,
                "critic/score/mean": min(1.0, 0.1 + 0.1 * step * rng.random()),
                "actor/ppo_kl": 0.01 * rng.random(),
                "actor/pg_clipfrac": 0.1 * rng.random(),
                "actor/pg_loss": rng.uniform(-1, 1),
                "actor/entropy": 1.0 - 0.05 * step * rng.random(),
                "actor/grad_norm": rng.random(),
                "router/shift_ratio_mean": 1.0 - 0.05 * rng.random(),
                "router/shift_clipfrac": 0.05 * rng.random(),
                "response_length/mean": 20 + rng.random(),
                "rollout_corr/k3_kl": 1e-5 * rng.random(),
                "rollout_corr/routing_agreement": 1.0 - 0.01 * rng.random(),
                "perf/step_s": 1.0,
            }
        )
        if step % val_every == 0 or step == steps - 1:
            val = {"step": step}
            if run.task == "countdown":
                val["val/val/score"] = rng.random()
                val["val/val_target/score"] = rng.random()
            else:
                val[f"val/{run.task}/score"] = rng.random()
            lines.append(val)
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (d / "run.json").write_text(
        json.dumps(
            {
                "run_name": name,
                "preset": plan.name,
                "algo": run.algo,
                "router_shift": run.router_shift,
                "gamma_min": run.gamma_min,
                "stop_gradient": run.stop_gradient,
                "routing": run.routing,
                "seed": run.seed,
                "task": run.task,
                "fingerprint": "0" * 16,
                "mlflow_run_id": "x",
                "collapsed": run.algo == "grpo" and not run.router_shift,
            }
        )
    )
    collapsed = run.algo == "grpo" and not run.router_shift
    (d / "final.json").write_text(
        json.dumps(
            {"step": steps - 1, "steps": steps, "collapsed": collapsed, "collapse_step": 3 if collapsed else None}
        )
    )


def write_fake_eval(eval_dir: Path, plan: Plan, name: str, task: str) -> None:
    rng = _rng(f"{name}/{task}")
    d = eval_dir / name
    d.mkdir(parents=True, exist_ok=True)
    if task == "countdown":
        data = {"splits": {s: {"accuracy": round(rng.random(), 4), "n": 16} for s in ("val", "val_target")}}
    else:
        wanted = ((plan.preset.get("eval") or {}).get(task) or {}).get("benchmarks", ref.paper_benchmarks(task))
        benches = {b: {"pass@1": round(rng.random(), 4), "n_problems": 2, "n_samples": 1} for b in wanted}
        if "aime24" in benches:  # avg@2: each run's score and their spread
            runs = [round(rng.random(), 4), round(rng.random(), 4)]
            benches["aime24"].update(n_samples=2, samples_requested=2, runs=runs, std_over_runs=0.05)
            benches["aime24"]["unfinished_thinking"] = 1
        config = {"template": "chat", "enable_thinking": task == "math", "temperature": 0.6, "top_p": 0.95}
        config.update(top_k=20, max_new_tokens=32, seed=0, backend="hf", dtype="float32", decoding="sampled")
        if task == "code":
            config["data"] = {"mbpp": "local file(s): mbpp.jsonl"}
        data = {
            "benchmarks": benches,
            "average": sum(b["pass@1"] for b in benches.values()) / len(benches),
            "config": config,
        }
    (d / f"{task}.json").write_text(json.dumps(data))


def write_fake_bench(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "rs_throughput_ratio": 0.9,
                "router_cache_bytes_per_token_layer_k": 6.0,
                "rollout_tokens_per_s": 123.4,
                "table": "...",
                "rs_throughput_ratio_per_step": [0.88, 0.9, 0.93, 0.89],
            }
        )
    )


def write_fake_results(results: Path, plan: Plan) -> None:
    """Every run, eval and bench file the preset's report targets read."""
    for name in plan.runs:
        write_fake_run(results / "runs", plan, name)
    for table in ("table_countdown", "table_main"):
        for task, runs in plan.table_runs(table).items():
            for name in ["base"] + runs:
                write_fake_eval(results / "eval", plan, name, task)
    write_fake_bench(results / "bench.json")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    plan = Plan.from_file(CONFIGS / "smoke.yaml")
    write_fake_results(root, plan)
    return plan, root


# ---------------------------------------------------------------------------- figures


SMOKE_FIGURES = [f for f in FIGURES if Plan.from_file(CONFIGS / "smoke.yaml").available(f)]


def test_smoke_builds_paper_and_stress_figures():
    assert {"fig4_plugin", "fig4_plugin_stress", "fig6_mechanism_stress"} <= set(SMOKE_FIGURES)


@pytest.mark.parametrize("figure", SMOKE_FIGURES)
def test_figure_is_byte_identical_across_rebuilds(smoke, tmp_path, figure):
    plan, root = smoke
    outs = []
    for i in range(2):
        out = tmp_path / f"build{i}" / f"{figure}.pdf"
        assert (
            report_main(
                [
                    "figure",
                    figure,
                    "--preset",
                    str(CONFIGS / "smoke.yaml"),
                    "--runs-dir",
                    str(root / "runs"),
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        outs.append(out)
    for suffix in (".pdf", ".png"):
        a, b = (o.with_suffix(suffix).read_bytes() for o in outs)
        assert len(a) > 1000
        assert a == b, f"{figure}{suffix} differs between two builds"
    assert outs[0].read_bytes().startswith(b"%PDF")
    assert b"CreationDate" not in outs[0].read_bytes()


def test_figure_with_several_seeds_is_byte_identical(tmp_path):
    # Several seeds -> bands over seeds: rebuilding must give the same bytes.
    plan = Plan.from_file(CONFIGS / "smoke.yaml", seeds=[0, 1, 2])
    for name in plan.figure_runs("fig4_plugin"):
        write_fake_run(tmp_path / "runs", plan, name)
    pdfs = []
    for i in range(2):
        out = tmp_path / f"b{i}" / "fig4_plugin.pdf"
        assert (
            report_main(
                [
                    "figure",
                    "fig4_plugin",
                    "--preset",
                    str(CONFIGS / "smoke.yaml"),
                    "--seeds",
                    "0",
                    "1",
                    "2",
                    "--runs-dir",
                    str(tmp_path / "runs"),
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        pdfs.append(out.read_bytes())
    assert pdfs[0] == pdfs[1]


def test_seed_bands_are_min_max_around_the_mean_and_say_so(tmp_path):
    """Synthetic metrics, 3 seeds with known values: the line is their mean, the band spans the
    lowest to the highest seed at every step, and the legend names the band and n."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from rspo.report import figures

    plan = Plan.from_file(CONFIGS / "smoke.yaml", seeds=[0, 1, 2])
    names = [n for n in plan.figure_runs("fig7_entropy") if plan.runs[n].method == "grpo"]
    assert len(names) == 3
    values = {0: [1.0, 2.0, 3.0], 1: [2.0, 2.0, 5.0], 2: [6.0, 2.0, 4.0]}
    for name in names:
        d = tmp_path / "runs" / name
        d.mkdir(parents=True)
        seed = plan.runs[name].seed
        d.joinpath("metrics.jsonl").write_text(
            "".join(json.dumps({"step": t, "actor/entropy": v}) + "\n" for t, v in enumerate(values[seed]))
        )
    captured = {}
    real_save = figures.style.save

    def keep(fig, out):
        captured["fig"] = fig
        return real_save(fig, out)

    figures.style.save = keep
    try:
        figures.build_figure("fig7_entropy", plan, tmp_path / "runs", tmp_path / "f.pdf", runs=names)
    finally:
        figures.style.save = real_save
    fig = captured["fig"]
    ax = fig.axes[0]
    line = ax.get_lines()[0]
    assert np.allclose(line.get_ydata(), [3.0, 2.0, 4.0])  # mean over seeds
    verts = ax.collections[0].get_paths()[0].vertices
    for t, lo, hi in ((0, 1.0, 6.0), (1, 2.0, 2.0), (2, 3.0, 5.0)):
        ys = verts[np.isclose(verts[:, 0], t), 1]
        assert np.isclose(ys.min(), lo) and np.isclose(ys.max(), hi), (t, ys)
    assert fig.legends[0].get_title().get_text() == "mean of n=3 seeds; band: min-max over seeds"
    plt.close(fig)
    assert figures.band_note(1) == "1 seed"


def test_figure_missing_metrics_file_is_a_clear_error(smoke, tmp_path, capsys):
    plan, root = smoke
    rc = report_main(
        [
            "figure",
            "fig1_reward",
            "--preset",
            str(CONFIGS / "smoke.yaml"),
            "--runs-dir",
            str(tmp_path / "nothing"),
            "--out",
            str(tmp_path / "f.pdf"),
        ]
    )
    assert rc == 2
    assert "metrics.jsonl" in capsys.readouterr().err


def test_figure_missing_required_metric_is_an_error(tmp_path):
    from rspo.report.figures import build_figure

    plan = Plan.from_file(CONFIGS / "smoke.yaml")
    for name in plan.figure_runs("fig7_entropy"):
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.jsonl").write_text(json.dumps({"step": 0, "critic/score/mean": 0.1}) + "\n")
    with pytest.raises(ValueError, match="actor/entropy"):
        build_figure("fig7_entropy", plan, tmp_path, tmp_path / "x.pdf")


def test_read_metrics_last_value_wins_and_bad_lines_fail(tmp_path):
    from rspo.report.figures import read_metrics

    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 0, "a": 1.0}\n{"step": 1, "a": 2.0}\n{"step": 1, "a": 3.0, "b": 5}\n')
    df = read_metrics(p)
    assert df["step"].tolist() == [0, 1]
    assert df["a"].tolist() == [1.0, 3.0]
    assert df["b"].isna().tolist() == [True, False]
    p.write_text('{"a": 1.0}\n')
    with pytest.raises(ValueError, match="step"):
        read_metrics(p)
    # a missing run names the two ways to get one: train it, or the shipped runs (make figures / make figure)
    with pytest.raises(FileNotFoundError, match=r"missing metrics file: .*make figures.*make figure FIG=<name>"):
        read_metrics(tmp_path / "absent" / "metrics.jsonl")


# ---------------------------------------------------------------------------- tables


def _table(name, preset_file, root, tmp_path):
    out = tmp_path / f"{name}.md"
    args = ["table", name, "--preset", str(preset_file), "--out", str(out)]
    args += (
        ["--bench", str(root / "bench.json")]
        if name == "table_efficiency"
        else ["--eval-dir", str(root / "eval"), "--runs-dir", str(root / "runs")]
    )
    assert report_main(args) == 0
    return out.read_text(), out.with_suffix(".tex").read_text()


@pytest.mark.parametrize("name", ["table_countdown", "table_main", "table_efficiency"])
def test_smoke_tables_have_no_reference_rows(smoke, tmp_path, name):
    plan, root = smoke
    md, tex = _table(name, CONFIGS / "smoke.yaml", root, tmp_path)
    assert "[paper]" not in md and "(paper)" not in tex
    assert "\\toprule" in tex and "\\bottomrule" in tex and "\\midrule" in tex
    assert md.count("\n|") >= 3


def test_table_countdown_numbers(smoke, tmp_path):
    plan, root = smoke
    md, _ = _table("table_countdown", CONFIGS / "smoke.yaml", root, tmp_path)
    acc = json.loads((root / "eval" / "gmpo-s0" / "countdown.json").read_text())["splits"]
    line = next(l for l in md.splitlines() if l.startswith("| GMPO |"))
    assert f"{100 * acc['val']['accuracy']:.1f}" in line and f"{100 * acc['val_target']['accuracy']:.1f}" in line
    # grpo-s0 is marked collapsed by the fake run.json
    assert next(l for l in md.splitlines() if l.startswith("| GRPO |")).endswith("| 1/1 |")
    assert next(l for l in md.splitlines() if l.startswith("| GRPO |")).endswith("| 3 | 1/1 |")  # its step
    assert next(l for l in md.splitlines() if l.startswith("| GMPO |")).endswith("| – | 0/1 |")
    assert "Base (pretrained)" in md and "Index replay (GMPO)" in md


def _main_preset(tmp_path: Path, name: str, tasks: list[str]) -> Path:
    """A paper_large-style preset (only a `main` family) for the table tests."""
    import yaml

    data = yaml.safe_load((CONFIGS / "smoke.yaml").read_text())
    data["preset"] = name
    data["grid"] = {"main": {"tasks": tasks, "methods": ["grpo", "gspo", "gmpo", "gmpo+rs"]}}
    data.pop("stress", None)  # the stress regime repeats Countdown families, which this preset has not
    data["seeds"] = [0, 1]
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_table_main_reference_rows_only_in_paper_presets(tmp_path):
    for name, expect in (("paper_large_math", True), ("my_math_study", False)):
        preset = _main_preset(tmp_path, name, ["math"])
        plan = Plan.from_file(preset)
        root = tmp_path / name
        write_fake_results(root, plan)
        md, tex = _table("table_main", preset, root, tmp_path)
        assert ("[paper]" in md) is expect
        assert ("Paper, Table 1" in tex) is expect
        if expect:
            # the paper's RSPO math row, as printed (Avg. 77.1)
            assert "| GMPO+RS (RSPO) [paper] | 80.1 | 95.0 | 94.2 | 50.7 | 65.8 | 77.1 | – |" in md
        # our GRPO AIME24 cell is the mean ± std over the two seeds
        vals = [
            100
            * json.loads((root / "eval" / f"math-grpo-s{s}" / "math.json").read_text())["benchmarks"]["aime24"][
                "pass@1"
            ]
            for s in (0, 1)
        ]
        import statistics

        cell = f"{statistics.fmean(vals):.1f} ± {statistics.stdev(vals):.1f}"
        assert next(l for l in md.splitlines() if l.startswith("| GRPO |")).split(" | ")[1] == cell


def test_table_main_writes_each_columns_protocol_and_what_the_papers_numbers_imply(smoke, tmp_path):
    """Under Table 1: the protocol the Base evaluation recorded (problems, template and thinking mode,
    sampling, budget, samples, seed, grader) and the notes on the paper's numbers; Dr. GRPO's
    83-problem AMC set after Avg., outside it."""
    plan, root = smoke
    md, tex = _table("table_main", CONFIGS / "smoke.yaml", root, tmp_path)
    header = next(line for line in md.splitlines() if line.startswith("| Method"))
    assert header == (
        "| Method | Math: AIME24 | Math: AMC23 | Math: MATH500 | Math: Minerva | Math: OlympiadBench | Math: Avg. "
        "| Math: AMC22-23 (83) | Code: LCB | Code: MBPP | Code: HumanEval | Code: Avg. |"
    )
    base = json.loads((root / "eval" / "base" / "math.json").read_text())["benchmarks"]
    paper5 = ["aime24", "amc23", "math500", "minerva", "olympiadbench"]
    avg = sum(100 * base[b]["pass@1"] for b in paper5) / 5
    row = next(line for line in md.splitlines() if line.startswith("| Base |")).split(" | ")
    assert row[6] == f"{avg:.1f}" and row[7] == f"{100 * base['amc22_23']['pass@1']:.1f}"
    math_line = next(line for line in md.splitlines() if line.startswith("- Protocol, math"))
    assert (
        "AIME24 2 problems, avg@2, sd over runs 5.0, 1/4 thoughts unfinished;" in math_line
        and "AMC23 2 problems, 1 sample" in math_line
    )
    assert "the model's chat template (thinking on)" in math_line
    assert "temperature 0.6, top-p 0.95, top-k 20, budget 32 tokens, seed 0" in math_line
    assert "Grader: math-verify" in math_line
    code_line = next(line for line in md.splitlines() if line.startswith("- Protocol, code"))
    assert "(thinking off)" in code_line and "Grader: sandboxed unit tests" in code_line
    assert "MBPP data: local file(s): mbpp.jsonl." in code_line
    assert "Paper AIME24: no row's value (80.4, 77.0, 80.4, 80.1, 80.1) is a multiple of 100/30" in md
    assert "Paper AMC23: every value is a multiple of 2.5 = 100/40" in md
    assert "Paper Base AIME24 80.4 is Qwen3's own published thinking-mode" in md
    assert "% Protocol, math" in tex


def test_the_papers_numbers_are_checked_against_what_one_evaluation_can_print():
    assert ref.one_evaluation_gives(82.5, 40) and ref.one_evaluation_gives(90.0, 40)
    assert not ref.one_evaluation_gives(80.4, 30) and not ref.one_evaluation_gives(77.0, 90)
    assert ref.one_evaluation_gives(80.0, 30) and ref.one_evaluation_gives(90.4, 83)  # 75/83
    notes = ref.implied_notes()
    assert len(notes) == 4 and "could give 1 of the 5 values" in notes[1]
    assert "MATH500 90.7, Minerva 47.7, OlympiadBench 62.0" in notes[2]


def test_table_claims_from_run_files(smoke, tmp_path):
    """Every claim whose two methods the smoke grid has, in both regimes, plus the benchmark row;
    the numbers are the paired effects of the fake files and the rule is printed under the table.
    The fake runs are 6 steps long: too short for the training-reward and trend measures (10 steps),
    so their rows are left out and the accuracy rows remain."""
    from rspo.report import claims, measures, rule

    plan, root = smoke
    out = tmp_path / "table_claims.md"
    assert (
        report_main(
            [
                "table",
                "table_claims",
                "--preset",
                str(CONFIGS / "smoke.yaml"),
                "--eval-dir",
                str(root / "eval"),
                "--runs-dir",
                str(root / "runs"),
                "--bench",
                str(root / "bench.json"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    md = out.read_text()
    assert claims.RULE in md and out.with_suffix(".tex").is_file()
    assert "| Role |" in md and "| MDE |" in md and "| p (Holm) |" in md
    rows = claims.collect(plan, root / "eval", root / "runs", root / "bench.json")
    got = {(r.claim.key, r.claim.measure, r.regime) for r in rows}
    # smoke: plugin has grpo and gmpo (no gspo), gamma_min 0.5/0.8 (no 0.2); stress repeats plugin only
    assert {
        ("grpo-collapses", "acc", "natural"),
        ("rs-grpo", "acc", "natural"),
        ("rs-gmpo", "acc", "natural"),
        ("nosg", "steps", "natural"),
        ("freeze", "acc", "natural"),
        ("logit-replay", "acc", "natural"),
        ("index-replay", "acc", "natural"),
        ("rs-grpo", "acc", "stress"),
        ("rs-gmpo", "acc", "stress"),
        ("grpo-collapses", "acc", "stress"),
        ("throughput", "throughput", "benchmark"),
        # beyond the paper: smoke's routing family has R3, TIS and RS+TIS rows
        ("r3-acc", "acc", "natural"),
        ("tis-acc", "acc", "natural"),
        ("rs-tis-acc", "acc", "natural"),
    } == got
    rs_grpo = next(r for r in rows if r.claim.key == "rs-grpo" and r.regime == "natural")
    acc = {
        s: measures.pooled_accuracy(root / "eval" / f"grpo-rs0.8-s{s}" / "countdown.json", ["val", "val_target"]).value
        - measures.pooled_accuracy(root / "eval" / f"grpo-s{s}" / "countdown.json", ["val", "val_target"]).value
        for s in plan.seeds
    }
    assert rs_grpo.n == len(plan.seeds) and rs_grpo.mean == pytest.approx(sum(acc.values()) / len(acc))
    tp = next(r for r in rows if r.regime == "benchmark")
    assert tp.n == 4 and tp.mean == pytest.approx(0.9 - 0.75) and tp.verdict == rule.SUPPORTED and tp.primary
    nosg = next(r for r in rows if r.claim.key == "nosg" and r.regime == "natural")
    assert nosg.mean == 0.0  # neither collapses in the fake files: both count their full length
    assert nosg.n == 1 and nosg.verdict == rule.INCONCLUSIVE  # one seed: no interval


def test_table_efficiency_reference_and_projection(tmp_path):
    plan = Plan.from_file(CONFIGS / "paper_small.yaml")
    write_fake_bench(tmp_path / "bench.json")
    t = tables.table_efficiency(plan, tmp_path / "bench.json")
    md = t.to_markdown()
    assert "| Qwen3-30B-A3B [paper] | 79.2 | 4.00 | 1.50 | – |" in md
    # 6 bytes per (token, layer, expert) at the paper's step: 6 * 1,048,576 * 48 * 8 / 2^30 = 2.25 GiB
    assert "| 90.0 | 6.00 | 2.25 | 123 |" in md


def test_bad_eval_values_are_rejected(tmp_path):
    p = tmp_path / "countdown.json"
    p.write_text(json.dumps({"splits": {"val": {"accuracy": 57.0, "n": 10}}}))
    with pytest.raises(ValueError, match=r"fraction in \[0, 1\]"):
        tables.countdown_accuracy(p, "val")
    with pytest.raises(ValueError, match="val_target"):
        tables.countdown_accuracy(p, "val_target")
    with pytest.raises(FileNotFoundError):
        tables.countdown_accuracy(tmp_path / "none.json", "val")


def test_paper_table1_averages_match_rows():
    # Every printed Avg. is the rounded mean of its row, except RSPO math (printed 77.1, mean 77.16).
    for task in ("math", "code"):
        cols = ref.paper_benchmarks(task)
        assert len(cols) == {"math": 5, "code": 3}[task]
        for method, row in ref.table1(task).items():
            mean = sum(row[b] for b in cols) / len(cols)
            tol = 0.07 if (task, method) == ("math", "gmpo+rs") else 0.05 + 1e-9
            assert abs(mean - row["avg"]) <= tol, (task, method, mean, row["avg"])
    assert ref.cache_gib(ref.PAPER_CACHE_BYTES_PER_TOKEN_LAYER_K) == pytest.approx(
        ref.PAPER_CACHE_GIB_PROBS + ref.PAPER_CACHE_GIB_INDICES
    )


def test_cli_rejects_unbuildable_table(tmp_path, capsys):
    rc = report_main(
        [
            "table",
            "table_main",
            "--preset",
            str(CONFIGS / "small.yaml"),
            "--eval-dir",
            str(tmp_path),
            "--out",
            str(tmp_path / "t.md"),
        ]
    )
    assert rc == 2
    assert "main" in capsys.readouterr().err


# ---------------------------------------------------------------------------- MLflow report run


def test_mlflow_flag_logs_every_file_into_one_report_run_tagged_with_its_runs(smoke, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    plan, root = smoke
    uri = f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # one eval JSON names its model as `rspo evaluate` writes it: the eval run is named from it
    cd_eval = tmp_path / "eval"
    for task, runs in plan.table_runs("table_countdown").items():
        for name in ["base"] + runs:
            write_fake_eval(cd_eval, plan, name, task)
    base = json.loads((cd_eval / "base" / "countdown.json").read_text())
    (cd_eval / "base" / "countdown.json").write_text(json.dumps({**base, "model": "results/smoke/models/base"}))
    preset = str(CONFIGS / "smoke.yaml")
    for fig in ("fig1_reward", "fig6_mechanism"):
        assert (
            report_main(
                [
                    "figure",
                    fig,
                    "--preset",
                    preset,
                    "--runs-dir",
                    str(root / "runs"),
                    "--out",
                    str(tmp_path / "figures" / f"{fig}.pdf"),
                    "--mlflow",
                ]
            )
            == 0
        )
    assert (
        report_main(
            [
                "table",
                "table_countdown",
                "--preset",
                preset,
                "--eval-dir",
                str(cd_eval),
                "--runs-dir",
                str(root / "runs"),
                "--out",
                str(tmp_path / "tables" / "t.md"),
                "--mlflow",
            ]
        )
        == 0
    )
    assert (
        report_main(
            [
                "table",
                "table_countdown",
                "--preset",
                preset,
                "--eval-dir",
                str(cd_eval),
                "--out",
                str(tmp_path / "no_mlflow.md"),
            ]
        )
        == 0
    )  # without the flag: nothing logged

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(plan.preset["mlflow"]["experiment"])
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.run_name for r in runs] == ["report"]
    run = runs[0]
    arts = {a.path for d in ("figures", "tables") for a in client.list_artifacts(run.info.run_id, d)}
    assert arts == {
        "figures/fig1_reward.png",
        "figures/fig1_reward.pdf",
        "figures/fig6_mechanism.png",
        "figures/fig6_mechanism.pdf",
        "tables/t.md",
        "tables/t.tex",
    }
    tags = run.data.tags
    assert tags["runs/fig1_reward"].split(", ") == plan.figure_runs("fig1_reward")
    assert tags["runs/fig6_mechanism"].split(", ") == plan.figure_runs("fig6_mechanism")
    assert tags["runs/table_countdown"].split(", ") == (
        ["eval-countdown-base"] + [f"eval-countdown-{n}" for n in plan.table_runs("table_countdown")["countdown"]]
    )
    assert "**fig1_reward**" in tags["mlflow.note.content"] and "**table_countdown**" in tags["mlflow.note.content"]


def test_default_families_plan_a_subset_and_full_the_whole_grid():
    """A preset with default_families: the default plan keeps those families (with the mechanism
    pair) in both regimes and drops the other stress families; full=True is the whole grid."""
    import yaml

    data = yaml.safe_load((CONFIGS / "smoke.yaml").read_text())
    data["default_families"] = ["plugin"]
    data["stress"]["families"] = ["plugin", "routing"]
    default, full = Plan(data), Plan(data, full=True)
    assert set(default.families) == {"plugin", "mechanism", "stress_plugin", "stress_mechanism", "main"}
    assert set(full.families) > set(default.families) and "routing" in full.families
    assert "stress_routing" in full.families and not default.available("fig8_routing_stress")
    assert set(default.runs) < set(full.runs)
    assert not default.available("fig8_routing") and full.available("fig8_routing")
    assert default.available("fig4_plugin_stress") and default.figure_runs("fig4_plugin") == full.figure_runs(
        "fig4_plugin"
    )
    assert set(default.table_runs("table_countdown")["countdown"]) < set(
        full.table_runs("table_countdown")["countdown"]
    )


def test_mismatch_regime_draws_its_figure_and_gets_its_claims_rows(tmp_path):
    """The small preset's mismatch regime (FP8 engine): fig9_mismatch_mismatch from its runs, and the
    claims beyond the paper (R3's routing agreement and KL, R3 / TIS / RS+TIS reward and accuracy)
    beside the paper's RS claim, computed from the run files."""
    from rspo.report import claims, measures, rule
    from rspo.report.figures import build_figure

    plan = Plan.from_file(CONFIGS / "small.yaml", families=["mismatch_routing"])
    assert len(plan.runs) == 5 * len(plan.seeds) == 25
    for name, run in plan.runs.items():
        write_fake_run(tmp_path / "runs", plan, name, steps=12, val_every=6)
        write_fake_eval(tmp_path / "eval", plan, name, "countdown")
        path = tmp_path / "runs" / name / "metrics.jsonl"
        recs = [json.loads(line) for line in path.read_text().splitlines()]
        r3 = run.routing == "rollout_replay"
        for rec in recs:
            if "rollout_corr/k3_kl" in rec:  # R3: full agreement, half the KL (the screen's picture)
                jitter = 0.1 * (rec["step"] % 3 - 1)  # step-to-step noise, the same in every run
                rec["rollout_corr/k3_kl"] = (1e-3 if r3 else 2e-3) * (1 + 0.01 * run.seed) * (1 + jitter)
                rec["rollout_corr/routing_agreement"] = 1.0 if r3 else 0.97 + 0.001 * run.seed + 0.01 * jitter
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    pdf, png = build_figure("fig9_mismatch_mismatch", plan, tmp_path / "runs", tmp_path / "fig9.pdf")
    assert Path(pdf).stat().st_size > 0 and Path(png).stat().st_size > 0
    rows = {(r.claim.key, r.claim.measure): r for r in claims.collect(plan, tmp_path / "eval", tmp_path / "runs", None)}
    assert {k for k, _ in rows} == {"rs-gmpo", "r3-agreement", "r3-kl", "r3-acc", "tis-acc", "rs-tis-acc"}
    assert all(r.regime == "mismatch" for r in rows.values())
    agree = rows[("r3-agreement", "agreement")]
    assert agree.n == 5 and agree.mean == pytest.approx(100 - 97 - 0.2, abs=0.05) and agree.verdict == rule.SUPPORTED
    assert agree.kind == "check" and not agree.primary and agree.verdict_text == "check holds"  # by construction
    kl = rows[("r3-kl", "mismatch_kl")]
    assert kl.est.floored  # equal differences in every seed: the interval's SD is the within-run noise
    assert kl.mean == pytest.approx(1.0) and kl.verdict == rule.SUPPORTED  # log2(2e-3 / 1e-3)
    tis = rows[("tis-acc", "acc")]
    acc = [
        measures.pooled_accuracy(
            tmp_path / "eval" / f"mismatch-gmpo-tis-s{s}" / "countdown.json", ["val", "val_target"]
        ).value
        - measures.pooled_accuracy(
            tmp_path / "eval" / f"mismatch-gmpo-s{s}" / "countdown.json", ["val", "val_target"]
        ).value
        for s in plan.seeds
    ]
    assert tis.mean == pytest.approx(sum(acc) / len(acc)) and not tis.primary
    assert rows[("tis-acc", "reward")].primary  # the training reward is the primary outcome
    note = "\n".join(claims.table_claims(plan, tmp_path / "eval", tmp_path / "runs").notes)
    assert 'mismatch = the same with the overlay {"rollout": {"dtype": "fp8"}' in note
