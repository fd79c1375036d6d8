"""Synthetic protocol workdirs whose truth is known, in the format rljax.protocol.driver writes,
with noise models fitted to the committed CPU runs (docs/guide/protocol/*.tar.xz).

A run follows start + rise (1 - exp(-s / scale r)) in samples s, stretched by the arm's true rN
times a per-seed factor exp(sd_arm z); sd_arm, the arm's own seed spread, is drawn per arm
(log-normal around `seed_sd`). Each eval grades `prompts` prompts: Binomial noise around the curve
plus a persistent per-run offset (sd `prompt_sd`: the seed x prompt part, which a larger eval set
shrinks and more evals do not), on one sample grid for every arm (raised to the largest batch, as
the protocol requires). Each throughput round is the true samples/s times exp(round_sd z).

SHALLOW: the earlier runlocal preset (base 128): runs stop at their first eval at or above 0.40
(target 0.37 + margin 0.03), so the decision target is crossed 1-3 evals in.
DEEP: the runlocal preset (base 16): every run runs its whole budget; the targets sit at 50/70/90%
of the way from the warm start to the base arm's top.
"""
import json
import os
from typing import NamedTuple

import numpy as np

from configs import protocol as protocol_config
from rljax.protocol import driver as protocol_lib
from rljax.protocol import layout
from rljax.protocol import report as report_lib


class Model(NamedTuple):
  start: float          # the warm start's accuracy
  rise: float
  scale: float          # samples
  stop: float           # a run stops at its first eval at or above this (1.0: runs its budget)
  max_samples: int
  eval_every: int
  prompts: int
  seed_sd: float        # centre of the per-arm log-sd of the seeds' stretch
  prompt_sd: float      # persistent per-run offset of the eval accuracy
  fractions: tuple      # the report's target rule (the middle one decides)
  samples_per_s: float  # the base's


SHALLOW = Model(start=0.319, rise=0.10, scale=2500.0, stop=0.40, max_samples=32_768,
                eval_every=1024, prompts=1000, seed_sd=0.08, prompt_sd=0.0,
                fractions=(0.3, 0.5, 0.7), samples_per_s=700.0)
# Fitted to docs/guide/protocol/grpo-deep-seed-offset-0.tar.xz (8 seeds per arm, 4000 prompts per
# eval): the base's curve; a per-arm seed spread whose samples to J have the log-sds measured there
# (0.10-0.13; the model's median 0.13); 807 samples/s at the base; throughput rounds' log-sd
# 0.06-0.16.
DEEP = Model(start=0.356, rise=0.217, scale=13_300.0, stop=1.0, max_samples=65_536,
             eval_every=8192, prompts=4000, seed_sd=0.12, prompt_sd=0.0,
             fractions=(0.5, 0.7, 0.9), samples_per_s=807.0)
ROUND_SD = 0.11
# The paper's truth at batches 128/256/1024/2048: 1024 takes 0.71x the base's time.
PAPER = {128: (1.0, 1.0), 256: (1.25, 1.0), 1024: (1.41, 1.0), 2048: (1.30, 1.6)}  # (gain, rN)
NULL = {128: (1.0, 1.0), 256: (1.0, 1.0), 1024: (1.0, 1.0), 2048: (1.0, 1.0)}


def true_relative_time(truth):
  return {b: rn / gain for b, (gain, rn) in truth.items()}


def write_run(run_dir, batch, stretch, rng, eval_every, model, prompts, eval_from=0):
  """metrics.jsonl of one run: train rows every step, eval rows every `eval_every` samples and
  after every step from `eval_from` samples on (> 0: MLPerf's validations)."""
  os.makedirs(run_dir)
  rows, samples, offset = [], 0, model.prompt_sd * rng.standard_normal()
  while True:
    if samples % eval_every == 0 or 0 < eval_from <= samples:
      p = model.start + model.rise * (1 - np.exp(-samples / (model.scale * stretch)))
      acc = (model.start if samples == 0 else
             rng.binomial(prompts, np.clip(p + offset, 0, 1)) / prompts)
      rows.append({'step': samples // batch, 'samples': samples, 'eval': True,
                   'eval_accuracy': acc})
      if (acc >= model.stop and samples >= eval_from) or samples >= model.max_samples:
        break
    samples += batch
    rows.append({'step': samples // batch, 'samples': samples, 'grad_norm': 1.0,
                 'step_time_s': batch / model.samples_per_s})
  with open(os.path.join(run_dir, 'metrics.jsonl'), 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in rows)


def arm_name(batch):
  return f'P{batch // 8}'


def write_seeds(root, batch, seeds, truth, seed_sd, rng, model, prompts):
  for seed in seeds:
    stretch = truth[batch][1] * np.exp(seed_sd[batch] * rng.standard_normal())
    write_run(layout.run_dir(root, 'arms', arm_name(batch), seed), batch, stretch, rng,
              max(model.eval_every, max(truth)), model, prompts)   # one grid for all arms


def write_workdir(root, truth, rng, model, seeds, rounds, prompts, level):
  """Arms x `seeds` seeds, `rounds` throughput rounds, protocol.json (lr0 given, no calibration
  and no confirmation: the decision is what is under test)."""
  seed_sd = {b: model.seed_sd * np.exp(0.5 * rng.standard_normal()) for b in truth}
  base = min(truth)
  for batch in truth:
    layout.write(root, 'arm', dict(name=arm_name(batch), batch=batch, value=batch // 8,
                                       lr=1e-4, lr_rule='sqrt', control=False),
                     group='arms', arm=arm_name(batch))
    write_seeds(root, batch, range(seeds), truth, seed_sd, rng, model, prompts)
  for r in range(rounds):
    for batch, (gain, _) in truth.items():
      value = model.samples_per_s * gain * np.exp(ROUND_SD * rng.standard_normal())
      layout.write(root, 'throughput', dict(
          batch=batch, round=r, samples_per_s=value, step_time_s=batch / value,
          rollout_time_s=0.0, update_time_s=batch / value, steps_measured=4, warmup_steps=2),
                       batch=batch, round=r)
  layout.write(root, 'calibration', dict(lr0=1e-4, source='given'))
  layout.write(root, 'protocol', dict(
      algo='grpo', target=min(model.stop, model.start + 0.05), targets=[],
      target_fractions=list(model.fractions), base_arm=arm_name(base), base_batch=base,
      rn_tolerance=0.2, smooth_window=5 if model is SHALLOW else 3, level=level, n_draws=2000,
      seed=0, throughput_warmup=2))
  return seed_sd


PRESET = protocol_config.get_config('runlocal').protocol   # the deep preset's design


def run_protocol(root, truth, rng, model=DEEP, seeds=PRESET.num_seeds,
                 rounds=PRESET.throughput_rounds, max_seeds=PRESET.max_seeds,
                 extra_seeds=PRESET.extra_seeds, prompts=None, level=PRESET.level):
  """A synthetic protocol through the real report code and the driver's staged seeds, by default
  with the deep preset's seeds, staging, throughput rounds and level."""
  prompts = prompts or model.prompts
  seed_sd = write_workdir(root, truth, rng, model, seeds, rounds, prompts, level)
  counts, spent = {arm_name(b): seeds for b in truth}, 0
  report = report_lib.build_report(root)
  while spent < extra_seeds:
    chosen = protocol_lib._staged(  # pylint: disable=protected-access
        report, counts, max_seeds)[:extra_seeds - spent]
    if not chosen:
      break
    for name in chosen:
      batch = next(b for b in truth if arm_name(b) == name)
      write_seeds(root, batch, [counts[name]], truth, seed_sd, rng, model, prompts)
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
