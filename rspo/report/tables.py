"""Paper tables as Markdown and LaTeX (booktabs), built only from evaluation JSON, run.json and
bench.json files, so a table is rebuilt without re-training.

Tables (paper index: docs/design.md):
- ``table_main`` (Table 1): Pass@1 (%) per math / code benchmark and their average, Base and the
  ``main`` runs, mean over seeds (± sample std with several seeds). Our Avg. is the mean of the
  paper's benchmark columns shown, per seed, then over seeds (the paper's definition); benchmarks
  the paper has no column for (Dr. GRPO's 83-problem AMC set) come after Avg., outside it. Under
  the table: the protocol of every column as the Base evaluation recorded it (problems, prompt
  template and thinking mode, temperature / top-p / top-k, token budget, samples, seed, grader),
  and for the paper's reference rows what their numbers imply (rspo.report.reference).
- ``table_countdown``: greedy accuracy (%) of the base model and of every Countdown run on
  ``val`` and ``val_target``, with how many seeds the collapse detector flagged (run.json).
- ``table_efficiency`` (Sec. 5.5): RSPO/GMPO throughput, router-cache bytes per (token, layer,
  routed expert), that cache projected to the paper's Qwen3-30B-A3B step, rollout tokens/s.

The paper's numbers (rspo.report.reference) appear as separate, labelled reference rows under
their own rule, only in the presets that reproduce the paper's setting of that table.

Input formats: countdown.json ``{"splits": {"val": {"accuracy": float in [0, 1], "n": int}, ...}}``;
math.json / code.json ``{"benchmarks": {"aime24": {"pass@1": float in [0, 1], "n_problems": int},
...}, "average": float}``; bench.json ``{"rs_throughput_ratio", "router_cache_bytes_per_token_layer_k",
"rollout_tokens_per_s", ...}``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rspo.jsonl import read_json
from rspo.plan import Plan
from rspo.report import reference as ref
from rspo.run_record import RunRecord


@dataclass(frozen=True)
class Cell:
    """A number with its spread over seeds (std None with one seed), or a plain text."""

    mean: float | None = None
    std: float | None = None
    text: str | None = None
    digits: int = 1

    @classmethod
    def of(cls, values: list[float], digits: int = 1) -> Cell:
        if not values:
            return cls(text="–")
        mean = statistics.fmean(values)
        std = statistics.stdev(values) if len(values) > 1 else None
        return cls(mean=mean, std=std, digits=digits)

    def md(self) -> str:
        if self.text is not None:
            return self.text
        s = f"{self.mean:.{self.digits}f}"
        return s if self.std is None else f"{s} ± {self.std:.{self.digits}f}"

    def tex(self) -> str:
        if self.text is not None:
            return _tex_escape(self.text).replace("–", "--")
        s = f"{self.mean:.{self.digits}f}"
        return s if self.std is None else f"{s}{{\\scriptsize$\\pm${self.std:.{self.digits}f}}}"


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[tuple[str, list[Cell]]]
    groups: list[tuple[str, int]] = field(default_factory=list)
    """Optional header row above `columns`: (label, number of columns spanned)."""
    reference_title: str = ""
    reference_rows: list[tuple[str, list[Cell]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    first_column: str = "Method"

    def to_markdown(self) -> str:
        lines = [f"**{self.title}**", ""]
        header = [self.first_column] + (
            [f"{g}: {c}" for g, c in zip(self._group_of_columns(), self.columns)] if self.groups else self.columns
        )
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join([":---"] + ["---:"] * len(self.columns)) + "|")
        for label, cells in self.rows:
            lines.append("| " + " | ".join([label] + [c.md() for c in cells]) + " |")
        if self.reference_rows:
            lines.append("| " + " | ".join([f"*{self.reference_title}*"] + [""] * len(self.columns)) + " |")
            for label, cells in self.reference_rows:
                lines.append("| " + " | ".join([f"{label} [paper]"] + [c.md() for c in cells]) + " |")
        if self.notes:
            lines.append("")
            lines.extend(f"- {n}" for n in self.notes)
        return "\n".join(lines) + "\n"

    def to_latex(self) -> str:
        n = len(self.columns)
        spec = (
            "l" + "".join(("|" if i and self._group_start(i) else "") + "c" for i in range(n))
            if self.groups
            else "l" + "c" * n
        )
        out = [f"% {self.title}", "\\begin{tabular}{" + spec + "}", "\\toprule"]
        if self.groups:
            cells, rules, col = [""], [], 2
            for i, (g, span) in enumerate(self.groups):
                sep = "c|" if i < len(self.groups) - 1 else "c"
                cells.append(f"\\multicolumn{{{span}}}{{{sep}}}{{\\textbf{{{_tex_escape(g)}}}}}")
                rules.append(f"\\cmidrule(lr){{{col}-{col + span - 1}}}")
                col += span
            out.append(" & ".join(cells) + " \\\\")
            out.append("".join(rules))
        out.append(
            " & ".join(
                [f"\\textbf{{{_tex_escape(self.first_column)}}}"]
                + [f"\\textbf{{{_tex_escape(c)}}}" for c in self.columns]
            )
            + " \\\\"
        )
        out.append("\\midrule")
        for label, cells in self.rows:
            out.append(" & ".join([_tex_escape(label)] + [c.tex() for c in cells]) + " \\\\")
        if self.reference_rows:
            out.append("\\midrule")
            out.append(f"\\multicolumn{{{n + 1}}}{{l}}{{\\textit{{{_tex_escape(self.reference_title)}}}}} \\\\")
            for label, cells in self.reference_rows:
                out.append(" & ".join([f"{_tex_escape(label)} (paper)"] + [c.tex() for c in cells]) + " \\\\")
        out += ["\\bottomrule", "\\end{tabular}"]
        out += [f"% {n_}" for n_ in self.notes]
        return "\n".join(out) + "\n"

    def _group_of_columns(self) -> list[str]:
        names: list[str] = []
        for g, span in self.groups:
            names += [g] * span
        return names

    def _group_start(self, i: int) -> bool:
        starts, col = set(), 0
        for _, span in self.groups:
            starts.add(col)
            col += span
        return i in starts


def _tex_escape(s: str) -> str:
    for a, b in (
        ("\\", "\\textbackslash{}"),
        ("&", "\\&"),
        ("%", "\\%"),
        ("_", "\\_"),
        ("#", "\\#"),
        ("±", "$\\pm$"),
        ("γ", "$\\gamma$"),
    ):
        s = s.replace(a, b)
    return s


# ---------------------------------------------------------------------------- inputs


def _fraction(path: Path, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{path}: {key} must be a finite number, got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{path}: {key} must be a fraction in [0, 1], got {value}")
    return float(value)


def countdown_accuracy(path: Path, split: str) -> float:
    """Accuracy (%) of one split from an eval countdown.json."""
    data = read_json(path)
    splits = data.get("splits")
    if not isinstance(splits, dict) or split not in splits:
        raise ValueError(f"{path}: no splits.{split}")
    return 100.0 * _fraction(path, f"splits.{split}.accuracy", (splits[split] or {}).get("accuracy"))


def benchmark_pass1(path: Path, bench: str) -> tuple[float, int | None]:
    """Pass@1 (%) and problem count of one benchmark from an eval math.json / code.json."""
    data = read_json(path)
    benches = data.get("benchmarks")
    if not isinstance(benches, dict) or bench not in benches:
        raise ValueError(f"{path}: no benchmarks.{bench}")
    entry = benches[bench] or {}
    return 100.0 * _fraction(path, f"benchmarks.{bench}.pass@1", entry.get("pass@1")), entry.get("n_problems")


def _collapsed(runs_dir: Path | None, run: str) -> bool | None:
    if runs_dir is None:
        return None
    value = RunRecord.open(runs_dir / run).identity.get("collapsed", False)
    if not isinstance(value, bool):
        raise ValueError(f"{runs_dir / run / 'run.json'}: collapsed must be true/false, got {value!r}")
    return value


def _by_method(plan: Plan, runs: list[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for r in runs:
        groups.setdefault(plan.runs[r].method, []).append(r)
    return groups


# ---------------------------------------------------------------------------- the tables


def table_countdown(plan: Plan, eval_dir: str | Path, runs_dir: str | Path | None = None) -> Table:
    runs = plan.table_runs("table_countdown").get("countdown")
    if not runs:
        raise ValueError(f"preset {plan.name!r} has no Countdown runs: table_countdown is not built for it")
    eval_dir = Path(eval_dir)
    rdir = Path(runs_dir) if runs_dir is not None else None
    splits = plan.spec.countdown_splits
    columns = (
        [f"{s} acc. (%)" for s in splits]
        + ["seeds"]
        + (["collapse step per seed", "collapsed"] if rdir is not None else [])
    )
    base_file = eval_dir / "base" / "countdown.json"
    rows = [
        (
            "Base (pretrained)",
            [Cell.of([countdown_accuracy(base_file, s)]) for s in splits]
            + [Cell(text="–")]
            + ([Cell(text="–"), Cell(text="–")] if rdir is not None else []),
        )
    ]
    for names in _by_method(plan, runs).values():
        cells = [Cell.of([countdown_accuracy(eval_dir / n / "countdown.json", s) for n in names]) for s in splits]
        cells.append(Cell(text=str(len(names))))
        if rdir is not None:
            steps = [RunRecord.open(rdir / n).onset for n in sorted(names, key=lambda n: plan.runs[n].seed)]
            cells.append(Cell(text=", ".join("–" if st is None else str(st) for st in steps)))
            cells.append(Cell(text=f"{sum(bool(_collapsed(rdir, n)) for n in names)}/{len(names)}"))
        rows.append((plan.label(names[0]), cells))
    n_eval = {s: (read_json(base_file)["splits"][s] or {}).get("n") for s in splits}
    notes = [
        f"Preset {plan.name}; greedy accuracy of the final checkpoint; "
        "mean over seeds (± sample std with several seeds).",
        "Collapse: the collapse detector's step per seed (– = never), and how many seeds it flagged.",
        "Problems per split: " + ", ".join(f"{s} {n}" for s, n in n_eval.items()) + ".",
        "The paper reports no Countdown accuracy table (its Countdown results are training curves).",
    ]
    return Table(title=f"Countdown accuracy ({plan.name})", columns=columns, rows=rows, notes=notes)


def _main_method_key(plan: Plan, run: str) -> str:
    r = plan.runs[run]
    return r.algo + ("+rs" if r.router_shift else "")


GRADERS = {
    "math": "math-verify on the last \\boxed{} of the answer",
    "code": "sandboxed unit tests, pass iff all pass",
}


def _protocol_line(task: str, base_file: Path, benches: list[str]) -> str:
    """How the Base evaluation of ``task`` was run, from its result file's config."""
    data = read_json(base_file)
    cfg = data.get("config") or {}
    per = data.get("benchmarks") or {}
    parts = []
    for b in benches:
        e = per.get(b) or {}
        k, asked = e.get("n_samples"), e.get("samples_requested")
        sampled = f"avg@{k}" if k and k > 1 else "1 sample"
        if asked and k and asked != k:
            sampled += f" ({asked} requested)"
        if e.get("std_over_runs") is not None:
            sampled += f", sd over runs {100 * e['std_over_runs']:.1f}"
        if e.get("unfinished_thinking"):
            sampled += f", {e['unfinished_thinking']}/{e.get('n_problems', 0) * (k or 1)} thoughts unfinished"
        parts.append(f"{ref.label(b)} {e.get('n_problems', '?')} problems, {sampled}")
    template = cfg.get("template", cfg.get("style", "?"))
    if template == "chat":
        think = cfg.get("enable_thinking")
        mode = "thinking on" if think else ("thinking off" if think is False else "no thinking switch")
        prompts = f"the model's chat template ({mode})"
    else:
        prompts = f"hand-written template {template}"
    if cfg.get("decoding") == "greedy" or cfg.get("temperature") == 0:
        dec = "greedy (temperature 0)"
    else:
        dec = f"temperature {cfg.get('temperature')}, top-p {cfg.get('top_p', 1.0)}, top-k {cfg.get('top_k') or 'off'}"
    budget = cfg.get("max_new_tokens") or "?"
    seed = cfg.get("seed", "?")
    extra = [f"{ref.label(b)} data: {v}" for b, v in (cfg.get("data") or {}).items()]
    return (
        f"Protocol, {task} (ours, as the Base evaluation recorded it): "
        + "; ".join(parts)
        + f". Prompts: {prompts}. Decoding: {dec}, budget {budget} tokens, seed {seed}, "
        + f"backend {cfg.get('backend', '?')} ({cfg.get('dtype', '?')}). Grader: {GRADERS[task]}."
        + (" " + "; ".join(extra) + "." if extra else "")
    )


