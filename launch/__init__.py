"""Cluster launchers for rljax: XManager, Cloud TPU VM slices, SLURM
(see docs/reference/launch.md)."""
