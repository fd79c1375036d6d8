"""Ahead-of-time planning: compile a run's programs for TPU/GPU targets on a CPU host and read
memory, costs and HLO."""
