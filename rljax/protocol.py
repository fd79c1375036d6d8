"""Align, then accelerate (PAPER.md) as one resumable job run by the same main as training:

  python -m rljax.main --config=configs/protocol.py:runlocal --workdir=D

1. Align: every arm (a batch with the sqrt lr rule, or a fixed-lr control) and seed is an ordinary
   training run in D/arms/<arm>/seed_<k>/, all starting from ONE cached warm start, each until
   target + stop_margin or its sample budget. Evals are spaced in samples, not steps, so every arm
   resolves its curve equally finely in the unit it is compared in.
2. Accelerate: a few steps at each candidate batch, beyond the sweep too, in D/throughput/<batch>/,
   summarised with the compile steps left out into D/throughput/<batch>.json.
3. Decide: rljax.analysis writes D/report.{json,md} and the plots.
4. Confirm: a run to target at the recommended batch in D/confirm/, then the report again, with
   predicted vs measured.

A run writes done.json when it returns; a re-run skips the runs that have one and resumes the
others from their checkpoints, so an interrupted protocol continues where it stopped. Every run
directory keeps the config it was started with (run_config.json): a re-run with a different config
for that run is an error, never a silent mix of two experiments in one report.
"""
import json
import os
import shutil
import time
from typing import NamedTuple

import jax
import ml_collections
import numpy as np

from rljax import algos
from rljax import report as report_lib
from rljax import config_checks
from rljax import metrics as metrics_lib
from rljax import optim
from rljax import train
from rljax import workdir as workdir_lib

class Arm(NamedTuple):
  name: str          # e.g. P16, P32_fixed_lr
  value: int         # the batch argument of configs/<algo>.py (GRPO: P prompts, PPO: B)
  batch: int         # responses per update step, the unit of the lr rule (GRPO: P x G)
  control: bool      # fixed lr (the base arm's) instead of the sqrt rule
  config: ml_collections.ConfigDict   # the arm's training config, without a seed


# ------------------------------------------------------------------------------------------------
# Arm configs: configs/<algo>.py at one batch, plus the protocol's settings.
# ------------------------------------------------------------------------------------------------


def batch_of(algo, value, arm_config):
  """Responses per update step at batch argument `value` (GRPO: P x G; PPO: B)."""
  return algos.get(algo).batch_size(algos.get(algo).with_batch(arm_config, value))


def value_of(algo, batch, arm_config):
  """The batch argument that gives `batch` responses per step (inverse of batch_of)."""
  return batch // batch_of(algo, 1, arm_config)


def arm_config(config, workdir, value, control=False):
  """config.arm at batch argument `value` (the algo's with_batch), plus the protocol's settings."""
  p = config.protocol
  arm = algos.get(config.algo).with_batch(config.arm, value)
  batch = batch_of(config.algo, value, arm)
  if control:   # the paper's failure case: a larger batch at the base arm's lr
    base = arm_config(config, workdir, p.base)
    arm.optimizer.lr = optim.scaled_lr(base.optimizer.lr, batch_of(config.algo, p.base, base),
                                       base.optimizer.base_batch, base.optimizer.lr_rule)
    arm.optimizer.lr_rule = 'constant'
  arm.mode = 'train'
  arm.train.eval_every = max(1, round(p.eval_every_samples / batch))
  arm.train.checkpoint_every = arm.train.eval_every * p.checkpoint_every_evals
  arm.train.max_samples, arm.train.max_steps = p.max_samples, 0
  arm.train.target = min(p.target + p.stop_margin, 1.0) if p.stop_at_target else 0.0
  arm.warmstart.dir = arm.warmstart.dir or os.path.join(os.path.abspath(workdir), 'warmstart')
  arm.warmstart.seed = p.warmstart_seed
  return arm


def arms(config, workdir):
  """The align arms: the sqrt sweep, then the fixed-lr controls. Validates the protocol first."""
  p = config.protocol
  key = algos.get(config.algo).BATCH_ARG
  if config.arm.rollout.P:
    raise ValueError(f'arm.rollout.P ({config.arm.rollout.P}) is set per arm by the protocol: sweep the '
                     f'batch with protocol.sweep and protocol.base, not --config.arm.rollout.P')
  values = list(p.sweep) + list(p.control) + list(p.throughput)
  if any(not isinstance(v, int) or v < 1 for v in values):
    raise ValueError(f'protocol.sweep, .control and .throughput must be positive integers, got '
                     f'{values}')
  if len(set(p.sweep)) != len(p.sweep) or len(set(p.control)) != len(p.control):
    raise ValueError(f'protocol.sweep {tuple(p.sweep)} / control {tuple(p.control)} repeat a batch')
  if p.base not in p.sweep:
    raise ValueError(f'protocol.base ({p.base}) must be one of protocol.sweep {tuple(p.sweep)}')
  if p.num_seeds < 1:
    raise ValueError(f'protocol.num_seeds must be >= 1, got {p.num_seeds}')
  if not 0 < p.target <= 1:
    raise ValueError(f'protocol.target must be an accuracy in (0, 1], got {p.target}')
  if p.max_samples < 1 or p.eval_every_samples < 1:
    raise ValueError('protocol.max_samples and protocol.eval_every_samples must be positive')
  if p.throughput_steps < 1 or p.throughput_warmup < 1:
    raise ValueError('protocol.throughput_steps and .throughput_warmup must be >= 1 (the first '
                     'step compiles and must not count)')
  result = []
  for value, control in [(v, False) for v in p.sweep] + [(v, True) for v in p.control]:
    cfg = arm_config(config, workdir, value, control)
    config_checks.check(cfg)
    name = f'{key}{value}' + ('_fixed_lr' if control else '')
    result.append(Arm(name, value, batch_of(config.algo, value, cfg), control, cfg))
  return result


