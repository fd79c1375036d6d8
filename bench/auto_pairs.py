"""`P=auto` against fixed batches, paired: per seed one run at each fixed batch and one `P=auto`
run, from one shared warm start and the same seed, in an order that alternates from seed to seed,
so that the machine's drift falls on every arm alike. Reports, per arm, the training seconds
(cumulative step time: compiles included, evaluations excluded) and samples to each target, and
the paired ratio of `P=auto` to each fixed batch (geometric mean of the per-seed ratios with a
t-interval on their logs, and the median with its distribution-free interval).

A host shared with other jobs makes measured seconds noisy, compiles most of all. With
`--throughput_from=D` (a protocol workdir) the same ratios are also given in modelled seconds:
each step's samples at the samples/s of D's interleaved throughput rounds for its batch
(log-log interpolated between measured batches), plus `--compile_s` per batch the run compiled.

  JAX_COMPILATION_CACHE_DIR=/tmp/pairs/jax_cache PYTHONPATH=. python bench/auto_pairs.py \
      --workdir=/tmp/pairs --warmstart=WS --seeds=0-7 --fixed=2,8

The arms are `python -m rljax.main --config=configs/grpo.py:runlocal,P=...` runs with the deep
protocol preset's settings (constant lr at the base batch 16 with the sqrt rule, evaluations of
`--eval_size` held-out prompts, 4000 as the deep preset's, micro-batches of half the batch up to
64) and an evaluation every `--eval_every_samples` samples. A finished run is not run again;
`--analyse` reads the runs only.
"""
import argparse
import itertools
import json
import os
import subprocess
import sys
import time

import numpy as np

from rljax import files
from rljax import stats
from rljax.protocol import curves


