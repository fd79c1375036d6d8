"""Statistics of training logs, in plain numpy: what the trainer and the protocol's report share."""
import collections

import numpy as np

NOISE_KEYS = ('grad_sq_small', 'grad_sq_big', 'b_small', 'b_big')


def noise_scale(g_small_sq, g_big_sq, b_small, b_big):
  """McCandlish et al. (2018) simple noise scale B_simple = tr(Sigma) / |G|^2, in batch units.

  E|g_b|^2 = |G|^2 + tr(Sigma) / b at any batch b, so squared norms at two batch sizes give
  unbiased estimates of |G|^2 and tr(Sigma). Both are averaged over steps BEFORE the ratio: one
  step's |G|^2 estimate is very noisy (often negative) and a ratio of noisy numbers is biased.
  Takes per-step arrays or scalars; steps with a missing value are skipped. nan when the averaged
  |G|^2 is not positive (the noise swamps the signal over these steps: not estimable).
  """
  small, big, bs, bb = np.broadcast_arrays(
      *(np.atleast_1d(np.asarray(v, float)) for v in (g_small_sq, g_big_sq, b_small, b_big)))
  ok = np.isfinite(small) & np.isfinite(big) & np.isfinite(bs) & np.isfinite(bb) & (bb > bs)
  if not ok.any():
    return np.nan
  small, big, bs, bb = small[ok], big[ok], bs[ok], bb[ok]
  grad_sq = np.mean((bb * big - bs * small) / (bb - bs))
  trace = np.mean((small - big) / (1 / bs - 1 / bb))
  return float(trace / grad_sq) if grad_sq > 0 else np.nan


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


NOISE_DOMINATED_SLOPE = -0.5
NOISE_DOMINATED_DOUBLING = 2**-0.5  # grad norm ratio per doubling of batch when noise dominates.

# ----------------------------------------------------------------------------------------------
# Curves and first crossings.
# ----------------------------------------------------------------------------------------------


def smooth(y, window):
  """Centred moving average over `window` points (rounded down to odd), along axis 0.

  Centred, not trailing: a trailing average lags by (window - 1) / 2 evals, and evals k steps
  apart are more samples apart at a larger batch, so a lag would bias rN against large batches.
  Near the ends the window shrinks symmetrically, so it stays centred (end points are kept).
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

  nan if y never reaches it; x[0] if y starts at or above it. y may be 2-D (points x curves):
  one crossing per column, which is how the bootstrap evaluates many curves at once.
  """
  x, y = np.asarray(x, float), np.asarray(y, float)
  y_TxC = y[:, None] if y.ndim == 1 else y
  if len(y) == 0:
    return np.nan if y.ndim == 1 else np.full(y_TxC.shape[1], np.nan)
  above_TxC = y_TxC >= target
  i = np.argmax(above_TxC, axis=0)
  prev = np.maximum(i - 1, 0)
  cols = np.arange(y_TxC.shape[1])
  y0, y1 = y_TxC[prev, cols], y_TxC[i, cols]
  with np.errstate(invalid='ignore', divide='ignore'):
    frac = np.where(i > 0, (target - y0) / (y1 - y0), 0.0)
  crossing = np.where(above_TxC.any(axis=0), x[prev] + frac * (x[i] - x[prev]), np.nan)
  return float(crossing[0]) if y.ndim == 1 else crossing


def eval_xy(run, x_key):
  """An eval curve (x, accuracy) with unlogged points dropped."""
  ev = run['eval']
  ok = np.isfinite(ev['eval_accuracy']) & np.isfinite(ev[x_key])
  return ev[x_key][ok], ev['eval_accuracy'][ok]


def _eval_curve(run, x_key, window):
  """An eval curve, smoothed."""
  x, y = eval_xy(run, x_key)
  return x, smooth(y, window)


def wallclock_at(run, samples):
  """Training seconds (cumulative step_time_s) when the run had consumed `samples` responses."""
  train = run['train']
  seconds = np.concatenate([[0.0], np.cumsum(np.nan_to_num(train['step_time_s']))])
  return np.interp(samples, np.concatenate([[0.0], train['samples']]), seconds)


def samples_to_target(run, target, window=1):
  """Cumulative training responses at which the (smoothed) eval curve first reaches target."""
  return first_crossing(*_eval_curve(run, 'samples', window), target)


def steps_to_target(run, target, window=1):
  """Update steps at which the (smoothed) eval curve first reaches target."""
  return first_crossing(*_eval_curve(run, 'step', window), target)