def table_main(plan: Plan, eval_dir: str | Path) -> Table:
    per_task = plan.table_runs("table_main")
    if not per_task:
        raise ValueError(f"preset {plan.name!r} has no `main` grid family: table_main is not built for it")
    eval_dir = Path(eval_dir)
    columns: list[str] = []
    groups: list[tuple[str, int]] = []
    benches: dict[str, list[str]] = {}
    extras: dict[str, list[str]] = {}
    for task in per_task:
        wanted = plan.spec.evaluation(task).benchmarks
        benches[task] = [b for b in ref.paper_benchmarks(task) if b in wanted]
        extras[task] = [b for b in ref.extra_benchmarks(task) if b in wanted]
        columns += [ref.label(b) for b in benches[task]] + ["Avg."]
        columns += [ref.label(b) for b in extras[task]]
        groups.append((task.capitalize(), len(benches[task]) + 1 + len(extras[task])))

    def width(task: str) -> int:
        return len(benches[task]) + 1 + len(extras[task])

    def cells_for(task: str, files: list[Path]) -> list[Cell]:
        scores = [[benchmark_pass1(f, b)[0] for b in benches[task]] for f in files]  # (seeds, benches)
        cols = [Cell.of([s[j] for s in scores]) for j in range(len(benches[task]))]
        more = [Cell.of([benchmark_pass1(f, b)[0] for f in files]) for b in extras[task]]
        return cols + [Cell.of([statistics.fmean(s) for s in scores])] + more

    methods: list[str] = ["base"]
    runs_of: dict[str, dict[str, list[str]]] = {}
    for task, runs in per_task.items():
        for r in runs:
            key = _main_method_key(plan, r)
            if key not in methods:
                methods.append(key)
            runs_of.setdefault(key, {}).setdefault(task, []).append(r)

    rows = []
    notes = [
        f"Preset {plan.name}; Pass@1 (%) of the final checkpoint; mean over seeds (± sample std with several seeds)."
    ]
    for key in methods:
        cells: list[Cell] = []
        for task in per_task:
            if key == "base":
                files = [eval_dir / "base" / f"{task}.json"]
            else:
                files = [eval_dir / r / f"{task}.json" for r in runs_of.get(key, {}).get(task, [])]
            cells += cells_for(task, files) if files else [Cell(text="–")] * width(task)
        rows.append((ref.TABLE1_LABELS.get(key, key.upper()), cells))
    for task in per_task:
        if extras[task]:
            shown = ", ".join(ref.label(b) for b in extras[task])
            notes.append(f"{task}: {shown} has no column in the paper's table; it is shown after Avg., outside it.")
        notes.append(_protocol_line(task, eval_dir / "base" / f"{task}.json", benches[task] + extras[task]))

    ref_rows = []
    if ref.has_reference("table_main", plan.name):
        table1 = {task: ref.table1(task) for task in per_task}
        for key in methods:
            cells = []
            for task in per_task:
                paper = table1[task].get(key)
                cells += (
                    (
                        [Cell(mean=paper[b]) for b in benches[task]]
                        + [Cell(mean=paper["avg"])]
                        + [Cell(text="–") for _ in extras[task]]
                    )
                    if paper
                    else [Cell(text="–")] * width(task)
                )
            ref_rows.append((ref.TABLE1_LABELS.get(key, key.upper()), cells))
        notes.append("Reference rows: the paper's Table 1 as printed (its Avg. column), not our results.")
    if "math" in per_task:  # what the paper's printed numbers say about how they were measured
        notes += ref.implied_notes()
    return Table(
        title=f"Pass@1 (%) on math and code benchmarks ({plan.name})",
        columns=columns,
        rows=rows,
        groups=groups,
        reference_title=ref.TABLE1_CAPTION,
        reference_rows=ref_rows,
        notes=notes,
    )


