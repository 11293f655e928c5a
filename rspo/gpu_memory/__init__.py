"""GPU memory of a training step: its phases measured at run time (phases), the plan of each phase
with its formulas (plan, shape), the trainer's own step simulated on fake tensors (simulate), and
the measured check a cluster user runs on one node before submitting (preflight)."""
