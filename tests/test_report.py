"""Tests for rljax.analysis on synthetic curves and gradients whose answers are known."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rljax import report as report_lib
from rljax import stats

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = 0.6


def curve(stretch=1.0):
  """A saturating learning curve against samples; stretch=s needs s times the samples."""
  return lambda n: 0.3 + 0.6 * (1 - np.exp(-np.asarray(n, float) / (20_000 * stretch)))


BASE_N = 20_000 * np.log(2)  # curve() reaches TARGET here.


def make_run(acc_fn, batch, n_steps, prompts_u=None, eval_every=5, step_time=1.0):
  """A run as load_run returns it; with prompts_u, prompt m is solved once accuracy > u[m]."""
  steps = np.arange(n_steps + 1)[::eval_every].astype(float)
  acc = acc_fn(steps * batch)
  correct = None
  if prompts_u is not None:
    correct_TxM = prompts_u[None, :] < acc[:, None]
    correct = {'step': steps, 'samples': steps * batch, 'correct_TxM': correct_TxM}
    acc = correct_TxM.mean(axis=1)
  train_steps = np.arange(1, n_steps + 1, dtype=float)
  return {
      'dir': None,
      'train': {'step': train_steps, 'samples': train_steps * batch,
                'step_time_s': np.full(n_steps, step_time), 'grad_norm': np.ones(n_steps)},
      'eval': {'step': steps, 'samples': steps * batch, 'eval_accuracy': acc},
      'eval_correct': correct,
  }


# ----------------------------------------------------------------------------------------------
# Curves and crossings.
# ----------------------------------------------------------------------------------------------


def test_first_crossing_is_exact_on_piecewise_linear_data():
  x, y = [0, 10, 20, 30], [0.0, 0.2, 0.6, 0.8]
  assert stats.first_crossing(x, y, 0.4) == pytest.approx(15.0)
  assert stats.first_crossing(x, y, 0.7) == pytest.approx(25.0)
  assert stats.first_crossing(x, y, 0.6) == pytest.approx(20.0)
  assert stats.first_crossing(x, y, 0.0) == 0.0  # already there at the first point
  assert np.isnan(stats.first_crossing(x, y, 0.9))
  assert np.isnan(stats.first_crossing([], [], 0.5))
  # The FIRST upward crossing, even if the curve dips back below later.
  assert stats.first_crossing([0, 10, 20, 30], [0.0, 0.5, 0.3, 0.7], 0.4) == pytest.approx(8.0)
  # Column-wise on 2-D input, as the bootstrap uses it.
  y2 = np.array([[0.0, 0.0], [0.2, 1.0], [0.6, 1.0], [0.8, 1.0]])
  np.testing.assert_allclose(stats.first_crossing(x, y2, 0.4), [15.0, 4.0])


def test_smooth_is_centred_and_keeps_lines():
  np.testing.assert_allclose(stats.smooth([0, 0, 3, 0, 0], 3), [0, 1, 1, 1, 0])
  line = np.linspace(0, 1, 9)
  np.testing.assert_allclose(stats.smooth(line, 5), line)  # no lag: crossings do not move
  np.testing.assert_allclose(stats.smooth([1.0, 5.0], 1), [1.0, 5.0])


def test_to_target_in_samples_steps_and_wallclock():
  run = make_run(lambda n: n / 1000.0, batch=100, n_steps=10, eval_every=1, step_time=2.0)
  assert stats.samples_to_target(run, 0.35) == pytest.approx(350.0)
  assert stats.steps_to_target(run, 0.35) == pytest.approx(3.5)
  assert stats.wallclock_to_target(run, 0.35) == pytest.approx(7.0)
  assert np.isnan(stats.samples_to_target(run, 2.0))
  assert np.isnan(stats.wallclock_to_target(run, 2.0))


def test_load_run_splits_dedupes_and_reads_eval_correct(tmp_path):
  rows = [
      {'step': 0, 'samples': 0, 'eval': True, 'eval_accuracy': 0.25},
      {'step': 1, 'samples': 8, 'grad_norm': 9.0, 'step_time_s': 1.0},
      {'step': 1, 'samples': 8, 'grad_norm': 2.0, 'step_time_s': 1.0},  # re-logged on resume
      {'step': 2, 'samples': 16, 'grad_norm': 3.0, 'step_time_s': 1.0, 'critic_grad_norm': 4.0},
      {'step': 2, 'samples': 16, 'eval': True, 'eval_accuracy': 0.75},
  ]
  text = ''.join(json.dumps(r) + '\n' for r in rows) + '{"step": 3, "sam'  # torn last line
  (tmp_path / 'metrics.jsonl').write_text(text)
  (tmp_path / 'eval_correct.jsonl').write_text('{"step": 0, "samples": 0, "correct": "0100"}\n'
                                               '{"step": 2, "samples": 16, "correct": "1101"}\n')
  run = report_lib.load_run(str(tmp_path))
  np.testing.assert_array_equal(run['train']['step'], [1, 2])
  np.testing.assert_array_equal(run['train']['grad_norm'], [2.0, 3.0])
  assert np.isnan(run['train']['critic_grad_norm'][0])
  np.testing.assert_array_equal(run['eval']['eval_accuracy'], [0.25, 0.75])
  assert 'eval_accuracy' not in run['train']
  np.testing.assert_array_equal(run['eval_correct']['correct_TxM'].mean(axis=1), [0.25, 0.75])


# ----------------------------------------------------------------------------------------------
# rN and its bootstrap CI.
# ----------------------------------------------------------------------------------------------


def test_rn_of_a_curve_stretched_in_samples():
  """Same accuracies at 1.5x the samples: rN is exactly 1.5 (interpolation scales with x)."""
  base = [make_run(curve(), 128, 400)]
  stretched = make_run(curve(), 128, 400)
  stretched['eval']['samples'] = stretched['eval']['samples'] * 1.5
  rn, lo, hi = stats.rn_with_ci(base, [stretched], TARGET, n_boot=50, rng=0)
  assert rn == pytest.approx(1.5)
  assert lo == pytest.approx(1.5) and hi == pytest.approx(1.5)  # one seed, no prompts: no noise
  assert stats.samples_to_target(base[0], TARGET) == pytest.approx(BASE_N, rel=0.01)


def seeded_runs(rng, n_seeds, stretch, prompts_u):
  """Seeds differ by a random stretch in samples (seed noise); prompts add eval-set noise."""
  return [make_run(curve(stretch * np.exp(0.2 * rng.standard_normal())), 128, 500, prompts_u)
          for _ in range(n_seeds)]


def test_bootstrap_ci_covers_truth_and_shrinks_with_seeds():
  """Truth rN = 1.5 over 20 synthetic sweeps. With 3 seeds a percentile bootstrap under-covers
  (it cannot know the spread of 3 numbers well), so 3 seeds are held to a lower bar."""
  rng = np.random.default_rng(0)
  widths, covered = {3: [], 12: []}, {3: [], 12: []}
  for _ in range(20):
    prompts_u = rng.uniform(size=300)
    for n_seeds in (3, 12):
      base = seeded_runs(rng, n_seeds, 1.0, prompts_u)
      arm = seeded_runs(rng, n_seeds, 1.5, prompts_u)
      rn, lo, hi = stats.rn_with_ci(base, arm, TARGET, n_boot=200, rng=rng)
      assert lo <= rn <= hi
      widths[n_seeds].append(hi - lo)
      covered[n_seeds].append(lo <= 1.5 <= hi)
  assert np.mean(covered[12]) >= 0.8 and np.mean(covered[3]) >= 0.6
  assert np.mean(covered[3] + covered[12]) >= 0.8
  assert np.mean(widths[12]) < 0.8 * np.mean(widths[3])


def test_bootstrap_resamples_prompts_when_eval_correct_is_logged():
  """One seed per side: all the CI width comes from resampling the held-out prompts."""
  prompts_u = np.random.default_rng(1).uniform(size=200)
  base = [make_run(curve(), 128, 400, prompts_u)]
  arm = [make_run(curve(1.5), 128, 400, prompts_u)]
  _, lo, hi = stats.rn_with_ci(base, arm, TARGET, n_boot=200, rng=0)
  assert hi > lo
  for run in base + arm:
    run['eval_correct'] = None
  _, lo, hi = stats.rn_with_ci(base, arm, TARGET, n_boot=200, rng=0)
  assert hi == lo


def test_arm_that_never_reaches_the_target():
  base = [make_run(curve(), 128, 400) for _ in range(2)]
  arm = [make_run(curve(), 128, 400), make_run(curve(100.0), 128, 400)]
  rn, _, hi = stats.rn_with_ci(base, arm, TARGET, n_boot=50, rng=0)
  assert np.isinf(rn) and np.isinf(hi)
  rn, _, _ = stats.rn_with_ci(arm, base, TARGET, n_boot=50, rng=0)
  assert np.isnan(rn)  # base never gets there: undefined, not 0


def test_aligned_range_is_contiguous_around_the_base():
  arms = [
      {'name': 'a', 'batch': 64, 'rN': 1.3, 'rN_ci': [1.2, 1.4]},
      {'name': 'b', 'batch': 128, 'rN': 0.95, 'rN_ci': [0.8, 1.1]},
      {'name': 'base', 'batch': 256, 'rN': 1.0, 'rN_ci': [0.9, 1.1], 'base': True},
      {'name': 'c', 'batch': 512, 'rN': 1.08, 'rN_ci': [1.02, 1.15]},
      {'name': 'd', 'batch': 1024, 'rN': 1.6, 'rN_ci': [1.4, 1.8]},
      {'name': 'e', 'batch': 2048, 'rN': 1.0, 'rN_ci': [0.9, 1.1]},  # beyond a gap: not counted
      {'name': 'fixed', 'batch': 4096, 'rN': 1.0, 'rN_ci': [0.9, 1.1], 'control': True},
  ]
  aligned = stats.aligned_range(arms, tolerance=0.1)
  assert (aligned['lo'], aligned['hi'], aligned['batches']) == (128, 512, [128, 256, 512])
  assert not aligned['within_noise']  # batch 512 is within tolerance but its CI excludes 1
  arms[3]['rN_ci'] = [0.95, 1.2]
  assert stats.aligned_range(arms, tolerance=0.1)['within_noise']
  assert stats.aligned_range(arms, tolerance=0.01)['batches'] == [256]


# ----------------------------------------------------------------------------------------------
# Gradient diagnostics.
# ----------------------------------------------------------------------------------------------


def test_grad_norm_slope_recovers_minus_half_with_a_sane_stderr():
  rng = np.random.default_rng(0)
  batches = 2.0**np.arange(3, 11)
  fits = [stats.grad_norm_slope(batches, 5 * batches**-0.5 *
                                   np.exp(0.05 * rng.standard_normal(len(batches))))
          for _ in range(400)]
  slopes, stderrs = np.array(fits).T
  assert abs(slopes[0] + 0.5) < 3 * stderrs[0]
  assert np.mean(slopes) == pytest.approx(-0.5, abs=0.005)
  # The reported stderr matches the actual spread of fitted slopes over noise draws
  # (its square is unbiased for the slope's variance; dividing by n, not n - 2, is 15% too big).
  assert np.sqrt(np.mean(stderrs**2)) == pytest.approx(np.std(slopes), rel=0.07)
  assert np.isnan(stats.grad_norm_slope([8, 16], [1.0, 0.7])[1])  # no residual dof


def test_doubling_ratios_are_per_doubling():
  batches = [64, 128, 512]
  ratios = stats.doubling_ratios(batches, [np.sqrt(64 / b) for b in batches])
  assert [(r['from'], r['to']) for r in ratios] == [(64, 128), (128, 512)]
  assert ratios[1]['ratio'] == pytest.approx(0.5)
  for r in ratios:
    assert r['per_doubling'] == pytest.approx(2**-0.5)


# ----------------------------------------------------------------------------------------------
# The decision.
# ----------------------------------------------------------------------------------------------


def test_decision_more_throughput_loses_to_a_larger_sample_penalty():
  n = 100_000.0
  candidates = [
      {'batch': 128, 'throughput_samples_per_s': 1000.0, 'rN': 1.0},
      {'batch': 256, 'throughput_samples_per_s': 1200.0, 'rN': 1.5, 'rN_ci': [1.3, 1.7]},
  ]
  decisions = stats.decide(candidates, n)
  assert [d['recommended'] for d in decisions] == [True, False]
  assert decisions[1]['predicted_wallclock_s'] == pytest.approx(n * 1.5 / 1200)
  assert decisions[1]['predicted_wallclock_ci_s'] == pytest.approx([n * 1.3 / 1200, n * 1.7 / 1200])
  assert stats.predict_wallclock(n, 1.5, 1200.0) == pytest.approx(125.0)
  candidates[1]['rN'] = 1.1  # now 1.2x throughput beats the 1.1x penalty
  assert [d['recommended'] for d in stats.decide(candidates, n)] == [False, True]


def test_decision_marks_extrapolated_batches_and_bounds_their_rn():
  candidates = [
      {'batch': 64, 'throughput_samples_per_s': 900.0, 'rN': None},
      {'batch': 128, 'throughput_samples_per_s': 1000.0, 'rN': 1.0},
      {'batch': 512, 'throughput_samples_per_s': 1400.0, 'rN': 1.2},
      {'batch': 4096, 'throughput_samples_per_s': 5000.0, 'rN': None},
  ]
  decisions = {d['batch']: d for d in stats.decide(candidates, 1e5)}
  big, small = decisions[4096], decisions[64]
  assert big['extrapolated'] and not decisions[512]['extrapolated']
  assert (big['rN_used'], big['rN_bound']) == (1.2, 'lower')  # never silently 1
  assert (small['rN_used'], small['rN_bound']) == (1.0, 'upper')
  assert 'bound' in big['note']
  assert decisions[512]['recommended'] and not big['recommended']
  allowed = {d['batch']: d for d in stats.decide(candidates, 1e5, allow_extrapolated=True)}
  assert allowed[4096]['recommended']


# ----------------------------------------------------------------------------------------------
# The report of a protocol workdir, end to end.
# ----------------------------------------------------------------------------------------------

# name: (P, lr rule, sample stretch, control)
ARMS = {
    'P8': (8, 'sqrt', 1.0, False),
    'P16': (16, 'sqrt', 1.0, False),
    'P32': (32, 'sqrt', 1.0, False),
    'P64': (64, 'sqrt', 1.6, False),
    'P32_fixed_lr': (32, 'constant', 1.5, True),
}
THROUGHPUT = {64: 800.0, 128: 1000.0, 256: 1300.0, 512: 1500.0, 1024: 3000.0}  # samples/s
B_SIMPLE, GRAD_SQ = 400.0, 0.01


def write_run(run_dir, batch, stretch, prompts_u, rng, budget=60_000, ppo=False):
  """metrics.jsonl + eval_correct.jsonl in the trainer's format for a curve stretched in samples.

  ppo=True logs a critic grad norm that barely falls with batch, and no eval_correct.jsonl.
  """
  os.makedirs(run_dir)
  acc_fn = curve(stretch * np.exp(0.05 * rng.standard_normal()))
  n_steps = budget // batch
  metrics, correct = [], []
  for step in range(n_steps + 1):
    samples = step * batch
    if step:
      b_small = batch / 4
      metrics.append({
          'step': step, 'samples': samples, 'tokens': 10 * samples, 'reward_mean': 0.5,
          'lr': 1e-4, 'grad_norm': 3 * batch**-0.5 * np.exp(0.05 * rng.standard_normal()),
          'step_time_s': batch / THROUGHPUT[batch], 'rollout_time_s': 0.3 * batch / 1000,
          'update_time_s': 0.7 * batch / 1000,
          'grad_sq_small': GRAD_SQ * (1 + B_SIMPLE / b_small) * (1 + 0.1 * rng.standard_normal()),
          'grad_sq_big': GRAD_SQ * (1 + B_SIMPLE / batch), 'b_small': b_small, 'b_big': batch,
      })
      if ppo:
        metrics[-1]['critic_grad_norm'] = 2 * batch**-0.1
    if step % max(1, 1024 // batch) == 0:
      solved = prompts_u < acc_fn(samples)
      metrics.append({'step': step, 'samples': samples, 'eval': True,
                      'eval_accuracy': float(solved.mean())})
      correct.append({'step': step, 'samples': samples,
                      'correct': ''.join('1' if s else '0' for s in solved)})
  for name, rows in (('metrics.jsonl', metrics), ('eval_correct.jsonl', [] if ppo else correct)):
    with open(os.path.join(run_dir, name), 'w') as f:
      f.writelines(json.dumps(r) + '\n' for r in rows)


def write_json(path, obj):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    json.dump(obj, f)


def write_workdir(root):
  """A protocol workdir in the contract layout: 5 arms x 3 seeds, throughput, a confirm run."""
  rng = np.random.default_rng(0)
  prompts_u = rng.uniform(size=500)
  for name, (p, rule, stretch, control) in ARMS.items():
    batch = 8 * p
    write_json(os.path.join(root, 'arms', name, 'arm.json'), {
        'name': name, 'P': p, 'G': 8, 'batch': batch, 'control': control, 'lr_rule': rule,
        'lr': 5e-5 * (np.sqrt(p / 16) if rule == 'sqrt' else 1.0)})
    for seed in range(3):
      write_run(os.path.join(root, 'arms', name, f'seed_{seed}'), batch, stretch, prompts_u, rng)
  for batch, thr in THROUGHPUT.items():
    write_json(os.path.join(root, 'throughput', f'{batch}.json'), {
        'batch': batch, 'samples_per_s': thr, 'rollout_time_s': 0.3 * batch / 1000,
        'update_time_s': 0.7 * batch / 1000, 'step_time_s': batch / thr})
  write_json(os.path.join(root, 'protocol.json'), {
      'target': TARGET, 'base_arm': 'P16', 'rn_tolerance': 0.1, 'algo': 'grpo', 'n_boot': 300})
  write_run(os.path.join(root, 'confirm'), 256, 1.0, prompts_u, rng)
  return root


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  return write_workdir(str(tmp_path_factory.mktemp('protocol')))


def test_build_report_end_to_end(workdir):
  report = report_lib.build_report(workdir)
  arms = {a['name']: a for a in report['arms']}
  assert arms['P16']['base'] and arms['P16']['rN'] == 1.0
  for name in ('P8', 'P32'):
    assert abs(arms[name]['rN'] - 1) < 0.1
  assert arms['P64']['rN'] == pytest.approx(1.6, rel=0.1)
  assert arms['P64']['rN_ci'][0] > 1  # the drift is beyond noise
  assert arms['P32']['rel_throughput'] == pytest.approx(1.3)
  aligned = report['aligned_range']
  assert (aligned['lo'], aligned['hi']) == (64, 256)
  assert report['grad_norm_slope'] == pytest.approx(-0.5, abs=0.05)
  assert report['noise_scale'] == pytest.approx(B_SIMPLE, rel=0.15)
  assert report['recommended']['batch'] == 256  # 1.5x throughput at 512 loses to rN 1.6
  extrapolated = {d['batch'] for d in report['candidates'] if d['extrapolated']}
  assert extrapolated == {1024}
  assert report['confirm']['batch'] == 256
  assert report['confirm']['measured_over_predicted'] == pytest.approx(1.0, rel=0.15)


def test_cli_rebuilds_the_report_files(workdir):
  result = subprocess.run([sys.executable, '-m', 'rljax.analysis', f'--workdir={workdir}'],
                          cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr
  with open(os.path.join(workdir, 'report.json')) as f:
    report = json.load(f)  # strict JSON: no NaN / Infinity literals
  arm_keys = {'batch', 'P', 'G', 'lr', 'samples_to_target', 'steps_to_target',
              'wallclock_to_target_s', 'rN', 'rN_ci', 'throughput_samples_per_s',
              'rel_throughput', 'grad_norm_median'}
  for arm in report['arms']:
    assert arm_keys <= set(arm)
  top_keys = {'grad_norm_slope', 'grad_norm_slope_stderr', 'noise_scale', 'aligned_range',
              'recommended', 'target', 'confirm'}
  assert top_keys <= set(report)
  for plot in report_lib.PLOTS:
    assert os.path.getsize(os.path.join(workdir, plot)) > 1000
  with open(os.path.join(workdir, 'report.md')) as f:
    markdown = f.read()
  assert '| arm | batch |' in markdown and 'within noise' in markdown


@pytest.mark.parametrize('make', ['missing', 'empty'])
def test_cli_fails_clearly_on_a_bad_workdir(tmp_path, make):
  path = tmp_path / 'nothing' if make == 'missing' else tmp_path
  result = subprocess.run([sys.executable, '-m', 'rljax.analysis', f'--workdir={path}'],
                          cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode != 0
  assert result.stderr.strip().startswith('rljax.analysis:')
  assert ('does not exist' if make == 'missing' else 'no arms') in result.stderr


def test_report_with_an_unreached_arm_and_no_throughput_files(tmp_path):
  """PPO-like: no eval_correct (seed-only bootstrap), throughput from the runs' own logs."""
  rng = np.random.default_rng(1)
  prompts_u = rng.uniform(size=500)
  for batch, stretch in ((256, 1.0), (512, 1.0), (1024, 100.0)):
    name = f'B{batch}'
    write_json(str(tmp_path / 'arms' / name / 'arm.json'), {
        'name': name, 'P': batch, 'G': 1, 'batch': batch, 'lr': 1e-4, 'lr_rule': 'sqrt',
        'control': False})
    for seed in range(2):
      write_run(str(tmp_path / 'arms' / name / f'seed_{seed}'), batch, stretch, prompts_u, rng,
                ppo=True)
  write_json(str(tmp_path / 'protocol.json'),
             {'target': TARGET, 'base_arm': 'B256', 'algo': 'ppo', 'n_boot': 100})
  report = report_lib.write_report(str(tmp_path))
  arms = {a['name']: a for a in report['arms']}
  assert arms['B1024']['rN_status'] == 'not reached' and np.isinf(arms['B1024']['rN'])
  assert (report['aligned_range']['lo'], report['aligned_range']['hi']) == (256, 512)
  assert report['recommended']['batch'] == 512
  assert report['critic_grad_norm_slope'] == pytest.approx(-0.1, abs=0.01)
  for row in report['throughput']:
    assert row['source'].startswith('align runs')
    assert row['samples_per_s'] == pytest.approx(THROUGHPUT[row['batch']])
  with open(tmp_path / 'report.json') as f:
    saved = {a['name']: a for a in json.load(f)['arms']}
  assert saved['B1024']['rN'] is None and saved['B1024']['rN_status'] == 'not reached'
  assert 'did not reach the target' in report['summary']
