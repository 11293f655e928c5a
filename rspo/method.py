"""The method's vocabulary, torch-free: the names and defaults that the configuration, the losses,
the grid and the TRL plug-in share, each stated once here.

It sits below both the configuration (rspo.config, which validates a preset) and the pure method
modules (rspo.losses, rspo.router), so that neither has to import the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rspo.registry import Registry


@dataclass(frozen=True)
class Objective:
    """An RL objective's facts, stated once where it is registered: beside its loss
    (rspo.losses.register_policy_loss) for a new one, here for the paper's three. The configuration's
    choices, the loss's default clip, how its clip fraction is merged over micro-batches and its
    figure colour all read them."""

    name: str
    label: str
    """Its name in figures and tables (GRPO)."""
    clip: tuple[float, float]
    """The default (low, high) clip range of the loss (rl.algorithm.clip_low / clip_high unset)."""
    clip_unit: str
    """What actor/pg_clipfrac counts: "token" (a share of response tokens) or "sequence" (of
    responses); micro-batches are merged weighted by that unit."""
    color: int
    """Its colour: an index into the report's categorical palette (rspo.report.style; 0-2 are the
    paper's three, 3-5 and 7-9 the report's other series)."""

    def __post_init__(self) -> None:
        if self.clip_unit not in ("token", "sequence"):
            raise ValueError(f"objective {self.name!r}: clip_unit must be token or sequence, got {self.clip_unit!r}")


OBJECTIVES: Registry = Registry("objective")
register_objective = OBJECTIVES.register  # add an objective (a name registered twice is refused)


# Appendix E's objectives, and the Appendix's clip ranges ("Algorithms and Hyperparameters"): GRPO
# (0.2, 0.2); GMPO (e^-0.4, e^0.4), i.e. 0.4 in log space; GSPO (3e-4, 4e-4). GSPO clips whole
# responses, so its clip fraction counts responses; GMPO's counts the tokens whose log-ratio it clips.
register_objective(Objective("grpo", "GRPO", (0.2, 0.2), "token", 0))
register_objective(Objective("gspo", "GSPO", (3e-4, 4e-4), "sequence", 1))
register_objective(Objective("gmpo", "GMPO", (0.4, 0.4), "token", 2))
# The registered objectives' names, a live view: a setting whose choices are ALGOS accepts an
# objective registered after it was defined.
ALGOS: Sequence[str] = OBJECTIVES.names()
ROUTING_MODES = ("none", "freeze", "logit_replay", "index_replay", "rollout_replay")  # App. D; R3 beyond it
ROLLOUT_CORRECTIONS = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")  # beyond it
DEFAULT_GAMMA_MIN = 0.8  # Sec. 4.2 / Appendix: gamma_min = 0.8 in all experiments
GAMMA_MIN_BOUNDS = (0.0, 1.0)  # gamma_min lies in (low, high]: a floor on a ratio in (0, 1]


class ConfigError(ValueError):
    """A preset, override or setting is malformed; the message starts with the offending key."""


def check_gamma_min(value: float, key: str = "gamma_min") -> float:
    """The one check of gamma_min, the floor on the router-shift ratio: it must lie in (0, 1].

    Used where a value enters: a preset (rspo.config), the grid's sweep (rspo.grid), the loss's
    arguments (rspo.losses) and the TRL configs; raises ConfigError (a ValueError) naming ``key``."""
    lo, hi = GAMMA_MIN_BOUNDS
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo < value <= hi:
        raise ConfigError(f"{key}: must lie in ({lo:g}, {hi:g}], got {value}")
    return float(value)
