"""The Snakemake workflow: every preset plans (dry run), lint is clean, malformed presets stop
before any job with the key in the message, named and file targets resolve, and the report rules
build real tables/figures and an HTML report from fake run outputs (no training).

Each test runs Snakemake in a scratch copy of the workflow (symlinks to Snakefile, workflow/,
profiles/, envs/; a copy of configs/), so nothing is written under the repository's results/."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rspo.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ["smoke", "small", "paper_small", "paper_large_math", "paper_large_code"]


def make_workspace(path: Path) -> Path:
    for name in ("Snakefile", "workflow", "profiles", "envs", "cluster", "tests"):
        (path / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / "configs", path / "configs")
    # the committed results a preset names (small: its pinned base, its regime search's record), each
    # folder linked, so that what a test writes under docs/results stays in its workspace
    (path / "docs" / "results").mkdir(parents=True)
    for folder in (ROOT / "docs" / "results").iterdir():
        (path / "docs" / "results" / folder.name).symlink_to(folder)
    return path


def snakemake(ws: Path, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args], cwd=ws, env=env, text=True, capture_output=True, timeout=timeout
    )


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a Snakemake run -> {rule: count}."""
    block = output.split("Job stats:", 1)[1]
    counts = {}
    for line in block.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    return counts


@pytest.fixture
def ws(tmp_path):
    return make_workspace(tmp_path)


# ---------------------------------------------------------------------------- planning


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_plans(ws, preset):
    t0 = time.perf_counter()
    r = snakemake(ws, "-n", "--config", f"preset={preset}")
    elapsed = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    counts = job_counts(out)
    plan = Plan.from_file(ROOT / "configs" / f"{preset}.yaml")
    assert counts["train"] == len(plan.runs)
    for target in plan.targets():
        assert counts[target] == 1
    # a run several figures need is planned once: one train job per distinct run name
    names = re.findall(r"--run-name (\S+)", out)
    assert len(names) == len(set(names)) == len(plan.runs)
    # the Countdown base: pretrained here, or the committed one installed where the preset pins it
    base = "install_base" if Plan.from_file(ROOT / "configs" / f"{preset}.yaml").spec.base_pin else "pretrain"
    assert counts.get(base, 0) == (1 if preset in ("smoke", "small", "paper_small") else 0)
    assert "pretrain" not in counts or base == "pretrain"
    # the 8-GPU presets train data parallel under torchrun; the others in one process
    launched = re.findall(r"python -m rspo (launch --processes \d+ )?train", out)
    expected = "launch --processes 8 " if "large" in preset else ""
    assert launched and set(launched) == {expected}
    # the README's presets table quotes the job count of the presets it times: it is this plan's
    quoted = re.search(rf"^\| `{preset}`( \(default\))? \|.*?\b(\d+) jobs", (ROOT / "README.md").read_text(), re.M)
    if preset == "small":  # the default preset's row must quote its count (it once did not match)
        assert quoted, "README's presets table has no job count for the default preset"
    if quoted:
        assert int(quoted.group(2)) == counts["total"], f"README quotes {quoted.group(2)} jobs for {preset}"
    print(f"{preset}: {counts['total']} jobs planned in {elapsed:.1f} s")


