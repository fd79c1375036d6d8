"""lr0 at the base batch from the calibration runs, with no accuracy fixed in advance.

A proxy target is placed on the runs' own curves (docs/guide/protocol.md, "lr0 calibration"): an
absolute accuracy chosen on one CPU is out of reach, or trivially near, on another whose
XLA:CPU rounds differently. The lr with the fewest samples to it is lr0; while that lr sits at an
edge of the lrs tried, the driver runs the next lr beyond it (`next_lr`), so the bracket moves
towards the optimum. When no lr reaches the target on every seed, the lr with the most progress
at the budget is taken, and the choice says so: calibration never ends a protocol.

A task whose curve rises within a small part of the budget gets a smaller budget and a finer eval
grid, by a power of two (`divisor`): the budget still holds `scales` time-scales of the curve,
so a fast task is measured on its rise instead of its plateau, and the preset's budget and
grid hold wherever the rise is slower (docs/guide/protocol.md, "Budget and eval grid").

A run is what rljax.protocol.layout.load_run gives; runs_by_lr maps an lr to its seeds' runs.
"""
import numpy as np

from rljax import stats
from rljax.protocol import curves


def _smoothed(runs, window):
  curves_ = [curves.smooth(curves.eval_xy(r, 'samples')[1], window) for r in runs]
  return [y for y in curves_ if len(y)]


def proxy_target(runs_by_lr, fraction, window):
  """start + fraction x (top - start), or nan when no lr rises above the start.

  start: the mean first smoothed eval over every run (all start from one warm start); top: over
  lrs, the highest of the lowest smoothed top among that lr's seeds, so with fraction < 1 every
  seed of the lr that rose most reaches the target.
  """
  smoothed = {lr: _smoothed(runs, window) for lr, runs in runs_by_lr.items()}
  firsts = [y[0] for ys in smoothed.values() for y in ys]
  if not firsts:
    return np.nan
  start = float(np.mean(firsts))
  top = max(min(float(np.max(y)) for y in ys) for ys in smoothed.values() if ys)
  return start + fraction * (top - start) if top > start else np.nan


def choose_lr(lrs, samples_per_lr, level=0.95):
  """The lr with the fewest samples to target (geometric mean over seeds), each with its t-interval.

  An lr with a seed that never reached the target is not chosen. 'at_edge' says the best lr is
  the smallest or largest tried: the optimum may lie beyond them.
  """
  rows = []
  for lr, n in sorted(zip(lrs, samples_per_lr)):
    n = np.asarray(n, float)
    reached = bool(len(n)) and bool(np.isfinite(n).all())
    geo = stats.log_mean_interval(n, level) if reached else dict(mean=np.inf, lo=np.nan, hi=np.inf)
    rows.append(dict(lr=float(lr), samples_per_seed=n.tolist(), reached=reached,
                     samples_to_target=geo['mean'], ci=[geo['lo'], geo['hi']]))
  reached = [r for r in rows if r['reached']]
  if not reached:
    return dict(lr0=np.nan, at_edge=False, lrs=rows)
  best = min(reached, key=lambda r: r['samples_to_target'])
  return dict(lr0=best['lr'], at_edge=best['lr'] in (rows[0]['lr'], rows[-1]['lr']), lrs=rows)


def _top(run, window):
  """The highest smoothed eval of a run (-inf with none)."""
  return max((float(np.max(y)) for y in _smoothed([run], window)), default=-np.inf)


def most_progress(runs_by_lr, window):
  """The lr whose seeds end highest (mean last smoothed eval): the most progress per sample at
  the budget, when no lr reaches the target on every seed. nan with no evals."""
  final = {lr: np.mean([y[-1] for y in ys]) for lr, runs in runs_by_lr.items()
           if (ys := _smoothed(runs, window))}
  return float(max(final, key=final.get)) if final else np.nan


def choose(runs_by_lr, target, fraction, window, level=0.95, budget=None, ceiling=0.0):
  """lr0 from the calibration runs: the dict of choose_lr plus the target and how it was set
  ('given' when target > 0, else placed by proxy_target) and the method ('fewest samples to
  target', or 'most progress at the budget' when no lr reached it on every seed). `budget`: the
  samples every run is read up to (the first run may have trained longer, see `divisor`).
  `ceiling` > 0: a seed whose curve stays below start + ceiling x (top - start) counts as not
  reaching the target: an lr fast to the target but levelling off below the others is not lr0."""
  if budget:
    runs_by_lr = {lr: [curves.until(r, budget) for r in runs] for lr, runs in runs_by_lr.items()}
  floor = proxy_target(runs_by_lr, ceiling, window) if ceiling else -np.inf
  rule = 'given' if target > 0 else f'start + {fraction:g} x (top - start) of the calibration runs'
  if not target > 0:
    target = proxy_target(runs_by_lr, fraction, window)
  lrs = sorted(runs_by_lr)
  samples = [[curves.to_target(r, target, window) if np.isfinite(target) and
               _top(r, window) >= floor else np.nan for r in runs_by_lr[lr]] for lr in lrs]
  choice = dict(choose_lr(lrs, samples, level), target=float(target), target_rule=rule,
                method='fewest samples to target',
                ceiling=float(floor) if ceiling else None)
  if not np.isfinite(choice['lr0']):
    lr0 = most_progress(runs_by_lr, window)
    choice.update(lr0=lr0, method='most progress at the budget',
                  at_edge=bool(np.isfinite(lr0)) and lr0 in (lrs[0], lrs[-1]))
  return choice


def next_lr(lrs, lr0, max_lrs):
  """The lr one step of the bracket's own spacing beyond lr0 when lr0 is at an edge of the lrs
  tried; None when it is interior, or when max_lrs have been tried (the stated bound)."""
  lrs = sorted(lrs)
  if len(lrs) < 2 or len(lrs) >= max_lrs or lr0 not in (lrs[0], lrs[-1]):
    return None
  step = lrs[0] / lrs[1] if lr0 == lrs[0] else lrs[-1] / lrs[-2]
  return float(f'{lr0 * step:.3g}')


def divisor(runs, budget, scales):
  """The largest power of two d with budget / d still holding `scales` time-scales of the runs'
  curve (the `saturating` fit of rljax.protocol.curves), and that time-scale; (1, nan) when
  scales is 0 or the runs do not rise. The fit's scales start at 1% of the runs' last samples:
  a faster rise reads as that slow, and divides the budget less, never more."""
  shape = curves.fit_curve_shape(runs) if scales else None
  if shape is None:
    return 1, np.nan
  ratio = budget / (scales * shape['scale'])
  return 2 ** max(int(np.floor(np.log2(ratio))), 0), shape['scale']


def divided(budget, every, d, batch):
  """(budget, every) / d', d' the largest power of two <= d keeping `every` a multiple of batch."""
  while d > 1 and (every % d or (every // d) % batch):
    d //= 2
  return budget // d, every // d
