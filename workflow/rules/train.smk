# One RL run per grid name (rspo.grid.expand_grid): GRPO / GSPO / GMPO, +RS, gamma_min sweep,
# stop-gradient ablation, routing alternatives, and the math/code `main` runs. A run that several
# figures need has one name and is trained once. final.json is written last by `rspo train`;
# metrics.jsonl, run.json and the checkpoints stay in place if a job dies, so a rerun resumes.
# With resources.train.processes > 1 the job runs under torchrun (data parallel, FSDP2) through
# `rspo launch`: one process per GPU on a GPU node, gloo processes on CPU; --threads is split over
# the processes; a time-limit stop leaves the launcher with exit 75 as it leaves one process.
# Under SLURM a run longer than one job may take stops before the job's limit (resources.runtime):
# it writes a checkpoint and exits 75, and the cluster profile's retries resubmit it, resuming
# (rspo.train.time_limit). Elsewhere --time-limit-min is empty: no limit.


rule train:
    input:
        unpack(train_inputs),
    output:
        f"{R}/runs/{{run}}/final.json",
    log:
        f"{R}/logs/train/{{run}}.log",
    wildcard_constraints:
        run="|".join(re.escape(name) for name in PLAN.runs) or "(?!)",
    conda:
        ENV_TORCH
    threads: res("train", "threads")
    resources:
        mem_mb=res("train", "mem_mb"),
        runtime=res("train", "runtime"),
        gpu=res("train", "gpu"),
        nodes=1,
        tasks_per_gpu=ONE_TASK_PER_JOB,
    params:
        preset=PRESET_FILE,
        preset_digest=lambda wildcards: run_fingerprint(wildcards.run),
        base=lambda wildcards: train_params(wildcards)["base"],
        data=lambda wildcards: train_params(wildcards)["data"],
        vals=lambda wildcards: train_params(wildcards)["vals"],
        out=lambda wildcards, output: os.path.dirname(output[0]),
        launcher=train_launcher(),
        margin=stop_margin(),
    shell:
        "{params.launcher} train --preset {params.preset} --run-name {wildcards.run} --base-model {params.base} "
        "--train-data {params.data} {params.vals} --out {params.out} --threads {threads} "
        '--time-limit-min "${{SLURM_JOB_ID:+{resources.runtime}}}" --stop-margin-min {params.margin} > {log} 2>&1'
