# Paper tables and figures (DESIGN.md section 5), built from per-run files only:
# `snakemake -f <target>` redraws one without re-training. Each target has a named rule
# and a file target; a preset that lacks the runs a target needs stops with a message.
# `python -m rspo report figure|table <name> ...` is the same command outside Snakemake.
# `--mlflow` also logs each figure (PNG, PDF) and table (Markdown, LaTeX) into the preset's one
# MLflow run named `report`, tagged `runs/<target>` with the runs it was built from.


# Fig. 1: training reward vs step, GRPO / GSPO / GMPO / RSPO (Countdown).
rule fig1_reward:
    input:
        unpack(lambda wildcards: figure_inputs("fig1_reward")),
    output:
        pdf=f"{R}/figures/fig1_reward.pdf",
        png=report(f"{R}/figures/fig1_reward.png", caption="../report/fig1_reward.rst", category="Figures"),
    log:
        f"{R}/logs/report/fig1_reward.log",
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("report"),
        runs=f"{R}/runs",
        seeds=SEEDS_ARG,
    threads: res("report", "threads")
    resources:
        mem_mb=res("report", "mem_mb"),
        runtime=res("report", "runtime"),
        gpu=0,
    conda:
        ENV_CPU
    shell:
        "python -m rspo report figure fig1_reward --preset {params.preset} --runs-dir {params.runs} "
        "--out {output.pdf} {params.seeds} --mlflow > {log} 2>&1"


# Fig. 2: training reward vs step of the math (and code) `main` runs.
rule fig2_reward_large:
    input:
        unpack(lambda wildcards: figure_inputs("fig2_reward_large")),
    output:
        pdf=f"{R}/figures/fig2_reward_large.pdf",
        png=report(f"{R}/figures/fig2_reward_large.png", caption="../report/fig2_reward_large.rst", category="Figures"),
    log:
        f"{R}/logs/report/fig2_reward_large.log",
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("report"),
        runs=f"{R}/runs",
        seeds=SEEDS_ARG,
    threads: res("report", "threads")
    resources:
        mem_mb=res("report", "mem_mb"),
        runtime=res("report", "runtime"),
        gpu=0,
    conda:
        ENV_CPU
    shell:
        "python -m rspo report figure fig2_reward_large --preset {params.preset} --runs-dir {params.runs} "
        "--out {output.pdf} {params.seeds} --mlflow > {log} 2>&1"


# Fig. 3: validation score vs step for gamma_min in the sweep.
rule fig3_gamma_min:
    input:
        unpack(lambda wildcards: figure_inputs("fig3_gamma_min")),
    output:
        pdf=f"{R}/figures/fig3_gamma_min.pdf",
        png=report(f"{R}/figures/fig3_gamma_min.png", caption="../report/fig3_gamma_min.rst", category="Figures"),
    log:
        f"{R}/logs/report/fig3_gamma_min.log",
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("report"),
        runs=f"{R}/runs",
        seeds=SEEDS_ARG,
    threads: res("report", "threads")
    resources:
        mem_mb=res("report", "mem_mb"),
        runtime=res("report", "runtime"),
        gpu=0,
    conda:
        ENV_CPU
    shell:
        "python -m rspo report figure fig3_gamma_min --preset {params.preset} --runs-dir {params.runs} "
        "--out {output.pdf} {params.seeds} --mlflow > {log} 2>&1"


# Fig. 4: RS as a plug-in, GRPO/GSPO/GMPO solid, +RS dashed (same colour).
rule fig4_plugin:
    input:
        unpack(lambda wildcards: figure_inputs("fig4_plugin")),
    output:
        pdf=f"{R}/figures/fig4_plugin.pdf",
        png=report(f"{R}/figures/fig4_plugin.png", caption="../report/fig4_plugin.rst", category="Figures"),
    log:
        f"{R}/logs/report/fig4_plugin.log",
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("report"),
        runs=f"{R}/runs",
        seeds=SEEDS_ARG,
    threads: res("report", "threads")
    resources:
        mem_mb=res("report", "mem_mb"),
        runtime=res("report", "runtime"),
        gpu=0,
    conda:
        ENV_CPU
    shell:
        "python -m rspo report figure fig4_plugin --preset {params.preset} --runs-dir {params.runs} "
        "--out {output.pdf} {params.seeds} --mlflow > {log} 2>&1"


# Fig. 5 (Appendix B): gradient through gamma vs stop-gradient.
rule fig5_stopgrad:
    input:
        unpack(lambda wildcards: figure_inputs("fig5_stopgrad")),
    output:
        pdf=f"{R}/figures/fig5_stopgrad.pdf",
        png=report(f"{R}/figures/fig5_stopgrad.png", caption="../report/fig5_stopgrad.rst", category="Figures"),
    log:
        f"{R}/logs/report/fig5_stopgrad.log",
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("report"),
        runs=f"{R}/runs",
        seeds=SEEDS_ARG,
    threads: res("report", "threads")
    resources:
        mem_mb=res("report", "mem_mb"),
        runtime=res("report", "runtime"),
        gpu=0,
    conda:
        ENV_CPU
    shell:
        "python -m rspo report figure fig5_stopgrad --preset {params.preset} --runs-dir {params.runs} "
        "--out {output.pdf} {params.seeds} --mlflow > {log} 2>&1"


