"""Eval curves to samples to target: smoothing, first crossings, the targets on the base arm's
curve, and the whole-curve stretch that maps the base arm's curve onto a run's.

A run, as rljax.protocol.layout.load_run gives it, is {'train': columns, 'eval': columns} of float
arrays. Runs are compared against cumulative retained training responses ("samples"), never steps;
a run that never reaches a target gives nan for it.
"""
import numpy as np


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


def until(run, samples):
  """The run as if it had stopped at `samples`: its train and eval rows up to there."""
  def cut(columns):
    keep = np.asarray(columns['samples'], float) <= samples
    return {key: np.asarray(value)[keep] for key, value in columns.items()}
  return dict(run, train=cut(run['train']), eval=cut(run['eval']))


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
# Samples to target from the whole rising curve: the stretch in samples that maps the base's
# curve onto a run's.
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
