"""Numpy statistics that training and the protocol share: Student t quantiles and the geometric-mean
interval, the gradient noise scale (the trainer logs it; P=auto and the protocol's quick answer use
its interval) and the steady-state throughput rule.

Intervals are two-sided at `level` (0.95 unless given); each function names its method.
"""
import collections
import functools

import numpy as np

NOISE_KEYS = ('grad_sq_small', 'grad_sq_big', 'b_small', 'b_big')

# ------------------------------------------------------------------------------------------------
# Student t quantiles (integer degrees of freedom), without scipy.
# ------------------------------------------------------------------------------------------------


def _t_central(t, df):
  """P(|T| <= t) for Student's t with integer df: the closed forms of Abramowitz & Stegun 26.7."""
  theta = np.arctan(t / np.sqrt(df))
  c2, total, term = np.cos(theta)**2, 1.0, 1.0
  if df % 2:
    for k in range(1, (df - 1) // 2):
      term *= 2 * k / (2 * k + 1) * c2
      total += term
    tail = np.sin(theta) * np.cos(theta) * total if df > 1 else 0.0
    return 2 / np.pi * (theta + tail)
  for k in range(1, df // 2):
    term *= (2 * k - 1) / (2 * k) * c2
    total += term
  return np.sin(theta) * total


@functools.lru_cache(maxsize=4096)   # pure; a report asks for the same few thousands of times
def t_quantile(level, df):
  """t such that P(|T_df| <= t) = level (e.g. 12.706 for level 0.95, df 1), by bisection."""
  df = int(df)
  if df < 1 or not 0 < level < 1:
    return np.nan
  lo, hi = 0.0, 1.0
  while _t_central(hi, df) < level:
    lo, hi = hi, 2 * hi
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if _t_central(mid, df) < level else (lo, mid)
  return (lo + hi) / 2


def log_mean_interval(values, level=0.95):
  """Geometric mean of positive values with a t-interval on their logs (df = n - 1)."""
  logs = np.log(np.asarray(values, float))
  n = len(logs)
  if n == 0:
    return dict(mean=np.nan, lo=np.nan, hi=np.nan, df=0)
  mean = float(np.exp(logs.mean()))
  if n < 2:
    return dict(mean=mean, lo=np.nan, hi=np.nan, df=0)
  half = t_quantile(level, n - 1) * logs.std(ddof=1) / np.sqrt(n)
  return dict(mean=mean, lo=float(np.exp(logs.mean() - half)),
              hi=float(np.exp(logs.mean() + half)), df=n - 1)


# ------------------------------------------------------------------------------------------------
# Gradient noise scale (McCandlish et al., 2018).
# ------------------------------------------------------------------------------------------------


def _noise_terms(g_small_sq, g_big_sq, b_small, b_big):
  """Per-step unbiased estimates of |G|^2 and tr(Sigma) from squared norms at two batch sizes."""
  small, big, bs, bb = np.broadcast_arrays(
      *(np.atleast_1d(np.asarray(v, float)) for v in (g_small_sq, g_big_sq, b_small, b_big)))
  ok = np.isfinite(small) & np.isfinite(big) & np.isfinite(bs) & np.isfinite(bb) & (bb > bs)
  small, big, bs, bb = small[ok], big[ok], bs[ok], bb[ok]
  return (bb * big - bs * small) / (bb - bs), (small - big) / (1 / bs - 1 / bb)


def noise_scale(g_small_sq, g_big_sq, b_small, b_big):
  """McCandlish et al. (2018) simple noise scale B_simple = tr(Sigma) / |G|^2, in batch units.

  E|g_b|^2 = |G|^2 + tr(Sigma) / b at any batch b, so squared norms at two batch sizes give
  unbiased estimates of |G|^2 and tr(Sigma). Both are averaged over steps BEFORE the ratio: one
  step's |G|^2 estimate is very noisy (often negative) and a ratio of noisy numbers is biased.
  Takes per-step arrays or scalars; steps with a missing value are skipped. nan when the averaged
  |G|^2 is not positive (the noise swamps the signal over these steps: not estimable).
  """
  grad_sq, trace = _noise_terms(g_small_sq, g_big_sq, b_small, b_big)
  if not len(grad_sq) or np.mean(grad_sq) <= 0:
    return np.nan
  return float(np.mean(trace) / np.mean(grad_sq))


def _noise_blocks(runs_terms, block):
  """[blocks, 2]: per block of `block` consecutive steps of a run, the sums of
  |G|^2 and tr(Sigma)."""
  sums = []
  for terms in runs_terms:
    grad_sq, trace = _noise_terms(*terms)
    for start in range(0, len(grad_sq), block):
      sums.append([grad_sq[start:start + block].sum(), trace[start:start + block].sum()])
  return np.array(sums, float).reshape(-1, 2)


def noise_scale_draws(runs_terms, block=10, n_boot=2000, rng=0):
  """Moving-block bootstrap draws of B_simple over steps (inf where a draw's |G|^2 is not
  positive); empty when fewer than 2 blocks. Neighbouring steps share a policy, hence blocks."""
  sums = _noise_blocks(runs_terms, block)
  if len(sums) < 2:
    return np.zeros(0)
  pick = np.random.default_rng(rng).integers(0, len(sums), size=(n_boot, len(sums)))
  grad, trace = sums[pick, 0].sum(axis=1), sums[pick, 1].sum(axis=1)
  with np.errstate(divide='ignore', invalid='ignore'):
    return np.where(grad > 0, trace / grad, np.inf)


def noise_scale_interval(runs_terms, block=10, n_boot=2000, rng=0, level=0.95):
  """B_simple over several runs' steps, with a moving-block bootstrap interval over steps.

  runs_terms: per run, the four NOISE_KEYS columns (each an array over steps). Steps are cut into
  blocks of `block` consecutive steps within each run and blocks are resampled with replacement
  (noise_scale_draws, returned as 'draws'); the interval is the percentile one. A replicate whose
  |G|^2 is not positive counts as unbounded (upper end inf).
  """
  sums = _noise_blocks(runs_terms, block)
  if not len(sums):
    return dict(value=np.nan, lo=np.nan, hi=np.nan, blocks=0, draws=np.zeros(0))
  value = sums[:, 1].sum() / sums[:, 0].sum() if sums[:, 0].sum() > 0 else np.nan
  draws = noise_scale_draws(runs_terms, block, n_boot, rng)
  if not len(draws):   # one block: nothing to resample
    return dict(value=float(value), lo=np.nan, hi=np.nan, blocks=1, draws=draws)
  tail = (1 - level) / 2   # order statistics, not interpolation: inf stays inf, never inf - inf
  lo, hi = np.quantile(draws, [tail, 1 - tail], method='inverted_cdf')
  return dict(value=float(value), lo=float(lo), hi=float(hi), blocks=len(sums), draws=draws)


class NoiseScaleWindow:
  """B_simple over the last `steps` training rows: one step alone is mostly noise.

  Starts from the rows already logged, so a resumed run goes on with the same window.
  """

  def __init__(self, rows, steps=50):
    self._terms = collections.deque(
        ([row[k] for k in NOISE_KEYS] for row in rows if 'grad_sq_small' in row), maxlen=steps)

  def update(self, row):
    """Adds `row`'s terms and sets row['noise_scale'] (None: not estimable); rows without
    micro-batches have no terms and get no field."""
    if 'grad_sq_small' in row:
      self._terms.append([row[k] for k in NOISE_KEYS])
      value = noise_scale(*np.transpose(self._terms))
      row['noise_scale'] = value if np.isfinite(value) else None


# ------------------------------------------------------------------------------------------------
# Throughput: one steady-state rule, and rounds.
# ------------------------------------------------------------------------------------------------


def steady_throughput(samples_S, seconds_S, warmup):
  """Samples per second over the steps after the first `warmup` (they compile): total samples
  over total seconds. The one rule for the throughput rounds and the align runs' own steps."""
  samples, seconds = np.asarray(samples_S, float)[warmup:], np.asarray(seconds_S, float)[warmup:]
  ok = np.isfinite(samples) & np.isfinite(seconds)
  total = seconds[ok].sum()
  return float(samples[ok].sum() / total) if total > 0 else np.nan


def throughput_interval(rounds, level=0.95):
  """Samples/s over repeated rounds: the median, and a t-interval on the log (geometric) mean."""
  rounds = np.asarray(rounds, float)
  rounds = rounds[np.isfinite(rounds) & (rounds > 0)]
  geo = log_mean_interval(rounds, level)
  return dict(median=float(np.median(rounds)) if len(rounds) else np.nan, mean=geo['mean'],
              lo=geo['lo'], hi=geo['hi'], rounds=len(rounds))
