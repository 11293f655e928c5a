# The regime search's trials as jobs (rspo/sweep.py): `--config trials=configs/sweeps/<file>.yaml`
# plans one job per base, per run, per trial line and one for the record; target `trials`
# (`make trials TRIALS=<file> [TRIAL_ONLY=a,b]`). Everything lives under the file's `work:` folder.
from rspo.config import ConfigError
from rspo.sweep import base_folder, committed_base, row_path, run_folder
from rspo.sweep_file import load_sweep

TRIALS_FILE = str(config.get("trials") or "")
if ARCHIVE:
    raise WorkflowError("--config trials: trials train runs; a run archive (--config archive) trains none")
TRIAL_ONLY = [x for x in str(config.get("trial_only") or "").split(",") if x]
try:
    SWEEP = load_sweep(TRIALS_FILE)
except ConfigError as e:
    raise WorkflowError(f"--config trials={TRIALS_FILE}: {e}") from None
if os.path.realpath(SWEEP.preset) != os.path.realpath(PRESET_FILE):
    raise WorkflowError(
        f"--config trials={TRIALS_FILE}: its preset is {SWEEP.preset}, the workflow's {PRESET_FILE} "
        f"(add --config preset={SWEEP.preset})"
    )
_unknown = sorted(set(TRIAL_ONLY) - {t.name for t in SWEEP.trials})
if _unknown:
    raise WorkflowError(f"--config trial_only: no trial {_unknown[0]!r} in {TRIALS_FILE}")
W = SWEEP.work
TRIAL_LINES = dict(zip(SWEEP.lines(), SWEEP.trials))  # one line of the record per entry of the file
LINES_RUN = [line for line, t in TRIAL_LINES.items() if not TRIAL_ONLY or t.name in TRIAL_ONLY]
TRIAL_RUNS = {str(run_folder(SWEEP, t, a, s)): (t, a, s) for t in SWEEP.trials for a, s in t.methods()}
TRIAL_BASES = {str(base_folder(SWEEP, b)): b for b in SWEEP.bases}
TRIAL_DATA = f"{R}/data/countdown"


def trial_base_inputs(wildcards):
    """A base pretrained by the search reads the preset's data and tokenizer; a committed one nothing."""
    if committed_base(SWEEP, TRIAL_BASES[wildcards.base]) is not None:
        return {}
    return {"data": f"{TRIAL_DATA}/train.jsonl", "tokenizer": f"{R}/models/tokenizer/tokenizer.json"}


rule trial_base:
    input:
        unpack(trial_base_inputs),
    output:
        "{base}/pretrain.json",
    log:
        "{base}.job.log",
    wildcard_constraints:
        base="|".join(re.escape(b) for b in TRIAL_BASES) or "(?!)",
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
        name=lambda wildcards: TRIAL_BASES[wildcards.base],
        tokenizer=f"{R}/models/tokenizer",
    shell:
        "python -m rspo sweep base {TRIALS_FILE} {params.name} --data {TRIAL_DATA} --tokenizer {params.tokenizer} "
        "--threads {threads} > {log} 2>&1"


rule trial_run:
    input:
        base=lambda wildcards: f"{base_folder(SWEEP, TRIAL_RUNS[wildcards.run][0].base)}/pretrain.json",
        train=f"{TRIAL_DATA}/train.jsonl",
        val=f"{TRIAL_DATA}/val.jsonl",
    output:
        "{run}/final.json",
    log:
        "{run}.job.log",
    wildcard_constraints:
        run="|".join(re.escape(r) for r in TRIAL_RUNS) or "(?!)",
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
        trial=lambda wildcards: TRIAL_RUNS[wildcards.run][0].name,
        method=lambda wildcards: TRIAL_RUNS[wildcards.run][1],
        seed=lambda wildcards: TRIAL_RUNS[wildcards.run][2],
    shell:
        "python -m rspo sweep run {TRIALS_FILE} --trial {params.trial} --method {params.method} "
        "--seed {params.seed} --data {TRIAL_DATA} --threads {threads} --mlflow > {log} 2>&1"


def trial_row_inputs(wildcards):
    trial = TRIAL_LINES[wildcards.line]
    return [f"{run_folder(SWEEP, trial, a, s)}/final.json" for a, s in trial.methods()]


rule trial_row:
    input:
        trial_row_inputs,
    output:
        f"{W}/trials/{{line}}.json",
    wildcard_constraints:
        line="|".join(re.escape(line) for line in TRIAL_LINES),
    conda:
        ENV_CPU
    shell:
        "python -m rspo sweep row {TRIALS_FILE} --line {wildcards.line}"


rule trial_record:
    input:
        [str(row_path(SWEEP, line)) for line in LINES_RUN],
    output:
        record=f"{W}/trials.jsonl",
        table=f"{W}/trials.md",
        steps=f"{W}/steps.tar.xz",
    conda:
        ENV_CPU
    shell:
        "python -m rspo sweep record {TRIALS_FILE} --table {output.table} --steps {output.steps}"


localrules:
    trial_row,
    trial_record,


rule trials:
    input:
        rules.trial_record.output,
