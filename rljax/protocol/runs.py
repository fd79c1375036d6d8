"""An arm of the protocol and its runs: configs/<algo>.py at one batch plus the protocol's
settings (lr by the arm's rule from lr0, one sample grid, the stop target), and each seed an
ordinary training run in its own directory, skipped when done and resumed otherwise."""
import os
import time
from typing import NamedTuple

import ml_collections

from rljax import algos
from rljax import files
from rljax import optim
from rljax.protocol import layout
from rljax.protocol import mlperf
from rljax.protocol import settings
from rljax.train import config_checks
from rljax.train import loop as train
from rljax.train import workdir as workdir_lib


class Arm(NamedTuple):
  name: str          # e.g. P16, P32_fixed_lr, lr5e-05
  value: int         # the batch argument of configs/<algo>.py (GRPO: P prompts, PPO: B)
  batch: int         # responses per update step, the unit of the lr rule (GRPO: P x G)
  control: bool      # fixed lr (the base arm's) instead of the sqrt rule
  config: ml_collections.ConfigDict   # the arm's training config, without a seed
  lr: float          # what its optimizer gives its batch (optim.at_batch): the lr and the clip
  clip: float


# ------------------------------------------------------------------------------------------------
# Arm configs: configs/<algo>.py at one batch, plus the protocol's settings.
# ------------------------------------------------------------------------------------------------


def batch_of(value, arm_config):
  """Responses per update step at batch argument `value` (GRPO: P x G; PPO: B)."""
  return value * arm_config.rollout.G


def value_of(batch, arm_config):
  """The batch argument that gives `batch` responses per step (inverse of batch_of)."""
  return batch // arm_config.rollout.G


def at_base(config):
  """(lr, clip) that config.arm's optimizer gives the base batch; its lr is the centre of the
  calibration sweep (`default_lr0`)."""
  return optim.at_batch(config.arm.optimizer, batch_of(config.protocol.base, config.arm))


def default_lr0(config):
  """The lr that config.arm gives the base batch: the centre of the calibration sweep."""
  return at_base(config)[0]