def wallclock_to_target(run, target, window=1):
  """Training seconds at the samples-to-target crossing, interpolated in cumulative step time.

  step_time_s excludes eval and includes the first step's compilation, as the trainer logs it.
  """
  samples = samples_to_target(run, target, window)
  return float(wallclock_at(run, samples)) if np.isfinite(samples) else np.nan


def mean_over_seeds(values):
  """Mean of per-seed values where a seed that never got there (nan) makes the mean inf."""
  values = np.asarray(values, float)
  return float(np.mean(np.where(np.isnan(values), np.inf, values))) if len(values) else np.nan


# ----------------------------------------------------------------------------------------------
# The sample penalty rN and its bootstrap confidence interval.
# ----------------------------------------------------------------------------------------------


def ratio(arm_n, base_n):
  """arm / base: inf when only the arm never gets there, nan when the base never does."""
  arm_n, base_n = np.asarray(arm_n, float), np.asarray(base_n, float)
  with np.errstate(invalid='ignore', divide='ignore'):
    return np.where(np.isinf(base_n) | np.isnan(base_n), np.nan, arm_n / base_n)


def _prompt_weights(runs, n_boot, rng):
  """How often each held-out prompt is drawn in each replicate (n_boot x M), or None.

  Only when every run scored the same M prompts: one draw per replicate is shared by all runs,
  since all runs are graded on the same prompts and their prompt-level errors are paired.
  """
  widths = {None if r['eval_correct'] is None else r['eval_correct']['correct_TxM'].shape[1]
            for r in runs}
  if len(widths) != 1 or None in widths:
    return None
  m = widths.pop()
  return rng.multinomial(m, np.full(m, 1.0 / m), size=n_boot)


def _boot_samples_to_target(run, target, window, weights_NxM, n_boot):
  """Samples-to-target of one run under each replicate's prompt resample (constant without)."""
  if weights_NxM is None:
    return np.full(n_boot, samples_to_target(run, target, window))
  ec = run['eval_correct']
  # Integer matmul: exact counts, and no BLAS threads contending with training on the same host.
  acc_TxN = ec['correct_TxM'].astype(np.int64) @ weights_NxM.T / weights_NxM.shape[1]
  return first_crossing(ec['samples'], smooth(acc_TxN, window), target)


def _seed_resampled_means(n_RxN, rng):
  """Per replicate, the mean over R seeds drawn with replacement from that replicate's column."""
  r, n = n_RxN.shape
  pick_NxR = rng.integers(0, r, size=(n, r))
  values = np.where(np.isnan(n_RxN), np.inf, n_RxN)
  return values[pick_NxR, np.arange(n)[:, None]].mean(axis=1)


def rn_with_ci(base_runs, arm_runs, target, n_boot=1000, rng=None, window=1, level=0.95):
  """rN = mean samples-to-target of the arm's seeds / of the base's seeds, with a bootstrap CI.

  Each replicate resamples seeds (with replacement, separately per side) and, when every run logged
  eval_correct for the same prompts, the held-out prompts too, recomputing every eval curve; so
  the CI covers both seed and eval-set noise. Otherwise only seeds are resampled.
  Returns (rN, lo, hi). rN is inf when an arm seed never reaches the target ("not reached"), nan
  when a base seed never does. Replicates where the base misses are left out of the quantiles.
  With very few seeds (3) a percentile bootstrap is too narrow (it under-covers: about 75-90% for
  a nominal 95% in the tests' synthetic sweeps), so read "beyond noise" from 3 seeds cautiously.
  """
  rng = np.random.default_rng(rng)
  point = ratio(mean_over_seeds([samples_to_target(r, target, window) for r in arm_runs]),
                 mean_over_seeds([samples_to_target(r, target, window) for r in base_runs]))
  runs = list(base_runs) + list(arm_runs)
  weights_NxM = _prompt_weights(runs, n_boot, rng)
  n_RxN = np.stack([_boot_samples_to_target(r, target, window, weights_NxM, n_boot) for r in runs])
  base_N = _seed_resampled_means(n_RxN[:len(base_runs)], rng)
  arm_N = _seed_resampled_means(n_RxN[len(base_runs):], rng)
  ratios = ratio(arm_N, base_N)
  if np.isnan(ratios).all():
    return float(point), np.nan, np.nan
  tail = (1 - level) / 2
  lo, hi = np.nanquantile(ratios, [tail, 1 - tail], method='nearest')
  return float(point), float(lo), float(hi)


def ci_includes(ci, value):
  lo, hi = ci
  return bool(lo <= value <= hi)


