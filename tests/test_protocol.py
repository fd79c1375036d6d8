"""Tests for rljax.protocol.driver: arm configs, phases, the whole pipeline on a tiny model,
and resume.

The pipeline runs for real (TFDS data built locally, real training runs, orbax checkpoints, a real
subprocess killed mid-protocol), only with a tiny model and budgets of a few steps.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import rljax_cli

from configs import protocol as protocol_config
from rljax import files
from rljax.protocol import driver as protocol
from rljax.protocol import jobs
from rljax.protocol import layout
from rljax.protocol import report as report_lib
from rljax.protocol import runs
from rljax import stats
from rljax.train import warmstart

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A tiny model, data set and budget: a few steps per run. Dotted config paths -> values.
TINY = {
    **{f'arm.model.{k}': v for k, v in dict(
        d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, num_experts=2,
        experts_per_token=1, expert_hidden=32, dense_hidden=64).items()},
    'arm.data.num_train': 2000, 'arm.data.num_test': 200, 'arm.train.eval_size': 64,
    'arm.rollout.G': 4, 'arm.train.micro_batch': 4,
    'arm.warmstart.min_steps': 2, 'arm.warmstart.max_steps': 2,
    'arm.warmstart.eval_every': 2, 'arm.warmstart.batch': 32,
    'protocol.sweep': (2, 4), 'protocol.base': 2, 'protocol.control': (4,),
    'protocol.throughput': (8,), 'protocol.max_samples': 48,
    'protocol.eval_every_samples': 16, 'protocol.throughput_warmup': 2,
    'protocol.throughput_steps': 2, 'protocol.throughput_rounds': 2, 'protocol.n_draws': 200,
    'protocol.max_seeds': 2, 'protocol.extra_seeds': 1, 'protocol.confirm_seeds': 1,
    'protocol.target': 0.01,
    'protocol.lr0': 1e-5,   # given: a tiny model never reaches a target, so nothing to calibrate
}


def _flag(path, value):
  text = f"({','.join(map(str, value))})" if isinstance(value, tuple) else str(value)
  return f'--config.{path}={text}'


def tiny_config(data_dir):
  """configs/protocol.py:runlocal,shallow,seeds=1 with TINY applied, as the command line
  applies it."""
  config = protocol_config.get_config('runlocal,shallow,seeds=1')
  for path, value in dict(TINY, **{'arm.data.dir': data_dir}).items():
    *parents, leaf = path.split('.')
    node = config
    for name in parents:
      node = node[name]
    node[leaf] = value
  return config


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('tfds'))


# ------------------------------------------------------------------------------------------------
# Arm configs.
# ------------------------------------------------------------------------------------------------


def test_runlocal_arms_follow_the_sqrt_rule_on_one_sample_grid():
  config = protocol_config.get_config('runlocal,shallow')
  arms = {a.name: a for a in protocol.arms(config, '/tmp/D')}
  assert sorted(arms) == ['P128', 'P16', 'P32', 'P32_fixed_lr', 'P64']
  base_lr = runs.arm_spec(arms['P16'])['lr']
  assert base_lr == protocol.default_lr0(config) == 5e-5
  for name, arm in arms.items():
    spec = runs.arm_spec(arm)
    assert arm.config.rollout.P == arm.value and spec['batch'] == arm.value * 8
    ratio = 1.0 if arm.control else (arm.batch / 128)**0.5
    assert spec['lr'] == pytest.approx(base_lr * ratio)
    assert arm.config.train.eval_every * arm.batch == 1024   # one sample grid for every arm
    assert arm.config.warmstart.dir == '/tmp/D/warmstart' and arm.config.warmstart.seed == 0
    assert arm.config.seed == 0
  assert arms['P32_fixed_lr'].config.optimizer.lr_rule == 'constant'
  config.protocol.seed_offset = 100   # a replicate protocol: other seeds, the same warm start
  assert {a.config.seed for a in protocol.arms(config, '/tmp/D')} == {100}
  given = {a.name: runs.arm_spec(a)['lr'] for a in protocol.arms(config, 'D', lr0=2e-5)}
  assert given['P16'] == 2e-5 and given['P64'] == pytest.approx(4e-5)
  assert given['P32_fixed_lr'] == 2e-5


def test_an_arm_off_the_sample_grid_is_refused():
  """Batch 2048 cannot be evaluated every 1024 samples: refused, not evaluated half as densely."""
  config = protocol_config.get_config('runlocal,shallow')
  config.protocol.sweep = (16, 32, 256)
  with pytest.raises(ValueError, match=r'multiple of every arm.s batch.*\[2048\]'):
    protocol.arms(config, 'D')
  config.protocol.eval_every_samples = 2048
  assert [a.config.train.eval_every for a in protocol.arms(config, 'D')] == [16, 8, 1, 8]


@pytest.mark.parametrize('arg', ['runlocal,shallow', 'algo=ppo,runlocal,shallow'])
def test_runlocal_builds_valid_arms_and_a_calibration_sweep(arg):
  config = protocol_config.get_config(arg)
  arms = protocol.arms(config, 'D')   # every arm passes the trainer's own config checks
  assert {a.batch for a in arms} == {128, 256, 512, 1024}
  sweep = [protocol.calibration_arm(config, 'D', lr) for lr in protocol.calibration_lrs(config)]
  lrs = [runs.arm_spec(a)['lr'] for a in sweep]
  assert len(lrs) == 5 and {a.batch for a in sweep} == {128}
  assert max(lrs) / min(lrs) == pytest.approx(4.0, rel=0.01)
  assert lrs[2] == pytest.approx(protocol.default_lr0(config), rel=0.01)


def test_the_deep_preset_runs_every_arm_on_and_calibrates_on_a_placed_proxy_target():
  """runlocal (GRPO): arms run the whole budget (targets come from the base arm's curve), the
  calibration runs its whole budget on its own finer grid (its proxy J is placed on its curves),
  within a quarter of the sweep's training samples at its widest bracket; evals on 4000 prompts
  (the test split's 1000 and 3000 drawn after the training split)."""
  config = protocol_config.get_config('runlocal')
  arms = protocol.arms(config, 'D')
  assert [(a.batch, a.config.train.target, a.config.train.max_samples) for a in arms] == [
      (16, 0.0, 65_536), (64, 0.0, 65_536), (256, 0.0, 65_536)]
  assert [a.config.train.eval_every * a.batch for a in arms] == [8192] * 3
  assert {(a.config.data.num_test, a.config.data.extra_test, a.config.train.eval_size)
          for a in arms} == {(1000, 3000, 4000)}
  sweep = [protocol.calibration_arm(config, 'D', lr) for lr in protocol.calibration_lrs(config)]
  assert [(a.batch, a.config.train.target, a.config.train.eval_every,
           a.config.train.max_samples) for a in sweep] == [(16, 0.0, 128, 32_768)] * 3
  lrs = [runs.arm_spec(a)['lr'] for a in sweep]
  assert lrs == pytest.approx([1e-4 * (16 / 128)**0.5 * f for f in (0.5, 1.0, 2.0)], rel=0.01)
  p = config.protocol
  assert (p.target, p.calibration_fraction) == (0.0, 0.7)
  widest = p.calibration_max_lrs * p.calibration_seeds * p.calibration_max_samples
  assert widest <= 0.25 * len(arms) * p.num_seeds * p.max_samples
  with pytest.raises(ValueError, match='two presets'):
    protocol_config.get_config('runlocal,small,shallow')
  with pytest.raises(ValueError, match='GRPO runlocal preset'):
    protocol_config.get_config('algo=ppo,runlocal,small')
  with pytest.raises(ValueError, match='a runlocal preset'):
    protocol_config.get_config('shallow')


@pytest.mark.parametrize('arg, lr, held_out', [
    ('algo=ppo,runlocal', 2e-4 * (16 / 256)**0.5, dict(num_test=1000, extra_test=3000)),
    ('runlocal,task=sums', 2e-4 * (16 / 128)**0.5, dict(num_test=4000, extra_test=0)),
    ('runlocal,task=tools', 1e-4 * (16 / 128)**0.5, dict(num_test=4000, extra_test=0))])
def test_the_deep_preset_takes_another_algo_or_task_with_its_own_lr_and_warm_start(
    arg, lr, held_out):
  """Only the algo/task argument changes: the arms are 16/64/256 responses at the arm config's own
  runlocal lr held constant, its own warm start, evaluated on 4000 held-out prompts."""
  config = protocol_config.get_config(arg)
  arms = protocol.arms(config, 'D')
  assert [a.batch for a in arms] == [16, 64, 256]
  assert runs.arm_spec(arms[0])['lr'] == pytest.approx(lr, rel=1e-6)
  own = protocol_config.arm_config(config.algo, config.protocol.arm_arg)
  for a in arms:
    assert a.config.optimizer.decay == 'constant' and a.config.train.eval_size == 4000
    assert a.config.warmstart.eval_every == own.warmstart.eval_every
    assert {k: a.config.data[k] for k in held_out} == held_out
  with pytest.raises(ValueError, match='deep runlocal preset'):
    protocol_config.get_config('runlocal,shallow,task=sums')


def test_micro_batches_must_hold_whole_groups():
  config = protocol_config.get_config('runlocal,shallow')
  config.arm.rollout.G, config.arm.train.micro_batch = 6, 16   # divides the batches, splits groups
  with pytest.raises(ValueError, match='whole groups'):
    protocol.arms(config, 'D')


def test_a_given_lr0_skips_the_calibration(tmp_path):
  config = protocol_config.get_config('runlocal,shallow')
  config.protocol.lr0 = 3e-5
  assert protocol.calibrate(config, str(tmp_path), jobs.InProcess()) == (3e-5, 0.0)
  assert layout.read(str(tmp_path), 'calibration') == {'lr0': 3e-5, 'source': 'given',
                                                           'target': 0.0}
  assert not (tmp_path / 'calibration').exists()


def _finished_run(run_dir, accuracies, batch=128):
  """A run that runs.run_once will skip: metrics.jsonl with evals every 1024 samples, done.json."""
  os.makedirs(run_dir)
  rows = [dict(step=8 * i, samples=1024 * i, eval=True, eval_accuracy=a)
          for i, a in enumerate(accuracies)]
  rows += [dict(step=s, samples=batch * s, step_time_s=0.1, grad_norm=1.0)
           for s in range(1, 8 * len(accuracies) - 7)]
  (Path(run_dir) / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  (Path(run_dir) / 'done.json').write_text('{}')


def _calibration_runs(config, workdir, accuracies_by_lr):
  """Finished calibration runs (run_once skips them), one per seed, at each lr given."""
  for lr, per_seed in accuracies_by_lr.items():
    name = protocol.calibration_arm(config, workdir, lr).name
    for seed, accuracies in enumerate(per_seed):
      _finished_run(layout.run_dir(workdir, 'calibration', name, seed), accuracies)


def test_calibration_chooses_the_lr_with_the_fewest_samples_to_a_given_target(tmp_path):
  """The calibration phase over finished runs (skipped, not retrained): 5 lrs x 2 seeds."""
  config = protocol_config.get_config('runlocal,shallow')
  config.protocol.target, config.protocol.smooth_window = 0.37, 1
  lrs = protocol.calibration_lrs(config)
  crossings = {0: [6, 7], 1: [4, 5], 2: [2, 3], 3: [3, 3], 4: [None, 5]}   # evals to 0.37
  _calibration_runs(config, str(tmp_path), {
      lr: [[0.3] * (k or 8) + [0.4] * (2 if k else 0) for k in crossings[i]]
      for i, lr in enumerate(lrs)})
  lr0, target = protocol.calibrate(config, str(tmp_path), jobs.InProcess())
  assert (lr0, target) == (lrs[2], 0.37) and lr0 == 5e-5   # 2.x and 3.x evals: the fewest
  assert layout.read(str(tmp_path), 'calibration') == {
      'lr0': 5e-5, 'source': 'calibrated', 'at_edge': False, 'target': 0.37,
      'method': 'fewest samples to target'}
  arms = protocol.arms(config, str(tmp_path), lr0, target)
  assert runs.arm_spec(arms[0])['lr'] == 5e-5
  assert arms[0].config.train.target == pytest.approx(0.37 + config.protocol.stop_margin)


def _rising(evals_to_top, top=0.45, n=9):
  """0.30 rising linearly to `top` over `evals_to_top` evals, then flat."""
  return list(np.minimum(0.30 + (top - 0.30) * np.arange(n) / evals_to_top, top))


def test_an_lr_at_the_edge_extends_the_bracket_until_the_best_is_interior(tmp_path, capsys):
  """The lowest lr is fastest to the placed proxy: the lr one bracket step below it runs next
  (finished here, so not retrained), is slower, and the best is then interior."""
  config = protocol_config.get_config('runlocal,shallow')
  config.protocol.smooth_window = 1
  lrs = protocol.calibration_lrs(config)   # 2.5e-5 ... 1e-4
  below = float(f'{lrs[0] * lrs[0] / lrs[1]:.3g}')
  speed = {below: 5, lrs[0]: 3, lrs[1]: 4, lrs[2]: 5, lrs[3]: 6, lrs[4]: 7}   # evals to the top
  _calibration_runs(config, str(tmp_path), {lr: [_rising(k)] * 2 for lr, k in speed.items()})
  lr0, target = protocol.calibrate(config, str(tmp_path), jobs.InProcess())
  assert lr0 == lrs[0] and target == pytest.approx(0.30 + 0.45 * 0.15)
  assert layout.read(str(tmp_path), 'calibration')['at_edge'] is False
  assert f'extending to {below:g}' in capsys.readouterr().out
  assert len(os.listdir(tmp_path / 'calibration')) == 6

  config.protocol.calibration_max_lrs = 5   # the bound: no extension, a warning, and it goes on
  other = tmp_path / 'bounded'
  _calibration_runs(config, str(other), {lr: [_rising(speed[lr])] * 2 for lr in lrs})
  assert protocol.calibrate(config, str(other), jobs.InProcess())[0] == lrs[0]
  assert 'rljax: warning: lr0 = 2.5e-05 is still at the edge' in capsys.readouterr().out
  assert layout.read(str(other), 'calibration')['at_edge'] is True


def _saturating_run(run_dir, scale, budget, every, first=256, batch=16):
  """A finished run rising as 0.3 + 0.6 (1 - exp(-samples / scale)), evaluated at `first` x 2^k
  below `every`, then every `every` samples up to `budget`."""
  lead = [first * 2**k for k in range(8) if first * 2**k < every]
  x = [0] + lead + list(range(every, budget + 1, every))
  rows = [dict(step=n // batch, samples=n, eval=True,
               eval_accuracy=0.3 + 0.6 * (1 - np.exp(-n / scale)))
          for n in x]
  rows += [dict(step=s, samples=batch * s, step_time_s=0.1, grad_norm=1.0)
           for s in range(1, budget // batch + 1)]
  os.makedirs(run_dir)
  (Path(run_dir) / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  (Path(run_dir) / 'done.json').write_text('{}')


@pytest.mark.parametrize('stretch, calibration_budget, arms_budget, arms_every', [
    (1.0, 8192, 8192, 1024),      # lr0's scale 400: 65536 / (16 x 400) = 10 -> 8
    (6.5, None, 65536, 8192)])    # scales of 2600-4550, as on the arithmetic task: as given
def test_a_fast_rise_divides_the_later_calibration_runs_and_the_arms_budgets(
    tmp_path, stretch, calibration_budget, arms_budget, arms_every):
  """The deep preset (budget_scales 16): the first calibration run's time-scale (500) divides the
  others' budget and grid by 4; lr0's (400) the arms' by 8. A slow rise leaves both as given."""
  config, workdir = protocol_config.get_config('runlocal'), str(tmp_path)
  lrs = protocol.calibration_lrs(config)
  scales = {lrs[0]: 500 * stretch, lrs[1]: 400 * stretch, lrs[2]: 700 * stretch}
  later, later_every = calibration_budget or 32768, 512 if calibration_budget else 2048
  for lr, scale in scales.items():
    name = protocol.calibration_arm(config, workdir, lr).name
    for seed in range(2):
      budget, every = (32768, 2048) if (lr, seed) == (lrs[0], 0) else (later, later_every)
      _saturating_run(layout.run_dir(workdir, 'calibration', name, seed), scale, budget, every)
  lr0, target = protocol.calibrate(config, workdir, jobs.InProcess())
  calibration = layout.read(workdir, 'calibration')
  assert lr0 == lrs[1] and not calibration['at_edge']
  assert calibration['calibration_budget'] == calibration_budget
  assert calibration['time_scale'] == pytest.approx(400 * stretch, rel=0.02)
  recorded = lambda lr, seed: files.read_json(os.path.join(layout.run_dir(
      workdir, 'calibration', protocol.calibration_name(lr), seed), 'config.json'))['train']
  assert recorded(lrs[0], 0)['max_samples'] == 32768
  assert recorded(lrs[1], 1)['max_samples'] == later
  assert recorded(lrs[1], 1)['eval_every'] * 16 == later_every
  for arm in protocol.arms(protocol.with_budget(config, workdir), workdir, lr0, target):
    assert arm.config.train.max_samples == arms_budget
    assert arm.config.train.eval_every * arm.batch == arms_every
    assert arm.config.train.eval_first_samples == 256


def test_calibration_with_no_lr_at_a_given_target_goes_on_with_the_most_progress(tmp_path,
                                                                                  capsys):
  config = protocol_config.get_config('runlocal,shallow')
  config.protocol.target = 0.9
  lrs = protocol.calibration_lrs(config)
  finals = [0.32, 0.35, 0.40, 0.36, 0.31]
  _calibration_runs(config, str(tmp_path), {lr: [[0.3, 0.31, f, f]] * 2
                                            for lr, f in zip(lrs, finals)})
  lr0, target = protocol.calibrate(config, str(tmp_path), jobs.InProcess())
  assert (lr0, target) == (lrs[2], 0.9)
  assert layout.read(str(tmp_path), 'calibration')['method'] == 'most progress at the budget'
  assert 'rljax: warning: no calibration lr reached J = 0.900' in capsys.readouterr().out


def test_add_seeds_stages_its_budget_to_the_base_and_the_point_fastest_arm(tmp_path, monkeypatch):
  """The staged-seed phase over finished runs: P32 has the shortest predicted time besides the
  base, and its interval holds 1, so P32 and the base P16 get seed 3 each (extra_seeds=2); P64
  and P128 are slower beyond noise. A new seed's training is stood in for by revealing a finished
  run (the e2e test below trains for real)."""
  config, workdir = protocol_config.get_config('runlocal,shallow'), str(tmp_path)
  config.protocol.update(lr0=5e-5, smooth_window=1, extra_seeds=2, max_seeds=5)
  arm_list = protocol.arms(config, workdir)
  protocol.write_protocol_json(config, workdir, arm_list[0], 0.37)
  crossings = dict(P16=[4, 5, 6, 5], P32=[5, 8, 10, 6], P64=[12, 14, 16], P128=[20, 24, 28],
                   P32_fixed_lr=[4, 5, 6])   # evals to the target, per seed
  for arm in arm_list:
    layout.write(workdir, 'arm', runs.arm_spec(arm), group='arms', arm=arm.name)
    for seed, k in enumerate(crossings[arm.name]):
      _finished_run(layout.run_dir(workdir, 'arms', arm.name, seed), [0.3] * k + [0.4] * 2,
                    arm.batch)
  for batch, thr in {128: 1000.0, 256: 1500.0, 512: 2000.0, 1024: 3000.0}.items():
    for r in range(3):
      layout.write(workdir, 'throughput', dict(
          batch=batch, round=r, samples_per_s=thr * (1 + 0.01 * r), step_time_s=0.1,
          rollout_time_s=0.02, update_time_s=0.08, steps_measured=4, warmup_steps=2),
                       batch=batch, round=r)
  for name in ('P16', 'P32'):   # what the new seeds "train": done already, so run_once skips them
    run_dir = layout.run_dir(workdir, 'arms', name, 3)
    os.remove(os.path.join(run_dir, 'done.json'))
    os.rename(run_dir, run_dir + '_later')
  original_run_once = runs.run_once

  def run_once(cfg, run_dir, label, stop=None):
    if os.path.exists(run_dir + '_later'):
      os.rename(run_dir + '_later', run_dir)
      (Path(run_dir) / 'done.json').write_text('{}')
    return original_run_once(cfg, run_dir, label, stop)
  monkeypatch.setattr(runs, 'run_once', run_once)
  protocol.add_seeds(config, workdir, arm_list, jobs.InProcess())
  seeds = {a.name: protocol._seeds_of(workdir, a) for a in arm_list}
  assert seeds == dict(P16=[0, 1, 2, 3], P32=[0, 1, 2, 3], P64=[0, 1, 2], P128=[0, 1, 2],
                       P32_fixed_lr=[0, 1, 2])


def test_confirmation_alternates_the_base_and_the_pick_seed_by_seed(tmp_path, capsys):
  """Seed-major, as align is: a machine slowing over the phase slows both batches alike. Over
  finished runs (skipped, not retrained), the order they are visited in."""
  config, workdir = protocol_config.get_config('runlocal,shallow'), str(tmp_path)
  p = config.protocol
  seeds = range(p.max_seeds, p.max_seeds + p.confirm_seeds)
  for name, batch in (('P16', 128), ('P32', 256)):
    for seed in seeds:
      _finished_run(layout.run_dir(workdir, 'confirm', name, seed), [0.3, 0.4], batch)
  decision = {'fastest': 256, 'verdict': 'faster', 'recommended': 256}
  protocol.confirm(config, workdir, {'base_batch': 128, 'decision': decision, 'primary': 0.37},
                   5e-5)
  visited = [line.split(': ')[1] for line in capsys.readouterr().out.splitlines()]
  assert visited == [f'{name} seed {seed}' for seed in seeds for name in ('P16', 'P32')]
  protocol.confirm(config, workdir, {'base_batch': 128, 'decision': decision, 'primary': 0.37,
                                     'confirm_plan': {'seeds': 1}}, 5e-5)
  visited = [line.split(': ')[1] for line in capsys.readouterr().out.splitlines()]
  assert visited == [f'{name} seed {p.max_seeds}' for name in ('P16', 'P32')]   # sized for power


def _decided(verdict, rows):
  return {'base_batch': 128, 'decision': {'verdict': verdict, 'candidates': [
      dict(batch=b, relative_wallclock=r, relative_wallclock_ci=ci) for b, r, ci in rows]},
          'arms': [dict(name=f'P{b // 8}', batch=b, control=False) for b in (128, 256, 512)] + [
              dict(name='P32_fixed_lr', batch=256, control=True)]}


def test_extra_seeds_go_to_the_base_and_the_point_fastest_batch_while_it_straddles_1():
  counts = dict(P16=3, P32=3, P64=3, P32_fixed_lr=3)
  straddles = _decided('within noise', [(128, 1.0, [1, 1]), (256, 0.8, [0.5, 1.3]),
                                        (512, 0.9, [0.7, 1.2])])
  assert protocol._staged(straddles, counts, max_seeds=5) == ['P16', 'P32']
  assert protocol._staged(straddles, dict(counts, P16=5), max_seeds=5) == ['P32']
  slower = _decided('base fastest', [(128, 1.0, [1, 1]), (256, 1.3, [1.1, 1.6])])
  assert protocol._staged(slower, counts, max_seeds=5) == []   # above 1 beyond noise: settled
  faster = _decided('faster', [(128, 1.0, [1, 1]), (256, 0.6, [0.5, 0.8])])
  assert protocol._staged(faster, counts, max_seeds=5) == []


def test_arm_overrides_apply_to_every_arm_but_not_to_the_batch():
  config = protocol_config.get_config('runlocal,shallow')
  config.arm.grpo.clip_high = 0.28
  assert all(a.config.grpo.clip_high == 0.28 for a in protocol.arms(config, 'D'))
  config.arm.rollout.P = 32
  with pytest.raises(ValueError, match='sweep the batch with protocol.sweep'):
    protocol.arms(config, 'D')


@pytest.mark.parametrize('field, value, message', [
    ('base', 12, 'protocol.base'),
    ('sweep', (8, 8, 16), 'repeat a batch'),
    ('target', 1.5, 'protocol.target'),
    ('target', -0.1, 'protocol.target'),
    ('calibration_fraction', 1.0, 'calibration_fraction'),
    ('calibration_fraction', 0.0, 'calibration_fraction'),
    ('calibration_max_lrs', 4, 'calibration_max_lrs'),
    ('calibration_ceiling', 1.0, r'calibration_ceiling \(1.0\) must be in \[0, 1\)'),
    ('confirm_power', 1.0, r'confirm_power \(1.0\) must be in \[0, 1\)'),
    ('eval_first_samples', -256, r'eval_first_samples \(-256\) and .budget_scales'),
    ('budget_scales', -1, r'\.budget_scales \(-1\) must be >= 0'),
    ('eval_first_samples', 100, r'protocol.eval_first_samples \(100\) must be a multiple'),
    ('num_seeds', 0, 'num_seeds'),
    ('throughput_warmup', 0, 'compiles'),
    ('throughput_rounds', 0, 'compiles'),
    ('throughput', (0, 8), 'positive integers'),
    ('max_seeds', 2, 'max_seeds'),
    ('lr0', -1.0, 'protocol.lr0'),
    ('seed_offset', -1, 'seed_offset'),
    ('calibration_factors', (1.0,), 'calibration_factors'),
    ('targets', (0.3, 1.2), 'targets'),
    ('level', 1.0, r'protocol.level \(1.0\) must be in \(0, 1\)'),
    ('level', float('nan'), r'protocol.level \(nan\) must be in \(0, 1\)'),
    ('n_draws', 0, r'and n_draws \(0\) >= 1'),
    ('target_fractions', (0.5, 1.0), r'protocol.target_fractions \(0.5, 1.0\) must be in \(0, 1\)'),
    ('stop_margin', float('nan'), r'protocol.rn_tolerance \(0.2\) and stop_margin \(nan\)'),
    ('smooth_window', 0, r'protocol.smooth_window must be >= 1, got 0'),
    ('checkpoint_every_evals', 0, r'protocol.checkpoint_every_evals must be >= 1'),
    ('confirm_seeds', 0, r'protocol.confirm_seeds must be >= 1'),
    ('analysis_seed', -1, r'protocol.analysis_seed must be >= 0'),
    ('warmstart_seed', -1, r'protocol.warmstart_seed must be >= 0'),
])
def test_bad_protocol_settings_fail_clearly(field, value, message):
  config = protocol_config.get_config('runlocal,shallow')
  config.protocol[field] = value
  with pytest.raises(ValueError, match=message):
    protocol.arms(config, 'D')


def test_unknown_algo_fails_clearly():
  with pytest.raises(ValueError, match="algo='sac'"):
    protocol_config.get_config('algo=sac')


def test_pinned_warm_start_is_shared_by_all_seeds():
  config = protocol_config.get_config('runlocal,shallow')
  fingerprints = set()
  for seed in range(3):
    arm = protocol.arms(config, 'D')[0].config
    arm.seed = seed
    fingerprints.add(warmstart.fingerprint(arm))
    arm.warmstart.seed = -1   # unpinned: the run's own seed
    assert warmstart.seed(arm) == seed
  assert len(fingerprints) == 1
  unpinned = protocol_config.get_config('runlocal,shallow').arm
  assert warmstart.seed(unpinned) == unpinned.seed == 0


def test_summarise_throughput_leaves_out_the_compile_steps(tmp_path):
  rows = [dict(step=s, samples=64 * s, tokens=300 * s, step_time_s=t, rollout_time_s=t / 4,
               reward_time_s=0.0, update_time_s=3 * t / 4, response_len_mean=4.7, grad_norm=1.0)
          for s, t in [(1, 9.0), (2, 5.0), (3, 0.2), (4, 0.3), (5, 0.1)]]
  (tmp_path / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  result = protocol.summarise_throughput(str(tmp_path), warmup=2)
  assert result['samples_per_s'] == pytest.approx(3 * 64 / 0.6)
  assert result['samples_per_s'] == stats.steady_throughput([64] * 5, [r['step_time_s'] for r in
                                                                      rows], 2)   # one rule
  assert result['rollout_time_s'] == pytest.approx(0.05) and result['steps_measured'] == 3
  with pytest.raises(ValueError, match='no steps after'):
    protocol.summarise_throughput(str(tmp_path), warmup=5)


# ------------------------------------------------------------------------------------------------
# The pipeline, end to end, and resume after a kill.
# ------------------------------------------------------------------------------------------------


def _main(workdir, data_dir):
  return [sys.executable, '-m', 'rljax.main',
          '--config=configs/protocol.py:runlocal,shallow,seeds=1',
          f'--workdir={workdir}', f'--config.arm.data.dir={data_dir}'] + [
              _flag(k, v) for k, v in TINY.items()]


@pytest.fixture(scope='module')
def resumed(tmp_path_factory, data_dir):
  """A tiny protocol killed (SIGKILL, no cleanup) right after its first arm, then run again."""
  workdir = str(tmp_path_factory.mktemp('protocol') / 'D')
  env = dict(os.environ, PYTHONPATH=REPO)
  first_done = os.path.join(workdir, 'arms', 'P2', 'seed_0', 'done.json')
  proc = subprocess.Popen(_main(workdir, data_dir), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 1200   # generous: a loaded 2-core machine is slow to warm start
  while not os.path.exists(first_done) and proc.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  _, stderr = proc.communicate()
  assert os.path.exists(first_done), stderr[-3000:]
  killed_before_report = not os.path.exists(os.path.join(workdir, 'report.json'))
  first_metrics = os.path.join(workdir, 'arms', 'P2', 'seed_0', 'metrics.jsonl')
  before = (os.stat(first_metrics).st_mtime_ns, open(first_metrics).read())
  result = subprocess.run(_main(workdir, data_dir), cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  after = (os.stat(first_metrics).st_mtime_ns, open(first_metrics).read())
  return dict(workdir=workdir, env=env, stdout=result.stdout,
              killed_before_report=killed_before_report, first_before=before, first_after=after)


@pytest.mark.e2e
def test_sigterm_stops_the_protocol_with_a_checkpoint_and_exit_75(tmp_path, data_dir):
  """A cluster's preemption signal reaches the run in progress: it saves its step and the
  protocol exits 75 (requeue) instead of going on to the next run."""
  workdir = str(tmp_path / 'D')
  proc = subprocess.Popen(_main(workdir, data_dir), cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  first = os.path.join(workdir, 'arms', 'P2', 'seed_0', 'metrics.jsonl')
  deadline = time.time() + 1200
  while not os.path.exists(first) and proc.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 75, stderr[-3000:]
  assert 'stopped on request' in stderr
  assert os.listdir(os.path.join(workdir, 'arms', 'P2', 'seed_0', 'checkpoints'))
  assert not os.path.exists(os.path.join(workdir, 'arms', 'P4'))   # nothing after it started


@pytest.mark.e2e
def test_the_protocol_on_slurm_trains_each_run_as_a_job_and_logs_what_it_logs_in_process(
    resumed, data_dir, slurm_env, tmp_path):
  """protocol.scheduler='slurm' on the one-node cluster of .ci/slurm.sh: the align runs go out as
  parallel sbatch jobs (each `python -m rljax.job RUN_DIR`), the driver waits for them,
  times the throughput rounds and the confirmation in its own process, and writes the report. Every
  run logs exactly the rows the in-process protocol logged (timings aside), so rN and every
  accuracy are the same; a second invocation submits nothing."""
  workdir = str(tmp_path / 'D')
  command = _main(workdir, data_dir) + ['--config.protocol.scheduler=slurm']
  env = dict(slurm_env, PYTHONPATH=REPO)
  result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.count('submitted as SLURM job') == 3, result.stdout[-3000:]   # 3 arms
  for arm in ('P2', 'P4', 'P4_fixed_lr'):
    ours, theirs = (os.path.join(d, 'arms', arm, 'seed_0') for d in (workdir, resumed['workdir']))
    assert os.path.exists(os.path.join(ours, 'sbatch.sh'))
    rows = lambda run: [{k: v for k, v in r.items() if k not in rljax_cli.TIMING}
                        for r in files.read_jsonl(os.path.join(run, 'metrics.jsonl'))]
    assert rows(ours) == rows(theirs), arm
  ours, theirs = (report_lib.build_report(d) for d in (workdir, resumed['workdir']))
  assert [(a['name'], a['rN'], a['samples_to_target']) for a in ours['arms']] == [
      (a['name'], a['rN'], a['samples_to_target']) for a in theirs['arms']]
  again = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert again.returncode == 0 and 'submitted as SLURM job' not in again.stdout, again.stderr


def test_an_unknown_scheduler_or_no_sbatch_is_refused_before_anything_trains(monkeypatch):
  config = protocol_config.get_config('runlocal,shallow')
  config.protocol.scheduler = 'pbs'
  with pytest.raises(ValueError, match="protocol.scheduler must be ''"):
    protocol.arms(config, 'D')
  config.protocol.scheduler = 'slurm'
  monkeypatch.setenv('PATH', '/nonexistent')
  with pytest.raises(ValueError, match='sbatch not found'):
    jobs.runner(config, 'D')


def test_a_job_without_a_recorded_config_fails_with_one_line(tmp_path):
  result = subprocess.run([sys.executable, '-m', 'rljax.job', str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and result.stderr.count('\n') == 1, result.stderr
  assert result.stderr.startswith('rljax: error: ') and 'holds no config.json' in result.stderr


@pytest.mark.e2e
def test_resume_skips_finished_arms_and_shares_one_warm_start(resumed):
  assert resumed['killed_before_report']
  assert 'align 1/3: P2 seed 0: already done, skipped' in resumed['stdout']
  assert resumed['first_after'] == resumed['first_before']   # not re-run, not even touched
  warm_starts = os.listdir(os.path.join(resumed['workdir'], 'warmstart'))
  assert len(warm_starts) == 1, warm_starts   # every arm started from the one warm start


@pytest.mark.e2e
def test_protocol_writes_runs_throughput_report_and_plots(resumed):
  workdir = resumed['workdir']
  calibration = layout.read(workdir, 'calibration')
  assert calibration == {'lr0': 1e-5, 'source': 'given', 'target': 0.01}
  for arm in ('P2', 'P4', 'P4_fixed_lr'):
    done = json.load(open(os.path.join(workdir, 'arms', arm, 'seed_0', 'done.json')))
    assert done['samples'] >= 48 or done['eval_accuracy'] >= 0.04
    spec = layout.read(workdir, 'arm', group='arms', arm=arm)
    assert spec['batch'] == int(arm[1]) * 4 and spec['control'] == arm.endswith('fixed_lr')
    sqrt_factor = 2**0.5 if arm == 'P4' else 1.0   # P2 at lr0, the control at the base's lr
    assert spec['lr'] == pytest.approx(calibration['lr0'] * sqrt_factor)
  for batch in (8, 16, 32):   # 32 = P8 is beyond the align sweep
    for r in range(2):
      t = layout.read(workdir, 'throughput', batch=batch, round=r)
      assert t['batch'] == batch and t['samples_per_s'] > 0 and t['steps_measured'] == 2
  # noise_scale in the training rows: B_simple of the recent steps' squared-norm terms.
  rows = [r for r in map(json.loads, open(os.path.join(workdir, 'arms', 'P4', 'seed_0',
                                                         'metrics.jsonl'))) if not r.get('eval')]
  small, big, bs, bb = (np.array([r[k] for r in rows]) for k in (
      'grad_sq_small', 'grad_sq_big', 'b_small', 'b_big'))
  assert (bs == 4).all() and (bb == 16).all()
  grad_sq = np.mean((bb * big - bs * small) / (bb - bs))
  trace = np.mean((small - big) / (1 / bs - 1 / bb))
  expected = trace / grad_sq if grad_sq > 0 else None
  assert rows[-1]['noise_scale'] == (pytest.approx(expected) if expected else None)
  report = json.load(open(os.path.join(workdir, 'report.json')))
  assert [a['name'] for a in report['arms']] == ['P2', 'P4', 'P4_fixed_lr']
  assert report['base_arm'] == 'P2' and report['stop_target'] == 0.01
  assert sorted(c['batch'] for c in report['decision']['candidates']) == [8, 16, 32]
  why_not = {c['batch']: c['why_not'] for c in report['decision']['candidates']}
  assert 'not in the align sweep' in why_not[32]
  assert 'Decision' in open(os.path.join(workdir, 'report.md')).read()
  for plot in layout.PLOTS:
    with open(os.path.join(workdir, plot), 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n', plot


@pytest.mark.e2e
def test_a_finished_protocol_retrains_nothing_and_refuses_a_changed_config(resumed):
  workdir, env = resumed['workdir'], resumed['env']
  data_dir = json.load(open(os.path.join(workdir, 'arms', 'P2', 'seed_0', 'config.json')))[
      'data']['dir']
  again = subprocess.run(_main(workdir, data_dir), cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
  assert again.returncode == 0, again.stderr[-2000:]
  assert again.stdout.count('already') >= 11 and 'training in' not in again.stdout
  changed = subprocess.run(_main(workdir, data_dir) + ['--config.arm.grpo.clip_high=0.3'],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert changed.returncode != 0
  assert 'was started with grpo.clip_high=0.2' in changed.stderr


@pytest.mark.e2e
def test_confirm_runs_at_the_base_and_the_fastest_batch(resumed, data_dir):
  """The confirmation runs for a given decision, in process, and the report's section on them."""
  config, workdir = tiny_config(data_dir), resumed['workdir']
  config.arm.train.micro_batch = 8   # in process: the batch split over this session's 8 devices
  config.protocol.min_micro_batches = 1   # so one micro-batch of 8, not 2 of 4
  lr0 = layout.read(workdir, 'calibration')['lr0']
  shutil.rmtree(os.path.join(workdir, 'confirm'), ignore_errors=True)   # another micro_batch
  protocol.confirm(config, workdir, {'base_batch': 8, 'primary': 0.02, 'decision': {
      'fastest': 8, 'verdict': 'base fastest', 'recommended': 8}}, lr0)
  spec = layout.read(workdir, 'arm', group='confirm', arm='P2')
  cfg = json.load(open(os.path.join(workdir, 'confirm', 'P2', 'seed_2', 'config.json')))
  assert spec['batch'] == 8 and cfg['seed'] == 2   # max_seeds = 2: a seed no align run used
  # the report's J
  assert cfg['train']['target'] == pytest.approx(0.02 + config.protocol.stop_margin)
  report = report_lib.build_report(workdir)
  assert [c['batch'] for c in report['confirm']][:1] == [8]
  assert 'measured_wallclock_s' in report['confirm'][0]


@pytest.mark.e2e
def test_quick_mode_trains_the_base_arm_only_and_predicts_every_batch(tmp_path, data_dir):
  """protocol.quick: calibration (given here), the base arm, the throughput rounds; every
  batch's rN from the base arm's B_simple, and its cost is the full sweep's minus the arms."""
  workdir = str(tmp_path / 'Q')
  result = subprocess.run(_main(workdir, data_dir) + ['--config.protocol.quick=True',
                                                      '--config.protocol.confirm=False'],
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True,
                          text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  assert sorted(os.listdir(os.path.join(workdir, 'arms'))) == ['P2']
  report = json.load(open(os.path.join(workdir, 'report.json')))
  assert report['mode'] == 'quick' and report['decision']['method'] == 'noise scale'
  assert report['cost']['quick'] == report['cost']['full_sweep'] > report['cost']['base_arm'] > 0
  rows = {c['batch']: c for c in report['decision']['candidates']}
  assert sorted(rows) == [8, 16, 32]
  b_noise = report['quick']['noise_scale']
  if np.isfinite(b_noise) and report['decision']['verdict'] != 'undefined':
    for batch in (16, 32):
      assert rows[batch]['rN_predicted'] == pytest.approx((1 + batch / b_noise) / (1 + 8 / b_noise))
  else:   # a tiny model may not reach the target, or its gradient be all noise: then it says so
    assert report['decision']['verdict'] == 'undefined'
    assert ('samples to target' in report['decision']['statement'] or
            'B_simple' in report['decision']['statement'])
  assert 'From the base arm alone' in open(os.path.join(workdir, 'report.md')).read()
