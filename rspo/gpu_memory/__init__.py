"""GPU memory of a training step planned: the plan of each phase with its formulas (plan, shape),
the trainer's own step simulated on fake tensors (simulate), and the measured check a cluster user
runs on one node before submitting (preflight). The phases themselves, and their memory measured
while a run trains, are rspo.phase_memory: the trainer and the engines use it, and sit below this
package's planner."""