def arm_config(config, workdir, value, lr0, control=False, target=None):
  """config.arm at batch argument `value`, lr0 at the base batch, plus the protocol's settings;
  `target` is the stop target J (protocol.target when None: 0 until calibration places it).

  Evals every eval_every_samples // batch steps: the same sample grid for every arm (checked in
  `arms` to divide), so smoothing and crossings resolve every curve alike.
  """
  p = config.protocol
  arm = algos.with_batch(config.arm, value)
  batch, base_batch = batch_of(value, arm), batch_of(p.base, config.arm)
  arm.optimizer.update(lr=lr0, base_batch=base_batch, max_grad_norm=at_base(config)[1])
  # B_simple needs >= 2 micro-batches a step (rljax/update.py); quick mode reads the base's.
  arm.train.micro_batch = min(arm.train.micro_batch or batch, batch // p.min_micro_batches)
  if control:   # the paper's failure case: a larger batch at the base arm's lr
    arm.optimizer.lr_rule = 'constant'
  arm.mode = 'train'
  arm.seed = p.seed_offset   # run seed_<k> trains with seed seed_offset + k
  arm.train.eval_every = max(1, p.eval_every_samples // batch)
  arm.train.eval_first_samples = p.eval_first_samples
  arm.train.eval_from_samples = mlperf.validation_start(p, batch)   # 0 without MLPerf's rules
  arm.train.checkpoint_every = arm.train.eval_every * p.checkpoint_every_evals
  arm.train.max_samples, arm.train.max_steps = p.max_samples, 0
  target = p.target if target is None else target
  arm.train.target = min(target + p.stop_margin, 1.0) if p.stop_at_target and target else 0.0
  arm.warmstart.dir = arm.warmstart.dir or os.path.join(os.path.abspath(workdir), 'warmstart')
  arm.warmstart.seed = p.warmstart_seed
  return arm


def arms(config, workdir, lr0=None, target=None):
  """The align arms: the sqrt sweep, then the fixed-lr controls. Validates the protocol first."""
  settings.check(config)
  lr0 = lr0 or config.protocol.lr0 or default_lr0(config)
  result = [make_arm(config, workdir, value, lr0, control, target)
            for value, control in ([(v, False) for v in config.protocol.sweep] +
                                   [(v, True) for v in config.protocol.control])]
  settings.check_arms(config, result)   # one sample grid; MLPerf's closed rules
  return result


def make_arm(config, workdir, value, lr0, control=False, target=None):
  """The arm at batch argument `value` (`arm_config`, checked), named by it: P16, P32_fixed_lr."""
  name = f'{algos.get(config.algo).BATCH_ARG}{value}' + ('_fixed_lr' if control else '')
  return checked_arm(name, value, arm_config(config, workdir, value, lr0, control, target),
                     control)


def checked_arm(name, value, cfg, control=False):
  """The Arm that trains `cfg` at batch argument `value`, once the config check passes it."""
  config_checks.check(cfg)
  batch = batch_of(value, cfg)
  return Arm(name, value, batch, control, cfg, *optim.at_batch(cfg.optimizer, batch))


def arm_spec(arm):
  """arm.json: what the report reads about an arm."""
  groups = arm.config.rollout.G > 1
  return dict(name=arm.name, batch=arm.batch, value=arm.value, P=arm.value if groups else None,
              G=arm.config.rollout.G if groups else None, lr=arm.lr,
              lr_rule=arm.config.optimizer.lr_rule, control=arm.control, clip=arm.clip)


# ------------------------------------------------------------------------------------------------
# Runs: ordinary trainings, skipped when done, resumed otherwise.
# ------------------------------------------------------------------------------------------------


def _has_checkpoint(run_dir):
  ckpt_dir = os.path.join(run_dir, 'checkpoints')
  return os.path.isdir(ckpt_dir) and any(d.isdigit() for d in os.listdir(ckpt_dir))


def finished(cfg, run_dir, label):
  """done.json's content where the run finished (said in one line), else None; `cfg` is recorded
  in run_dir, or checked against the record."""
  workdir_lib.record_or_check(run_dir, cfg)
  done = files.read_json(os.path.join(run_dir, 'done.json'))
  if done is not None:
    print(f'[protocol] {label}: already done, skipped', flush=True)
  return done


def run_once(cfg, run_dir, label, stop=None):
  """Trains `cfg` in run_dir unless done.json says it finished; returns done.json's content."""
  done_path = os.path.join(run_dir, 'done.json')
  done = finished(cfg, run_dir, label)
  if done is not None:
    return done
  if not _has_checkpoint(run_dir):   # killed before its first checkpoint: logs would duplicate
    for name in ('metrics.jsonl', 'eval_correct.jsonl'):
      if os.path.exists(os.path.join(run_dir, name)):
        os.remove(os.path.join(run_dir, name))
  print(f'[protocol] {label}: training in {run_dir}', flush=True)
  start = time.time()
  final_eval = train.train(cfg, run_dir, stop)
  rows = [r for r in files.read_jsonl(os.path.join(run_dir, 'metrics.jsonl'))
          if not r.get('eval')]
  done = dict(eval_accuracy=final_eval, steps=rows[-1]['step'] if rows else 0,
              samples=rows[-1]['samples'] if rows else 0, seconds_this_process=time.time() - start)
  files.write_json_atomic(done_path, done)
  print(f'[protocol] {label}: done, eval {final_eval:.3f} after {done["samples"]} samples',
        flush=True)
  return done


def seed_config(arm, seed):
  cfg = ml_collections.ConfigDict(arm.config.to_dict())
  cfg.seed = arm.config.seed + seed
  return cfg


def run_arm_seeds(workdir, group, arm, seeds, label, runner):
  """The arm's runs at `seeds`, each in D/<group>/<arm>/seed_<k>/ (arm.json written first), given
  to `runner` (rljax.protocol.jobs: trained now, or submitted)."""
  layout.write(workdir, 'arm', arm_spec(arm), group=group, arm=arm.name)
  for seed in seeds:
    runner.run(seed_config(arm, seed), layout.run_dir(workdir, group, arm.name, seed),
               f'{label}: {arm.name} seed {seed}')
