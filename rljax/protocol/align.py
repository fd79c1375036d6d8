"""The align step in numbers: rN (an arm's samples to target over the base's) with its interval,
whether the sqrt rule aligned each batch, and the aligned range (lr0: rljax.protocol.calibration).

A run that never reached the target (nan) makes rN unbounded; anything computed from it says so
in a status.
"""
import numpy as np

from rljax import stats


def _welch_half_width(logs_a, logs_b, level):
  """Half-width of Welch's t-interval for mean(logs_a) - mean(logs_b), and its df (floored to an
  integer, which widens the interval slightly). nan with fewer than 2 values on a side."""
  if len(logs_a) < 2 or len(logs_b) < 2:
    return np.nan, 0
  va, vb = np.var(logs_a, ddof=1) / len(logs_a), np.var(logs_b, ddof=1) / len(logs_b)
  if va + vb == 0:
    return 0.0, len(logs_a) + len(logs_b) - 2
  df = (va + vb)**2 / (va**2 / (len(logs_a) - 1) + vb**2 / (len(logs_b) - 1))
  return stats.t_quantile(level, np.floor(df)) * np.sqrt(va + vb), int(np.floor(df))


def rn_interval(base_n, arm_n, level=0.95, arm_floor=None):
  """rN = geometric mean samples-to-target of the arm's seeds / of the base's, with an interval.

  Method: Welch's t-interval on log samples-to-target (each arm keeps its own seed spread; the
  committed runs show per-arm log-sds from 0.04 to 0.6, and a pooled spread then under-covers).
  Seed-to-seed spread is multiplicative, hence logs. An arm seed that never reached the target
  (nan) makes rN unbounded ('not reached'); its `arm_floor` (samples it did reach) then gives a
  lower end. A base seed that never reached it leaves rN undefined ('base not reached').
  """
  base_n, arm_n = np.asarray(base_n, float), np.asarray(arm_n, float)
  result = dict(rN=np.nan, lo=np.nan, hi=np.nan, df=0, status='ok')
  if len(base_n) == 0 or np.isnan(base_n).any():
    return dict(result, status='base not reached')
  missed = np.isnan(arm_n)
  if missed.any():
    if arm_floor is None:
      return dict(result, rN=np.inf, hi=np.inf, status='not reached')
    arm_n = np.where(missed, np.asarray(arm_floor, float), arm_n)
  lb, la = np.log(base_n), np.log(arm_n)
  half, df = _welch_half_width(la, lb, level)
  rn = float(np.exp(la.mean() - lb.mean()))
  result.update(rN=rn, df=df, lo=float(rn * np.exp(-half)), hi=float(rn * np.exp(half)))
  if missed.any():
    result.update(rN=np.inf, hi=np.inf, status='not reached')
  return result


def alignment(lo, hi, tolerance):
  """'aligned' when rN's interval lies inside [1 - tolerance, 1 + tolerance], 'not aligned' when
  it lies outside it, else 'undetermined' (the seeds cannot tell)."""
  if not (np.isfinite(lo) and hi >= lo):
    return 'undetermined'
  if 1 - tolerance <= lo and hi <= 1 + tolerance:
    return 'aligned'
  if hi < 1 - tolerance or lo > 1 + tolerance:
    return 'not aligned'
  return 'undetermined'


def aligned_range(arms, tolerance):
  """The contiguous batches around the base whose every sqrt arm is 'aligned' (see alignment).

  arms: dicts with 'batch', 'rN_ci' and optional 'base' / 'control' (controls are skipped).
  Beyond each end, 'undetermined' lists the batches up to the first one 'not aligned': where the
  range really ends is unknown between them.
  """
  arms = [a for a in arms if not a.get('control')]
  base_batch = next(a['batch'] for a in arms if a.get('base'))
  batches = sorted({a['batch'] for a in arms})
  status = {}
  for b in batches:
    states = {alignment(*a['rN_ci'], tolerance) for a in arms if a['batch'] == b}
    status[b] = ('aligned' if b == base_batch or states == {'aligned'} else
                 'not aligned' if 'not aligned' in states else 'undetermined')
  i = batches.index(base_batch)
  lo = hi = i
  while lo > 0 and status[batches[lo - 1]] == 'aligned':
    lo -= 1
  while hi < len(batches) - 1 and status[batches[hi + 1]] == 'aligned':
    hi += 1
  undetermined = []
  for side in (batches[lo - 1::-1] if lo else [], batches[hi + 1:]):
    for b in side:
      if status[b] == 'not aligned':
        break
      undetermined.append(b)
  return dict(batches=batches[lo:hi + 1], lo=batches[lo], hi=batches[hi], tolerance=tolerance,
              undetermined=sorted(undetermined), status=status)