def aligned_range(arms_summary, tolerance=0.1):
  """The contiguous batch range around the base where |rN - 1| <= tolerance.

  arms_summary: dicts with 'batch', 'rN', 'rN_ci', and optional 'base' (marks the base arm) and
  'control' (skipped: a fixed-lr control says nothing about where sqrt-scaled curves align).
  Walks outward from the base batch and stops, on each side, at the first batch where some arm is
  outside tolerance. 'within_noise' says whether every arm in the range also has a CI including 1:
  if not, "aligned" rests on the tolerance, not on the noise.
  """
  arms = sorted((a for a in arms_summary if not a.get('control')), key=lambda a: a['batch'])
  base_batch = next(a['batch'] for a in arms if a.get('base'))
  batches = sorted({a['batch'] for a in arms})
  ok = {b: all(abs(a['rN'] - 1) <= tolerance for a in arms if a['batch'] == b) for b in batches}
  ok[base_batch] = True
  lo = hi = batches.index(base_batch)
  while lo > 0 and ok[batches[lo - 1]]:
    lo -= 1
  while hi < len(batches) - 1 and ok[batches[hi + 1]]:
    hi += 1
  inside = batches[lo:hi + 1]
  per_arm = [{
      'name': a.get('name'),
      'base': bool(a.get('base')),
      'batch': a['batch'],
      'rN': a['rN'],
      'rN_ci': list(a['rN_ci']),
      'within_tolerance': bool(abs(a['rN'] - 1) <= tolerance),
      'ci_includes_1': ci_includes(a['rN_ci'], 1.0),
  } for a in arms]
  return {
      'lo': inside[0],
      'hi': inside[-1],
      'batches': inside,
      'tolerance': tolerance,
      'within_noise': all(a['ci_includes_1'] for a in per_arm
                          if a['batch'] in inside and not a['base']),
      'arms': per_arm,
  }


# ----------------------------------------------------------------------------------------------
# Gradient diagnostics: grad norm vs batch, noise scale.
# ----------------------------------------------------------------------------------------------