def test_a_fresh_clone_plans_the_whole_study(tmp_path):
    """`make main` in a fresh clone must do the work: nothing committed lies in the workflow's
    output tree, so a dry run of the default target plans the base (the pinned one installed from
    docs/results, which the clone holds) and training."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    tracked = subprocess.run(["git", "ls-files", "results"], cwd=clone, text=True, capture_output=True).stdout.split()
    assert set(tracked) <= {"results/.gitkeep"}, tracked
    r = snakemake(clone, "-n", "--cores", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    counts = job_counts(r.stdout)
    assert counts.get("install_base", 0) == 1 and counts.get("train", 0) >= 1, counts
    assert (clone / "docs" / "results" / "bases" / "small" / "base" / "model.safetensors").is_file()
    rebuild = snakemake(clone, "-n", "--cores", "2", "--config", "rebuild_base=true")  # `make base`
    assert "install_base" not in job_counts(rebuild.stdout) and job_counts(rebuild.stdout)["pretrain"] == 1


@pytest.mark.slow
def test_seeds_override_multiplies_runs(ws):
    r = snakemake(ws, "-n", "--config", "preset=small", "seeds=[0,1,2,3]")
    assert r.returncode == 0, r.stderr[-3000:]
    counts = job_counts(r.stdout + r.stderr)
    plan = Plan.from_file(ROOT / "configs" / "small.yaml")
    assert counts["train"] == len(Plan(plan.preset, seeds=[0, 1, 2, 3]).runs)
    four = Plan(plan.preset, seeds=[0, 1, 2, 3], full=True)  # a regime's own seeds keep only those asked (stress: 0-2)
    assert "stress-grpo-s2" in four.runs and "stress-grpo-s3" not in four.runs and "grpo-s3" in four.runs
    # figures are told about the seeds; the train command names each seed's run
    assert "--seeds 0 1 2 3" in r.stdout
    assert "--run-name gmpo-rs0.8-s3 " in r.stdout


def test_lint_is_clean(ws):
    r = snakemake(ws, "--lint")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Congratulations" in r.stdout + r.stderr


@pytest.mark.slow
def test_named_and_file_targets_small(ws):
    r = snakemake(ws, "-n", "fig_plugin_small", "results/small/figures/fig4_plugin.pdf", "table_efficiency")
    assert r.returncode == 0, r.stderr[-3000:]
    counts = job_counts(r.stdout + r.stderr)
    # the alias and the file target plan the same single figure job and only the six plugin runs
    seeds = len(Plan.from_file(ROOT / "configs" / "small.yaml").seeds)
    assert counts["fig4_plugin"] == 1 and counts["fig_plugin_small"] == 1 and counts["train"] == 6 * seeds
    assert counts["table_efficiency"] == 1 and counts["bench"] == 1
    assert "fig1_reward" not in counts and "evaluate_countdown" not in counts


@pytest.mark.slow
def test_table_main_needs_a_main_family(ws):
    r = snakemake(ws, "-n", "table_main")
    assert r.returncode != 0
    assert "table_main is not built by preset 'small'" in r.stdout + r.stderr
    r = snakemake(ws, "-n", "table_main", "--config", "preset=smoke")
    assert r.returncode == 0, r.stderr[-3000:]
    counts = job_counts(r.stdout + r.stderr)
    assert counts["table_main"] == 1 and counts["train"] == 8 and counts["evaluate_task"] == 10


# ---------------------------------------------------------------------------- bad input


def _bad_preset(ws: Path, name: str, edit) -> None:
    data = yaml.safe_load((ws / "configs" / "small.yaml").read_text())
    data["preset"] = name
    edit(data)
    (ws / "configs" / f"{name}.yaml").write_text(yaml.safe_dump(data))


# The three cases plus a preset whose name is not its file's; more cases, in-process, in
# tests/test_presets.py.
BAD = {
    "unknown_key": (lambda d: d["rl"]["algorithm"].update(gama_min=0.5), "rl.algorithm.gama_min: unknown key"),
    "gamma": (lambda d: d["rl"]["algorithm"].update(gamma_min=1.5), "rl.algorithm.gamma_min: 1.5 is greater than"),
    "algo": (lambda d: d["grid"]["plugin"].update(algos=["grpo", "ppo"]), "grid.plugin.algos[1]: 'ppo' is not one of"),
    "name": (lambda d: d.update(preset="other"), "must equal the file name"),
    "processes": (
        lambda d: d.setdefault("resources", {}).setdefault("train", {}).update(processes=3),
        "rl.schedule.prompts_per_step: 32 prompts cannot be split over 3 data-parallel processes",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_preset_fails_before_any_job(ws, case):
    edit, message = BAD[case]
    _bad_preset(ws, f"bad_{case}", edit)
    r = snakemake(ws, "--cores", "1", "--config", f"preset=bad_{case}")
    assert r.returncode != 0
    assert message in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]
    assert not (ws / "results").exists(), "a job ran although the preset is invalid"


@pytest.mark.slow
@pytest.mark.parametrize(
    "config,message", [(["preset=nope"], "configs/nope.yaml"), (["preset=small", "seeds=[-1]"], "seeds")]
)
def test_bad_snakemake_config_fails(ws, config, message):
    r = snakemake(ws, "-n", "--config", *config)
    assert r.returncode != 0
    assert message in r.stdout + r.stderr


# ---------------------------------------------------------------------------- report rules, for real


def _touch(path: Path, mtime: float, text: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if text is not None or not path.exists():
        path.write_text(text if text is not None else "{}\n")
    os.utime(path, (mtime, mtime))


@pytest.mark.slow
def test_report_rules_run_on_fake_outputs_and_make_an_html_report(ws):
    sys.path.insert(0, str(ROOT / "tests"))
    from test_report import write_fake_results

    plan = Plan.from_file(ws / "configs" / "smoke.yaml")
    res = ws / "results" / "smoke"
    t0 = time.time() - 1000
    write_fake_results(res, plan)  # runs/, eval/, bench.json
    os.utime(ws / "configs" / "smoke.yaml", (t0 - 100, t0 - 100))
    for f in ("train.jsonl", "val.jsonl", "val_target.jsonl", "meta.json"):
        _touch(res / "data" / "countdown" / f, t0)
    for task in ("math", "code"):
        _touch(res / "data" / task / "train.jsonl", t0)
        _touch(res / "models" / f"base-{task}" / "pretrain.json", t0 + 10)
    _touch(res / "models" / "tokenizer" / "tokenizer.json", t0)
    _touch(res / "models" / "base" / "pretrain.json", t0 + 10)
    for p in (res / "runs").glob("*/final.json"):
        os.utime(p, (t0 + 20, t0 + 20))
    for p in list((res / "eval").glob("*/*.json")) + [res / "bench.json"]:
        os.utime(p, (t0 + 30, t0 + 30))

    # one figure and one table (every report target is built from real outputs by the smoke DAG,
    # tests/test_workflow_smoke.py): what this test adds is that existing upstream outputs are not
    # re-made, and the HTML report
    targets = ["fig4_plugin", "table_countdown"]
    r = snakemake(ws, "--cores", "2", *targets, "--config", "preset=smoke", timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    counts = job_counts(r.stdout + r.stderr)
    assert set(counts) == set(targets) | {"total"}, counts  # nothing upstream re-ran
    for f in (
        "figures/fig4_plugin.pdf",
        "figures/fig4_plugin.png",
        "tables/table_countdown.md",
        "tables/table_countdown.tex",
    ):
        assert (res / f).stat().st_size > 100, f
    # onstart created the preset's MLflow store in the working directory, not in the repository
    assert (res / "mlflow" / "mlflow.db").is_file()

    r = snakemake(ws, "-n", *targets, "--config", "preset=smoke")
    assert "Nothing to be done" in r.stdout + r.stderr

    r = snakemake(ws, "--report", "report.html", *targets, "--config", "preset=smoke")
    assert r.returncode == 0, r.stderr[-3000:]
    html = (ws / "report.html").read_text(errors="replace")
    assert "router shift as a plug-in stabiliser" in html.lower()
    assert "Countdown accuracy" in html


def plan_outputs(target: str) -> list[str]:
    if target.startswith("fig"):
        return [f"figures/{target}.pdf", f"figures/{target}.png"]
    return [f"tables/{target}.md", f"tables/{target}.tex"]


def json_load(path: Path):
    import json

    return json.loads(path.read_text())


# ---------------------------------------------------------------------------- the SLURM submission

FAKE_SBATCH = """#!/bin/sh
echo "sbatch $*" >> "$FAKE_SBATCH_LOG"
echo "sbatch: error: recorded by the test, not submitted" >&2
exit 1
"""


# the preset's resources kind of each rule that may ask for GPUs (workflow/rules/*.smk: res(kind, ...))
GPU_RULE_KIND = {
    "pretrain": "pretrain",
    "pretrain_task": "pretrain",
    "train": "train",
    "evaluate_countdown": "evaluate",
    "evaluate_task": "evaluate",
    "bench": "bench",
    "bench_speed": "bench",
}
PLANNED_JOB = re.compile(r"^(?:local)?rule (\w+):\n((?:    .*\n)+)", re.M)


def planned_jobs(dry_run: str) -> list[tuple[str, list[str], list[str], dict[str, str]]]:
    """(rule, inputs, outputs, resources) of every job a Snakemake dry run prints."""
    jobs = []
    for m in PLANNED_JOB.finditer(dry_run):
        fields = dict(re.findall(r"^    (\w+): (.*)$", m.group(2), re.M))
        files = {k: [x for x in fields.get(k, "").split(", ") if x] for k in ("input", "output")}
        resources = dict(x.split("=", 1) for x in fields.get("resources", "").split(", ") if "=" in x)
        jobs.append((m.group(1), files["input"], files["output"], resources))
    return jobs


def sbatch_lines(ws: Path, tmp_path: Path, preset: str, jobs) -> dict[str, list[str]]:
    """Submit ``jobs`` through the cluster profile to a recording `sbatch` (first on PATH: no cluster
    needed; it refuses every job after writing its line down). Their inputs are made as empty files
    and only their rules are allowed (--allowed-rules), so each is ready to submit at once; a job whose
    output another one reads goes in a later round. The sbatch lines, by rule."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in {"sbatch": FAKE_SBATCH, "sacct": "#!/bin/sh\necho acct\n"}.items():
        (bin_dir / name).write_text(text)
    for name in ("sshare", "sacctmgr"):
        (bin_dir / name).write_text("#!/bin/sh\necho acct\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    log = tmp_path / f"sbatch-{preset}.log"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_SBATCH_LOG=str(log))
    env.pop("MLFLOW_TRACKING_URI", None)
    rounds: list[list] = []
    for job in jobs:
        free = next((r for r in rounds if not any(set(job[1]) & set(o[2]) or set(o[1]) & set(job[2]) for o in r)), None)
        free.append(job) if free is not None else rounds.append([job])
    for jobs_of_round in rounds:
        for _, inputs, outputs, _ in jobs_of_round:
            for f in outputs:
                (ws / f).unlink(missing_ok=True)
            for f in inputs:
                (ws / f).parent.mkdir(parents=True, exist_ok=True)
                (ws / f).write_text("{}")
        rules = sorted({rule for rule, *_ in jobs_of_round})
        targets = [job[2][0] for job in jobs_of_round]
        # --retries 0: the profile resubmits a refused job up to 10 times
        cmd = [sys.executable, "-m", "snakemake", "--profile", "cluster", "--jobs", str(len(targets)), "--retries", "0"]
        cmd += ["--config", f"preset={preset}", "--allowed-rules", *rules, "--", *targets]
        r = subprocess.run(cmd, cwd=ws, env=env, text=True, capture_output=True, timeout=300)
        assert r.returncode != 0 and log.is_file(), r.stdout[-3000:] + r.stderr[-3000:]  # submitted, then refused
    lines: dict[str, list[str]] = {}
    for line in log.read_text().splitlines():
        rule = re.search(r"rule_(\w+?)_wildcards|rule_(\w+)", line)
        lines.setdefault(next(g for g in rule.groups() if g), []).append(line)
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["paper_small", "paper_large_math", "paper_large_code"])
def test_every_gpu_job_of_a_paper_preset_asks_slurm_for_one_task_with_its_gpus_and_threads(ws, tmp_path, preset):
    """The whole sbatch line the SLURM plugin builds for one job of every GPU-asking rule of the preset
    (pretrain, train, evaluate, bench): one task (no --ntasks-per-gpu, which made an 8-GPU train job 8
    tasks of 64 CPUs, 512 CPUs on one node), all the preset's GPUs on one node (--nodes=1, where
    torchrun --standalone starts the ranks inside that task), CPUs in total (tasks x CPUs per task)
    equal to the preset's threads, and its memory. Before --nodes=1: SLURM could spread the GPUs over
    nodes; before the profile's `cores`: 2 CPUs per task here (the submit host's cores)."""
    r = snakemake(ws, "-n", "--config", f"preset={preset}")
    assert r.returncode == 0, r.stderr[-3000:]
    jobs, seen = [], set()
    for job in planned_jobs(r.stdout + r.stderr):
        if int(job[3].get("gpu", "0")) > 0 and job[0] not in seen:
            assert job[0] in GPU_RULE_KIND, f"a new GPU rule {job[0]}: name its resources kind here"
            seen.add(job[0])
            jobs.append(job)
    assert "train" in seen and any(rule.startswith("evaluate") for rule in seen), seen
    lines = sbatch_lines(ws, tmp_path, preset, jobs)
    assert set(lines) == seen, (set(lines), seen)
    plan = Plan.from_file(ROOT / "configs" / f"{preset}.yaml")
    for rule, submitted in lines.items():
        want = plan.resources(GPU_RULE_KIND[rule])
        for line in submitted:
            flags = dict(re.findall(r"(--[\w-]+)(?:[= ]([^\s-]\S*))?", line))
            assert "--ntasks-per-gpu" not in flags and "--ntasks-per-node" not in flags, line[:600]
            tasks = int(flags.get("--ntasks", 1))
            assert tasks == 1, line[:600]
            assert flags.get("--nodes") == "1", line[:600]
            assert int(flags["--gpus"]) == want["gpu"] > 0, line[:600]
            assert tasks * int(flags["--cpus-per-task"]) == want["threads"], line[:600]
            assert int(flags["--mem"]) == want["mem_mb"], line[:600]


