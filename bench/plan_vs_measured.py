"""The plan's bounds for one H200 (`python -m rljax.plan --target=gpu:h200-1 ... --json`) beside
what bench/gpu.sh measured on one, as the Markdown tables of docs/performance.md:

  PYTHONPATH=. python bench/plan_vs_measured.py bench/results/h200 bench/results/plan/gpu1b_h200-1

Per decode step: the measured time and the bench's own roofline (bf16 weights and cache read once,
at the probed bandwidth); the plan's bound (the compiled step's FLOPs and bytes at the datasheet's
peaks); the kernels the compiled step launches (rljax.aot.hlo.loop_kernels) at the time each kernel
of the measured program took (its batch-1 step over the kernels of its own decode loop,
sampler_b1_hlo.txt.gz); and the plan's FLOPs and bytes at the ceilings probed beside each
measurement plus those kernels.
"""
import gzip
import json
import os
import re
import sys

from rljax.aot import hlo
from rljax.aot import targets

H200 = targets.CHIPS['h200']


def launch_seconds(measured_dir, measured_rows):
  """(seconds per kernel, kernels per step) of the measured batch-1 decode step."""
  with gzip.open(os.path.join(measured_dir, 'sampler_b1_hlo.txt.gz'), 'rt') as f:
    kernels = hlo.loop_kernels(f.read())
  step_s = next(r['decode_step_ms'] for r in measured_rows if r['batch'] == 1) / 1e3
  return step_s / kernels, kernels


def decode_table(measured_dir, plan):
  with open(os.path.join(measured_dir, 'sampler.json')) as f:
    rows = [r for r in json.load(f)['rows'] if r['length'] == 64]
  per_kernel_s, measured_kernels = launch_seconds(measured_dir, rows)
  bounds = {b['batch']: b for b in plan['decode_bounds']}
  lines = ['| batch | measured step | its roofline | plan bound | plan kernels | kernels x '
           f'{per_kernel_s * 1e6:.1f} us | plan at probed ceilings + kernels |',
           '|---|---|---|---|---|---|---|']
  for row in rows:
    b = bounds[row['batch']]
    kernels_s = b['kernels'] * per_kernel_s
    probed_s = max(b['memory_s'] * H200.hbm_bandwidth / (row['bandwidth_GBps'] * 1e9),
                   b['compute_s'] * H200.peak_flops / (row['peak_GFLOPs'] * 1e9))
    lines.append(f"| {row['batch']} | {row['decode_step_ms']:.2f} ms | {row['mem_roof_ms']:.2f} ms "
                 f"| {b['bound_s'] * 1e3:.2f} ms | {b['kernels']} | {kernels_s * 1e3:.2f} ms | "
                 f"{(probed_s + kernels_s) * 1e3:.2f} ms |")
  note = (f'Measured program: {measured_kernels} kernels per batch-1 step, '
          f'{per_kernel_s * 1e6:.2f} us each.')
  return '\n'.join(lines) + '\n\n' + note


def train_table(measured_dir, plans):
  """Measured train step (the log's `micro M: T tok/s, MFU x%` lines) beside the plan's bound."""
  with open(os.path.join(measured_dir, 'all.log')) as f:
    measured = {int(m): float(t) for m, t in re.findall(r'^micro (\d+): ([\d.e+]+) tok/s', f.read(),
                                                        re.M)}
  lines = ['| micro-batch | measured tok/s | measured MFU (989 TFLOP/s) | plan bound | plan tok/s '
           '| plan MFU ceiling |', '|---|---|---|---|---|---|']
  for plan in plans:
    roof, tokens = plan['roofline'], plan['batch'] * (plan['prompt_len'] + plan['new_tokens'])
    tok_s = measured[plan['micro_batch']]
    mfu = 6 * plan['active_params'] * tok_s / H200.peak_flops
    lines.append(f"| {plan['micro_batch']} | {tok_s:,.0f} | {100 * mfu:.1f}% | "
                 f"{roof['update']['bound_s']:.3f} s | {tokens / roof['update']['bound_s']:,.0f} | "
                 f"{100 * roof['mfu_ceiling']:.0f}% |")
  return '\n'.join(lines)


def main(measured_dir, plan_prefix):
  with open(plan_prefix + '_decode.json') as f:
    print(decode_table(measured_dir, json.load(f)), end='\n\n')
  plans = []
  for micro in (32, 64):
    path = f'{plan_prefix}_train{micro}.json'
    if os.path.exists(path):
      with open(path) as f:
        plans.append(json.load(f))
  print(train_table(measured_dir, plans))


if __name__ == '__main__':
  main(*sys.argv[1:])
