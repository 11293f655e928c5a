# Shared set-up: load and validate the preset, plan the runs, paths, resources, environments.
# Rules stay thin: every decision about WHICH runs, data and models a target needs lives in
# rspo/grid.py (the run grid) and rspo/plan.py (the planner shared with the report CLI; the preset
# is the single source of truth).

import os
import re
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from rspo import config as rcfg
from rspo.grid import train_config
from rspo.plan import FIGURES, NEEDS, TABLES, Plan, figure_regime, paper_figure
from rspo.plan import validate_preset
from rspo.plan import preset_digest as plan_preset_digest
from rspo.preset import Preset

ROOT = Path(workflow.basedir)


def _preset_file(value):
    """`--config preset=NAME` -> configs/NAME.yaml; a value with a folder or a .yaml suffix is a path."""
    if os.path.dirname(value) or value.endswith((".yaml", ".yml")):
        return value
    return f"configs/{value}.yaml"


def _load_plan():
    path = _preset_file(str(config["preset"]))
    if config.get("archive"):
        # an archive plans from the preset it was packed from (its copy beside the bundle), which
        # configs/ may have moved on from (more seeds, another evaluation size)
        from rspo.archive import own_preset

        kept = own_preset(config["archive"], Path(path).stem)
        if kept is not None:
            digest = lambda f: plan_preset_digest(Preset.load(f).data, "report")
            if Path(path).is_file() and digest(path) != digest(kept):
                print(
                    f"archive {config['archive']} was packed from an earlier version of {path}: "
                    f"its tables are made with the preset it was packed from, {kept}",
                    file=sys.stderr,
                )
            path = str(kept)
    try:
        spec = Preset.load(path)
        preset = spec.data
        validate_preset(preset, ROOT / "workflow" / "schemas" / "preset.schema.yaml", where=path)
        stem = Path(path).stem
        if spec.name != stem:
            raise rcfg.ConfigError(
                f"{path}: preset: {spec.name!r} must equal the file name {stem!r} (results go to results/<preset>/)"
            )
        manifest = None
        if config.get("archive"):
            from rspo.archive import ArchiveError, read_manifest

            try:
                manifest = read_manifest(config["archive"], preset)
            except ArchiveError as e:
                raise WorkflowError(f"invalid archive: {e}") from None
        seeds = config.get("seeds")
        full = str(config.get("full", manifest["full"] if manifest else False)).lower() == "true"
        families = config.get("families", (manifest or {}).get("families"))
        if isinstance(families, str):  # --config families=plugin,mismatch_routing
            families = [f for f in families.split(",") if f]
        plan = Plan(preset, None if seeds is None else [int(x) for x in seeds], full=full, families=families, path=path)
        plan.check()
    except (rcfg.ConfigError, FileNotFoundError) as e:
        raise WorkflowError(f"invalid preset: {e}") from None
    return path, plan, manifest


PRESET_FILE, PLAN, ARCHIVE_MANIFEST = _load_plan()
# Archive mode (`--config archive=DIR`): the run files come from a run archive (rspo.archive) and
# only the report rules run; workflow/rules/archive.smk replaces data, pretrain, train, evaluate.
ARCHIVE = str(config.get("archive") or "")
P = PLAN.name
# The user's runs in results/<preset>; a shipped archive's tables and figures in results/<preset>-archive,
# which `make figures` fills without touching the user's folder, in an MLflow experiment of its own.
R = f"results/{P}-archive" if ARCHIVE else f"results/{P}"
if ARCHIVE:
    from rspo.tracking import SHIPPED_SUFFIX, experiment_name

    os.environ.setdefault("RSPO_MLFLOW_EXPERIMENT", experiment_name(PLAN.spec) + SHIPPED_SUFFIX)
# Pass --seeds to the report CLI only when they differ from the preset's own; --full for the whole
# grid, --families for a selection in place of the preset's default_families.
PLAN_ARGS = " ".join(([] if config.get("seeds") is None else ["--seeds", *map(str, PLAN.seeds)]) + PLAN.cli_args)

# Jobs call `python -m rspo ...`: make `python` the interpreter that runs Snakemake (the
# project's venv) unless a conda env (--sdm conda) puts its own python first on PATH.
_bindir = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _bindir:
    os.environ.update(PATH=os.pathsep.join([_bindir, os.environ.get("PATH", "")]))

# MLflow 3.7+ writes ./mlflow.db in each job's cwd unless told otherwise: pin one sqlite store
# per preset (an MLFLOW_TRACKING_URI already set, e.g. a tracking server, is kept). SLURM jobs
# inherit the submitting environment (sbatch --export=ALL) and re-read this file anyway.
# (Relative paths such as R are relative to the working directory, where Snakemake runs jobs.)
os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{Path(R, 'mlflow', 'mlflow.db').resolve()}")

