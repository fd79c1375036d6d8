"""Statistics of training logs in plain numpy: the trainer's noise scale, the protocol's numbers.

A run, as rljax.protocol.report.load_run gives it, is {'train': columns, 'eval': columns} of float arrays.
Conventions:
- Runs are compared against cumulative retained training responses ("samples"), never steps.
- A run that never reaches a target gives nan for it; anything computed from it says so in a status.
- Intervals are two-sided at `level` (0.95 unless given); each function names its method.
"""
import collections

import numpy as np

NOISE_KEYS = ('grad_sq_small', 'grad_sq_big', 'b_small', 'b_big')
NOISE_DOMINATED_SLOPE = -0.5
NOISE_DOMINATED_DOUBLING = 2**-0.5  # grad norm ratio per doubling of batch when noise dominates.

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


# ------------------------------------------------------------------------------------------------
# Eval curves and first crossings.
# ------------------------------------------------------------------------------------------------


def smooth(y, window):
  """Centred moving average over `window` points (rounded down to odd), along axis 0.

  Centred, not trailing: a trailing average lags by (window - 1) / 2 evals, which in samples is
  longer at a larger batch unless every arm is evaluated on the same sample grid. Near the ends
  the window shrinks symmetrically, so it stays centred (end points are kept).
  """
  y = np.asarray(y, float)
  half = max(int(window), 1) // 2
  if half == 0 or len(y) == 0:
    return y
  n = len(y)
  cumsum = np.concatenate([np.zeros((1,) + y.shape[1:]), np.cumsum(y, axis=0)])
  i = np.arange(n)
  h = np.minimum(np.minimum(i, n - 1 - i), half)
  width = (2 * h + 1).reshape((n,) + (1,) * (y.ndim - 1))
  return (cumsum[i + h + 1] - cumsum[i - h]) / width


def first_crossing(x, y, target):
  """x where y first reaches `target`, linearly interpolated between the two bracketing points.

  nan if y never reaches it; x[0] if y starts at or above it.
  """
  x, y = np.asarray(x, float), np.asarray(y, float)
  above = np.flatnonzero(y >= target)
  if len(above) == 0:
    return np.nan
  i = above[0]
  if i == 0:
    return float(x[0])
  frac = (target - y[i - 1]) / (y[i] - y[i - 1])
  return float(x[i - 1] + frac * (x[i] - x[i - 1]))


def eval_xy(run, x_key):
  """An eval curve (x, accuracy) with unlogged points dropped."""
  ev = run['eval']
  ok = np.isfinite(ev['eval_accuracy']) & np.isfinite(ev[x_key])
  return ev[x_key][ok], ev['eval_accuracy'][ok]


def wallclock_at(run, samples, warmup=0):
  """Training seconds (cumulative step_time_s) when the run had consumed `samples` responses. With
  warmup > 0 its first `warmup` steps (compilation) count at the mean time of its later steps,
  the steady_throughput rule."""
  times = np.asarray(run['train']['step_time_s'], float)
  if 0 < warmup < len(times):
    later = times[warmup:]
    times = np.concatenate([np.full(warmup, np.mean(later[np.isfinite(later)])), later])
  seconds = np.concatenate([[0.0], np.cumsum(np.nan_to_num(times))])
  return np.interp(samples, np.concatenate([[0.0], run['train']['samples']]), seconds)


def to_target(run, target, window=1, x_key='samples'):
  """Samples (or steps) at which the smoothed eval curve first reaches target; nan if never."""
  x, y = eval_xy(run, x_key)
  return first_crossing(x, smooth(y, window), target)


def wallclock_to_target(run, target, window=1, warmup=0):
  """Training seconds at the samples-to-target crossing (eval excluded; compilation included unless
  warmup > 0, as in wallclock_at)."""
  samples = to_target(run, target, window)
  return float(wallclock_at(run, samples, warmup)) if np.isfinite(samples) else np.nan


def samples_reached(run):
  """The samples of the last eval: a lower bound on samples-to-target of a run that missed it."""
  x, _ = eval_xy(run, 'samples')
  return float(x[-1]) if len(x) else np.nan


def targets_from_base(base_runs, fractions, window=1):
  """Targets on the rising part of the base arm's curve: start + f x (top - start) for each f.

  start: the seed mean of the smoothed accuracy at the first eval (the warm start); top: the
  lowest over seeds of the highest smoothed accuracy, so every base seed reaches every target
  with f < 1. Empty when the base arm does not rise.
  """
  curves = [smooth(eval_xy(r, 'samples')[1], window) for r in base_runs]
  curves = [y for y in curves if len(y)]
  if not curves:
    return []
  start = float(np.mean([y[0] for y in curves]))
  top = float(min(np.max(y) for y in curves))
  return [start + f * (top - start) for f in fractions] if top > start else []


