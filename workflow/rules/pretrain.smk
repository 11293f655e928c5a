# Pretraining (SFT) of the small Qwen2.5-MoE-style base models; presets whose base model is a hub
# id (paper_large_*: Qwen/Qwen3-30B-A3B) never need these rules. The marker pretrain.json is
# written last, so a job killed mid-way leaves no output and resumes from its checkpoints.


# A preset that pins its base (`base_model:`, rspo.base_pin) installs that committed folder in place
# of pretraining (digest checked); `--config rebuild_base=true` (`make base`) pretrains it here instead.
PINNED_BASE = PLAN.spec.base_pin is not None and str(config.get("rebuild_base", "")).lower() != "true"

if PINNED_BASE:

    localrules:
        install_base,

    rule install_base:
        output:
            f"{R}/models/base/pretrain.json",
        log:
            f"{R}/logs/pretrain/install_base.log",
        conda:
            ENV_CPU
        params:
            preset=PRESET_FILE,
            preset_digest=preset_digest("pretrain"),
            out=lambda wildcards, output: os.path.dirname(output[0]),
        shell:
            "python -m rspo base install --preset {params.preset} --out {params.out} > {log} 2>&1"

else:

    rule pretrain:
        input:
            data=f"{R}/data/countdown/train.jsonl",
            tokenizer=f"{R}/models/tokenizer/tokenizer.json",
        output:
            f"{R}/models/base/pretrain.json",
        log:
            f"{R}/logs/pretrain/base.log",
        conda:
            ENV_TORCH
        threads: res("pretrain", "threads")
        resources:
            mem_mb=res("pretrain", "mem_mb"),
            runtime=res("pretrain", "runtime"),
            gpu=res("pretrain", "gpu"),
            nodes=1,
            tasks_per_gpu=ONE_TASK_PER_JOB,
        params:
            preset=PRESET_FILE,
            preset_digest=preset_digest("pretrain"),
            data=lambda wildcards, input: os.path.dirname(input.data),
            tokenizer=lambda wildcards, input: os.path.dirname(input.tokenizer),
            out=lambda wildcards, output: os.path.dirname(output[0]),
        shell:
            "python -m rspo pretrain --preset {params.preset} --data {params.data} "
            "--tokenizer {params.tokenizer} --out {params.out} --threads {threads} > {log} 2>&1"


rule pretrain_task:
    input:
        data=f"{R}/data/{{task}}/train.jsonl",
    output:
        f"{R}/models/base-{{task}}/pretrain.json",
    log:
        f"{R}/logs/pretrain/base-{{task}}.log",
    wildcard_constraints:
        task="math|code",
    conda:
        ENV_TORCH
    threads: res("pretrain", "threads")
    resources:
        mem_mb=res("pretrain", "mem_mb"),
        runtime=res("pretrain", "runtime"),
        gpu=res("pretrain", "gpu"),
        nodes=1,
        tasks_per_gpu=ONE_TASK_PER_JOB,
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("pretrain"),
        out=lambda wildcards, output: os.path.dirname(output[0]),
    shell:
        "python -m rspo pretrain --preset {params.preset} --task {wildcards.task} --data {input.data} "
        "--out {params.out} --threads {threads} > {log} 2>&1"
