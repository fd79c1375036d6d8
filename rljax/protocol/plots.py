"""The protocol report's figures: the only module that imports matplotlib."""
import os

import matplotlib
from matplotlib.figure import Figure
import numpy as np

from rljax.protocol import curves
from rljax.protocol import gradients


def _mean_curve(seeds):
  """Seed mean on the first seed's x grid, up to where every seed has data."""
  end = min(x[-1] for x, _ in seeds)
  grid = seeds[0][0][seeds[0][0] <= end]
  return grid, np.mean([np.interp(grid, x, y) for x, y in seeds], axis=0)


def _plot_xy(run, x_key):
  """An eval curve against samples, steps or training seconds."""
  if x_key == 'wallclock':
    x, y = curves.eval_xy(run, 'samples')
    return curves.wallclock_at(run, x), y
  return curves.eval_xy(run, x_key)


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
  """Eval accuracy of every arm: seeds faint, seed mean bold, controls dashed, targets dotted."""
  colors = _colors(arm['spec']['batch'] for arm in data['arms'])
  fig = Figure(figsize=(7.5, 4.8), layout='constrained')
  ax = fig.subplots()
  for arm in sorted(data['arms'], key=lambda a: (bool(a['spec']['control']), a['spec']['batch'])):
    spec = arm['spec']
    style = dict(color=colors[spec['batch']], ls='--' if spec['control'] else '-')
    seeds = [c for c in (_plot_xy(run, x_key) for run in arm['runs']) if len(c[0])]
    for x, y in seeds:
      ax.plot(x, y, alpha=0.25, lw=0.8, **style)
    if seeds:
      ax.plot(*_mean_curve(seeds), lw=2, label=f"{spec['name']} (B={spec['batch']})", **style)
  for target in report['targets']:
    primary = target == report['primary']
    ax.axhline(target, color='k', ls=':', lw=1.5 if primary else 0.7,
               label=f'decision target {target:.3g}' if primary else None)
  ax.set(xlabel=xlabel, ylabel='eval accuracy')
  ax.legend(fontsize=8)
  fig.savefig(path, dpi=110)


def _plot_calibration(path, report):
  """Samples to the stop target per lr at the base batch, seeds and geometric mean with its CI."""
  fig = Figure(figsize=(6.5, 4.5), layout='constrained')
  ax = fig.subplots()
  rows = report['calibration']['lrs']
  for r in rows:
    seeds = np.asarray(r['samples_per_seed'], float)
    ax.scatter(np.full(len(seeds), r['lr']), seeds, color='gray', s=12)
    if r['reached']:
      y, (lo, hi) = r['samples_to_target'], r['ci']
      yerr = [[y - lo], [hi - y]] if np.isfinite([lo, hi]).all() else None
      ax.errorbar([r['lr']], [y], yerr=yerr, fmt='o', color='C0', capsize=3)
  if np.isfinite(report['calibration'].get('lr0') or np.nan):
    ax.axvline(report['calibration']['lr0'], color='C3', ls='--', label='chosen lr0')
    ax.legend(fontsize=8)
  ax.set(xscale='log', yscale='log', xlabel='lr at the base batch',
         ylabel='samples to target (seeds; geometric mean, t CI)',
         title='lr0 calibration' if rows else 'no lr0 calibration (lr0 given)')
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
  slope, intercept, _, _ = gradients.loglog_fit([a['batch'] for a in fit],
                                            [a['grad_norm_median'] for a in fit])
  base = next(a for a in report['arms'] if a['base'])
  batches = np.array(sorted({a['batch'] for a in report['arms']}), float)
  if np.isfinite(slope):
    ax.plot(batches, np.exp(intercept) * batches**slope, 'C1-',
            label=f'fit over aligned range: slope {slope:.3f}')
  if np.isfinite(base['grad_norm_median']):
    reference = (batches / base['batch'])**gradients.NOISE_DOMINATED_SLOPE
    ax.plot(batches, base['grad_norm_median'] * reference, 'k--', lw=1,
            label='slope -1/2 through base')
  ax.set(yscale='log', ylabel='median grad norm (matched sample window)')
  _batch_axis(ax, batches.astype(int))
  ax.legend(fontsize=8)
  fig.savefig(path, dpi=110)


def _plot_throughput(path, report):
  """Seconds per step split into rollout and update (stacked), and samples/s with its CI."""
  rows = report['throughput']
  pos = np.arange(len(rows))
  rollout = np.array([t['rollout_time_s'] for t in rows], float)
  update = np.array([t['update_time_s'] for t in rows], float)
  fig = Figure(figsize=(10, 4.2), layout='constrained')
  left, right = fig.subplots(1, 2)
  left.bar(pos, rollout, label='rollout')
  left.bar(pos, update, bottom=np.nan_to_num(rollout), label='update')
  left.set_xticks(pos, labels=[str(t['batch']) for t in rows])
  left.set(xlabel='batch (responses)', ylabel='seconds per step (median over rounds)')
  left.legend(fontsize=8)
  for t in rows:
    for value in t['per_round']:
      right.scatter([t['batch']], [value], color='gray', s=10)
    if np.isfinite([t['lo'], t['hi']]).all():
      right.errorbar([t['batch']], [t['mean']], yerr=[[t['mean'] - t['lo']], [t['hi'] - t['mean']]],
                     fmt='o', color='C0', capsize=3)
  right.set(ylabel='samples per second (rounds; geometric mean, t CI)')
  _batch_axis(right, [t['batch'] for t in rows])
  fig.savefig(path, dpi=110)


def _plot_time_to_target(path, report):
  """Predicted seconds to target relative to the base, with the bootstrap CI; choice starred."""
  fig = Figure(figsize=(6.5, 4.8), layout='constrained')
  ax = fig.subplots()
  rows = [c for c in report['decision']['candidates'] if 'relative_wallclock' in c]
  for c in rows:
    y, (lo, hi) = c['relative_wallclock'], c['relative_wallclock_ci']
    ax.errorbar([c['batch']], [y], yerr=[[y - lo], [hi - y]], fmt='o', color='C0', capsize=3)
    ax.annotate(f"P={c['p_fastest']:.2f}", (c['batch'], y), fontsize=7, xytext=(4, 4),
                textcoords='offset points')
  if report['recommended'] is not None and rows:
    rec = next(c for c in rows if c['batch'] == report['recommended'])
    ax.scatter([rec['batch']], [rec['relative_wallclock']], marker='*', s=250, color='C3',
               zorder=3, label='recommended')
    ax.legend(fontsize=8)
  ax.axhline(1.0, color='k', ls=':', lw=1)
  ax.set(ylabel='predicted wall-clock to J / the base (95% CI)')
  _batch_axis(ax, [c['batch'] for c in rows] or [report['base_batch']])
  fig.savefig(path, dpi=110)


def write_plots(workdir, data, report):
  """The PNGs of rljax.protocol.layout.PLOTS, in the workdir."""
  paths = {name: os.path.join(workdir, name) for name in report['plots']}
  _plot_curves(paths['eval_vs_samples.png'], data, report, 'samples',
               'cumulative training responses (samples)')
  _plot_curves(paths['eval_vs_steps.png'], data, report, 'step', 'update steps')
  _plot_curves(paths['eval_vs_wallclock.png'], data, report, 'wallclock',
               'training wall-clock (s)')
  _plot_calibration(paths['lr0_calibration.png'], report)
  _plot_grad_norm(paths['grad_norm_vs_batch.png'], report)
  _plot_throughput(paths['throughput_vs_batch.png'], report)
  _plot_time_to_target(paths['time_to_target_vs_batch.png'], report)
