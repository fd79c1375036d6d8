"""rljax.protocol.report, layout and prose on synthetic protocol workdirs whose answers are known,
written through the schema that rljax.protocol.driver writes with; and the
`python -m rljax.analysis` CLI."""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rljax.protocol import layout
from rljax.protocol import report as report_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOP_TARGET = 0.75


def curve(stretch=1.0):
  """A saturating learning curve against samples; stretch=s needs s times the samples."""
  return lambda n: 0.3 + 0.6 * (1 - np.exp(-np.asarray(n, float) / (20_000 * stretch)))


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


def write_run(run_dir, batch, stretch, rng, budget=60_000, ppo=False, seed_sd=0.03):
  """metrics.jsonl in the trainer's format for a curve stretched in samples, evaluated every 1024
  samples; ppo=True logs a critic grad norm that barely falls with batch."""
  os.makedirs(run_dir)
  acc_fn = curve(stretch * np.exp(seed_sd * rng.standard_normal()))
  rows = []
  for step in range(budget // batch + 1):
    samples = step * batch
    if step:
      b_small = batch / 4
      rows.append({
          'step': step, 'samples': samples, 'tokens': 10 * samples, 'reward_mean': 0.5,
          'lr': 1e-4, 'grad_norm': 3 * batch**-0.5 * np.exp(0.05 * rng.standard_normal()),
          'step_time_s': batch / THROUGHPUT[batch], 'rollout_time_s': 0.3 * batch / 1000,
          'update_time_s': 0.7 * batch / 1000,
          'grad_sq_small': GRAD_SQ * (1 + B_SIMPLE / b_small) * (1 + 0.1 * rng.standard_normal()),
          'grad_sq_big': GRAD_SQ * (1 + B_SIMPLE / batch), 'b_small': b_small, 'b_big': batch,
      })
      if ppo:
        rows[-1]['critic_grad_norm'] = 2 * batch**-0.1
    if samples % 1024 == 0:
      rows.append({'step': step, 'samples': samples, 'eval': True,
                   'eval_accuracy': float(acc_fn(samples))})
  with open(os.path.join(run_dir, 'metrics.jsonl'), 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in rows)


def protocol_record(**changes):
  return dict(dict(algo='grpo', target=STOP_TARGET, targets=[], target_fractions=[0.3, 0.5, 0.7],
                   base_arm='P16', base_batch=128, rn_tolerance=0.1, smooth_window=3, level=0.95,
                   n_draws=2000, seed=0, throughput_warmup=1), **changes)


def write_arm(root, group, name, p, rule, control, lr, seeds, stretch, rng, **kw):
  layout.write(root, 'arm', dict(name=name, value=p, P=p, G=8, batch=8 * p, lr=lr,
                                     lr_rule=rule, control=control), group=group, arm=name)
  for seed in seeds:
    write_run(layout.run_dir(root, group, name, seed), 8 * p, stretch, rng, **kw)


def write_workdir(root):
  """lr0 calibration (3 lrs, the middle best), 5 arms x 3 seeds, 3 throughput rounds, confirm."""
  rng = np.random.default_rng(0)
  for lr, stretch in ((2.5e-5, 1.5), (5e-5, 1.0), (1e-4, 1.3)):
    write_arm(root, 'calibration', f'lr{lr:g}', 16, 'sqrt', False, lr, range(2), stretch, rng)
  layout.write(root, 'calibration', dict(lr0=5e-5, source='calibrated'))
  for name, (p, rule, stretch, control) in ARMS.items():
    lr = 5e-5 * (np.sqrt(p / 16) if rule == 'sqrt' else 1.0)
    write_arm(root, 'arms', name, p, rule, control, lr, range(3), stretch, rng)
  for r in range(3):
    for batch, thr in THROUGHPUT.items():
      value = thr * np.exp(0.02 * rng.standard_normal())
      layout.write(root, 'throughput', dict(
          batch=batch, round=r, samples_per_s=value, step_time_s=batch / value,
          rollout_time_s=0.3 * batch / 1000, update_time_s=0.7 * batch / 1000, steps_measured=4,
          warmup_steps=1), batch=batch, round=r)
  layout.write(root, 'protocol', protocol_record())
  for name, p in (('P16', 16), ('P32', 32)):
    write_arm(root, 'confirm', name, p, 'sqrt', False, 5e-5, (3, 4), 1.0, rng)
  return root


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  return write_workdir(str(tmp_path_factory.mktemp('protocol')))


def test_load_run_splits_and_dedupes(tmp_path):
  rows = [
      {'step': 0, 'samples': 0, 'eval': True, 'eval_accuracy': 0.25},
      {'step': 1, 'samples': 8, 'grad_norm': 9.0, 'step_time_s': 1.0},
      {'step': 1, 'samples': 8, 'grad_norm': 2.0, 'step_time_s': 1.0},  # re-logged on resume
      {'step': 2, 'samples': 16, 'grad_norm': 3.0, 'step_time_s': 1.0, 'critic_grad_norm': 4.0},
      {'step': 2, 'samples': 16, 'eval': True, 'eval_accuracy': 0.75},
  ]
  text = ''.join(json.dumps(r) + '\n' for r in rows) + '{"step": 3, "sam'  # torn last line
  (tmp_path / 'metrics.jsonl').write_text(text)
  run = layout.load_run(str(tmp_path))
  np.testing.assert_array_equal(run['train']['step'], [1, 2])
  np.testing.assert_array_equal(run['train']['grad_norm'], [2.0, 3.0])
  assert np.isnan(run['train']['critic_grad_norm'][0])
  np.testing.assert_array_equal(run['eval']['eval_accuracy'], [0.25, 0.75])
  assert 'eval_accuracy' not in run['train']


def test_schema_refuses_a_record_without_its_declared_fields(tmp_path):
  with pytest.raises(ValueError, match=r"lacks \['round'"):
    layout.write(str(tmp_path), 'throughput', {'batch': 8}, batch=8, round=0)
  layout.write(str(tmp_path), 'calibration', {'lr0': 1e-4, 'source': 'given'})
  assert layout.read(str(tmp_path), 'calibration')['lr0'] == 1e-4
  assert layout.read(str(tmp_path), 'protocol') is None
  with open(layout.path(str(tmp_path), 'protocol'), 'w') as f:
    json.dump({'algo': 'grpo'}, f)
  with pytest.raises(ValueError, match='lacks'):
    layout.read(str(tmp_path), 'protocol')


def test_build_report_end_to_end(workdir):
  report = report_lib.build_report(workdir)
  arms = {a['name']: a for a in report['arms']}
  start, top = 0.3, min(curve(1.0)(60_000), 0.9)
  assert report['targets'] == pytest.approx([start + f * (top - start) for f in (0.3, 0.5, 0.7)],
                                            abs=0.02)
  assert report['primary'] == report['targets'][1]
  assert arms['P16']['base'] and arms['P16']['rN'] == 1.0
  assert abs(arms['P32']['rN'] - 1) < 0.06 and arms['P32']['alignment'] == 'aligned'
  assert arms['P64']['rN'] == pytest.approx(1.6, rel=0.05)
  assert arms['P64']['rN_ci'][0] > 1.1 and arms['P64']['alignment'] == 'not aligned'
  assert arms['P32_fixed_lr']['rN_vs_same_batch_sqrt'] == pytest.approx(1.5, rel=0.07)
  assert len(arms['P64']['per_target']) == 3
  aligned = report['aligned_range']
  assert aligned['batches'] == [128, 256] and aligned['status'][512] == 'not aligned'
  assert aligned['undetermined'] == [64]   # rN 1.06 [0.99, 1.14] straddles the band's edge 1.1
  assert report['grad_norm_slope_all']['slope'] == pytest.approx(-0.5, abs=0.05)
  assert report['grad_norm_slope_all']['df'] == 2
  noise = arms['P16']
  assert noise['noise_scale'] == pytest.approx(B_SIMPLE, rel=0.15)
  assert noise['noise_scale_ci'][0] < noise['noise_scale'] < noise['noise_scale_ci'][1]
  assert arms['P32']['own_throughput']['median'] == pytest.approx(THROUGHPUT[256])
  calibration = report['calibration']
  assert calibration['lr0'] == calibration['recomputed_lr0'] == 5e-5
  assert [r['lr'] for r in calibration['lrs']] == [2.5e-5, 5e-5, 1e-4]
  # 1.3x throughput at 256 with rN ~ 1 wins; 1.5x at 512 loses to rN 1.6; 1024 has no rN.
  decision = report['decision']
  assert decision['verdict'] == 'faster' and report['recommended'] == 256
  rows = {c['batch']: c for c in decision['candidates']}
  assert rows[256]['relative_wallclock'] == pytest.approx(1 / 1.3, rel=0.07)
  assert rows[256]['p_fastest'] > 0.9 and 'not in the align sweep' in rows[1024]['why_not']
  assert [c['batch'] for c in report['confirm']] == [128, 256]
  confirm = report['confirm'][1]
  assert confirm['measured_wallclock_s'] == pytest.approx(confirm['predicted_wallclock_s'],
                                                          rel=0.15)
  assert confirm['steady_wallclock_s'] == pytest.approx(confirm['predicted_wallclock_s'], rel=0.15)
  base_s, pick_s = (np.log(c['steady_wallclock_per_seed']) for c in report['confirm'])
  ratio = report['confirmation_ratio']   # Welch on log seconds, here computed by hand
  var = base_s.var(ddof=1) / len(base_s) + pick_s.var(ddof=1) / len(pick_s)
  assert ratio['batch'] == 256 and ratio['ratio'] == pytest.approx(
      np.exp(pick_s.mean() - base_s.mean()), rel=1e-12)
  assert ratio['ci'][0] < ratio['ratio'] < ratio['ci'][1] and np.log(
      ratio['ci'][1] / ratio['ratio']) >= 1.96 * np.sqrt(var)   # t quantile >= the normal's
  assert confirm['throughput_vs_rounds'] == pytest.approx(1.0, rel=0.1)
  gap, base_confirm = ratio['gap'], report['confirm'][0]
  assert gap['total'] == pytest.approx(ratio['ratio'] / ratio['predicted'], rel=1e-12)
  assert gap['throughput'] == pytest.approx(base_confirm['throughput_vs_rounds'] /
                                            confirm['throughput_vs_rounds'], rel=1e-12)
  geo = lambda c: np.exp(np.mean(np.log(c['measured_samples_per_seed']))) / c['predicted_samples']
  assert gap['samples'] == pytest.approx(geo(confirm) / geo(base_confirm), rel=1e-9)
  assert ratio['expected_ci'][0] < ratio['predicted'] < ratio['expected_ci'][1]
  assert ratio['inside_expected_ci'] == (ratio['expected_ci'][0] <= ratio['ratio'] <=
                                         ratio['expected_ci'][1])
  # The quick answer: rN from the base arm's B_simple alone, and its cost beside the sweep's.
  quick = report['quick']
  b = quick['noise_scale']
  assert b == pytest.approx(B_SIMPLE, rel=0.15)
  predicted = {c['batch']: c['rN_predicted'] for c in quick['decision']['candidates']
               if 'rN_predicted' in c}
  assert predicted[512] == pytest.approx((1 + 512 / b) / (1 + 128 / b), rel=1e-12)
  assert {c['batch'] for c in quick['checks']} == {64, 256, 512}   # every sqrt arm but the base
  cost, logged = report['cost'], lambda group: sum(
      float(json.loads(line)['samples']) for path in glob.glob(
          os.path.join(workdir, group, '*', 'seed_*', 'metrics.jsonl'))
      for line in open(path).readlines()[-1:])
  assert cost['arms'] == logged('arms') and cost['calibration'] == logged('calibration')
  assert cost['quick'] == cost['calibration'] + cost['base_arm'] + cost['throughput']


@pytest.mark.e2e
def test_cli_rebuilds_the_report_files(workdir):
  result = subprocess.run([sys.executable, '-m', 'rljax.analysis', f'--workdir={workdir}'],
                          cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr
  assert 'recommended batch: 256' in result.stdout
  with open(os.path.join(workdir, 'report.json')) as f:
    report = json.load(f)  # strict JSON: no NaN / Infinity literals
  for arm in report['arms']:
    assert {'batch', 'lr', 'samples_to_target', 'rN', 'rN_ci', 'alignment', 'per_target',
            'noise_scale', 'noise_scale_ci', 'grad_norm_median'} <= set(arm)
  assert {'calibration', 'targets', 'aligned_range', 'grad_norm_slope', 'throughput',
          'decision', 'recommended', 'confirm'} <= set(report)
  for plot in layout.PLOTS:
    assert os.path.getsize(os.path.join(workdir, plot)) > 1000
  with open(os.path.join(workdir, 'report.md')) as f:
    markdown = f.read()
  assert '| arm | batch |' in markdown and 'Batch 256 is faster than the base 128' in markdown


@pytest.mark.parametrize('make', ['missing', 'empty'])
@pytest.mark.e2e
def test_cli_fails_clearly_on_a_bad_workdir(tmp_path, make):
  path = tmp_path / 'nothing' if make == 'missing' else tmp_path
  result = subprocess.run([sys.executable, '-m', 'rljax.analysis', f'--workdir={path}'],
                          cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
  assert result.stderr.strip().startswith('rljax.analysis: error:')
  assert ('does not exist' if make == 'missing' else 'no arms') in result.stderr


def test_report_with_an_unreached_arm_and_no_throughput_rounds(tmp_path):
  """PPO-like, lr0 given: throughput from the align runs' own steps (one value per seed)."""
  rng, root = np.random.default_rng(1), str(tmp_path)
  for batch, stretch in ((256, 1.0), (512, 1.0), (1024, 100.0)):
    layout.write(root, 'arm', dict(name=f'B{batch}', value=batch, batch=batch, lr=1e-4,
                                       lr_rule='sqrt', control=False), group='arms',
                     arm=f'B{batch}')
    for seed in range(3):   # Welch's interval at 2 + 2 seeds has df 1: nothing aligns
      write_run(layout.run_dir(root, 'arms', f'B{batch}', seed), batch, stretch, rng,
                ppo=True)
  layout.write(root, 'calibration', dict(lr0=1e-4, source='given'))
  layout.write(root, 'protocol', protocol_record(algo='ppo', base_arm='B256', base_batch=256,
                                                     targets=[0.5, 0.6, 0.7]))
  report = report_lib.write_report(root, with_plots=False)
  arms = {a['name']: a for a in report['arms']}
  assert report['targets'] == [0.5, 0.6, 0.7] and report['rule'] == 'given'
  assert arms['B1024']['rN_status'] == 'not reached' and np.isinf(arms['B1024']['rN'])
  assert report['critic_grad_norm_slope']['slope'] == pytest.approx(-0.1, abs=0.01)
  for row in report['throughput']:
    assert row['source'].startswith('align runs') and row['rounds'] == 3
  rows = {c['batch']: c for c in report['decision']['candidates']}
  assert 'did not reach' in rows[1024]['why_not']
  assert report['decision']['verdict'] in ('faster', 'within noise', 'base fastest')
  with open(tmp_path / 'report.json') as f:
    saved = {a['name']: a for a in json.load(f)['arms']}
  assert saved['B1024']['rN'] is None and saved['B1024']['rN_status'] == 'not reached'
  assert 'lr0 = 0.0001 was given' in report['summary']
  assert 'did not reach it' in report['summary']
