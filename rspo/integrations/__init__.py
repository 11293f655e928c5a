"""Router-shift weighting inside other trainers: ``rspo.integrations.trl`` (TRL 1.16's GRPO and GMPO
trainers; the optional ``trl`` extra), and ``require_trl``, the check that it is installed."""

from __future__ import annotations


def require_trl(command: str) -> None:
    """Stop ``command`` with what to install when TRL (the optional ``bench`` extra) is missing."""
    try:
        import trl  # noqa: F401
    except ImportError as e:
        raise SystemExit(
            f"{command} needs TRL, an optional benchmark dependency: pip install -e '.[bench]' (or run `make bench`)"
        ) from e