def _arm_spec(arm):
  """What rljax.analysis reads from arm.json."""
  opt, groups = arm.config.optimizer, arm.config.rollout.G > 1
  return dict(name=arm.name, batch=arm.batch, P=arm.value if groups else None,
              G=arm.config.rollout.G if groups else None, lr=optim.scaled_lr(
                  opt.lr, arm.batch, opt.base_batch, opt.lr_rule), lr_rule=opt.lr_rule,
              control=arm.control)


# ------------------------------------------------------------------------------------------------
# Runs: ordinary trainings, skipped when done, resumed otherwise.
# ------------------------------------------------------------------------------------------------


def _same_config(cfg, run_dir):
  """Records the run's config, or checks it equals the one the directory was started with."""
  path = os.path.join(run_dir, 'run_config.json')
  now = json.loads(json.dumps(cfg.to_dict()))   # tuples -> lists, as it reads back
  if os.path.exists(path):
    old, new = workdir_lib.flat(workdir_lib.read_json(path)), workdir_lib.flat(now)
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if changed:
      k = changed[0]
      raise ValueError(f'{run_dir} was started with {k}={old.get(k)!r}, the config now says '
                       f'{new.get(k)!r} ({len(changed)} field(s) differ): use a new --workdir '
                       'or the original config')
  else:
    os.makedirs(run_dir, exist_ok=True)
    workdir_lib.write_json_atomic(path, now)


def _has_checkpoint(run_dir):
  ckpt_dir = os.path.join(run_dir, 'checkpoints')
  return os.path.isdir(ckpt_dir) and any(d.isdigit() for d in os.listdir(ckpt_dir))


def run_once(cfg, run_dir, label):
  """Trains `cfg` in run_dir unless done.json says it finished; returns done.json's content."""
  done_path = os.path.join(run_dir, 'done.json')
  _same_config(cfg, run_dir)
  if os.path.exists(done_path):
    print(f'[protocol] {label}: already done, skipped', flush=True)
    return workdir_lib.read_json(done_path)
  if not _has_checkpoint(run_dir):   # killed before its first checkpoint: logs would duplicate
    for name in ('metrics.jsonl', 'eval_correct.jsonl'):
      if os.path.exists(os.path.join(run_dir, name)):
        os.remove(os.path.join(run_dir, name))
  print(f'[protocol] {label}: training in {run_dir}', flush=True)
  start = time.time()
  final_eval = train.train(cfg, run_dir)
  rows = [r for r in metrics_lib.read_jsonl(os.path.join(run_dir, 'metrics.jsonl'))
          if not r.get('eval')]
  done = dict(eval_accuracy=final_eval, steps=rows[-1]['step'] if rows else 0,
              samples=rows[-1]['samples'] if rows else 0, seconds_this_process=time.time() - start)
  workdir_lib.write_json_atomic(done_path, done)
  print(f'[protocol] {label}: done, eval {final_eval:.3f} after {done["samples"]} samples',
        flush=True)
  return done


def summarise_throughput(run_dir, warmup):
  """Steady-state throughput of a short run: steps after the first `warmup` (they compile)."""
  train_rows = report_lib.load_run(run_dir)['train']
  keep = train_rows['step'] > warmup
  if not keep.any():
    raise ValueError(f'{run_dir}: no steps after the {warmup} warm-up steps')
  samples = np.diff(np.concatenate([[0.0], train_rows['samples']]))[keep]
  tokens = np.diff(np.concatenate([[0.0], train_rows['tokens']]))[keep]
  seconds = train_rows['step_time_s'][keep]
  median = lambda key: float(np.median(train_rows[key][keep]))
  return dict(samples_per_s=float(samples.sum() / seconds.sum()),
              tokens_per_s=float(tokens.sum() / seconds.sum()),
              step_time_s=median('step_time_s'), rollout_time_s=median('rollout_time_s'),
              reward_time_s=median('reward_time_s'), update_time_s=median('update_time_s'),
              response_len_mean=median('response_len_mean'), steps_measured=int(keep.sum()),
              warmup_steps=int(warmup))


