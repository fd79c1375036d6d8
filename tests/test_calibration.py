"""rljax.protocol.calibration against hand-built curves, and the deep preset's calibration on two
CPU numerics paths (real runs, shrunk)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rljax.protocol import calibration
from rljax.protocol import curves

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(accuracies, every=1024):
  """A run as layout.load_run gives it: evals every `every` samples from 0."""
  acc = np.asarray(accuracies, float)
  return dict(eval=dict(samples=every * np.arange(len(acc), dtype=float), eval_accuracy=acc),
              train=dict(samples=np.array([]), step_time_s=np.array([])))


def test_choose_lr_takes_the_fewest_samples_and_flags_the_edge():
  choice = calibration.choose_lr([1e-4, 2.5e-5, 5e-5], [[9e3, 1.1e4], [8e3, np.nan], [5e3, 6e3]])
  assert choice['lr0'] == 5e-5 and not choice['at_edge']
  assert [r['lr'] for r in choice['lrs']] == [2.5e-5, 5e-5, 1e-4]
  assert not choice['lrs'][0]['reached']   # 8k on one seed, but the other never got there
  assert choice['lrs'][1]['samples_to_target'] == pytest.approx(np.sqrt(5e3 * 6e3))
  assert calibration.choose_lr([1e-4, 5e-5], [[4e3, 4e3], [6e3, 6e3]])['at_edge']


def test_the_proxy_target_sits_a_fraction_of_the_way_to_the_best_lrs_weakest_seed():
  runs = {1e-5: [_run([0.30, 0.40, 0.50]), _run([0.32, 0.36, 0.44])],
          2e-5: [_run([0.31, 0.45, 0.47]), _run([0.29, 0.47, 0.48])],
          4e-5: [_run([0.30, 0.31, 0.30]), _run([0.30, 0.28, 0.29])]}
  start = np.mean([0.30, 0.32, 0.31, 0.29, 0.30, 0.30])   # every run's first eval
  top = max(min(0.50, 0.44), min(0.47, 0.48), min(0.31, 0.30))   # 0.47, at 2e-5
  assert calibration.proxy_target(runs, 0.7, 1) == pytest.approx(start + 0.7 * (top - start))
  flat = {1e-5: [_run([0.3, 0.3, 0.29])], 2e-5: [_run([0.3, 0.28, 0.3])]}
  assert np.isnan(calibration.proxy_target(flat, 0.7, 1))


def test_choose_places_the_target_and_takes_the_fastest_lr_to_it():
  runs = {1e-5: [_run([0.30, 0.35, 0.40, 0.45, 0.50])] * 2,
          2e-5: [_run([0.30, 0.42, 0.46, 0.46, 0.46])] * 2,
          4e-5: [_run([0.30, 0.33, 0.36, 0.36, 0.36])] * 2}
  choice = calibration.choose(runs, 0.0, 0.5, 1)
  assert choice['target'] == pytest.approx(0.40)   # halfway from 0.30 to 0.50, the top of 1e-5
  assert choice['lr0'] == 2e-5 and not choice['at_edge']   # 853 samples, against 2048 at 1e-5
  assert (choice['method'] == 'fewest samples to target'
          and 'calibration runs' in choice['target_rule'])
  given = calibration.choose(runs, 0.48, 0.5, 1)
  assert given['target'] == 0.48 and given['target_rule'] == 'given'
  assert given['lr0'] == 1e-5 and given['at_edge']   # only 1e-5 reaches 0.48


def test_with_no_lr_at_the_target_the_most_progress_at_the_budget_is_chosen_and_said():
  runs = {1e-5: [_run([0.30, 0.33, 0.36])], 2e-5: [_run([0.30, 0.35, 0.38])],
          4e-5: [_run([0.30, 0.32, 0.31])]}
  choice = calibration.choose(runs, 0.9, 0.5, 1)   # a given target nobody reaches
  assert (choice['lr0'], choice['method'], choice['at_edge']) == (
      2e-5, 'most progress at the budget', False)
  flat = {1e-5: [_run([0.30, 0.29])], 2e-5: [_run([0.30, 0.30])]}   # placed: nothing rose
  choice = calibration.choose(flat, 0.0, 0.5, 1)
  assert np.isnan(choice['target']) and choice['lr0'] == 2e-5 and choice['at_edge']


def test_the_bracket_extends_past_the_edge_it_found_until_its_bound():
  lrs = [1.77e-5, 3.54e-5, 7.07e-5]
  assert calibration.next_lr(lrs, 1.77e-5, 6) == pytest.approx(8.85e-6)   # its own spacing
  assert calibration.next_lr(lrs, 7.07e-5, 6) == pytest.approx(1.41e-4, rel=1e-3)
  assert calibration.next_lr(lrs, 3.54e-5, 6) is None   # interior
  assert calibration.next_lr(lrs, 1.77e-5, 3) is None   # the bound
  assert calibration.next_lr(lrs, np.nan, 6) is None   # nothing chosen: nothing to follow


def _saturating_run(scale, budget, every, start=0.3, rise=0.6):
  """A noiseless run rising as start + rise (1 - exp(-x / scale)), evaluated every `every`."""
  x = np.arange(0, budget + 1, every, dtype=float)
  return _run(start + rise * (1 - np.exp(-x / scale)), every)


@pytest.mark.parametrize('scale, expected', [(500.0, 4), (1000.0, 2), (2600.0, 1)])
def test_the_divisor_keeps_the_budget_holding_its_time_scales(scale, expected):
  """budget / d >= 16 time-scales for the largest power of two d: 32768 / (16 x 500) = 4.1 -> 4."""
  runs = [_saturating_run(scale, 32768, 256)] * 2
  d, fitted = calibration.divisor(runs, 32768, 16)
  assert fitted == pytest.approx(scale, rel=0.01)   # the fit's scale grid is 1% apart
  assert d == expected
  assert calibration.divisor(runs, 32768, 0)[0] == 1


def test_a_time_scale_below_the_fits_range_divides_less():
  """The fit's scales start at 1% of the last eval's samples: a faster rise is read as that slow,
  so the budget is divided less than it could be, never more."""
  d, fitted = calibration.divisor([_saturating_run(100.0, 32768, 256)], 32768, 16)
  assert fitted == pytest.approx(327.68, rel=0.01) and d == 4   # 16 at the true scale


def test_divided_keeps_the_grid_a_multiple_of_the_largest_batch():
  assert calibration.divided(65536, 8192, 8, 256) == (8192, 1024)
  assert calibration.divided(65536, 8192, 64, 256) == (2048, 256)   # 8192 / 64 = 128 < 256
  assert calibration.divided(65536, 8192, 1, 256) == (65536, 8192)


def test_choose_reads_every_run_up_to_the_budget_given():
  """A run that trained past the others' budget is read only up to it: its later top does not
  move the proxy target."""
  long = _run([0.30, 0.50, 0.60, 0.90])
  runs = {1e-5: [long], 2e-5: [_run([0.30, 0.55, 0.60])]}
  assert calibration.choose(runs, 0.0, 0.5, 1)['target'] == pytest.approx(0.60)   # 1e-5 to 0.90
  choice = calibration.choose(runs, 0.0, 0.5, 1, budget=2048)
  assert choice['target'] == pytest.approx(0.45)   # both tops 0.60 up to 2048 samples
  assert choice['lr0'] == 2e-5


def test_an_lr_that_levels_off_below_the_ceiling_is_not_lr0():
  """4e-5 reaches the proxy first but tops out at 0.62, below start + 0.9 x (top - start) = 0.87:
  with the ceiling lr0 is 2e-5, the fastest of the lrs that rise all the way."""
  runs = {1e-5: [_run([0.05, 0.30, 0.70, 0.90, 0.95])] * 2,
          2e-5: [_run([0.05, 0.60, 0.90, 0.95, 0.96])] * 2,
          4e-5: [_run([0.05, 0.80, 0.62, 0.60, 0.61])] * 2}
  assert calibration.choose(runs, 0.0, 0.5, 1)['lr0'] == 4e-5
  choice = calibration.choose(runs, 0.0, 0.5, 1, ceiling=0.9)
  assert choice["ceiling"] == pytest.approx(0.05 + 0.9 * (0.96 - 0.05))   # top: 2e-5
  assert choice['lr0'] == 2e-5 and not choice['at_edge']
  assert not choice['lrs'][2]['reached']


# ------------------------------------------------------------------------------------------------
# Portability: the deep preset's calibration and target placement under two CPU numerics paths.
# ------------------------------------------------------------------------------------------------

# The deep preset (quick, one seed) shrunk to minutes: calibration runs of 3072 samples evaluated
# every 512 on 512 held-out prompts, a first bracket 4x apart each way (the preset's is 2x: at
# this budget the runs' spread needs the wider step to order three lrs), one base-arm seed, one
# throughput round, no confirmation. Nothing in it is an accuracy.
SHRUNK = ['--config=configs/protocol.py:runlocal,quick,seeds=1',
          '--config.protocol.calibration_factors=(0.25,1.0,4.0)',
          '--config.protocol.calibration_max_samples=3072',
          '--config.protocol.calibration_eval_every_samples=512',
          '--config.protocol.max_samples=3072', '--config.protocol.eval_every_samples=512',
          '--config.protocol.eval_first_samples=0', '--config.protocol.budget_scales=0',
          '--config.protocol.sweep=(2,)', '--config.protocol.throughput_rounds=1',
          '--config.protocol.throughput_steps=2', '--config.protocol.confirm=False',
          '--config.arm.train.eval_size=512']


def _other_numerics():
  """Another CPU's numerics on this one: XLA:CPU limited to AVX2 where the host has AVX-512, to
  SSE4.2 where AVX2 is already its best (limiting it to AVX2 there changes nothing)."""
  flags = open('/proc/cpuinfo').read() if os.path.exists('/proc/cpuinfo') else ''
  return '--xla_cpu_max_isa=' + ('AVX2' if 'avx512f' in flags else 'SSE4_2')


def _eval_curve(path):
  return [row['eval_accuracy'] for row in map(json.loads, open(path)) if 'eval_accuracy' in row]


@pytest.mark.e2e
def test_the_deep_preset_calibrates_and_places_targets_under_two_cpu_numerics(tmp_path):
  """Shrunk, on this CPU as it is and as another CPU (XLA's ISA limited): each path finds an lr0
  with both neighbours slower (the bracket extended where it had to) and places the targets
  inside the base arm's rise; the two paths' curves differ, so both were exercised. Product
  compile flags (the suite's fast-compile ones round differently again), each its own data and
  compilation cache."""
  env = {k: v for k, v in os.environ.items() if k != 'JAX_COMPILATION_CACHE_DIR'}
  paths = {'default': '', 'other': _other_numerics()}
  procs = {name: subprocess.Popen(
      [sys.executable, '-m', 'rljax.main', *SHRUNK, f'--workdir={tmp_path / name}',
       f'--config.arm.data.dir={tmp_path / name}_data'], cwd=REPO, text=True,
      env=dict(env, XLA_FLAGS=flags, JAX_PLATFORMS='cpu', PYTHONPATH=REPO),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for name, flags in paths.items()}
  logs = {name: proc.communicate(timeout=1800)[0] for name, proc in procs.items()}
  curves_ = {}
  for name, proc in procs.items():
    assert proc.returncode == 0, (name, logs[name][-3000:])
    workdir = tmp_path / name
    chosen = json.load(open(workdir / 'calibration.json'))
    assert chosen['method'] == 'fewest samples to target' and not chosen['at_edge'], (name, chosen)
    assert np.isfinite(chosen['lr0']) and chosen['lr0'] > 0
    report = json.load(open(workdir / 'report.json'))
    base = next(a for a in report['arms'] if a['base'])
    rise = curves.smooth(_eval_curve(workdir / 'arms' / base['name'] / 'seed_0' /
                                     'metrics.jsonl'), report['smooth_window'])
    assert rise[0] < min(report['targets']) < max(report['targets']) < max(rise), name
    assert np.isfinite(base['samples_to_target'])
    curves_[name] = _eval_curve(next((workdir / 'calibration').glob('*/seed_0/metrics.jsonl')))
  assert curves_['default'] != curves_['other']