# Conda environments (for --sdm conda); paths are relative to workflow/rules/.
ENV_CPU = "../../envs/cpu.yaml"
ENV_TORCH = "../../envs/gpu.yaml" if PLAN.uses_gpu else ENV_CPU


# The preset is not an input file of the jobs (then any edit, even to `eval:`, would rerun the
# whole DAG, pretraining included). Each job carries instead, as a param, a digest of what its
# outputs can depend on; Snakemake reruns a job whose params changed. Train jobs: the
# fingerprint of the run's resolved TrainConfig. Other kinds: every preset section except
# those its command never reads (rspo.plan.NOT_READ).
def preset_digest(kind):
    return plan_preset_digest(PLAN.preset, kind)


_FINGERPRINTS = {}


def run_fingerprint(run):
    if run not in _FINGERPRINTS:
        _FINGERPRINTS[run] = train_config(PLAN.spec, PLAN.runs[run]).fingerprint()
    return _FINGERPRINTS[run]


# A GPU job is one SLURM task that holds all its GPUs and the preset's threads; torchrun (`rspo launch`)
# or the engine starts the ranks inside it. The SLURM plugin (2.6.1) asks --ntasks-per-gpu=1 for a job
# with `gpu` and no `tasks_per_gpu`: 8 tasks of `threads` CPUs each for an 8-GPU job (512 CPUs on one
# node for a paper train job), which SLURM refuses, or runs the job once per task (the plugin's issue
# #459). 0 leaves the flag out, and sbatch gives the job one task. Set on every rule that can ask for
# GPUs; CPU jobs ignore it (the plugin asks them --ntasks=1). A site overrides it per rule with the
# profile's set-resources (docs/cluster.md).
ONE_TASK_PER_JOB = 0


def training_notice(dag):
    """Before any job starts (onstart): a run that will train where the preset has no runs yet says so,
    and how to draw the shipped results instead (`snakemake fig4_plugin` on a fresh clone trains the
    runs behind the figure: about an hour on 2 cores for the small preset)."""
    if ARCHIVE or os.path.isdir(f"{R}/runs"):
        return
    train = sum(1 for job in dag.needrun_jobs() if job.rule.name == "train")
    if not train:
        return
    shipped = f"docs/results/{P}"
    instead = (
        f"`make figures` (all of them), `make figure FIG=<name>` (one), or `--config archive={shipped}`"
        if os.path.isfile(f"{shipped}/archive.json")
        else "a run archive of this preset (`--config archive=<its folder>`)"
    )
    print(
        f"rspo: this run trains {train} RL run(s) of preset {P} before what it builds ({R}/runs does not "
        f"exist yet). To draw the shipped runs instead, stop it (Ctrl-C) and use {instead}.",
        file=sys.stderr,
    )


def res(kind, key):
    """Resource `key` for jobs of kind `kind`; the preset's `resources` mapping overrides
    plan.DEFAULT_RESOURCES."""
    return PLAN.resources(kind)[key]


def train_launcher():
    """`python -m rspo`, or `python -m rspo launch --processes N` for resources.train.processes > 1:
    torchrun's N data-parallel processes (FSDP2), its parser kept off the command's arguments and a
    time-limit stop (exit 75) passed on to Snakemake as itself (rspo/commands/launch.py)."""
    n = int(res("train", "processes"))
    return "python -m rspo" if n == 1 else f"python -m rspo launch --processes {n}"


def stop_margin():
    """Minutes a train job keeps free before its time limit under SLURM, beyond its longest step and
    save (rspo.train.time_limit; `--config stop_margin_min=...`, default 10)."""
    return float(config.get("stop_margin_min", 10))


def bench_threads(wildcards):
    """Scheduling threads of the benchmark: every local core, so that it runs alone (two torch
    jobs on a small machine slow each other down ~50x); on a cluster its own job's threads.
    Evaluated per job, once the executor is known: while the Snakefile is read Snakemake has no
    executor yet and calls every run local, so a value computed then asked SLURM for the cluster
    profile's `cores` (--cpus-per-task=4096) for each benchmark job."""
    n = res("bench", "threads")
    cores = workflow.resource_settings.cores
    local = workflow.local_exec and not workflow.remote_exec
    return max(n, cores) if local and isinstance(cores, int) else n


# ---------------------------------------------------------------------------- models and data


# Hub models are fetched once into HUB_DIR/<org>--<name> (rule fetch_model, rspo.hub); every
# job reads that folder. A preset's model.path that is a local folder is read as it is.
HUB_DIR = str(config.get("hub_dir") or "results/hub")


def hub_folder(task):
    """The local folder of a task's hub model ('' when the base is pretrained here or a folder)."""
    from rspo.hub import is_hub_id, slug

    model = PLAN.hub_model(task)
    return f"{HUB_DIR}/{slug(model)}" if model and is_hub_id(model) else ""


