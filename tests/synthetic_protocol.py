"""Synthetic protocol workdirs whose truth is known, in the format rljax.protocol.driver writes, with a
noise model fitted to the committed CPU runs (docs/guide/protocol/*.tar.xz):

- every run starts at the warm start's 0.319 and follows 0.319 + 0.10 (1 - exp(-s / 2500 r)) in
  samples s, stretched by the arm's true rN times a per-seed factor exp(sd_arm z);
- sd_arm, the arm's own seed spread, is drawn per arm (log-normal around 0.08); with the eval
  noise this gives per-arm log-sds of samples to target of 0.07-0.37 (10th-90th percentile;
  the logs: 0.08-0.42) by first crossing;
- each eval grades 1000 prompts (binomial noise, ~1.5 points), on one sample grid for every arm
  (`eval_every`, raised to the largest batch: the protocol refuses anything else);
- a run stops at its first eval at or above 0.40 (target 0.37 + margin 0.03), so the decision
  target is crossed 1-3 evals in, as in the logs;
- each throughput round is the true samples/s times exp(0.07 z).
"""
import json
import os

import numpy as np

from rljax.protocol import driver as protocol_lib
from rljax.protocol import report as report_lib

START, RISE, SCALE, STOP, MAX_SAMPLES, PROMPTS = 0.319, 0.10, 2500.0, 0.40, 32_768, 1000
BASE_SAMPLES_PER_S, ROUND_SD = 700.0, 0.07
# The paper's truth at batches 128/256/1024/2048: 1024 takes 0.71x the base's time.
PAPER = {128: (1.0, 1.0), 256: (1.25, 1.0), 1024: (1.41, 1.0), 2048: (1.30, 1.6)}  # (gain, rN)
NULL = {128: (1.0, 1.0), 256: (1.0, 1.0), 1024: (1.0, 1.0), 2048: (1.0, 1.0)}


def true_relative_time(truth):
  return {b: rn / gain for b, (gain, rn) in truth.items()}


def write_run(run_dir, batch, stretch, rng, eval_every, prompts=PROMPTS):
  """metrics.jsonl of one run: train rows every step, eval rows every `eval_every` samples."""
  os.makedirs(run_dir)
  rows, samples = [], 0
  while True:
    if samples % eval_every == 0:
      p = START + RISE * (1 - np.exp(-samples / (SCALE * stretch)))
      acc = START if samples == 0 else rng.binomial(prompts, p) / prompts
      rows.append({'step': samples // batch, 'samples': samples, 'eval': True,
                   'eval_accuracy': acc})
      if acc >= STOP or samples >= MAX_SAMPLES:
        break
    samples += batch
    rows.append({'step': samples // batch, 'samples': samples, 'grad_norm': 1.0,
                 'step_time_s': batch / BASE_SAMPLES_PER_S})
  with open(os.path.join(run_dir, 'metrics.jsonl'), 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in rows)


def arm_name(batch):
  return f'P{batch // 8}'


def write_seeds(root, batch, seeds, truth, seed_sd, rng, eval_every, prompts=PROMPTS):
  for seed in seeds:
    stretch = truth[batch][1] * np.exp(seed_sd[batch] * rng.standard_normal())
    write_run(report_lib.run_dir(root, 'arms', arm_name(batch), seed), batch, stretch, rng,
              max(eval_every, max(truth)), prompts)   # one grid for all arms, as required


def write_workdir(root, truth, rng, seeds=3, rounds=3, eval_every=1024, prompts=PROMPTS):
  """Arms x `seeds` seeds, `rounds` throughput rounds, protocol.json (lr0 given, no calibration
  and no confirmation: the decision is what is under test)."""
  seed_sd = {b: 0.08 * np.exp(0.5 * rng.standard_normal()) for b in truth}
  base = min(truth)
  for batch in truth:
    report_lib.write(root, 'arm', dict(name=arm_name(batch), batch=batch, value=batch // 8,
                                       lr=1e-4, lr_rule='sqrt', control=False),
                     group='arms', arm=arm_name(batch))
    write_seeds(root, batch, range(seeds), truth, seed_sd, rng, eval_every, prompts)
  for r in range(rounds):
    for batch, (gain, _) in truth.items():
      value = BASE_SAMPLES_PER_S * gain * np.exp(ROUND_SD * rng.standard_normal())
      report_lib.write(root, 'throughput', dict(
          batch=batch, round=r, samples_per_s=value, step_time_s=batch / value,
          rollout_time_s=0.0, update_time_s=batch / value, steps_measured=4, warmup_steps=2),
                       batch=batch, round=r)
  report_lib.write(root, 'calibration', dict(lr0=1e-4, source='given'))
  report_lib.write(root, 'protocol', dict(
      algo='grpo', target=0.37, targets=[], target_fractions=[0.3, 0.5, 0.7],
      base_arm=arm_name(base), base_batch=base, rn_tolerance=0.2, smooth_window=5, level=0.95,
      n_draws=2000, seed=0, throughput_warmup=2))
  return seed_sd


def run_protocol(root, truth, rng, seeds=3, rounds=3, max_seeds=None, extra_seeds=4,
                 eval_every=1024, prompts=PROMPTS):
  """A synthetic protocol through the real report code, with rljax.protocol.driver's adaptive seeds."""
  max_seeds = seeds + 2 if max_seeds is None else max_seeds
  seed_sd = write_workdir(root, truth, rng, seeds, rounds, eval_every, prompts)
  counts, spent = {arm_name(b): seeds for b in truth}, 0
  report = report_lib.build_report(root)
  while spent < extra_seeds:
    chosen = protocol_lib._straddling(report, counts, max_seeds)[:extra_seeds - spent]  # pylint: disable=protected-access
    if not chosen:
      break
    for name in chosen:
      batch = next(b for b in truth if arm_name(b) == name)
      write_seeds(root, batch, [counts[name]], truth, seed_sd, rng, eval_every, prompts)
      counts[name] += 1
    spent += len(chosen)
    report = report_lib.build_report(root)
  return report


def replicates(tmp_root, truth, n, rng, **kw):
  """Decisions of n independent synthetic protocols: (recommended, verdict, P(fastest) by batch,
  training samples of the sweep's align runs)."""
  results = []
  for i in range(n):
    report = run_protocol(os.path.join(tmp_root, f'rep{i}'), truth, rng, **kw)
    decision = report['decision']
    results.append((report['recommended'], decision['verdict'],
                    {c['batch']: c.get('p_fastest', 0.0) for c in decision['candidates']},
                    report['cost']['arms']))
  return results