def auto_flags(options, args):
  """rljax.main flags of a P=auto arm's suffixes: 'm<P>' (start at P, the lower bound),
  'v<verify_samples>' and 'h<max_samples>' (a longer budget, the rule's horizon, the run stopped
  once an evaluation reaches --stop_at); without 'h' the arms' common --max_samples."""
  flags = {'m': ['--config.auto_batch.min={n}', '--config.rollout.P={n}',
                 '--config.train.micro_batch={half}'],
           'v': ['--config.auto_batch.verify_samples={n}'],
           'h': ['--config.train.max_samples={n}', f'--config.train.target={args.stop_at}']}
  found = {o[:1]: o[1:] for o in options}
  if (set(found) - set(flags) or not all(n.isdigit() and int(n) > 0 for n in found.values())
      or int(found.get('m', 1)) & (int(found.get('m', 1)) - 1)):
    raise ValueError(f"P=auto arm options {options}: expected -m<P> (a power of two), "
                     "-v<samples> or -h<samples>")
  found.setdefault('h', None)
  return ([f'--config.train.max_samples={args.max_samples}'] if found['h'] is None else []) + [
      flag.format(n=n, half=int(n) * 8 // 2) for key, n in found.items() if n is not None
      for flag in flags[key]]


def run_args(arm, seed, args):
  """The rljax.main command line of `arm` at `seed`: a fixed P, or 'auto' with optional suffixes
  (auto_flags), e.g. 'auto-v2048-h65536' or 'auto-m16-h65536'."""
  name, *options = arm.split('-')
  if name == 'auto':
    extra = auto_flags(options, args)
    batch = 8 * next((int(o[1:]) for o in options if o.startswith('m')), 2)
  else:
    batch = int(arm) * 8
    extra = [f'--config.train.max_samples={args.max_samples}',
             f'--config.train.micro_batch={min(64, batch // 2)}']
  return [sys.executable, '-m', 'rljax.main', f'--config=configs/grpo.py:runlocal,P={name}',
          f'--workdir={arm_dir(args.workdir, arm, seed)}', f'--config.seed={seed}',
          f'--config.warmstart.dir={args.warmstart}', '--config.warmstart.seed=0',
          '--config.optimizer.decay=constant', f'--config.optimizer.lr={args.lr}',
          '--config.optimizer.base_batch=16', f'--config.train.eval_size={args.eval_size}',
          f'--config.data.extra_test={max(0, args.eval_size - 1000)}',
          f'--config.train.eval_every={max(1, args.eval_every_samples // batch)}',
          '--config.train.checkpoint_every=100000', '--config.metrics.tensorboard=False',
          f'--config.auto_batch.max={args.auto_max}', *args.extra, *extra]


def arm_dir(workdir, arm, seed):
  return os.path.join(workdir, f'seed_{seed}', f'P{arm}')


def run_all(arms, seeds, args):
  """Runs every (seed, arm) not finished yet; the order of the arms alternates by seed."""
  for k, seed in enumerate(seeds):
    for arm in (arms if k % 2 == 0 else arms[::-1]):
      directory = arm_dir(args.workdir, arm, seed)
      if os.path.exists(os.path.join(directory, 'done.json')):
        continue
      os.makedirs(directory, exist_ok=True)
      start = time.time()
      with open(os.path.join(directory, 'log.txt'), 'w') as log:
        subprocess.run(run_args(arm, seed, args), stdout=log, stderr=subprocess.STDOUT, check=True)
      with open(os.path.join(directory, 'done.json'), 'w') as f:
        json.dump(dict(process_s=time.time() - start), f)
      print(f'seed {seed} P={arm}: {time.time() - start:.0f} s', flush=True)


def crossing(directory, target, window):
  """(samples at the first crossing of `target` by the eval curve smoothed over `window`
  evaluations, nan when it never crosses; the run's training rows)."""
  rows = files.read_jsonl(os.path.join(directory, 'metrics.jsonl'))
  evals = [r for r in rows if r.get('eval')]
  samples = curves.first_crossing([r['samples'] for r in evals],
                                  curves.smooth([r['eval_accuracy'] for r in evals], window),
                                  target)
  return samples, [r for r in rows if not r.get('eval')]


def to_target(directory, target, window):
  """(samples, training seconds) at the first crossing."""
  samples, train = crossing(directory, target, window)
  run = dict(train=dict(step_time_s=[r['step_time_s'] for r in train],
                        samples=[r['samples'] for r in train]))
  return samples, float(curves.wallclock_at(run, samples)) if np.isfinite(samples) else np.nan


def rounds_rate(workdir):
  """samples/s(batch) from a protocol report's throughput rounds, log-log interpolated."""
  with open(os.path.join(workdir, 'report.json')) as f:
    rows = sorted((r['batch'], r['median']) for r in json.load(f)['throughput'])
  log_b, log_r = np.log([b for b, _ in rows]), np.log([r for _, r in rows])
  return lambda batch: float(np.exp(np.interp(np.log(batch), log_b, log_r)))


def modelled_to_target(directory, target, window, rate, compile_s):
  """Modelled seconds to the first crossing: samples at the rounds' rate per batch, plus one
  compile per batch the run trained at."""
  samples, train = crossing(directory, target, window)
  if not np.isfinite(samples):
    return np.nan
  before = [r for r in train if r['samples'] - r['retained'] < samples]
  batch = lambda r: r.get('batch', r['retained'])   # P=auto's rows name their batch
  seconds = sum(min(r['retained'], samples - r['samples'] + r['retained']) / rate(batch(r))
                for r in before)
  return seconds + compile_s * len({batch(r) for r in before})


def paired_ratio(auto_s, fixed_s):
  """Geometric mean of per-seed ratios with a t-interval on their logs; the median ratio with
  its order-statistic interval (None when there are too few pairs for 95%)."""
  logs = np.log(np.asarray(auto_s) / np.asarray(fixed_s))
  logs = logs[np.isfinite(logs)]
  n = len(logs)
  half = stats.t_quantile(0.95, n - 1) * logs.std(ddof=1) / np.sqrt(n) if n > 1 else np.nan
  ordered = np.sort(np.exp(logs))
  k = int(np.floor(n / 2 - 0.98 * np.sqrt(n)))   # binomial order statistics, ~95%
  median_ci = (ordered[k], ordered[n - 1 - k]) if k >= 0 and n >= 6 else None
  return dict(n=n, gmean=float(np.exp(logs.mean())), lo=float(np.exp(logs.mean() - half)),
              hi=float(np.exp(logs.mean() + half)), median=float(np.median(np.exp(logs))),
              median_ci=median_ci)


def moves(directory):
  rows = files.read_jsonl(os.path.join(directory, 'metrics.jsonl'))
  return [(r['samples'], r['auto_from'], r['auto_to']) for r in rows
          if 'auto_from' in r and r['auto_from'] != r['auto_to']]


def analyse(arms, seeds, args):
  fixed = [arm for arm in arms if not arm.startswith('auto')]
  autos = [arm for arm in arms if arm.startswith('auto')]
  table = {}
  for target in args.targets:
    per_arm = {arm: [to_target(arm_dir(args.workdir, arm, s), target, args.window) for s in seeds]
               for arm in arms}
    table[target] = per_arm
    print(f'\ntarget {target}: samples / training seconds per seed')
    for arm in arms:
      cells = ' '.join(f'{n / 1000:.1f}k/{t:.1f}s' for n, t in per_arm[arm])
      print(f'  P={arm}: {cells}')
    for auto, arm in itertools.product(autos, fixed):
      found = paired_ratio([t for _, t in per_arm[auto]], [t for _, t in per_arm[arm]])
      print(f'  {auto} / P={arm}, measured seconds: {found}')
    if args.throughput_from:
      rate = rounds_rate(args.throughput_from)
      modelled = {arm: [modelled_to_target(arm_dir(args.workdir, arm, s), target, args.window, rate,
                                           args.compile_s) for s in seeds] for arm in arms}
      print('  modelled seconds: ' + '; '.join(
          f'P={arm} ' + ' '.join(f'{t:.1f}' for t in modelled[arm]) for arm in arms))
      for auto, arm in itertools.product(autos, fixed):
        print(f'  {auto} / P={arm}, modelled seconds: '
              f'{paired_ratio(modelled[auto], modelled[arm])}')
  for auto, s in itertools.product(autos, seeds):
    print(f'{auto} seed {s} moves (samples, from, to): {moves(arm_dir(args.workdir, auto, s))}')
  return table


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--warmstart', required=True, help='a shared warm-start directory')
  parser.add_argument('--seeds', default='0-7')
  parser.add_argument('--fixed', default='2,8', help='fixed P arms (the first is the base)')
  parser.add_argument('--targets', default='0.4713,0.5119')
  parser.add_argument('--lr', type=float, default=1.77e-5)
  parser.add_argument('--max_samples', type=int, default=20480)
  parser.add_argument('--eval_every_samples', type=int, default=2048)
  parser.add_argument('--eval_size', type=int, default=4000,
                      help='held-out prompts per evaluation (beyond the 1000 of the test split: '
                           'data.extra_test)')
  parser.add_argument('--auto', default='auto',
                      help="P=auto arms: 'auto', suffixed by -v<verify_samples>, -h<max_samples>")
  parser.add_argument('--stop_at', type=float, default=0.55,
                      help='eval accuracy that stops an -h<max_samples> arm')
  parser.add_argument('--auto_max', type=int, default=32)
  parser.add_argument('--window', type=int, default=3)
  parser.add_argument('--analyse', action='store_true', help='read the runs only')
  parser.add_argument('--throughput_from', default='', help='a protocol workdir: modelled seconds')
  parser.add_argument('--compile_s', type=float, default=0.0, help='modelled seconds per compile')
  args, args.extra = parser.parse_known_args(argv)
  first, _, last = args.seeds.partition('-')
  seeds = list(range(int(first), int(last or first) + 1))
  args.targets = [float(t) for t in args.targets.split(',')]
  arms = args.fixed.split(',') + args.auto.split(',')
  try:
    for arm in arms:
      run_args(arm, 0, args)
  except ValueError as error:
    parser.error(str(error))
  if args.eval_size < 1:
    parser.error(f'--eval_size={args.eval_size}: expected a positive number of prompts')
  if not args.analyse:
    run_all(arms, seeds, args)
  analyse(arms, seeds, args)


if __name__ == '__main__':
  main()