def base_model(task):
    """What `--base-model` / `--model` gets for a task's base: the fetched hub model's folder, the
    preset's own folder, or the model pretrained here."""
    return hub_folder(task) or PLAN.hub_model(task) or f"{R}/models/{PLAN.base_dir(task)}"


def base_marker(task):
    """The file that proves the base model is complete: the fetched snapshot's marker, the
    pretraining marker, or nothing for a folder the preset names."""
    if hub_folder(task):
        return [f"{hub_folder(task)}/rspo_snapshot.json"]
    if PLAN.hub_model(task):
        return []
    return [f"{R}/models/{PLAN.base_dir(task)}/pretrain.json"]


def _check_memory():
    """A preset that trains on GPUs is planned against the GPU it will get (`--config gpu=NAME`,
    default h100-80gb, or `--config gpu_gib=N` for any other card: its memory in GiB as CUDA reports
    it, torch.cuda.mem_get_info()'s total / 2**30) before any job is submitted: a plan that does not fit stops here, naming
    the phase, the numbers and the settings to change (rspo/gpu_memory/plan.py). `--config
    skip_memory_check=true` runs it anyway."""
    from rspo.gpu_memory.plan import GPUS, plan_preset
    from rspo.gpu_memory.verdict import advice, fit_line, summary

    if "gpu_gib" in config:  # a number > 0 (workflow/schemas/config.schema.yaml)
        if "gpu" in config:
            raise WorkflowError("--config gpu=... and gpu_gib=...: give one (a named GPU or its memory in GiB)")
        gib = float(config["gpu_gib"])
        gpu, flag = f"{gib:g}gib", f"--gpu-gib {gib:g}"
    else:
        gpu = str(config.get("gpu", "h100-80gb"))
        if gpu not in GPUS:
            raise WorkflowError(
                f"--config gpu={gpu}: unknown GPU; choose one of {', '.join(GPUS)}, "
                "or give any card's memory with --config gpu_gib=N (GiB)"
            )
        gib, flag = GPUS[gpu], f"--gpu {gpu}"
    if (
        ARCHIVE
        or "cuda" not in PLAN.run_settings("model", "device")
        or str(config.get("skip_memory_check", False)).lower() == "true"
    ):
        return
    s = summary(P, gpu, plan_preset(PRESET_FILE, gib, HUB_DIR))
    if s["fits"]:  # one line, before the jobs (a dry run's answer to "will it fit")
        print(f"memory plan of preset {P}: {fit_line(s)}", file=sys.stderr)
    else:
        raise WorkflowError(
            f"memory plan of preset {P}: {advice(s)}. `python -m rspo plan-memory --preset {PRESET_FILE} "
            f"{flag}` shows every term and ranks the settings not at their limit by the GiB each saves; "
            "`--config skip_memory_check=true` runs the preset anyway."
        )


_check_memory()


# Hub data (a task's training source, code benchmarks) are fetched once into HUB_DIR/data/<task> by
# the local rule fetch_data (rspo.fetch_data; read through rspo.data.fetched); the jobs that read them
# (prepare_task, evaluate_task) run with the hub's offline switches set (HF_HUB_OFFLINE=1
# HF_DATASETS_OFFLINE=1), so a compute node without internet never tries it.


def data_to_fetch(task):
    """(fetch the training source?, code benchmarks to fetch) of a task: what would otherwise come
    from the network inside a job."""
    from rspo.data.fetched import FETCHED_BENCHMARKS

    train = task in PLAN.tasks and PLAN.prepare_source(task) == "hub"
    benchmarks = []
    if task == "code" and "code" in PLAN.tasks:
        settings = PLAN.spec.evaluation("code", {})
        given = {k for k, v in vars(settings.data_paths).items() if v is not None}
        benchmarks = [b for b in settings.benchmarks if b in FETCHED_BENCHMARKS and b not in given]
    return train, benchmarks


def fetched_data(task):
    """The marker of a task's fetched hub data, or '' when nothing of it comes from the network."""
    train, benchmarks = data_to_fetch(task)
    return f"{HUB_DIR}/data/{task}/rspo_data.json" if train or benchmarks else ""


def fetch_data_args(task):
    train, benchmarks = data_to_fetch(task)
    return ("--train " if train else "") + (f"--benchmarks {' '.join(benchmarks)}" if benchmarks else "")


def prepare_source_arg(task):
    """`rspo prepare --source`: the fetched folder for a hub source, else the preset's source."""
    source = PLAN.prepare_source(task)
    return f"{HUB_DIR}/data/{task}" if source == "hub" else source


