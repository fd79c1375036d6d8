"""What `P=auto`'s move check (rljax.auto_batch.check) can resolve on real training curves: it
replays the check on protocol arms that never moved, at pretend moves, where the true progress
ratio is 1, and prints how often the interval covers 1, how wide it is, and how often a move with
a given samples/s gain would have been undone by noise alone.

  PYTHONPATH=. python bench/auto_check_noise.py DIR [DIR ...] --verify_samples=8192

DIR: a protocol workdir (or an unpacked archive of one) whose arms/<arm>/seed_<k>/metrics.jsonl
are read; pretend moves at 1x, 2x and 4x verify_samples into each run.
"""
import argparse
import glob
import os

import numpy as np

from rljax.auto_batch import check as auto_check
from rljax import files


def pretend_checks(path, verify_samples):
  """(rho, lo, hi) of the check at each pretend move of one run's training rows."""
  rows = [r for r in files.read_jsonl(path) if 'reward_mean' in r]
  samples = np.array([r['samples'] for r in rows], float)
  reward = np.array([r['reward_mean'] for r in rows], float)
  weight = np.array([r['retained'] for r in rows], float)
  found = []
  for s0 in (verify_samples, 2 * verify_samples, 4 * verify_samples):
    window = (samples > s0 - 3 * verify_samples) & (samples <= s0 + verify_samples)
    if samples[-1] >= s0 + verify_samples:
      found.append(auto_check.progress_ratio(samples[window], reward[window], weight[window], s0))
  return found


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('dirs', nargs='+')
  parser.add_argument('--verify_samples', type=int, default=8192)
  args = parser.parse_args(argv)
  paths = sorted(p for d in args.dirs for p in glob.glob(
      os.path.join(d, 'arms', '*', 'seed_*', 'metrics.jsonl')))
  checks = np.array([c for p in paths for c in pretend_checks(p, args.verify_samples)])
  rho, lo, hi = checks.T
  print(f'{len(checks)} pretend moves in {len(paths)} runs (true progress ratio 1), '
        f'verify_samples {args.verify_samples}')
  print(f'  interval covers 1: {np.mean((lo <= 1) & (1 <= hi)):.3f}; '
        f'median rho {np.median(rho):.2f}; '
        f'median interval [{np.median(lo):.2f}, {np.median(hi):.2f}]')
  for gain in (1.0, 1.2, 1.5, 2.0):
    print(f'  undone by noise alone at a samples/s gain of {gain}: {np.mean(hi * gain < 1):.3f}')


if __name__ == '__main__':
  main()