# Fig. 6: router shift ratio / shift clipfrac / ppo_kl / pg_clipfrac, GRPO vs RSPO.
rule fig6_mechanism:
    input:
        unpack(lambda wildcards: figure_inputs("fig6_mechanism")),
    output:
        pdf=f"{R}/figures/fig6_mechanism.pdf",
        png=report(f"{R}/figures/fig6_mechanism.png", caption="../report/fig6_mechanism.rst", category="Figures"),
    log:
        f"{R}/logs/report/fig6_mechanism.log",
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("report"),
        runs=f"{R}/runs",
        seeds=SEEDS_ARG,
    threads: res("report", "threads")
    resources:
        mem_mb=res("report", "mem_mb"),
        runtime=res("report", "runtime"),
        gpu=0,
    conda:
        ENV_CPU
    shell:
        "python -m rspo report figure fig6_mechanism --preset {params.preset} --runs-dir {params.runs} "
        "--out {output.pdf} {params.seeds} --mlflow > {log} 2>&1"


# Fig. 7 (Appendix C): policy entropy vs step.
rule fig7_entropy:
    input:
        unpack(lambda wildcards: figure_inputs("fig7_entropy")),
    output:
        pdf=f"{R}/figures/fig7_entropy.pdf",
        png=report(f"{R}/figures/fig7_entropy.png", caption="../report/fig7_entropy.rst", category="Figures"),
    log:
        f"{R}/logs/report/fig7_entropy.log",
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("report"),
        runs=f"{R}/runs",
        seeds=SEEDS_ARG,
    threads: res("report", "threads")
    resources:
        mem_mb=res("report", "mem_mb"),
        runtime=res("report", "runtime"),
        gpu=0,
    conda:
        ENV_CPU
    shell:
        "python -m rspo report figure fig7_entropy --preset {params.preset} --runs-dir {params.runs} "
        "--out {output.pdf} {params.seeds} --mlflow > {log} 2>&1"


# Fig. 8 (Appendix D): router freeze, logit replay, index replay vs RSPO.
rule fig8_routing:
    input:
        unpack(lambda wildcards: figure_inputs("fig8_routing")),
    output:
        pdf=f"{R}/figures/fig8_routing.pdf",
        png=report(f"{R}/figures/fig8_routing.png", caption="../report/fig8_routing.rst", category="Figures"),
    log:
        f"{R}/logs/report/fig8_routing.log",
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("report"),
        runs=f"{R}/runs",
        seeds=SEEDS_ARG,
    threads: res("report", "threads")
    resources:
        mem_mb=res("report", "mem_mb"),
        runtime=res("report", "runtime"),
        gpu=0,
    conda:
        ENV_CPU
    shell:
        "python -m rspo report figure fig8_routing --preset {params.preset} --runs-dir {params.runs} "
        "--out {output.pdf} {params.seeds} --mlflow > {log} 2>&1"


# Table 1: Pass@1 on math and code benchmarks (paper numbers as reference rows).
rule table_main:
    input:
        unpack(lambda wildcards: table_inputs("table_main")),
    output:
        md=report(f"{R}/tables/table_main.md", caption="../report/table_main.rst", category="Tables"),
        tex=f"{R}/tables/table_main.tex",
    log:
        f"{R}/logs/report/table_main.log",
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("report"),
        evals=f"{R}/eval",
        runs=f"{R}/runs",
        seeds=SEEDS_ARG,
    threads: res("report", "threads")
    resources:
        mem_mb=res("report", "mem_mb"),
        runtime=res("report", "runtime"),
        gpu=0,
    conda:
        ENV_CPU
    shell:
        "python -m rspo report table table_main --preset {params.preset} "
        "--eval-dir {params.evals} --runs-dir {params.runs} {params.seeds} "
        "--out {output.md} --mlflow > {log} 2>&1"


# Countdown accuracy of the base model and every run on val and val_target.
rule table_countdown:
    input:
        unpack(lambda wildcards: table_inputs("table_countdown")),
    output:
        md=report(f"{R}/tables/table_countdown.md", caption="../report/table_countdown.rst", category="Tables"),
        tex=f"{R}/tables/table_countdown.tex",
    log:
        f"{R}/logs/report/table_countdown.log",
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("report"),
        evals=f"{R}/eval",
        runs=f"{R}/runs",
        seeds=SEEDS_ARG,
    threads: res("report", "threads")
    resources:
        mem_mb=res("report", "mem_mb"),
        runtime=res("report", "runtime"),
        gpu=0,
    conda:
        ENV_CPU
    shell:
        "python -m rspo report table table_countdown --preset {params.preset} "
        "--eval-dir {params.evals} --runs-dir {params.runs} {params.seeds} "
        "--out {output.md} --mlflow > {log} 2>&1"


# Sec. 5.5: throughput of RSPO vs GMPO and router-cache memory.
rule table_efficiency:
    input:
        unpack(lambda wildcards: table_inputs("table_efficiency")),
    output:
        md=report(f"{R}/tables/table_efficiency.md", caption="../report/table_efficiency.rst", category="Tables"),
        tex=f"{R}/tables/table_efficiency.tex",
    log:
        f"{R}/logs/report/table_efficiency.log",
    threads: res("report", "threads")
    resources:
        mem_mb=res("report", "mem_mb"),
        runtime=res("report", "runtime"),
        gpu=0,
    conda:
        ENV_CPU
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("report"),
    shell:
        "python -m rspo report table table_efficiency --preset {params.preset} "
        "--bench {input.bench} "
        "--out {output.md} --mlflow > {log} 2>&1"


# The issue's name for Fig. 4 ("plug-in, small setting").
rule fig_plugin_small:
    input:
        rules.fig4_plugin.output,
