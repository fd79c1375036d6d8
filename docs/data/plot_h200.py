"""Plots docs/data/h200_*.json (rollout vs update time per batch on one H200) as a PNG.

  python docs/data/plot_h200.py   # writes docs/protocol_h200_rollout_vs_update.png
"""
import json
import os

from matplotlib.figure import Figure

HERE = os.path.dirname(os.path.abspath(__file__))
fig = Figure(figsize=(9, 3.6), layout='constrained')
for ax, name, title in zip(fig.subplots(1, 2), ('decode_bound', 'full'),
                           ('106M-param MoE (f32)', '1.29B-param MoE (bf16)')):
  with open(os.path.join(HERE, f'h200_{name}.json')) as f:
    rows = json.load(f)['rows']
  batch = [r[0] for r in rows]
  ax.loglog(batch, [r[1] * 1e3 for r in rows], 'o-', label='rollout (64 new tokens)')
  ax.loglog(batch, [r[2] * 1e3 for r in rows], 's-', label='update (fwd + bwd, 72 tokens)')
  ax.loglog(batch, [rows[0][2] * 1e3 * b / batch[0] for b in batch], 'k:', lw=1, label='linear')
  ax.set(title=f'H200, {title}', xlabel='batch (responses)', ylabel='ms')
  ax.legend(fontsize=7)
fig.savefig(os.path.join(os.path.dirname(HERE), 'protocol_h200_rollout_vs_update.png'), dpi=90)
