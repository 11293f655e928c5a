"""Router-shift weighting inside other trainers: ``rspo.integrations.trl`` (TRL 1.16's GRPO and GMPO
trainers; the optional ``trl`` extra)."""
