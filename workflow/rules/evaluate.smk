# Evaluation of the base models and of every run's final checkpoint (Countdown val / val_target
# accuracy; math and code Pass@1 suites of Table 1), and the Sec. 5.5 efficiency benchmark.


rule evaluate_countdown:
    input:
        unpack(lambda wildcards: eval_inputs(wildcards.name, "countdown")),
    output:
        f"{R}/eval/{{name}}/countdown.json",
    log:
        f"{R}/logs/eval/{{name}}.countdown.log",
    wildcard_constraints:
        name="[^/]+",
    conda:
        ENV_TORCH
    threads: res("evaluate", "threads")
    resources:
        mem_mb=res("evaluate", "mem_mb"),
        runtime=res("evaluate", "runtime"),
        gpu=res("evaluate", "gpu"),
        nodes=1,
        tasks_per_gpu=ONE_TASK_PER_JOB,
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("evaluate"),
        model=lambda wildcards: eval_model(wildcards.name, "countdown"),
        data=lambda wildcards, input: os.path.dirname(input.val),
    shell:
        "python -m rspo evaluate countdown --preset {params.preset} --model {params.model} "
        "--data {params.data} --out {output} --threads {threads} > {log} 2>&1"


rule evaluate_task:
    input:
        unpack(lambda wildcards: eval_inputs(wildcards.name, wildcards.task)),
    output:
        f"{R}/eval/{{name}}/{{task}}.json",
    log:
        f"{R}/logs/eval/{{name}}.{{task}}.log",
    wildcard_constraints:
        name="[^/]+",
        task="math|code",
    conda:
        ENV_TORCH
    threads: res("evaluate", "threads")
    resources:
        mem_mb=res("evaluate", "mem_mb"),
        runtime=res("evaluate", "runtime"),
        gpu=res("evaluate", "gpu"),
        nodes=1,
        tasks_per_gpu=ONE_TASK_PER_JOB,
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("evaluate"),
        model=lambda wildcards: eval_model(wildcards.name, wildcards.task),
        data_dir=lambda wildcards, input: (
            f"--data-dir {os.path.dirname(input.fetched)}" if "fetched" in input.keys() else ""
        ),
    shell:
        "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python -m rspo evaluate {wildcards.task} --preset {params.preset} --model {params.model} "
        "{params.data_dir} --out {output} --threads {threads} > {log} 2>&1"


# Sec. 5.5: RSPO vs GMPO update throughput and router-cache memory on the preset's pretrained
# Countdown model. A timing benchmark must run alone: locally it takes every core (so no other
# job runs beside it) and still uses the preset's `resources.bench.threads` torch threads.
rule bench:
    input:
        base=f"{R}/models/base/pretrain.json",
        data=f"{R}/data/countdown/train.jsonl",
    output:
        f"{R}/bench.json",
    log:
        f"{R}/logs/bench.log",
    conda:
        ENV_TORCH
    threads: bench_threads
    resources:
        mem_mb=res("bench", "mem_mb"),
        runtime=res("bench", "runtime"),
        gpu=res("bench", "gpu"),
        nodes=1,
        tasks_per_gpu=ONE_TASK_PER_JOB,
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("bench"),
        model=lambda wildcards, input: os.path.dirname(input.base),
        data=lambda wildcards, input: os.path.dirname(input.data),
        threads=res("bench", "threads"),
    shell:
        "python -m rspo bench --preset {params.preset} --model {params.model} --data {params.data} "
        "--threads {params.threads} --out {output} > {log} 2>&1"


# Speed of the RL step side by side with TRL's GRPOTrainer, a plain training loop and `generate`
# on the preset's pretrained model and a 12-layer random-init copy (`python -m rspo speed`). Not
# part of the default target: it needs the optional `bench` extra (TRL), which `make bench`
# installs. Runs alone like `bench`.
rule bench_speed:
    input:
        base=f"{R}/models/base/pretrain.json",
        data=f"{R}/data/countdown/train.jsonl",
    output:
        f"{R}/speed.json",
    log:
        f"{R}/logs/speed.log",
    conda:
        ENV_TORCH
    threads: bench_threads
    resources:
        mem_mb=res("bench", "mem_mb"),
        runtime=res("bench", "runtime"),
        gpu=res("bench", "gpu"),
        nodes=1,
        tasks_per_gpu=ONE_TASK_PER_JOB,
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("bench"),
        model=lambda wildcards, input: os.path.dirname(input.base),
        data=lambda wildcards, input: os.path.dirname(input.data),
        threads=res("bench", "threads"),
    shell:
        "python -m rspo speed --preset {params.preset} --model {params.model} --data {params.data} "
        "--threads {params.threads} --profile --out {output} > {log} 2>&1"
