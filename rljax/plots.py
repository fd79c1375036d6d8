"""The protocol report's figures: the only module that imports matplotlib."""
import os

import matplotlib
from matplotlib.figure import Figure
import numpy as np

from rljax import report as report_lib
from rljax import stats


# Plots.
# ----------------------------------------------------------------------------------------------


def _mean_curve(curves):
  """Seed mean on the first seed's x grid, up to where every seed has data."""
  end = min(x[-1] for x, _ in curves)
  grid = curves[0][0][curves[0][0] <= end]
  return grid, np.mean([np.interp(grid, x, y) for x, y in curves], axis=0)


def _plot_xy(run, x_key):
  """An eval curve against samples, steps or training seconds."""
  if x_key == 'wallclock':
    x, y = stats.eval_xy(run, 'samples')
    return stats.wallclock_at(run, x), y
  return stats.eval_xy(run, x_key)


def _colors(batches):
  """One viridis colour per batch, small to large, so the sweep reads as a gradient."""
  batches = sorted(set(batches))
  cmap = matplotlib.colormaps['viridis']
  return {b: cmap(0.9 * i / max(len(batches) - 1, 1)) for i, b in enumerate(batches)}


def _batch_axis(ax, batches):
  """Log-scale batch axis ticked at the batches themselves."""
  ax.set_xscale('log')
  ax.set_xticks(sorted(set(batches)), labels=[str(b) for b in sorted(set(batches))])
  ax.minorticks_off()
  ax.set_xlabel('batch (responses)')


def _plot_curves(path, data, report, x_key, xlabel):
  """Eval accuracy of every arm: seeds faint, seed mean bold, controls dashed, target dotted."""
  colors = _colors(arm['spec']['batch'] for arm in data['arms'])
  fig = Figure(figsize=(7.5, 4.8), layout='constrained')
  ax = fig.subplots()
  for arm in sorted(data['arms'], key=lambda a: (bool(a['spec'].get('control')),
                                                 a['spec']['batch'])):
    spec = arm['spec']
    style = dict(color=colors[spec['batch']], ls='--' if spec.get('control') else '-')
    curves = [c for c in (_plot_xy(run, x_key) for run in arm['runs']) if len(c[0])]
    for x, y in curves:
      ax.plot(x, y, alpha=0.25, lw=0.8, **style)
    if curves:
      ax.plot(*_mean_curve(curves), lw=2, label=f"{spec['name']} (B={spec['batch']})", **style)
  ax.axhline(report['target'], color='k', ls=':', lw=1, label=f"target {report['target']:g}")
  ax.set(xlabel=xlabel, ylabel='eval accuracy')
  ax.legend(fontsize=8)
  fig.savefig(path, dpi=110)


def _plot_grad_norm(path, report):
  """Median grad norm vs batch, log-log, with the aligned-range fit and a -1/2 reference."""
  fig = Figure(figsize=(6.5, 4.8), layout='constrained')
  ax = fig.subplots()
  for key, marker, label in (('grad_norm_median', 'o', 'actor'),
                             ('critic_grad_norm_median', 's', 'critic')):
    for control in (False, True):
      arms = [a for a in report['arms'] if a['control'] == control and np.isfinite(a[key])]
      if arms:
        ax.scatter([a['batch'] for a in arms], [a[key] for a in arms], marker=marker,
                   facecolors='none' if control else None, edgecolors='C0' if control else None,
                   label=f"{label}{' (control)' if control else ''}")
  fit = [a for a in report['arms'] if a['batch'] in report['grad_norm_fit_batches'] and
         not a['control']]
  slope, intercept, _ = stats.loglog_fit([a['batch'] for a in fit], [a['grad_norm_median'] for a in fit])
  base = next(a for a in report['arms'] if a['base'])
  batches = np.array(sorted({a['batch'] for a in report['arms']}), float)
  if np.isfinite(slope):
    ax.plot(batches, np.exp(intercept) * batches**slope, 'C1-',
            label=f'fit over aligned range: slope {slope:.3f}')
  if np.isfinite(base['grad_norm_median']):
    ax.plot(batches, base['grad_norm_median'] * (batches / base['batch'])**stats.NOISE_DOMINATED_SLOPE,
            'k--', lw=1, label='slope -1/2 through base')
  ax.set(yscale='log', ylabel='median grad norm (matched sample window)')
  _batch_axis(ax, batches.astype(int))
  ax.legend(fontsize=8)
  fig.savefig(path, dpi=110)