def measure_throughput(config, workdir, value):
  """A few training steps at one batch, no target: D/throughput/<batch>.json (skipped if there)."""
  p = config.protocol
  cfg = arm_config(config, workdir, value)
  batch = batch_of(config.algo, value, cfg)
  path = os.path.join(workdir, 'throughput', f'{batch}.json')
  if os.path.exists(path):
    print(f'[protocol] throughput at batch {batch}: already measured, skipped', flush=True)
    return workdir_lib.read_json(path)
  cfg.train.max_samples, cfg.train.max_steps = 0, p.throughput_warmup + p.throughput_steps
  cfg.train.target, cfg.train.checkpoint_every = 0.0, 0
  cfg.train.eval_every = cfg.train.max_steps + 1   # evals are not part of the steady state
  config_checks.check(cfg)
  run_dir = os.path.join(workdir, 'throughput', str(batch))
  shutil.rmtree(run_dir, ignore_errors=True)   # a fresh measurement, never a resumed one
  print(f'[protocol] throughput at batch {batch}: {cfg.train.max_steps} steps', flush=True)
  train.train(cfg, run_dir)
  result = dict(batch=batch, value=value, **summarise_throughput(run_dir, p.throughput_warmup))
  workdir_lib.write_json_atomic(path, result)
  print(f"[protocol] throughput at batch {batch}: {result['samples_per_s']:.0f} samples/s "
        f"(rollout {result['rollout_time_s']:.3f} s, update {result['update_time_s']:.3f} s "
        'per step)', flush=True)
  return result


# ------------------------------------------------------------------------------------------------
# The protocol.
# ------------------------------------------------------------------------------------------------


def write_protocol_json(config, workdir, arm_list):
  p = config.protocol
  base = next(a for a in arm_list if a.value == p.base and not a.control)
  workdir_lib.write_json_atomic(os.path.join(workdir, 'protocol.json'), dict(
      algo=config.algo, target=p.target, base_arm=base.name, rn_tolerance=p.rn_tolerance,
      smooth_window=p.smooth_window, n_boot=p.n_boot, seed=p.analysis_seed,
      allow_extrapolated=False, sweep_key=algos.get(config.algo).BATCH_ARG, num_seeds=p.num_seeds,
      arms=[_arm_spec(a) for a in arm_list], protocol=p.to_dict()))


def confirm(config, workdir, report):
  """A run to target at the recommended batch, with a seed the align runs did not use."""
  rec = report['recommended']
  if rec is None:
    print('[protocol] no batch recommended (see report.md): nothing to confirm', flush=True)
    return None
  base = arm_config(config, workdir, config.protocol.base)
  value = value_of(config.algo, rec['batch'], base)
  cfg = arm_config(config, workdir, value)
  cfg.seed = config.protocol.num_seeds
  cfg.train.target = min(config.protocol.target + config.protocol.stop_margin, 1.0)
  arm = Arm(f'{algos.get(config.algo).BATCH_ARG}{value}', value, rec['batch'], False, cfg)
  run_dir = os.path.join(workdir, 'confirm')
  os.makedirs(run_dir, exist_ok=True)
  workdir_lib.write_json_atomic(os.path.join(run_dir, 'arm.json'), _arm_spec(arm))
  return run_once(cfg, run_dir, f'confirm at batch {rec["batch"]} (seed {cfg.seed})')


def run(config, workdir):
  """The whole protocol in `workdir`; returns the final report (also written there)."""
  if not workdir:
    raise ValueError('the protocol needs a --workdir')
  p = config.protocol
  start = time.time()
  arm_list = arms(config, workdir)   # validates everything before anything trains
  os.makedirs(workdir, exist_ok=True)
  if p.compilation_cache and not jax.config.jax_compilation_cache_dir:
    # Seeds of one arm compile the same programs: compile once, load them from disk after.
    jax.config.update('jax_compilation_cache_dir', os.path.join(os.path.abspath(workdir),
                                                                'jax_cache'))
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)
  write_protocol_json(config, workdir, arm_list)
  for arm in arm_list:
    arm_dir = os.path.join(workdir, 'arms', arm.name)
    os.makedirs(arm_dir, exist_ok=True)
    workdir_lib.write_json_atomic(os.path.join(arm_dir, 'arm.json'), _arm_spec(arm))

  runs = [(seed, arm) for seed in range(p.num_seeds) for arm in arm_list]   # seed-major: a
  for i, (seed, arm) in enumerate(runs):                                    # partial sweep is
    cfg = ml_collections.ConfigDict(arm.config.to_dict())                   # already a report
    cfg.seed = seed
    run_once(cfg, os.path.join(workdir, 'arms', arm.name, f'seed_{seed}'),
             f'align {i + 1}/{len(runs)}: {arm.name} seed {seed}')

  sweep = sorted({a.value for a in arm_list if not a.control} | set(p.throughput))
  for value in sweep:
    measure_throughput(config, workdir, value)

  report = report_lib.write_report(workdir)
  if p.confirm and confirm(config, workdir, report) is not None:
    report = report_lib.write_report(workdir)
  rec = report['recommended']
  print(f"[protocol] wrote {os.path.join(workdir, 'report.md')} in {time.time() - start:.0f} s "
        f"(this invocation); recommended batch: {rec['batch'] if rec else 'none'}", flush=True)
  print(report['summary'], flush=True)
  return report
