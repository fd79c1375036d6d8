"""Checking a batch move by the progress it measurably made (config.auto_batch): pure numpy.

The noise scale predicts what a move costs per sample; after the move the run measures it. The
training reward against cumulative samples s follows r = a + c sqrt(s) closely enough that a
stretch of it with no move fits with a progress ratio of 1 (docs/guide/auto_batch.md). A move at
s0 that scales progress per sample by rho bends that into r = a + c sqrt(s_eff), with s_eff = s
before s0 and s0 + rho (s - s0) after. rho is fitted by profile least squares over the steps a
window before and after the move (a and c in closed form, rho on a log grid), each step weighted by
its samples (its reward is a mean over them); its interval is where the profile's residual sum of
squares stays within t(n - 3)^2 residual variances of its minimum (a likelihood-ratio interval).

The rule: the move made progress per second of rho x (samples/s after / before) of staying. If
that interval lies below 1 the move is undone. If the move made at least the progress per sample
the noise scale predicted, the measured rho may stand in for the noise scale's prediction of the
next doubling (rule.decide's `measured`).
"""
from typing import NamedTuple

import numpy as np

from rljax import stats

RHO_GRID = np.exp(np.linspace(np.log(1 / 32), np.log(32), 401))   # 1/32x..32x, 1.7% apart


class Check(NamedTuple):
  progress: float      # rho: progress per sample after the move over before
  lo: float            # its interval (the grid's ends when the data do not bound it)
  hi: float
  goodput_hi: float    # hi x the samples/s ratio: below 1, the move lost progress per second
  verdict: str         # 'undo', 'keep' or 'keep, measured'


def _sse(samples, reward, weight, s0, rho):
  """Weighted residual sum of squares of r = a + c sqrt(s_eff) at `rho`, (a, c) fitted."""
  s_eff = np.where(samples <= s0, samples, s0 + rho * (samples - s0))
  root_w = np.sqrt(weight)
  design = np.stack([np.ones_like(s_eff), np.sqrt(s_eff)], axis=1) * root_w[:, None]
  coef, *_ = np.linalg.lstsq(design, reward * root_w, rcond=None)
  residual = reward * root_w - design @ coef
  return float(residual @ residual)


def progress_ratio(samples, reward, weight, s0, level=0.95):
  """(rho, lo, hi) for a move at `s0` from steps (cumulative samples after each, reward mean,
  samples in it); rho's profile least-squares estimate and interval at `level`."""
  samples, reward, weight = (np.asarray(x, float) for x in (samples, reward, weight))
  df = len(samples) - 3
  if df < 1 or (samples > s0).sum() < 2 or (samples <= s0).sum() < 2:
    return np.nan, np.nan, np.nan
  sse = np.array([_sse(samples, reward, weight, s0, rho) for rho in RHO_GRID])
  inside = RHO_GRID[sse - sse.min() <= stats.t_quantile(level, df) ** 2 * sse.min() / df]
  return float(RHO_GRID[sse.argmin()]), float(inside.min()), float(inside.max())


def judge(samples, reward, weight, s0, throughput_ratio, predicted):
  """The Check of a move at `s0` whose samples/s grew by `throughput_ratio` and whose progress
  per sample the noise scale predicted at `predicted` (efficiency after / before)."""
  rho, lo, hi = progress_ratio(samples, reward, weight, s0)
  if not np.isfinite(rho):
    return Check(rho, lo, hi, np.nan, 'keep')   # too few steps to tell: nothing to undo on
  goodput_hi = hi * throughput_ratio
  verdict = 'undo' if goodput_hi < 1 else 'keep, measured' if rho >= predicted else 'keep'
  return Check(rho, lo, hi, goodput_hi, verdict)
