"""`python -m rspo report figure|table <name> ...`: build one paper figure or table from run files;
`python -m rspo report time --runs-dir DIR`: where each run's wall time went, and the sum.

    python -m rspo report figure fig4_plugin --preset configs/small.yaml \
        --runs-dir results/small/runs --out results/small/figures/fig4_plugin.pdf   # + .png
    python -m rspo report table table_countdown --preset configs/small.yaml \
        --eval-dir results/small/eval --runs-dir results/small/runs \
        --out results/small/tables/table_countdown.md  # + .tex
    python -m rspo report table table_main --preset configs/paper_large_math.yaml --eval-dir ... --out ...
    python -m rspo report table table_efficiency --preset configs/small.yaml --bench results/small/bench.json --out ...
    python -m rspo report table table_claims --preset configs/small.yaml --eval-dir results/small/eval \
        --runs-dir results/small/runs --bench results/small/bench.json --out results/small/tables/table_claims.md

The runs a figure or table uses come from the preset (rspo.plan), exactly as Snakemake plans
them; `--seeds 0 1 2` replaces the preset's seeds (Snakemake passes it for `--config seeds=[...]`),
`--runs a b c` draws a figure from an explicit list instead.

`--mlflow` (the Snakemake rules pass it) also logs the PNG and PDF of a figure, or the Markdown and
LaTeX of a table, into the preset's MLflow report run (one run named `report`, rspo.tracking
`log_report`), tagged `runs/<name>` with the MLflow runs it was built from: the training runs of a
figure, the evaluation runs (`eval-<task>-<model>`) of a table.
"""

from __future__ import annotations

import argparse
import sys

from rspo.config import ConfigError
from rspo.plan import FIGURES, TABLES, Plan


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m rspo report", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="kind", required=True)
    f = sub.add_parser("figure", help="one paper figure (PDF + PNG)")
    f.add_argument("name", choices=FIGURES)
    f.add_argument("--preset", required=True, help="preset YAML (configs/<name>.yaml)")
    f.add_argument("--runs-dir", required=True, help="results/<preset>/runs")
    f.add_argument("--out", required=True, help="output .pdf; a .png is written beside it")
    f.add_argument("--seeds", type=int, nargs="+", help="replace the preset's seeds")
    f.add_argument("--full", action="store_true", help="the whole grid (presets with default_families)")
    f.add_argument("--families", nargs="+", help="these grid families instead of the preset's default_families")
    f.add_argument("--runs", nargs="+", help="draw these runs instead of the preset's selection")
    f.add_argument("--mlflow", action="store_true", help="also log the figure into the preset's MLflow report run")
    t = sub.add_parser("table", help="one paper table (Markdown + LaTeX)")
    t.add_argument("name", choices=TABLES)
    t.add_argument("--preset", required=True, help="preset YAML (configs/<name>.yaml)")
    t.add_argument("--eval-dir", help="results/<preset>/eval (table_main, table_countdown)")
    t.add_argument("--runs-dir", help="results/<preset>/runs (table_countdown: collapse flags from run.json)")
    t.add_argument("--bench", help="results/<preset>/bench.json (table_efficiency, table_claims)")
    t.add_argument("--out", required=True, help="output .md; a .tex is written beside it")
    t.add_argument("--seeds", type=int, nargs="+", help="replace the preset's seeds")
    t.add_argument("--full", action="store_true", help="the whole grid (presets with default_families)")
    t.add_argument("--families", nargs="+", help="these grid families instead of the preset's default_families")
    t.add_argument("--mlflow", action="store_true", help="also log the table into the preset's MLflow report run")
    w = sub.add_parser("time", help="where each run's wall time went (final.json's time account), and the sum")
    w.add_argument("--runs-dir", required=True, help="results/<preset>/runs")
    return ap


def log_to_mlflow(plan: Plan, target: str, files: list, built_from: list[str]) -> None:
    from rspo.report.mlflow_run import log_report
    from rspo.tracking import default_tracking_uri, experiment_name

    experiment = experiment_name(plan.spec)
    run_id = log_report(default_tracking_uri(plan.name), experiment, plan.name, target, files, built_from)
    print(f"logged {target} into MLflow run {run_id} (report)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.kind == "time":
        from rspo.report.time_table import format_time_table, run_accounts

        print(format_time_table(run_accounts(args.runs_dir)))
        return 0
    try:
        plan = Plan.from_file(args.preset, args.seeds, args.full, args.families)
        if args.kind == "figure":
            from rspo.report.figures import build_figure

            pdf, png = build_figure(args.name, plan, args.runs_dir, args.out, runs=args.runs)
            print(f"wrote {pdf} and {png}")
            if args.mlflow:
                log_to_mlflow(plan, args.name, [png, pdf], list(args.runs or plan.figure_runs(args.name)))
            return 0
        from rspo.report import tables

        if args.name == "table_efficiency":
            if not args.bench:
                parser.error("table_efficiency needs --bench results/<preset>/bench.json")
            table = tables.table_efficiency(plan, args.bench)
        elif args.name == "table_claims":
            if not (args.eval_dir and args.runs_dir):
                parser.error("table_claims needs --eval-dir and --runs-dir (and --bench for the throughput claim)")
            from rspo.report.claims import table_claims

            table = table_claims(plan, args.eval_dir, args.runs_dir, args.bench)
        else:
            if not args.eval_dir:
                parser.error(f"{args.name} needs --eval-dir results/<preset>/eval")
            if args.name == "table_main":
                table = tables.table_main(plan, args.eval_dir)
            else:
                table = tables.table_countdown(plan, args.eval_dir, args.runs_dir)
        md, tex = tables.write(table, args.out)
        print(f"wrote {md} and {tex}")
        if args.mlflow:
            log_to_mlflow(plan, args.name, [md, tex], tables.table_sources(plan, args.name, args.eval_dir))
        return 0
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"rspo report: error: {e}", file=sys.stderr)
        return 2