# ------------------------------------------------------------------------------------------------
# Samples to target per seed: geometric means and the sample penalty rN.
# ------------------------------------------------------------------------------------------------


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


def _welch_half_width(logs_a, logs_b, level):
  """Half-width of Welch's t-interval for mean(logs_a) - mean(logs_b), and its df (floored to an
  integer, which widens the interval slightly). nan with fewer than 2 values on a side."""
  if len(logs_a) < 2 or len(logs_b) < 2:
    return np.nan, 0
  va, vb = np.var(logs_a, ddof=1) / len(logs_a), np.var(logs_b, ddof=1) / len(logs_b)
  if va + vb == 0:
    return 0.0, len(logs_a) + len(logs_b) - 2
  df = (va + vb)**2 / (va**2 / (len(logs_a) - 1) + vb**2 / (len(logs_b) - 1))
  return t_quantile(level, np.floor(df)) * np.sqrt(va + vb), int(np.floor(df))


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


# ------------------------------------------------------------------------------------------------
# rN from the whole rising curve: the stretch in samples that maps the base's curve onto a run's.
# ------------------------------------------------------------------------------------------------

LOG_STRETCH_GRID = np.linspace(-3.0, 3.0, 1201)   # stretches from 0.05x to 20x, 0.5% apart


def saturating(x, start, rise, scale):
  """start + rise x (1 - exp(-x / scale)): the base arm's curve shape (a smoother, not a law)."""
  return start + rise * (1 - np.exp(-np.asarray(x, float) / scale))


def fit_curve_shape(base_runs):
  """The base arm's curve: `saturating` fitted by least squares to every base seed's raw evals.

  start: the seeds' mean first eval (the shared warm start, at 0 samples); scale by a grid over
  2 decades either side of the evals' sample range, rise in closed form for each scale. None
  when the base arm does not rise.
  """
  points = [eval_xy(r, 'samples') for r in base_runs]
  points = [(x, y) for x, y in points if len(x) > 1]
  if not points:
    return None
  start = float(np.mean([y[0] for _, y in points]))
  x_P = np.concatenate([x[1:] for x, _ in points])
  dy_P = np.concatenate([y[1:] for _, y in points]) - start
  scale_G = np.geomspace(x_P.max() / 100, x_P.max() * 100, 921)   # 1% apart
  g_GxP = 1 - np.exp(-x_P[None, :] / scale_G[:, None])
  rise_G = (g_GxP * dy_P).sum(axis=1) / (g_GxP * g_GxP).sum(axis=1)
  sse_G = ((dy_P - rise_G[:, None] * g_GxP)**2).sum(axis=1)
  best = int(np.argmin(sse_G))
  if rise_G[best] <= 0:
    return None
  return dict(start=start, rise=float(rise_G[best]), scale=float(scale_G[best]))


def log_stretch(run, shape):
  """log s, where the base curve stretched s-fold in samples best fits the run's raw evals.

  Least squares over every eval after the start, so eval noise averages over the whole rising
  curve instead of setting one crossing; a grid in log s, refined by a parabola through the
  best grid point and its neighbours.
  """
  x_P, y_P = (v[1:] for v in eval_xy(run, 'samples'))
  if not len(x_P):
    return np.nan
  s_G = np.exp(LOG_STRETCH_GRID)
  pred_GxP = saturating(x_P[None, :] / s_G[:, None], shape['start'], shape['rise'], shape['scale'])
  sse_G = ((y_P - pred_GxP)**2).sum(axis=1)
  k = int(np.clip(np.argmin(sse_G), 1, len(s_G) - 2))
  left, mid, right = sse_G[k - 1:k + 2]
  curvature = left - 2 * mid + right
  step = LOG_STRETCH_GRID[1] - LOG_STRETCH_GRID[0]
  offset = 0.5 * (left - right) / curvature if curvature > 0 else 0.0
  return float(LOG_STRETCH_GRID[k] + np.clip(offset, -1, 1) * step)


def shape_samples_to(shape, target):
  """Samples at which the base curve shape reaches `target`; nan when it never does."""
  frac = (target - shape['start']) / shape['rise']
  return float(-shape['scale'] * np.log1p(-frac)) if 0 < frac < 1 else np.nan


def stretch_samples_to_target(runs, shape, target, window=1):
  """Per seed: the base shape's samples to target x the seed's stretch. A seed whose smoothed
  curve never reached the target stays nan (it counts as 'not reached', as with crossings)."""
  base_n = shape_samples_to(shape, target)
  return [base_n * np.exp(log_stretch(r, shape)) if np.isfinite(to_target(r, target, window))
          else np.nan for r in runs]


