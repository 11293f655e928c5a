# Data: Countdown splits (Qin et al. 2025 generator), the Countdown tokenizer, the math/code RL
# prompts of the `main` grid family (DeepScaleR / DeepCoder code mix, or offline fallbacks), and
# the hub models a preset starts from, fetched once (rspo.hub).


rule countdown_data:
    output:
        train=f"{R}/data/countdown/train.jsonl",
        val=f"{R}/data/countdown/val.jsonl",
        val_target=f"{R}/data/countdown/val_target.jsonl",
        meta=f"{R}/data/countdown/meta.json",
    log:
        f"{R}/logs/data/countdown.log",
    conda:
        ENV_CPU
    threads: res("data", "threads")
    resources:
        mem_mb=res("data", "mem_mb"),
        runtime=res("data", "runtime"),
        gpu=0,
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("data"),
        out=lambda wildcards, output: os.path.dirname(output.meta),
    shell:
        "python -m rspo generate --preset {params.preset} --out {params.out} " "--workers {threads} > {log} 2>&1"


rule tokenizer:
    output:
        f"{R}/models/tokenizer/tokenizer.json",
    log:
        f"{R}/logs/data/tokenizer.log",
    conda:
        ENV_CPU
    threads: 1
    resources:
        mem_mb=res("data", "mem_mb"),
        runtime=res("data", "runtime"),
        gpu=0,
    params:
        out=lambda wildcards, output: os.path.dirname(output[0]),
    shell:
        "python -m rspo tokenizer --out {params.out} > {log} 2>&1"


rule prepare_task:
    input:
        lambda wildcards: [fetched_data(wildcards.task)] if PLAN.prepare_source(wildcards.task) == "hub" else [],
    output:
        f"{R}/data/{{task}}/train.jsonl",
    log:
        f"{R}/logs/data/{{task}}.log",
    wildcard_constraints:
        task="math|code",
    conda:
        ENV_CPU
    threads: res("data", "threads")
    resources:
        mem_mb=res("data", "mem_mb"),
        runtime=res("data", "runtime"),
        gpu=0,
    params:
        source=lambda wildcards: prepare_source_arg(wildcards.task),
    shell:
        "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python -m rspo prepare {wildcards.task} --out {output} --source {params.source} > {log} 2>&1"


# A task's hub data (its training source, the code benchmarks scored from the hub), fetched once into
# HUB_DIR/data/<task> before any job reads it: a local rule, like fetch_model (rspo.data.fetched).
localrules:
    fetch_data,


rule fetch_data:
    output:
        f"{HUB_DIR}/data/{{task}}/rspo_data.json",
    log:
        f"{HUB_DIR}/logs/data.{{task}}.log",
    wildcard_constraints:
        task="math|code",
    conda:
        ENV_CPU
    threads: 1
    resources:
        mem_mb=res("data", "mem_mb"),
        runtime=res("data", "runtime"),
        gpu=0,
    params:
        args=lambda wildcards: fetch_data_args(wildcards.task),
        out=lambda wildcards, output: os.path.dirname(output[0]),
    shell:
        "python -m rspo fetch-data {wildcards.task} --out {params.out} {params.args} > {log} 2>&1"


# One download per hub model, before any job reads it; every train and evaluate job then reads the
# folder. A local rule: it runs where Snakemake runs (a login node has internet where compute nodes
# may not). With HF_HUB_OFFLINE=1 it takes the model from the local hub cache or fails naming it.
localrules:
    fetch_model,


rule fetch_model:
    output:
        f"{HUB_DIR}/{{model}}/rspo_snapshot.json",
    log:
        f"{HUB_DIR}/logs/{{model}}.log",
    wildcard_constraints:
        model="|".join(re.escape(m) for m in hub_models()) or "(?!)",
    conda:
        ENV_CPU
    threads: 1
    resources:
        mem_mb=res("data", "mem_mb"),
        runtime=res("data", "runtime"),
        gpu=0,
    params:
        model=lambda wildcards: hub_models()[wildcards.model],
        out=lambda wildcards, output: os.path.dirname(output[0]),
    shell:
        "python -m rspo fetch-model --model {params.model} --out {params.out} > {log} 2>&1"
