"""Paper figures from per-run metric files (results/<preset>/runs/<run>/metrics.jsonl).

Each figure is a row (Fig. 6: a 2 x 2 grid) of line plots of one logged metric against the RL
step. A line is one method (the run name without its seed); with several seeds it is the mean
over seeds with a band from the lowest to the highest seed at each step (min-max: with the 3
seeds of a small study a bootstrap interval would claim more than 3 points can show), and the
figure says so under its legend ("mean of n seeds; band: min-max over seeds"); with one seed the
raw curve, and the note says "1 seed". One colour per base algorithm, +RS dashed
(rspo.report.style). PDF + PNG, byte-stable.

| figure | paper | panels (metric keys) |
|---|---|---|
| fig1_reward | Fig. 1 | critic/score/mean |
| fig2_reward_large | Fig. 2 | critic/score/mean, one panel per task |
| fig3_gamma_min | Fig. 3 | val/<set>/score, one panel per validation set |
| fig4_plugin | Fig. 4 | critic/score/mean, val/<set>/score |
| fig5_stopgrad | Fig. 5 | critic/score/mean, val/<set>/score |
| fig6_mechanism | Fig. 6 | router/shift_ratio_mean, router/shift_clipfrac, actor/ppo_kl, actor/pg_clipfrac |
| fig7_entropy | Fig. 7 | actor/entropy |
| fig8_routing | Fig. 8 | critic/score/mean, val/<set>/score |
| fig9_mismatch | beyond the paper | rollout_corr/k3_kl, rollout_corr/routing_agreement, critic/score/mean |

``<figure>_<regime>`` draws the same figure from a regime's runs (rspo.grid.REGIMES: presets with
a ``stress`` or ``mismatch`` section; not in the paper): ``fig4_plugin_stress``,
``fig9_mismatch_mismatch`` (the FP8-engine routing family of the small study).

Choices that are ours: curves are not smoothed (the paper does not say whether it smooths);
a validation panel (``val/<set>/score``, the set ``val`` when logged, else the first one) is
dropped, with a message on stderr, when no run of the figure logged validation (e.g. a preset
with ``val_every: 0``), while a missing training metric is an error; Fig. 5 shows both the
stop-gradient run and the gradient-through-gamma run (the paper plots only the unstable one);
when a step is logged twice (a resumed run), the last value counts.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt  # noqa: E402  (after style: Agg backend)
import pandas as pd
import seaborn as sns  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from rspo.plan import FIGURES, Plan, Run, paper_figure
from rspo.report import style
from rspo.run_record import (
    GAMMA,
    GAMMA_UNDER,
    MISMATCH_KL,
    PG_CLIPFRAC,
    PPO_KL,
    REWARD,
    ROUTING_AGREEMENT,
    Steps,
    is_number,
)

METRIC_LABELS = {
    REWARD: "Training reward",
    "actor/entropy": "Entropy",
    GAMMA: "Router-shift ratio γ (mean)",
    GAMMA_UNDER: "Router-shift clipfrac (γ < γmin)",
    PPO_KL: "ppo_kl",
    PG_CLIPFRAC: "pg_clipfrac",
    MISMATCH_KL: "KL(engine || trainer), k3",
    ROUTING_AGREEMENT: "Routing agreement (engine, old pass)",
}


def min_max(values) -> tuple[float, float]:
    """The band of a line over seeds: (lowest, highest) value at a step."""
    return float(values.min()), float(values.max())


def band_note(n_seeds: int) -> str:
    return f"mean of n={n_seeds} seeds; band: min-max over seeds" if n_seeds > 1 else "1 seed"


@dataclass(frozen=True)
class Panel:
    metric: str  # a metric key, or "val" for the preferred validation set
    title: str = ""
    required: bool = True
    task: str = ""  # restrict to the runs of this task (fig2)


# ---------------------------------------------------------------------------- reading runs


def read_metrics(path: str | Path) -> pd.DataFrame:
    """metrics.jsonl -> one row per step (later lines win for a repeated step), columns = keys."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"missing metrics file: {path} (train the run first, or draw from the shipped runs: `make figures` "
            "unpacks them into results/<preset>-archive/runs, `make figure FIG=<name>` redraws one from there)"
        )
    rows = {step: {k: float(v) for k, v in row.items() if is_number(v)} for step, row in Steps.parse(path).rows.items()}
    if not rows:
        raise ValueError(f"{path}: no metric lines")
    df = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    df.index.name = "step"
    return df.reset_index()


def val_sets(frames: dict[str, pd.DataFrame]) -> list[str]:
    """Validation sets logged by any run (val/<set>/score), `val` first."""
    sets = sorted(
        {
            c.split("/")[1]
            for df in frames.values()
            for c in df.columns
            if c.startswith("val/") and c.endswith("/score") and c.count("/") == 2
        }
    )
    return sorted(sets, key=lambda s: (s != "val", s))


# ---------------------------------------------------------------------------- styles


def run_style(figure: str, run: Run, plan: Plan, gammas: list[float]) -> tuple[str, tuple, object]:
    """(legend label, colour, dash pattern) of a run in a figure."""
    figure = paper_figure(figure)
    label = plan.label(run.name)
    dash = style.DASHED if run.router_shift else style.SOLID
    color = style.algo_color(run.algo)
    if figure == "fig3_gamma_min":
        label = f"γmin = {run.gamma_min:g}"
        color = style.sequential(len(gammas))[gammas.index(run.gamma_min)]
        dash = style.SOLID
    elif figure == "fig5_stopgrad":
        label = "RSPO, stop-grad on γ (default)" if run.stop_gradient else "RSPO, gradient through γ"
        color = style.algo_color(run.algo) if run.stop_gradient else style.NOSG_COLOR
    elif run.routing != "none":
        color = style.ROUTING_COLORS[run.routing]
    elif run.rollout_correction != "none":
        color = style.CORRECTION_COLOR
    return label, color, dash


