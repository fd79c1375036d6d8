"""Draws runs from their metrics.jsonl: held-out accuracy against samples and against wall-clock,
with a line at the first run's warm start + GAIN points; for PPO runs also the critic's explained
variance and the actor and critic gradient norms.

  python docs/plot_runs.py OUT.png GAIN LABEL=WORKDIR [LABEL=WORKDIR ...]
"""
import sys

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from rljax import metrics


def smooth(y, window=10):
  y = np.asarray(y, float)
  if len(y) < window:
    return y
  return np.convolve(y, np.ones(window) / window, mode='valid')


def main(out, gain, runs):
  logs = {label: metrics.read_jsonl(f'{workdir}/metrics.jsonl') for label, workdir in runs}
  ppo = any('explained_variance' in row for rows in logs.values() for row in rows)
  fig, axes = plt.subplots(1, 4 if ppo else 2, figsize=(20 if ppo else 10, 4.2))
  first_evals = None
  for label, rows in logs.items():
    evals = [r for r in rows if r.get('eval')]
    train = [r for r in rows if not r.get('eval')]
    first_evals = first_evals or evals
    axes[0].plot([r['samples'] for r in evals], [r['eval_accuracy'] for r in evals], 'o-', ms=3,
                 label=label)
    axes[1].plot([r['wallclock_s'] / 60 for r in evals], [r['eval_accuracy'] for r in evals], 'o-',
                 ms=3, label=label)
    if train and 'explained_variance' in train[0]:
      steps = [r['samples'] for r in train]
      axes[2].plot(steps[9:] if len(steps) >= 10 else steps,
                   smooth([r['explained_variance'] for r in train]), label=label)
      for key, style in (('grad_norm', '-'), ('critic_grad_norm', '--')):
        axes[3].plot(steps[9:] if len(steps) >= 10 else steps,
                     smooth([r[key] for r in train]), style,
                     label=f'{label}: {"actor" if key == "grad_norm" else "critic"}')
  if first_evals:
    for ax in axes[:2]:
      ax.axhline(first_evals[0]['eval_accuracy'] + gain / 100, color='gray', ls=':', lw=1,
                 label=f'warm start + {gain:g} points')
  axes[0].set(xlabel='training responses (samples)', ylabel='held-out accuracy (greedy)',
              title='accuracy vs samples')
  axes[1].set(xlabel='wall-clock of the RL loop (min)', ylabel='held-out accuracy',
              title='accuracy vs wall-clock')
  if ppo:
    label_critic_panels(axes)
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out, dpi=110)


def label_critic_panels(axes):
  axes[2].axhline(0.0, color='gray', lw=1)
  axes[2].set(xlabel='samples', ylabel='explained variance (10-step mean)',
              title='critic explained variance')
  axes[3].set(xlabel='samples', ylabel='global grad norm (10-step mean)', yscale='log',
              title='actor vs critic gradient norm')


if __name__ == '__main__':
  main(sys.argv[1], float(sys.argv[2]), [arg.split('=', 1) for arg in sys.argv[3:]])
