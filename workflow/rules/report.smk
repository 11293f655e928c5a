# Paper tables and figures (docs/design.md, paper index), built from per-run files only:
# `snakemake -f <target>` redraws one without re-training. Each target has a named rule
# and a file target; a preset that lacks the runs a target needs stops with a message.
# `python -m rspo report figure|table <name> ...` is the same command outside Snakemake.
# `--mlflow` also logs each figure (PNG, PDF) and table (Markdown, LaTeX) into the preset's one
# MLflow run named `report`, tagged `runs/<target>` with the runs it was built from.
# One rule per figure, defined in a loop; each has its caption in workflow/report/<figure>.rst
# (a regime's figure shares the caption of the figure it redraws).


for _fig in FIGURES:

    rule:
        name:
            _fig
        input:
            unpack(lambda wildcards, fig=_fig: figure_inputs(fig)),
        output:
            pdf=f"{R}/figures/{_fig}.pdf",
            png=report(
                f"{R}/figures/{_fig}.png",
                caption=figure_caption(_fig),
                category="Figures" if figure_regime(_fig) == "natural" else f"Figures ({figure_regime(_fig)} regime)",
            ),
        log:
            f"{R}/logs/report/{_fig}.log",
        conda:
            ENV_CPU
        threads: res("report", "threads")
        resources:
            mem_mb=res("report", "mem_mb"),
            runtime=res("report", "runtime"),
            gpu=0,
        params:
            fig=_fig,
            preset=PRESET_FILE,
            preset_digest=preset_digest("report"),
            runs=f"{R}/runs",
            seeds=PLAN_ARGS,
        shell:
            "python -m rspo report figure {params.fig} --preset {params.preset} --runs-dir {params.runs} "
            "--out {output.pdf} {params.seeds} --mlflow > {log} 2>&1"


# Tables: table_main (Table 1, paper numbers as reference rows), table_countdown (Countdown
# accuracy of the base model and every run), table_efficiency (Sec. 5.5 throughput and router
# cache) and table_claims (each small-scale claim: effect, 95% CI over seeds, verdict).
for _table in TABLES:

    rule:
        name:
            _table
        input:
            unpack(lambda wildcards, table=_table: table_inputs(table)),
        output:
            md=report(f"{R}/tables/{_table}.md", caption=f"../report/{_table}.rst", category="Tables"),
            tex=f"{R}/tables/{_table}.tex",
        log:
            f"{R}/logs/report/{_table}.log",
        conda:
            ENV_CPU
        threads: res("report", "threads")
        resources:
            mem_mb=res("report", "mem_mb"),
            runtime=res("report", "runtime"),
            gpu=0,
        params:
            table=_table,
            preset=PRESET_FILE,
            preset_digest=preset_digest("report"),
            args=lambda wildcards, input, table=_table: table_args(table, input),
            seeds=PLAN_ARGS,
        shell:
            "python -m rspo report table {params.table} --preset {params.preset} {params.args} "
            "{params.seeds} --out {output.md} --mlflow > {log} 2>&1"


# The issue's name for Fig. 4 ("plug-in, small setting").
rule fig_plugin_small:
    input:
        rules.fig4_plugin.output,