def _plot_throughput(path, report):
  """Seconds per step split into rollout and update (stacked), and samples per second."""
  rows = report['throughput']
  pos = np.arange(len(rows))
  rollout = np.array([t.get('rollout_time_s', np.nan) for t in rows], float)
  update = np.array([t.get('update_time_s', np.nan) for t in rows], float)
  fig = Figure(figsize=(10, 4.2), layout='constrained')
  left, right = fig.subplots(1, 2)
  left.bar(pos, rollout, label='rollout')
  left.bar(pos, update, bottom=np.nan_to_num(rollout), label='update')
  left.set_xticks(pos, labels=[str(t['batch']) for t in rows])
  left.set(xlabel='batch (responses)', ylabel='seconds per step')
  left.legend(fontsize=8)
  right.plot([t['batch'] for t in rows], [t['samples_per_s'] for t in rows], 'o-')
  right.set(ylabel='samples per second')
  _batch_axis(right, [t['batch'] for t in rows])
  fig.savefig(path, dpi=110)


def _plot_time_to_target(path, report):
  """Predicted seconds to target per batch: measured rN with CI, bounds hollow, choice starred."""
  fig = Figure(figsize=(6.5, 4.8), layout='constrained')
  ax = fig.subplots()
  for d in report['candidates']:
    y = d['predicted_wallclock_s']
    if not np.isfinite(y):
      continue
    if d['extrapolated']:
      ax.scatter([d['batch']], [y], marker='^' if d['rN_bound'] == 'lower' else 'v',
                 facecolors='none', edgecolors='C0')
      continue
    ci = d['predicted_wallclock_ci_s']
    yerr = [[y - ci[0]], [ci[1] - y]] if ci and np.isfinite(ci).all() else None
    ax.errorbar([d['batch']], [y], yerr=yerr, fmt='o', color='C0', capsize=3,
                label='predicted (rN 95% CI)' if d['batch'] == report['base_batch'] else None)
  if report['recommended']:
    ax.scatter([report['recommended']['batch']], [report['recommended']['predicted_wallclock_s']],
               marker='*', s=250, color='C3', zorder=3, label='recommended')
  measured = [a for a in report['arms'] if not a['control'] and
              np.isfinite(a['wallclock_to_target_s'])]
  ax.scatter([a['batch'] for a in measured], [a['wallclock_to_target_s'] for a in measured],
             marker='x', color='gray', label='measured in align runs')
  ax.scatter([], [], marker='^', facecolors='none', edgecolors='C0',
             label='extrapolated (bound)')
  ax.set(ylabel='seconds to target')
  _batch_axis(ax, [d['batch'] for d in report['candidates']])
  ax.legend(fontsize=8)
  fig.savefig(path, dpi=110)


def write_plots(workdir, data, report):
  """The six PNGs of PLOTS, in the workdir."""
  paths = [os.path.join(workdir, p) for p in report_lib.PLOTS]
  _plot_curves(paths[0], data, report, 'samples', 'cumulative training responses (samples)')
  _plot_curves(paths[1], data, report, 'step', 'update steps')
  _plot_curves(paths[2], data, report, 'wallclock', 'training wall-clock (s)')
  _plot_grad_norm(paths[3], report)
  _plot_throughput(paths[4], report)
  _plot_time_to_target(paths[5], report)
