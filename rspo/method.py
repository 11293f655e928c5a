"""The method's vocabulary, torch-free: the names and defaults that the configuration, the losses,
the grid and the TRL plug-in share, each stated once here.

It sits below both the configuration (rspo.config, which validates a preset) and the pure method
modules (rspo.losses, rspo.router), so that neither has to import the other.
"""

from __future__ import annotations

ALGOS = ("grpo", "gspo", "gmpo")  # Appendix E's objectives
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