def panels_for(figure: str, plan: Plan, runs: list[str]) -> list[Panel]:
    figure = paper_figure(figure)
    if figure in ("fig1_reward",):
        return [Panel(REWARD)]
    if figure == "fig2_reward_large":
        tasks = [t for t in plan.tasks if any(plan.runs[r].task == t for r in runs)]
        return [Panel(REWARD, f"Training reward ({t})", task=t) for t in tasks]
    if figure == "fig3_gamma_min":
        return [Panel("val*")]  # expanded to one panel per validation set
    if figure in ("fig4_plugin", "fig5_stopgrad", "fig8_routing"):
        return [Panel(REWARD), Panel("val", required=False)]
    if figure == "fig6_mechanism":
        metrics = (GAMMA, GAMMA_UNDER, PPO_KL, PG_CLIPFRAC)
        return [Panel(m) for m in metrics]
    if figure == "fig7_entropy":
        return [Panel("actor/entropy")]
    if figure == "fig9_mismatch":
        return [Panel(MISMATCH_KL), Panel(ROUTING_AGREEMENT), Panel(REWARD)]
    raise ValueError(f"unknown figure {figure!r}; choose one of {list(FIGURES)}")


# ---------------------------------------------------------------------------- drawing


def build_figure(
    figure: str, plan: Plan, runs_dir: str | Path, out_pdf: str | Path, runs: list[str] | None = None
) -> tuple[Path, Path]:
    """Draw `figure` for the preset's runs (or the given `runs`) into out_pdf and a PNG beside it."""
    if figure not in FIGURES:
        raise ValueError(f"unknown figure {figure!r}; choose one of {list(FIGURES)}")
    names = list(runs) if runs else plan.figure_runs(figure)
    if not names:
        raise ValueError(f"preset {plan.name!r} has no runs for {figure}")
    unknown = [n for n in names if n not in plan.runs]
    if unknown:
        raise ValueError(f"{figure}: runs {unknown} are not in preset {plan.name!r}'s grid")
    runs_dir = Path(runs_dir)
    frames = {n: read_metrics(runs_dir / n / "metrics.jsonl") for n in names}

    sets = val_sets(frames)
    panels: list[Panel] = []
    for p in panels_for(figure, plan, names):
        if p.metric == "val*":
            if not sets:
                raise ValueError(f"{figure}: no run logged a validation score (val/<set>/score) in {runs_dir}")
            panels += [Panel(f"val/{s}/score", f"Validation score ({s})") for s in sets]
        elif p.metric == "val":
            if sets:
                panels.append(Panel(f"val/{sets[0]}/score", f"Validation score ({sets[0]})", required=False))
            else:
                print(f"{figure}: no validation score logged; drawing without the validation panel", file=sys.stderr)
        else:
            panels.append(p)

    gammas = sorted({plan.runs[n].gamma_min for n in names})
    styles = {n: run_style(figure, plan.runs[n], plan, gammas) for n in names}
    labels = list(dict.fromkeys(styles[n][0] for n in names))  # legend order = run order
    palette = {styles[n][0]: styles[n][1] for n in names}
    dashes = {styles[n][0]: styles[n][2] for n in names}
    n_seeds = len({plan.runs[n].seed for n in names})
    several_seeds = n_seeds > 1

    style.apply_theme()
    ncols = 2 if paper_figure(figure) == "fig6_mechanism" else len(panels)
    nrows = math.ceil(len(panels) / ncols)
    width = min(style.PAGE_WIDTH, style.COLUMN_WIDTH * ncols) if ncols > 1 else style.COLUMN_WIDTH
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, style.PANEL_HEIGHT * nrows), squeeze=False)
    handles: dict[str, object] = {}
    for ax, panel in zip(axes.flat, panels):
        parts = []
        for n in names:
            run = plan.runs[n]
            if panel.task and run.task != panel.task:
                continue
            df = frames[n]
            if panel.metric not in df.columns:
                continue
            d = df[["step", panel.metric]].dropna()
            parts.append(
                pd.DataFrame(
                    {
                        "step": d["step"].to_numpy(),
                        "value": d[panel.metric].to_numpy(),
                        "label": styles[n][0],
                        "seed": run.seed,
                    }
                )
            )
        if not parts:
            if panel.required:
                raise ValueError(f"{figure}: no run logged {panel.metric!r} (runs: {names}, dir {runs_dir})")
            ax.set_visible(False)
            continue
        data = pd.concat(parts, ignore_index=True)
        present = [lab for lab in labels if lab in set(data["label"])]
        sns.lineplot(
            data=data,
            x="step",
            y="value",
            hue="label",
            hue_order=present,
            style="label",
            style_order=present,
            palette={k: palette[k] for k in present},
            dashes={k: dashes[k] for k in present},
            estimator="mean",
            errorbar=min_max if several_seeds else None,
            ax=ax,
        )
        leg = ax.get_legend()
        if leg is not None:
            for h, t in zip(leg.legend_handles, [t.get_text() for t in leg.get_texts()]):
                handles.setdefault(t, h)
            leg.remove()
        name = panel.title or METRIC_LABELS.get(panel.metric, panel.metric)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(METRIC_LABELS.get(panel.metric, "Validation score"))
        sns.despine(ax=ax)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    order = [lab for lab in labels if lab in handles]
    fig.tight_layout()
    legend = fig.legend(
        [handles[lab] for lab in order],
        order,
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
        ncol=min(len(order), 4),
        frameon=False,
    )
    legend.set_title(band_note(n_seeds))
    return style.save(fig, out_pdf)
