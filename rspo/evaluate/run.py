"""Evaluating a checkpoint (`python -m rspo evaluate countdown|math|code`, whose command line is
rspo.commands.evaluate): score it, write JSON, log to MLflow.

    python -m rspo evaluate countdown --preset configs/small.yaml --model results/small/runs/grpo-s0/final \
        --data results/small/data/countdown --out results/small/eval/grpo-s0/countdown.json

Settings come from the preset's ``eval.<family>`` mapping; flags override them. The model is
loaded in the dtype and on the device of the preset's runs (``rl.model``, or the family's
``tasks.<family>.model``), and the result's ``config`` records every setting used: prompt template
and thinking mode, temperature, top-p, top-k, token budget, samples per benchmark, seed, backend,
dtype, data revisions. A Countdown evaluation records per split its accuracy, the per-problem scores
(``scores``, in split order, for paired analyses) and the failure reasons. Decoding is greedy by
default (paper Sec. 5.1: temperature 0, one sample per input); ``--temperature`` > 0 with ``--samples``
samples scores the mean over samples (Pass@1 estimate).

Math and code (rspo.evaluate.suites): ``template`` (chat: the model's chat template, with
``enable_thinking`` true or false where the template has that switch; or a hand-written one; auto
by default: rspo.chat), ``temperature``, ``top_p``, ``top_k``, ``max_new_tokens``, ``samples``
(avg@k per benchmark, e.g. ``{aime24: 32}``; ``n``: for every benchmark), ``seed``; ``--limit 0``
(and ``limit: 0``) means every problem. The settings are checked, and the prompt format resolved
against the model's tokenizer, before the model or the engine is loaded.

Progress (rspo.progress, off with ``--quiet``): one bar or log line per generated batch of each
split / benchmark, ``[eval countdown grpo-s0 val] prompt 64/200 (32%) ...``; a Countdown split
ends with a line that carries its accuracy (``acc``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rspo.backend_capabilities import capabilities
from rspo.chat import resolve_format
from rspo.eval_config import CountdownEval, SuiteEval
from rspo.preset import Preset


@dataclass(frozen=True)
class EvalEngine:
    """What an evaluation generates with: the backend, its precision and device (the preset's
    runs' where the evaluation section names no backend), the GPUs of one vLLM engine."""

    backend: str
    dtype: str
    device: str
    tensor_parallel_size: int

    def options(self) -> dict[str, Any]:
        """A vLLM evaluation engine has its GPUs to itself: vLLM's default share of their memory
        (the share rspo.gpu_memory.plan plans), over every GPU of the job."""
        from rspo.gpu_memory.plan import EVAL_UTILIZATION

        return {"tensor_parallel_size": self.tensor_parallel_size, "gpu_memory_utilization": EVAL_UTILIZATION}


def evaluation_settings(preset: Preset, family: str, overrides: dict[str, Any] | None = None):
    """The family's evaluation settings (rspo.eval_config: the preset's ``eval.<family>``, then
    ``overrides``, the command's flags that were given) and its engine (``EvalEngine``: the
    engine, precision and device of the preset's runs, rl or with the task's overlay, where the
    section names no backend)."""
    settings = preset.evaluation(family, overrides)
    runs = preset.rl(family)
    backend = settings.backend or runs.rollout.backend
    tp = engine_tensor_parallel(settings.tensor_parallel_size, backend)
    return settings, EvalEngine(backend, runs.model.dtype, runs.model.device, tp)


def decoding_of(settings: SuiteEval):
    """The section's decoding settings (rspo.evaluate.decoding.Decoding)."""
    from rspo.evaluate.decoding import Decoding

    return Decoding(
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        max_new_tokens=settings.max_new_tokens,
        samples=settings.samples_per_benchmark(),
        n=settings.n or 1,
        seed=settings.seed,
    )


def engine_tensor_parallel(setting: int | str, backend: str) -> int:
    """A vLLM evaluation engine spans every GPU the job holds ("auto", the default: the visible
    GPUs; 1 on a CPU or with the hf backend), or the number the preset gives."""
    if not capabilities(backend).tensor_parallel:
        return 1
    if setting == "auto":
        import torch

        return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1
    return int(setting)


class PhaseProgress:
    """One rspo.progress.Progress per split or benchmark, advanced by the generator's batches."""

    def __init__(self, label: str, quiet: bool = False) -> None:
        self.label, self.quiet = label, quiet
        self.bar = None
        self.done = 0

    def start(self, name: str, total: int) -> None:
        from rspo.progress import Progress

        self.close()
        self.bar = Progress(f"{self.label} {name}", total, unit="prompt", quiet=self.quiet, every=1)
        self.done = 0

    def advance(self, k: int) -> None:
        if self.bar is not None:
            self.done += k
            self.bar.update(self.done)

    def finish(self, metrics: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.update(self.done, metrics, force=True)
        self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def evaluate_countdown(
    model_dir: str,
    data_dir: str,
    settings: CountdownEval,
    engine: EvalEngine,
    prompt_format: str,
    progress: PhaseProgress | None = None,
) -> dict[str, Any]:
    from rspo.data.countdown import load_split
    from rspo.rollout import EVAL_SAMPLING, load_generator
    from rspo.tasks import get_task, reason_counts

    task = get_task("countdown", prompt_format)
    temperature, n = settings.temperature, settings.samples
    gen = load_generator(
        model_dir,
        engine.backend,
        sampling=replace(EVAL_SAMPLING, max_new_tokens=settings.max_new_tokens),
        dtype=engine.dtype,
        device=engine.device,
        progress=progress.advance if progress else None,
        engine_options=engine.options(),
    )
    out: dict[str, Any] = {
        "model": str(model_dir),
        "temperature": temperature,
        "n": n,
        "config": {**gen.settings, "temperature": temperature, "n": n},
        "splits": {},
    }
    for split in settings.splits:
        records = load_split(Path(data_dir) / f"{split}.jsonl")
        if settings.problems:
            records = records[: settings.problems]
        prompts = [task.prompt(r) for r in records]
        if progress:
            progress.start(split, len(prompts))
        completions = gen(prompts, n, temperature)
        flat = [c for cs in completions for c in cs]
        recs = [r for r in records for _ in range(n)]
        scored = task.score_batch(flat, recs, 1)
        per_problem = [sum(s for s, _ in scored[i * n : (i + 1) * n]) / n for i in range(len(records))]
        if progress:
            progress.finish({"acc": sum(per_problem) / max(1, len(per_problem))})
        out["splits"][split] = {
            "accuracy": sum(per_problem) / len(per_problem),
            "n": len(records),
            "scores": [round(x, 6) for x in per_problem],  # per problem, in split order (paired analyses)
            "reasons": reason_counts(scored),
            "samples": [
                {"prompt": prompts[i], "completion": flat[i * n], "score": scored[i * n][0], "reason": scored[i * n][1]}
                for i in range(min(5, len(records)))
            ],
        }
    return out


def code_data_paths(settings, data_dir: str | None) -> dict[str, Any]:
    """The local data of each code benchmark: the preset's ``data_paths``, then what a fetched folder
    (``rspo fetch-data code``, rspo.data.fetched) holds of the others; the rest comes from the network."""
    paths = {k: v for k, v in vars(settings.data_paths).items() if v is not None}
    if data_dir:
        from rspo.data.fetched import benchmark_paths

        missing = [b for b in settings.benchmarks if b not in paths]
        paths.update(benchmark_paths(data_dir, missing))
    return paths


def evaluate_suite(
    family: str,
    model: str,
    settings: SuiteEval,
    engine: EvalEngine,
    progress: PhaseProgress,
    data_dir: str | None = None,
) -> dict[str, Any]:
    """Math or code: the prompt format resolved against the model's tokenizer first (the settings
    were checked when read), then the generator built and the suite run; the result's config
    records it all. ``data_dir``: a fetched folder of the code benchmarks (``code_data_paths``)."""
    from rspo.evaluate import suites
    from rspo.hub import resolve_model
    from rspo.models import load_tokenizer_checked
    from rspo.rollout import load_generator

    decoding = decoding_of(settings)
    decoding.check(f"eval.{family}")
    tokenizer = load_tokenizer_checked(resolve_model(model))
    fmt = resolve_format(family, settings.template, settings.enable_thinking, tokenizer, f"eval.{family}")
    gen = load_generator(
        model,
        engine.backend,
        sampling=decoding.sampling(),
        dtype=engine.dtype,
        device=engine.device,
        progress=progress.advance,
        engine_options=engine.options(),
    )
    kwargs: dict[str, Any] = dict(
        benchmarks=list(settings.benchmarks),
        limit=settings.limit,
        workers=settings.workers,
        decoding=decoding,
        prompt_format=fmt,
        on_benchmark=progress.start,
    )
    if family == "math":
        result = suites.evaluate_math(gen, **kwargs)
    else:  # offline fixtures / local copies; other hub pins
        paths = code_data_paths(settings, data_dir)
        revisions = {k: v for k, v in vars(settings.revisions).items() if v is not None}
        result = suites.evaluate_code(gen, data_paths=paths or None, revisions=revisions or None, **kwargs)
    progress.close()
    result["model"] = str(model)
    result["config"] = {**gen.settings, **result["config"]}  # the suite's settings are the ones used
    return result


def log_evaluation(
    preset: Preset,
    family: str,
    model_dir: str,
    result: dict[str, Any],
    datasets: list[tuple[str, str]] | None = None,
) -> None:
    """The evaluation as an MLflow run of the preset's experiment (its metrics, datasets and tags)."""
    from rspo.tracking import Tracker, default_tracking_uri, eval_run_key, eval_run_name, experiment_name

    name = preset.name
    experiment = experiment_name(preset)
    tracker = Tracker(
        default_tracking_uri(name),
        experiment,
        eval_run_name(family, model_dir),
        tags={"kind": "eval", "family": family, "model": str(model_dir), "preset": name},
        source=f"rspo evaluate {family}",
        key=eval_run_key(family, model_dir),
        preset=name,
    )
    if datasets:
        tracker.log_datasets(datasets)
    metrics: dict[str, float] = {}
    if family == "countdown":
        for split, r in result["splits"].items():
            metrics[f"eval/countdown/{split}/accuracy"] = r["accuracy"]
    else:
        for bench, r in result.get("benchmarks", {}).items():
            metrics[f"eval/{family}/{bench}/pass_at_1"] = r["pass@1"]
        if "average" in result:
            metrics[f"eval/{family}/average"] = result["average"]
    tracker.log_metrics(metrics, 0)
    tracker.end("FINISHED")
