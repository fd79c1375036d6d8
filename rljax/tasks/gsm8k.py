"""GSM8K-format word problems from local JSONL (rljax.tasks._jsonl_math), verified by
math-verify."""
from rljax.tasks._jsonl_math import check, lengths, make, REWARD

__all__ = ['check', 'lengths', 'make', 'REWARD']   # the task interface (rljax.tasks)