def hub_models():
    """{folder slug: hub id} of the hub models this preset's tasks start from."""
    from rspo.hub import slug

    return {slug(PLAN.hub_model(t)): PLAN.hub_model(t) for t in PLAN.tasks if hub_folder(t)}


def train_data(task):
    return f"{R}/data/{task}/train.jsonl"


COUNTDOWN_VAL = {
    "val": f"{R}/data/countdown/val.jsonl",
    "val_target": f"{R}/data/countdown/val_target.jsonl",
}


def run_of(wildcards):
    return PLAN.runs[wildcards.run]


def train_inputs(wildcards):
    task = run_of(wildcards).task
    inputs = {"base": base_marker(task), "data": train_data(task)}
    if task == "countdown":
        inputs.update(COUNTDOWN_VAL)
    return inputs


def train_params(wildcards):
    task = run_of(wildcards).task
    vals = COUNTDOWN_VAL if task == "countdown" else {}
    return {
        "base": base_model(task),
        "data": train_data(task),
        "vals": " ".join(f"--val {k}={v}" for k, v in vals.items()),
    }


def eval_model(name, task):
    return base_model(task) if name == "base" else f"{R}/runs/{name}/final"


def eval_inputs(name, task):
    """Evaluation of the base model (name 'base') or of a run's final checkpoint."""
    if name == "base":
        model = base_marker(task)
    else:
        if name not in PLAN.runs or PLAN.runs[name].task != task:
            raise WorkflowError(f"{name!r} is not a {task} run of preset {P}")
        model = [f"{R}/runs/{name}/final.json"]
    inputs = {"model": model}
    if task == "countdown":
        inputs.update(COUNTDOWN_VAL)
    if task == "code" and data_to_fetch(task)[1]:
        inputs["fetched"] = fetched_data(task)
    return inputs


# ---------------------------------------------------------------------------- paper targets


def fig_files(fig):
    return [f"{R}/figures/{fig}.pdf", f"{R}/figures/{fig}.png"]


def table_files(table):
    return [f"{R}/tables/{table}.md", f"{R}/tables/{table}.tex"]


def need(target):
    if not PLAN.available(target):
        hint = ""
        if not PLAN.full and Plan(PLAN.preset, PLAN.seeds, full=True).available(target):
            hint = "; it is part of the whole grid: add --config full=true"
        raise WorkflowError(
            f"{target} is not built by preset {P!r}: it needs {NEEDS[target]} "
            f"(this preset builds: {', '.join(PLAN.targets())}){hint}"
        )
    if ARCHIVE_MANIFEST is not None:
        runs = (
            PLAN.figure_runs(target)
            if target in FIGURES
            else [r for rs in PLAN.table_runs(target).values() for r in rs]
        )
        missing = [r for r in runs if r not in ARCHIVE_MANIFEST["runs"]]
        if missing:
            raise WorkflowError(
                f"{target} needs runs that the archive {ARCHIVE} does not hold: {', '.join(missing)} "
                f"(it holds {len(ARCHIVE_MANIFEST['runs'])} runs of preset {P}; --config full=true or "
                "families=... ask for runs that only an archive packed with --full or those --families has)"
            )


def figure_inputs(fig):
    need(fig)
    return {"runs": [f"{R}/runs/{n}/final.json" for n in PLAN.figure_runs(fig)]}


def table_inputs(table):
    need(table)
    inputs = {}
    if table in ("table_efficiency", "table_claims"):
        inputs["bench"] = f"{R}/bench.json"
    if table == "table_claims" and PLAN.spec.regime_trials:
        # the regime search's sweep files and their committed records (rspo.report.regime_search), with the
        # per-step metrics of those that ship them
        records = PLAN.spec.regime_records()
        steps = [p.parent / "steps.tar.xz" for p in records]
        inputs["trials"] = [str(p) for p in (*PLAN.spec.regime_trials, *records)] + [
            str(p) for p in steps if p.is_file()
        ]
    if table != "table_efficiency":
        evals = []
        for task, runs in PLAN.table_runs(table).items():
            evals += [f"{R}/eval/{name}/{task}.json" for name in ["base"] + runs]
            evals += [f"{R}/runs/{name}/final.json" for name in runs]
        inputs["evals"] = evals
    return inputs


def figure_caption(fig):
    """A regime's figure (fig4_plugin_stress) has the caption of the figure it redraws."""
    return f"../report/{paper_figure(fig)}.rst"


def table_args(table, input):
    """The report CLI's input options of a table."""
    args = []
    if table != "table_efficiency":
        args += [f"--eval-dir {R}/eval", f"--runs-dir {R}/runs"]
    if "bench" in input.keys():
        args.append(f"--bench {input.bench}")
    return " ".join(args)


def all_targets():
    files = []
    for target in PLAN.targets():
        files += fig_files(target) if target in FIGURES else table_files(target)
    return files
