"""Collapse detector (paper Sec. 3.1: "a sharp and sustained drop in validation score/reward
accompanied by abnormally large KL / gradient norms").

The windowed reward is the mean training reward over the last ``window`` steps; a step is *down*
when it is below ``(1 - drop)`` times the best windowed reward seen so far (and that best is > 0).
The detector fires once, by whichever of two rules holds first:

- ``spike``: a down step with, within the window, |actor/ppo_kl| or actor/grad_norm above
  ``spike`` times its median over all steps before the window (the paper's wording: a sharp drop
  with a KL or gradient-norm spike); its step is that step;
- ``sustained`` (``sustain`` > 0): ``sustain`` down steps in a row, with or without a spike (a
  run whose reward fades to nothing without a spike is collapsed too: three stress runs of the
  earlier small study ended at 0-1% validation accuracy and the spike rule never fired); its step
  is the first of those down steps (the onset), so "steps to collapse" means the same for both.

Deviation from the paper: the paper names no thresholds; these are ours (``tracking.collapse_*``).
"""

from __future__ import annotations

import copy
import statistics
from typing import Any

from rspo.run_record import PPO_KL, REWARD


class CollapseDetector:
    def __init__(self, window: int = 5, drop: float = 0.5, spike: float = 5.0, sustain: int = 0) -> None:
        self.window, self.drop, self.spike, self.sustain = window, drop, spike, sustain
        self.rewards: list[float] = []
        self.kls: list[float] = []
        self.grads: list[float] = []
        self.best = float("-inf")
        self.fired = False
        self.step: int | None = None
        self.kind: str | None = None
        self.down_since: int | None = None
        """The first step of the current run of down steps (None when the last step was not down)."""

    def _spiked(self, series: list[float]) -> bool:
        before, recent = series[: -self.window], series[-self.window :]
        if len(before) < self.window:
            return False
        base = statistics.median(before)
        return base > 0 and max(recent) > self.spike * base

    def _fire(self, step: int, kind: str) -> bool:
        self.fired, self.step, self.kind = True, step, kind
        return True

    def update(self, step: int, metrics: dict[str, float]) -> bool:
        """Add one step's metrics; True exactly when the detector fires."""
        self.rewards.append(float(metrics.get(REWARD, 0.0)))
        self.kls.append(abs(float(metrics.get(PPO_KL, 0.0))))
        self.grads.append(float(metrics.get("actor/grad_norm", 0.0)))
        if len(self.rewards) < self.window:
            return False
        current = sum(self.rewards[-self.window :]) / self.window
        down = self.best > 0 and current < (1.0 - self.drop) * self.best
        self.best = max(self.best, current)
        self.down_since = (step if self.down_since is None else self.down_since) if down else None
        if self.fired or not down:
            return False
        if self._spiked(self.kls) or self._spiked(self.grads):
            return self._fire(step, "spike")
        if self.sustain and step - self.down_since + 1 >= self.sustain:
            return self._fire(self.down_since, "sustained")
        return False

    def state_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.__dict__)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.__dict__.update(copy.deepcopy(state))