def test_a_gpu_preset_whose_plan_does_not_fit_is_refused_before_any_job(ws):
    """rspo plan-memory runs when the workflow loads a device: cuda preset: paper_large_math with
    tensor parallel size 1 and no token budget is refused, naming the phase and the settings;
    --config skip_memory_check=true submits it anyway; another GPU is planned with --config gpu, any
    card by its memory with --config gpu_gib."""
    preset = yaml.safe_load((ROOT / "configs" / "paper_large_math.yaml").read_text())
    preset["preset"] = "oversized"
    preset["rl"]["rollout"]["tensor_parallel_size"] = 1
    del preset["rl"]["schedule"]["max_tokens_per_micro_batch"]
    (ws / "configs" / "oversized.yaml").write_text(yaml.safe_dump(preset))
    r = snakemake(ws, "-n", "--config", "preset=oversized")
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "memory plan of preset oversized: the update phase of task math needs" in out
    assert "79.19 GiB are on h100-80gb" in out and "skip_memory_check=true" in out
    assert "rule train" not in out  # nothing was planned to run
    assert snakemake(ws, "-n", "--config", "preset=oversized", "skip_memory_check=true").returncode == 0
    r = snakemake(ws, "-n", "--config", "preset=paper_large_math", "gpu=h200-141gb")
    assert r.returncode == 0, r.stderr[-2000:]
    # a plan that fits says so in one line before the jobs
    assert "memory plan of preset paper_large_math: fits " in r.stderr and " GiB per GPU on h200-141gb" in r.stderr
    # any other card by its memory: a 40 GiB card is refused with the plan-memory flag to rerun
    r = snakemake(ws, "-n", "--config", "preset=paper_large_math", "gpu_gib=40")
    assert r.returncode != 0 and "40.0 GiB are on 40gib" in r.stdout + r.stderr
    assert "--gpu-gib 40`" in r.stdout + r.stderr
    assert snakemake(ws, "-n", "--config", "preset=paper_large_math", "gpu_gib=141").returncode == 0
    for bad, why in (("gpu_gib=big", "gpu_gib"), ("gpu_gib=0", "gpu_gib"), ("gpu=v100", "gpu_gib=N")):
        r = snakemake(ws, "-n", "--config", "preset=paper_large_math", bad)
        assert r.returncode != 0 and why in r.stdout + r.stderr


def test_a_run_that_would_train_on_a_fresh_clone_says_so_before_it_starts(ws):
    """`snakemake fig4_plugin` where the preset has no runs yet trains the runs behind it: Snakemake's
    onstart says how many and how to draw the shipped runs instead (make figures, make figure, the
    archive); from the archive, nothing is said. (--touch runs the hook without running any job.)"""
    r = snakemake(ws, "--touch", "--cores", "1", "--config", "preset=small", "--", "fig4_plugin")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    runs = Plan.from_file(ROOT / "configs" / "small.yaml").figure_runs("fig4_plugin")
    assert f"rspo: this run trains {len(runs)} RL run(s) of preset small" in out and len(runs) == 30, out[-3000:]
    assert "`make figure FIG=<name>`" in out and "--config archive=docs/results/small" in out
    r = snakemake(
        ws, "--touch", "--cores", "1", "--config", "preset=small", "archive=docs/results/small", "--", "fig4_plugin"
    )
    assert r.returncode == 0 and "rspo: this run trains" not in r.stdout + r.stderr