def loglog_fit(x, y):
  """(slope, intercept, stderr of slope) of log y on log x over the finite positive pairs."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
  lx, ly = np.log(x[ok]), np.log(y[ok])
  if len(lx) < 2 or np.ptp(lx) == 0:
    return np.nan, np.nan, np.nan
  dx = lx - lx.mean()
  slope = dx @ (ly - ly.mean()) / (dx @ dx)
  intercept = ly.mean() - slope * lx.mean()
  resid = ly - intercept - slope * lx
  stderr = np.sqrt(resid @ resid / (len(lx) - 2) / (dx @ dx)) if len(lx) > 2 else np.nan
  return float(slope), float(intercept), float(stderr)


def grad_norm_slope(batches, median_grad_norms):
  """(slope, stderr) of the least-squares line of log grad norm on log batch.

  -1/2 is the noise-dominated regime (the gradient is an average of B noisy per-sample terms);
  a flatter slope means more samples per step no longer buy a less noisy step. stderr is the
  usual OLS one, nan with fewer than 3 points (no residual degrees of freedom).
  """
  slope, _, stderr = loglog_fit(batches, median_grad_norms)
  return slope, stderr


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
  return [{
      'from': b1,
      'to': b2,
      'ratio': g2 / g1,
      'per_doubling': (g2 / g1)**(1 / np.log2(b2 / b1)),
      'theory': NOISE_DOMINATED_DOUBLING,
  } for (b1, g1), (b2, g2) in zip(points, points[1:])]


def matched_sample_window(runs):
  """(0, S]: S = the fewest samples any run logged, so every arm is summarised over the same
  stretch of training measured in samples, where aligned runs are at the same point of learning
  (the grad norm drifts as the policy learns; a per-arm window would mix that drift in)."""
  ends = [r['train']['samples'][-1] for r in runs if len(r['train']['samples'])]
  return (0.0, float(min(ends)) if ends else 0.0)


def _in_window(runs, key, window):
  """Finite values of a training column over the steps whose samples fall in the window."""
  lo, hi = window
  values = [r['train'][key][(r['train']['samples'] > lo) & (r['train']['samples'] <= hi)]
            for r in runs if key in r['train']]
  values = np.concatenate(values) if values else np.zeros(0)
  return values[np.isfinite(values)]


def median_in_window(runs, key, window):
  values = _in_window(runs, key, window)
  return float(np.median(values)) if len(values) else np.nan


def _stacked_in_window(runs, key, window):
  """Like _in_window but keeps nan rows, so the four noise-scale columns stay step-aligned."""
  lo, hi = window
  return np.concatenate([r['train'][key][(r['train']['samples'] > lo) &
                                         (r['train']['samples'] <= hi)] for r in runs])


def runs_noise_scale(runs, window):
  keys = ('grad_sq_small', 'grad_sq_big', 'b_small', 'b_big')
  if not all(k in r['train'] for r in runs for k in keys):
    return np.nan
  return noise_scale(*(_stacked_in_window(runs, k, window) for k in keys))


# ----------------------------------------------------------------------------------------------
# The decision: predicted wall-clock to target per candidate batch.
# ----------------------------------------------------------------------------------------------


def predict_wallclock(base_samples_to_target, rn, throughput):
  """Seconds to target at a batch: the samples it needs (base N x rN) over samples per second."""
  with np.errstate(invalid='ignore', divide='ignore'):
    return np.asarray(base_samples_to_target, float) * np.asarray(rn, float) / np.asarray(
        throughput, float)


def _fill_rn(candidate, measured):
  """rN for a batch without an align measurement, from the nearest measured batch, as a bound.

  Assumes rN does not fall as the batch grows (a larger batch never needs fewer samples): the
  nearest measured batch below gives a LOWER bound; below the smallest measured batch, the
  smallest gives an UPPER bound. Never assumes 1.
  """
  below = [b for b in measured if b < candidate['batch']]
  source = max(below) if below else min(measured)
  bound = 'lower' if below else 'upper'
  return measured[source], bound, source


def decide(candidates, base_samples_to_target, allow_extrapolated=False):
  """Per-candidate predicted wall-clock to target, and the recommended (fastest) batch.

  candidates: dicts with 'batch', 'throughput_samples_per_s' and 'rN' (None where the batch was
  not in the align sweep; optional 'rN_ci'). Unmeasured batches are marked extrapolated, with a
  bounded rN from the nearest measured batch (see _fill_rn). The least predicted wall-clock among
  non-extrapolated candidates is recommended, unless allow_extrapolated.
  Returns new dicts, sorted by batch, with 'rN_used', 'rN_bound' ('measured' | 'lower' |
  'upper'), 'extrapolated', 'predicted_wallclock_s' (+ '_ci_s'), 'note' and 'recommended'.
  """
  measured = {c['batch']: c['rN'] for c in candidates if c.get('rN') is not None}
  decisions = []
  for c in sorted(candidates, key=lambda c: c['batch']):
    d = dict(c, extrapolated=c.get('rN') is None, recommended=False, note='')
    if not d['extrapolated']:
      d.update(rN_used=c['rN'], rN_bound='measured')
    elif measured:
      rn, bound, source = _fill_rn(c, measured)
      d.update(rN_used=rn, rN_bound=bound,
               note=f'not in the align sweep: rN of batch {source} used as a {bound} bound, so '
               f'the prediction is a {bound} bound on wall-clock')
    else:
      d.update(rN_used=np.nan, rN_bound='unknown', note='no measured rN to extrapolate from')
    thr = c['throughput_samples_per_s']
    d['predicted_wallclock_s'] = float(predict_wallclock(base_samples_to_target, d['rN_used'], thr))
    ci = c.get('rN_ci')
    d['predicted_wallclock_ci_s'] = (
        [float(predict_wallclock(base_samples_to_target, r, thr)) for r in ci]
        if ci is not None and not d['extrapolated'] else None)
    decisions.append(d)
  eligible = [d for d in decisions if np.isfinite(d['predicted_wallclock_s']) and
              (allow_extrapolated or not d['extrapolated'])]
  if eligible:
    min(eligible, key=lambda d: d['predicted_wallclock_s'])['recommended'] = True
  return decisions


# ----------------------------------------------------------------------------------------------
# The protocol report.


def steady_state(runs):
  """Throughput from the align runs' own logs, skipping each first step (it compiles)."""
  samples, seconds, parts = 0.0, 0.0, {k: [] for k in ('rollout_time_s', 'update_time_s')}
  for r in runs:
    train = r['train']
    per_step = np.diff(np.concatenate([[0.0], train['samples']]))[1:]
    samples += np.nansum(per_step)
    seconds += np.nansum(train['step_time_s'][1:])
    for k in parts:
      parts[k].extend(train.get(k, np.zeros(0))[1:])
  median = lambda v: float(np.nanmedian(v)) if np.isfinite(v).any() else np.nan
  return {
      'samples_per_s': samples / seconds if seconds > 0 else np.nan,
      'rollout_time_s': median(np.array(parts['rollout_time_s'])),
      'update_time_s': median(np.array(parts['update_time_s'])),
      'source': 'align runs (no throughput/ file)',
  }