BENCH_KEYS = ("rs_throughput_ratio", "router_cache_bytes_per_token_layer_k", "rollout_tokens_per_s")


def table_efficiency(plan: Plan, bench_file: str | Path) -> Table:
    path = Path(bench_file)
    data = read_json(path)
    values = {}
    for k in BENCH_KEYS:
        v = data.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{path}: {k} must be a finite number >= 0, got {v!r}")
        values[k] = float(v)
    columns = [
        "Throughput RSPO / GMPO (%)",
        "Router cache (B per token, layer, top-k slot)",
        "Router cache at paper step (GiB)",
        "Rollout (tokens/s)",
    ]
    rows = [
        (
            f"This suite ({plan.name})",
            [
                Cell(mean=100 * values["rs_throughput_ratio"]),
                Cell(mean=values["router_cache_bytes_per_token_layer_k"], digits=2),
                Cell(mean=ref.cache_gib(values["router_cache_bytes_per_token_layer_k"]), digits=2),
                Cell(mean=values["rollout_tokens_per_s"], digits=0),
            ],
        )
    ]
    notes = [
        f"Preset {plan.name}; from {path.name} (`python -m rspo bench`).",
        "Paper step: L = 48 MoE layers, K = 8 routed experts, 128 x 8192 = 1,048,576 tokens (Sec. 5.5).",
    ]
    ref_rows = []
    if ref.has_reference("table_efficiency", plan.name):
        ref_rows.append(
            (
                "Qwen3-30B-A3B",
                [
                    Cell(mean=100 * ref.PAPER_THROUGHPUT_RATIO),
                    Cell(mean=ref.PAPER_CACHE_BYTES_PER_TOKEN_LAYER_K, digits=2),
                    Cell(mean=ref.PAPER_CACHE_GIB_PROBS + ref.PAPER_CACHE_GIB_INDICES, digits=2),
                    Cell(text="–"),
                ],
            )
        )
        notes.append(
            "Reference row: the paper's Sec. 5.5 numbers; its bytes per (token, layer, expert) are implied "
            "by its accounting (FP16 probability + int16 index)."
        )
    return Table(
        title=f"Overhead of router-shift weighting ({plan.name})",
        columns=columns,
        rows=rows,
        reference_title=ref.EFFICIENCY_CAPTION,
        reference_rows=ref_rows,
        notes=notes,
        first_column="Setting",
    )


def write(table: Table, out_md: str | Path) -> tuple[Path, Path]:
    """Write FILE.md and FILE.tex (same stem)."""
    out_md = Path(out_md)
    if out_md.suffix != ".md":
        raise ValueError(f"table output must end in .md (a .tex is written beside it), got {out_md}")
    out_md.parent.mkdir(parents=True, exist_ok=True)
    tex = out_md.with_suffix(".tex")
    out_md.write_text(table.to_markdown())
    tex.write_text(table.to_latex())
    return out_md, tex


def table_sources(plan: Plan, name: str, eval_dir: str | None) -> list[str]:
    """MLflow names of the evaluation runs a table reads (eval-<task>-<model label>)."""
    from pathlib import Path

    from rspo.tracking import eval_run_name

    out = []
    for task, runs in plan.table_runs(name).items():
        for run in ["base"] + runs:
            path = Path(eval_dir or ".") / run / f"{task}.json"
            try:
                model = read_json(path).get("model") or run
            except (OSError, ValueError, AttributeError):
                model = run
            out.append(eval_run_name(task, str(model)))
    return out
