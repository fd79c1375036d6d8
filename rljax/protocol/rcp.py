"""MLPerf's reference convergence points (RCPs) and their check, as mlcommons' RCP checker computes
them (github.com/mlcommons/logging, mlperf_logging/rcp_checker/rcp_checker.py; rules in
mlperf_logging/rcp_checker/training_6.1.0/rcps_*.json), written here from its description:

- An RCP is a batch's samples to converge over several reference runs (twice a submission's
  runs); its mean is olympic (the fastest and the slowest run dropped), its stdev numpy's (ddof 0)
  over every run.
- The fastest acceptable mean is the lowest mean a one-sided equal-variance t-test at alpha 0.05
  still finds no faster than the RCP's, with the RCP's stdev and the checker's sample counts (the
  reference runs less 2, the submission's runs less 2). The checker bisects for it; its closed
  form is mean - t_{1 - alpha}(df) x stdev x sqrt(1 / n_ref + 1 / n_subm), floored at 0.
- RCPs are pruned: none below the batch of the fastest mean, and an interior one that converges
  slower than the line between its neighbours is dropped, left to right.
- A submission's olympic mean passes when it is at least the fastest acceptable mean of the RCP at
  its batch, or of one interpolated linearly in batch between the nearest RCPs below and above
  (its fastest mean at twice a submission's runs as n_ref); more than one run that did not
  converge fails it. Faster than the RCP's mean but passing, its score is scaled by RCP mean /
  its mean (scaling.json).
"""
import math

import numpy as np

from rljax import stats

ALPHA = 0.05
DROPPED = 1   # runs dropped at each end of an olympic mean (4 for unet3d only)


def olympic_mean(values, dropped=DROPPED):
  """The mean without the `dropped` fastest and slowest values; nan when none is left."""
  kept = sorted(values)[dropped:len(values) - dropped]
  return float(np.mean(kept)) if kept else math.nan


def min_acceptable_mean(mean, stdev, n_ref, n_subm, alpha=ALPHA):
  """The lowest mean samples to converge that the checker's one-sided t-test accepts."""
  if stdev == 0:
    return mean
  df = n_ref + n_subm - 2
  if n_ref < 1 or n_subm < 1 or df < 1:
    return math.nan
  t_one_sided = stats.t_quantile(1 - 2 * alpha, df)   # P(T <= t) = 1 - alpha
  return max(0.0, mean - t_one_sided * stdev * math.sqrt(1 / n_ref + 1 / n_subm))


def record(batch, values, runs):
  """An RCP at `batch` from its runs' samples to converge; `runs`: a submission's result files."""
  mean, stdev = olympic_mean(values), float(np.std(values))
  lowest = min_acceptable_mean(mean, stdev, len(values) - 2 * DROPPED, runs - 2 * DROPPED)
  return dict(batch=batch, mean=mean, stdev=stdev, min_mean=lowest,
              max_speedup=_ratio(mean, lowest))


def interpolated(batch, low, high, runs):
  """The RCP the checker makes at `batch` between two RCPs, linear in batch."""
  mean, stdev = (float(np.interp(batch, [low['batch'], high['batch']], [low[k], high[k]]))
                 for k in ('mean', 'stdev'))
  lowest = min_acceptable_mean(mean, stdev, 2 * runs, runs - 2 * DROPPED)
  return dict(batch=batch, mean=mean, stdev=stdev, min_mean=lowest,
              max_speedup=_ratio(mean, lowest))


def _ratio(mean, lowest):
  return mean / lowest if lowest > 0 else math.inf


def pruned(records, runs):
  """The RCPs the checker compares against by default: from the batch of the fastest mean up, each
  interior one kept only if no slower than the line between its neighbours."""
  kept = sorted(records, key=lambda r: r['batch'])
  if not kept:
    return []
  fastest = min(kept, key=lambda r: r['mean'])
  kept = [r for r in kept if r['batch'] >= fastest['batch']]
  i = 1
  while i < len(kept) - 1:
    if kept[i]['mean'] > interpolated(kept[i]['batch'], kept[i - 1], kept[i + 1], runs)['mean']:
      del kept[i]
    else:
      i += 1
  return kept


def reference_for(batch, records, runs):
  """(the RCP a submission at `batch` is checked against or None, how the checker found it)."""
  by_batch = {r['batch']: r for r in records}
  below = [b for b in by_batch if b < batch]
  above = [b for b in by_batch if b > batch]
  if batch in by_batch:
    return by_batch[batch], 'RCP found'
  if below and above:
    return interpolated(batch, by_batch[max(below)], by_batch[min(above)], runs), \
        'RCP interpolation'
  if above:
    return by_batch[min(above)], 'the smallest RCP (none below this batch)'
  return None, 'missing RCP (none at or above this batch)' if below else 'no RCP'


def check(batch, values, records, runs):
  """Would runs at `batch` with samples to converge `values` (inf: did not converge) pass against
  `records` (pruned first)? dict(passed, how, mean (olympic), reference, scale)."""
  values = [float(v) for v in values]
  mean = olympic_mean(values)
  if sum(not math.isfinite(v) for v in values) > DROPPED:
    return dict(passed=False, how='insufficient convergence (more than one run did not converge)',
                mean=mean, reference=None, scale=1.0)
  reference, how = reference_for(batch, pruned(records, runs), runs)
  if reference is None:
    return dict(passed=False, how=how, mean=mean, reference=None, scale=1.0)
  passed = mean >= reference['min_mean']
  scale = max(1.0, reference['mean'] / mean) if passed else 1.0
  return dict(passed=bool(passed), how=how, mean=mean, reference=reference, scale=scale)
