# Pretraining (SFT) of the small Qwen2.5-MoE-style base models; presets whose base model is a hub
# id (paper_large_*: Qwen/Qwen3-30B-A3B) never need these rules. The marker pretrain.json is
# written last, so a job killed mid-way leaves no output and resumes from its checkpoints.


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
    params:
        preset=PRESET_FILE,
        preset_digest=preset_digest("pretrain"),
        out=lambda wildcards, output: os.path.dirname(output[0]),
    shell:
        "python -m rspo pretrain --preset {params.preset} --task {wildcards.task} --data {input.data} "
        "--out {params.out} --threads {threads} > {log} 2>&1"
