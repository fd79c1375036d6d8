"""Run logs: WORKDIR/metrics.jsonl (the contract other tools read), WORKDIR/eval_correct.jsonl
(per-prompt eval correctness, for bootstrap confidence intervals) and a console progress line.

Only the process that owns logging (process 0) writes. On resume, rows logged after the restored
checkpoint are dropped, so the file reads as one uninterrupted run.
"""
import json
import os

import numpy as np


def _plain(value):
  """numpy / jax scalars -> JSON-native numbers."""
  if isinstance(value, (bool, int, float, str)) or value is None:
    return value
  return np.asarray(value).item()


def read_jsonl(path):
  """The rows of a JSON-lines file; a torn last line (its writer was killed mid-line) is dropped."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  rows = []
  for index, line in enumerate(lines):
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      if index < len(lines) - 1:
        raise
  return rows


class MetricsWriter:

  def __init__(self, workdir, enabled=True):
    self.enabled = enabled
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self.eval_path = os.path.join(workdir, 'eval_correct.jsonl')

  def _append(self, path, row):
    if self.enabled:
      with open(path, 'a') as f:
        f.write(json.dumps({k: _plain(v) for k, v in row.items()}) + '\n')

  def truncate_after(self, step):
    """Drops rows with step > `step` (logged after the checkpoint we resume from; -1: all rows).

    Rewrites into a temporary file and renames it, so a kill here loses no row.
    """
    if not self.enabled:
      return
    for path in (self.path, self.eval_path):
      rows = [row for row in read_jsonl(path) if row['step'] <= step]
      with open(path + '.tmp', 'w') as f:
        f.writelines(json.dumps(row) + '\n' for row in rows)
      os.replace(path + '.tmp', path)

  def train(self, row, console=True):
    self._append(self.path, row)
    if console and self.enabled:
      print(f"step {row['step']} | samples {row['samples']} | reward {row['reward_mean']:.3f} | "
            f"lr {row['lr']:.2e} | grad norm {row['grad_norm']:.3f} | "
            f"{row['samples_per_s']:.0f} samples/s", flush=True)

  def eval(self, step, samples, accuracy, correct_N, wallclock_s):
    self._append(self.path, dict(step=step, samples=samples, eval=True, eval_accuracy=accuracy,
                                 wallclock_s=wallclock_s))
    self._append(self.eval_path, dict(step=step, samples=samples,
                                      correct=''.join('1' if c else '0' for c in correct_N)))
    if self.enabled:
      print(f'step {step} | samples {samples} | eval accuracy {accuracy:.3f}', flush=True)
