"""Progress of long commands: a tqdm bar on a terminal, plain parseable lines in a log.

Every long command (pretrain, train, evaluate, generate, bench) reports through one ``Progress``::

    from rspo.progress import Progress

    prog = Progress("train gmpo-rs0.8-s0", total=80, initial=resumed_step, quiet=args.quiet,
                    enabled=dist.is_main)
    for step in range(resumed_step + 1, 81):
        ...
        prog.update(step, {"reward": 0.531, "val": None, "gamma": 0.9912})  # None prints "-"
    prog.close()

On a terminal (the stream is a TTY) this is a tqdm bar whose postfix holds the metrics. Otherwise
(a Snakemake job writes ``> results/<preset>/logs/...log 2>&1``) it writes a line at every
multiple of ``every`` (default: 1% of the total), at least one per ``interval`` seconds while the
count advances, the first and the last step, and every ``force=True`` update (the trainer forces
its validation steps); ``close`` writes the last state if it was not written::

    [train gmpo-rs0.8-s0] step 12/80 (15%) elapsed 0:00:14 eta 0:01:19 s/step 1.12 reward 0.531 val - ...

The format is stable: ``[label] <unit> <n>/<total> (<pct>%) elapsed H:MM:SS eta H:MM:SS|-``
followed by ``key value`` pairs; ``s/<unit>`` (seconds per unit since the previous line) comes
first, then the caller's metrics in the caller's order. A value is a number, ``-`` (not measured
at this step) or a word without spaces. ``parse_line`` reads a line back. Lines go to stderr
(stdout keeps each command's final JSON line) and are flushed at once, so
``tail -f results/<preset>/logs/train/<run>.log`` follows a running job.

``quiet=True`` (every command's ``--quiet``) or ``enabled=False`` (ranks other than 0 under
torchrun) turns a ``Progress`` into a no-op.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from rspo.run_record import GAMMA, GAMMA_UNDER, PG_CLIPFRAC, PPO_KL, REWARD

_now = time.monotonic  # the clock (a test replaces it)

__all__ = ["Progress", "format_line", "format_value", "parse_line", "format_seconds", "train_progress_metrics"]


def format_seconds(seconds: float | None) -> str:
    """H:MM:SS (hours unbounded), or '-' when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def format_value(v: Any) -> str:
    """One metric value as a single token: 4 significant digits, '-' for None / NaN."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float) or hasattr(v, "__float__"):
        try:
            x = float(v)
        except (TypeError, ValueError):
            return _token(str(v))
        if not math.isfinite(x):
            return "-" if math.isnan(x) else ("inf" if x > 0 else "-inf")
        if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-4):
            return f"{x:.3e}"
        return f"{x:.1f}" if abs(x) >= 1000 else f"{x:.4g}"
    return _token(str(v))


def _token(s: str) -> str:
    s = re.sub(r"\s+", "_", s.strip())
    return s or "-"


def format_line(
    label: str, unit: str, n: int, total: int | None, elapsed: float, eta: float | None, metrics: Mapping[str, Any]
) -> str:
    head = f"[{label.replace(']', ')')}] {_token(unit)} {n}"
    if total:
        head += f"/{total} ({int(100 * min(n, total) / total)}%)"
    head += f" elapsed {format_seconds(elapsed)} eta {format_seconds(eta)}"
    return head + "".join(f" {_token(k)} {format_value(v)}" for k, v in metrics.items())


_LINE = re.compile(
    r"^\[(?P<label>[^\]]*)\] (?P<unit>\S+) (?P<n>\d+)(?:/(?P<total>\d+) \((?P<pct>\d+)%\))?"
    r" elapsed (?P<elapsed>\d+:\d\d:\d\d) eta (?P<eta>-|\d+:\d\d:\d\d)(?P<rest>(?: \S+ \S+)*)$"
)


def _seconds(text: str) -> float | None:
    if text == "-":
        return None
    h, m, s = text.split(":")
    return int(h) * 3600 + int(m) * 60 + int(s)


def _number(text: str) -> float | str | None:
    if text == "-":
        return None
    try:
        return float(text)
    except ValueError:
        return text


def parse_line(line: str) -> dict[str, Any] | None:
    """A plain progress line -> {label, unit, step, total, percent, elapsed_s, eta_s, metrics};
    None when the line is not a progress line (other log output)."""
    m = _LINE.match(line.rstrip("\n"))
    if m is None:
        return None
    toks = m["rest"].split()
    return {
        "label": m["label"],
        "unit": m["unit"],
        "step": int(m["n"]),
        "total": int(m["total"]) if m["total"] else None,
        "percent": int(m["pct"]) if m["pct"] else None,
        "elapsed_s": _seconds(m["elapsed"]),
        "eta_s": _seconds(m["eta"]),
        "metrics": {toks[i]: _number(toks[i + 1]) for i in range(0, len(toks), 2)},
    }


class Progress:
    """Progress of one loop of ``total`` units (steps, prompts, records); see the module doc.

    ``update(n, metrics)`` takes the absolute count ``n`` (not an increment), so a caller can
    skip counts; ``initial`` is where a resumed loop starts (ETA counts only the work done here).
    """

    def __init__(
        self,
        label: str,
        total: int | None,
        *,
        unit: str = "step",
        initial: int = 0,
        every: int | None = None,
        interval: float = 60.0,
        quiet: bool = False,
        enabled: bool = True,
        stream: TextIO | None = None,
        tty: bool | None = None,
    ) -> None:
        self.label = label
        self.total = int(total) if total else None
        self.unit = unit
        self.initial = self.n = self._line_n = int(initial)
        self.every = max(1, int(every)) if every else max(1, (self.total or 0) // 100)
        self.interval = float(interval)
        self.active = enabled and not quiet
        self.stream = stream if stream is not None else sys.stderr
        if tty is None:
            isatty = getattr(self.stream, "isatty", None)
            tty = bool(isatty()) if callable(isatty) else False
        self.tty = tty
        self.t0 = self._line_t = _now()
        self.metrics: dict[str, Any] = {}
        self._printed_n = -1
        self._bar = None
        if self.active and self.tty:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total,
                initial=self.initial,
                desc=label,
                unit=unit,
                file=self.stream,
                dynamic_ncols=True,
                mininterval=0.5,
                leave=True,
            )

    # ------------------------------------------------------------------ reporting

    def update(self, n: int, metrics: Mapping[str, Any] | None = None, *, force: bool = False) -> None:
        """The loop reached ``n`` units; ``metrics`` are shown (in order) with this count."""
        if not self.active:
            return
        n = int(n)
        self.metrics = dict(metrics) if metrics is not None else {}
        advanced = n > self.n
        self.n = max(self.n, n)
        if self._bar is not None:
            if advanced:
                self._bar.update(n - self._bar.n)
            if self.metrics:
                self._bar.set_postfix_str(
                    " ".join(f"{k} {format_value(v)}" for k, v in self.metrics.items()), refresh=force
                )
            elif force:
                self._bar.refresh()
            return
        now = _now()
        due = (
            force
            or n == self.initial + 1
            or (self.total is not None and n >= self.total)
            or n // self.every > self._line_n // self.every  # crossed a multiple of `every`
            or (advanced and now - self._line_t >= self.interval)
        )
        if due:
            self._write(n, now)

    def line(self, n: int | None = None, now: float | None = None) -> str:
        """The plain line for count ``n`` (default: the last one) with the last metrics."""
        n = self.n if n is None else n
        now = _now() if now is None else now
        done = n - self.initial
        elapsed = now - self.t0
        per = (now - self._line_t) / (n - self._line_n) if n > self._line_n else (elapsed / done if done > 0 else None)
        eta = None
        if self.total is not None and done > 0:
            eta = max(0, self.total - n) * elapsed / done
        return format_line(self.label, self.unit, n, self.total, elapsed, eta, {f"s/{self.unit}": per, **self.metrics})

    def _write(self, n: int, now: float) -> None:
        text = self.line(n, now)
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken log must not kill the job
            self.active = False
            return
        self._line_n, self._line_t, self._printed_n = n, now, n

    def write(self, message: str) -> None:
        """A free-form message that does not break the bar (tqdm.write on a terminal)."""
        if not self.active:
            return
        if self._bar is not None:
            self._bar.write(message, file=self.stream)
        else:
            self.stream.write(message + "\n")
            self.stream.flush()

    def close(self) -> None:
        """End the bar; in plain mode write the last state if the last update was not printed."""
        if not self.active:
            return
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._printed_n != self.n and self.n > self.initial:
            self._write(self.n, _now())
        self.active = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------- what each command shows

# RL training: display name -> metric key of Trainer.train_step (validation sets are added per set)
TRAIN_KEYS: dict[str, str] = {
    "reward": REWARD,
    "gamma": GAMMA,
    "gamma_clip": GAMMA_UNDER,
    "ppo_kl": PPO_KL,
    "clipfrac": PG_CLIPFRAC,
    "entropy": "actor/entropy",
}


def val_display_name(name: str) -> str:
    """Display name of validation set ``name``: ``val``, ``val_target``, ``val_<other>``."""
    return name if name == "val" or name.startswith("val_") else f"val_{name}"


def train_progress_metrics(metrics: Mapping[str, Any], val_sets: list[str]) -> dict[str, Any]:
    """The numbers a researcher watches during RL, in a fixed order (absent ones are None,
    printed '-': e.g. the validation score between validation steps)."""
    out: dict[str, Any] = {"reward": metrics.get(TRAIN_KEYS["reward"])}
    for name in val_sets:
        out[val_display_name(name)] = metrics.get(f"val/{name}/score")
    for short in ("gamma", "gamma_clip", "ppo_kl", "clipfrac", "entropy"):
        out[short] = metrics.get(TRAIN_KEYS[short])
    return out
