"""Figure style: Agg backend, one seaborn theme, fixed colours per method, byte-stable output.

Byte stability (measured with matplotlib 3.11): PNG is deterministic with the
default metadata; PDF needs its CreationDate/ModDate/Producer/Creator metadata removed. The bands
over seeds (rspo.report.figures) are min-max, with no random resampling.

Colours follow the paper's convention: one colour per base algorithm (GRPO, GSPO, GMPO), the
router-shift (+RS) variant in the same colour with a dashed line.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display, no backend-dependent output

import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402

from rspo.method import OBJECTIVES  # noqa: E402

# Paper single-column width (inches) and panel height.
COLUMN_WIDTH = 3.35
PAGE_WIDTH = 6.9
PANEL_HEIGHT = 2.2

RC = {
    "figure.figsize": (COLUMN_WIDTH, PANEL_HEIGHT),
    "savefig.dpi": 300,
    "savefig.bbox": "tight",
    "font.size": 7,
    "axes.titlesize": 8,
    "axes.labelsize": 7,
    "xtick.labelsize": 6.5,
    "ytick.labelsize": 6.5,
    "legend.fontsize": 6.5,
    "legend.title_fontsize": 6.5,
    "lines.linewidth": 1.1,
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "svg.fonttype": "none",
    "svg.hashsalt": "rspo",
}

PDF_METADATA = {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None}

_PALETTE = sns.color_palette("colorblind", 10)


def algo_color(algo: str) -> tuple[float, float, float]:
    """One colour per base algorithm, its registered one (rspo.method.Objective.color); +RS reuses it
    with a dashed line."""
    return _PALETTE[OBJECTIVES[algo].color]


ROUTING_COLORS = {
    "freeze": _PALETTE[4],
    "logit_replay": _PALETTE[5],
    "index_replay": _PALETTE[7],
    "rollout_replay": _PALETTE[8],
}
CORRECTION_COLOR = _PALETTE[9]  # TIS and RS+TIS (dashed with RS), beyond the paper
NOSG_COLOR = _PALETTE[3]


def sequential(n: int) -> list[tuple[float, float, float]]:
    """n readable colours of one sequential palette (gamma_min sweeps, low -> high)."""
    return sns.color_palette("crest", n + 1)[1:]


SOLID = ""
DASHED = (4, 2)


def apply_theme() -> None:
    sns.set_theme(context="paper", style="ticks", palette="colorblind", rc=RC)


def save(fig: plt.Figure, out_pdf: str | Path) -> tuple[Path, Path]:
    """Write FILE.pdf and FILE.png (same stem) deterministically; close the figure."""
    out_pdf = Path(out_pdf)
    if out_pdf.suffix != ".pdf":
        raise ValueError(f"figure output must end in .pdf (a .png is written beside it), got {out_pdf}")
    out_pdf.parent.mkdir(parents=True, exist_ok=True)
    png = out_pdf.with_suffix(".png")
    try:
        fig.savefig(out_pdf, format="pdf", metadata=PDF_METADATA)
        fig.savefig(png, format="png")
    finally:
        plt.close(fig)
    return out_pdf, png