def choose_lr(lrs, samples_per_lr, level=0.95):
  """The lr with the fewest samples to target (geometric mean over seeds), each with its t-interval.

  An lr with a seed that never reached the target is not chosen. 'at_edge' says the best lr is
  the smallest or largest tried: the optimum may lie beyond the sweep.
  """
  rows = []
  for lr, n in sorted(zip(lrs, samples_per_lr)):
    n = np.asarray(n, float)
    reached = bool(len(n)) and bool(np.isfinite(n).all())
    geo = log_mean_interval(n, level) if reached else dict(mean=np.inf, lo=np.nan, hi=np.inf)
    rows.append(dict(lr=float(lr), samples_per_seed=n.tolist(), reached=reached,
                     samples_to_target=geo['mean'], ci=[geo['lo'], geo['hi']]))
  reached = [r for r in rows if r['reached']]
  if not reached:
    return dict(lr0=np.nan, at_edge=False, lrs=rows)
  best = min(reached, key=lambda r: r['samples_to_target'])
  return dict(lr0=best['lr'], at_edge=best['lr'] in (rows[0]['lr'], rows[-1]['lr']), lrs=rows)


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


# ------------------------------------------------------------------------------------------------
# Gradient diagnostics: grad norm vs batch, noise scale.
# ------------------------------------------------------------------------------------------------


def loglog_fit(x, y):
  """(slope, intercept, stderr of slope, df) of log y on log x over the finite positive pairs."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
  lx, ly = np.log(x[ok]), np.log(y[ok])
  if len(lx) < 2 or np.ptp(lx) == 0:
    return np.nan, np.nan, np.nan, 0
  dx = lx - lx.mean()
  slope = dx @ (ly - ly.mean()) / (dx @ dx)
  intercept = ly.mean() - slope * lx.mean()
  resid = ly - intercept - slope * lx
  df = len(lx) - 2
  stderr = np.sqrt(resid @ resid / df / (dx @ dx)) if df else np.nan
  return float(slope), float(intercept), float(stderr), df


def grad_norm_slope(batches, median_grad_norms, level=0.95, reference=NOISE_DOMINATED_SLOPE):
  """The log-log slope of grad norm on batch, its t-interval (df = points - 2) and a verdict.

  -1/2 is the noise-dominated regime (the gradient is an average of B noisy per-sample terms); a
  flatter slope means more samples per step no longer buy a less noisy step.
  """
  slope, _, stderr, df = loglog_fit(batches, median_grad_norms)
  half = t_quantile(level, df) * stderr if df else np.nan
  ci = [slope - half, slope + half]
  if not np.isfinite(slope):
    verdict = 'no slope (fewer than 2 batches)'
  elif not np.isfinite(half):
    verdict = 'no interval (2 batches, no residual degrees of freedom)'
  elif ci[0] <= reference <= ci[1]:
    verdict = f'consistent with {reference:g}'
  else:
    verdict = ('flatter' if ci[0] > reference else 'steeper') + f' than {reference:g}'
  return dict(slope=slope, stderr=stderr, df=df, ci=ci, verdict=verdict)


def doubling_ratios(batches, median_grad_norms):
  """Grad norm ratio between consecutive measured batches, per doubling, beside 2**-0.5 = 0.707.

  Arms sharing a batch are combined by geometric mean. For batches not exactly 2x apart the
  ratio is normalised to one doubling: (g2 / g1) ** (1 / log2(B2 / B1)).
  """
  logs = {}
  for b, g in zip(batches, median_grad_norms):
    if np.isfinite(g) and g > 0:
      logs.setdefault(b, []).append(np.log(g))
  points = sorted((b, float(np.exp(np.mean(v)))) for b, v in logs.items())
  return [dict(ratio=g2 / g1, per_doubling=(g2 / g1)**(1 / np.log2(b2 / b1)),
               theory=NOISE_DOMINATED_DOUBLING, **{'from': b1, 'to': b2})
          for (b1, g1), (b2, g2) in zip(points, points[1:])]


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
  """[blocks, 2]: per block of `block` consecutive steps of a run, the sums of |G|^2 and tr(Sigma)."""
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


def noise_scale_from_grad_norms(batches, grad_norms):
  """B_simple from the grad-norm curve: E|g_B|^2 = |G|^2 (1 + B_simple / B), fit by least squares
  of g^2 on 1/B. Medians of norms stand in for root-mean-square norms, so this is a cross-check,
  not a second exact estimate. nan when the fit's |G|^2 or noise term is not positive."""
  b, g = np.asarray(batches, float), np.asarray(grad_norms, float)
  ok = np.isfinite(b) & np.isfinite(g) & (b > 0)
  if len(set(b[ok])) < 2:
    return np.nan
  x, y = 1 / b[ok], g[ok]**2
  slope = ((x - x.mean()) @ (y - y.mean())) / ((x - x.mean()) @ (x - x.mean()))
  intercept = y.mean() - slope * x.mean()
  return float(slope / intercept) if intercept > 0 and slope > 0 else np.nan


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
