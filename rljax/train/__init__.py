"""One training run: its setup, the RL step and loop, evaluation, warm start, checkpoints, logs."""
