"""rljax.protocol.mlperf_report on a synthetic workdir of the `mlperf,runlocal` preset, written in
the layout rljax.protocol.layout declares (evals on the protocol's grid and after every step from
each batch's validation start, runs stopped at the target + margin): MLPerf's numbers against
plain numpy recomputations from the raw logs."""
import itertools
import json
import math
import os

import numpy as np
import pytest

import synthetic_protocol as synth
from rljax.protocol import layout
from rljax.protocol import mlperf
from rljax.protocol import report as report_lib

RULES = mlperf.RULES['runlocal']
MODEL = synth.Model(start=0.46, rise=0.20, scale=9000.0, stop=RULES.target + 0.03,
                    max_samples=65_536, eval_every=2048, prompts=RULES.eval_prompts, seed_sd=0.1,
                    prompt_sd=0.0, fractions=(0.5,), samples_per_s=170.0)
TRUTH = {32: (1.0, 1.0), 64: (1.5, 1.0), 128: (2.2, 1.1), 256: (2.6, 1.3)}   # (gain, rN)
SEEDS = 6


def start(batch):   # the compliance checker's validation_start_samples, in numpy
  return batch * int(np.ceil(RULES.start_steps + RULES.start_samples / batch))


def write_workdir(root, rng):
  for batch, (gain, rn) in TRUTH.items():
    name = f'P{batch // 16}'
    layout.write(root, 'arm', dict(name=name, batch=batch, value=batch // 16, P=batch // 16, G=16,
                                   lr=mlperf.lr_at(RULES, batch), lr_rule='sqrt', control=False,
                                   clip=mlperf.clip_at(RULES, batch)), group='arms', arm=name)
    model = MODEL._replace(samples_per_s=MODEL.samples_per_s * gain)
    for seed in range(SEEDS):
      run_dir = layout.run_dir(root, 'arms', name, seed)
      synth.write_run(run_dir, batch, rn * np.exp(0.1 * rng.standard_normal()), rng,
                      MODEL.eval_every, model, MODEL.prompts, eval_from=start(batch))
      with open(os.path.join(run_dir, 'config.json'), 'w') as f:
        json.dump(dict(train=dict(micro_batch=batch // 2), model=dict(dtype='float32')), f)
    for r in range(3):
      value = model.samples_per_s * np.exp(0.05 * rng.standard_normal())
      layout.write(root, 'throughput', dict(
          batch=batch, round=r, samples_per_s=value, step_time_s=batch / value,
          rollout_time_s=0.0, update_time_s=batch / value, steps_measured=4, warmup_steps=2),
                   batch=batch, round=r)
  layout.write(root, 'calibration', dict(lr0=RULES.lr, source='given'))
  layout.write(root, 'protocol', dict(
      algo='grpo', target=RULES.target, targets=[RULES.target], target_fractions=[0.5],
      base_arm='P2', base_batch=32, rn_tolerance=0.2, smooth_window=3, level=0.95, n_draws=500,
      seed=0, throughput_warmup=2, protocol=dict(
          mlperf='runlocal', division='closed', eval_every_samples=MODEL.eval_every,
          target=RULES.target, quick=False)))


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('mlperf'))
  write_workdir(root, np.random.default_rng(0))
  return root


@pytest.fixture(scope='module')
def report(workdir):
  return report_lib.write_report(workdir, with_plots=False)


def raw_rows(run_dir):
  with open(os.path.join(run_dir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


def numpy_run(run_dir, batch):
  """(samples to converge, training seconds to it) from the raw rows, in plain numpy."""
  rows = raw_rows(run_dir)
  evals = [(r['samples'], r['eval_accuracy']) for r in rows if r.get('eval')]
  hits = [s for s, a in evals if s >= start(batch) and (s - start(batch)) % batch == 0
          and a > RULES.target]
  if not hits:
    return math.inf, math.inf
  times = np.array([r['step_time_s'] for r in rows if not r.get('eval')])
  times[:2] = times[2:].mean()   # the compiling steps at the steady step time
  return float(hits[0]), float(times[:hits[0] // batch].sum())


def numpy_score(seconds):
  """MLPerf's olympic mean of 3 runs (the median; a non-converged run dropped as the slowest),
  averaged over every choice of 3."""
  scores = [np.median(c) for c in itertools.combinations(seconds, 3) if np.isinf(c).sum() <= 1]
  return float(np.mean(scores))


def test_samples_and_seconds_to_converge_follow_mlperfs_rule(workdir, report):
  m = report['mlperf']
  assert [r['batch'] for r in m['batches']] == sorted(TRUTH)
  for row in m['batches']:
    b = row['batch']
    assert row['validation_start'] == start(b) and row['boundaries_missed'] == 0
    want = [numpy_run(layout.run_dir(workdir, 'arms', f'P{b // 16}', k), b) for k in range(SEEDS)]
    np.testing.assert_allclose(row['samples_per_run'], [w[0] for w in want])
    np.testing.assert_allclose(row['seconds_per_run'], [w[1] for w in want], rtol=1e-9)
    assert row['score_s'] == pytest.approx(numpy_score([w[1] for w in want]), rel=1e-9)
    done = np.sort([w[0] for w in want if np.isfinite(w[0])])
    assert row['rcp']['mean'] == pytest.approx(done[1:-1].mean())
    assert row['rcp']['stdev'] == pytest.approx(done.std())


def test_the_rcp_table_is_in_the_checkers_layout(workdir, report):
  m = report['mlperf']
  with open(os.path.join(workdir, 'rcps_qwen35_397b_grpo.json')) as f:
    written = json.load(f)
  assert written == json.loads(json.dumps(layout.jsonable(m['rcps'])))
  assert sorted(written) == sorted(f'qwen35_397b_grpo_ref_{b}' for b in TRUTH)
  for row in m['batches']:
    record = written[f"qwen35_397b_grpo_ref_{row['batch']}"]
    assert record['Benchmark'] == 'qwen35_397b_grpo' and record['BS'] == row['batch']
    assert record['Epochs to converge'] == [int(s) for s in row['samples_per_run']
                                            if math.isfinite(s)]
    assert record['Hyperparams'] == dict(
        opt_base_learning_rate=pytest.approx(8.85e-6 * math.sqrt(row['batch'] / 16)),
        opt_gradient_clip_norm=pytest.approx(0.125 * math.sqrt(256 / row['batch'])),
        num_prompts_per_step=row['batch'] // 16, num_generations_per_prompt=16,
        gradient_accumulation_steps=2)


def test_each_batch_is_checked_against_the_others_and_scored(report):
  m = report['mlperf']
  for row in m['batches']:
    check = row['rcp_check']
    assert check['passed'] == (check['reference'] is not None and
                               check['mean'] >= check['reference']['min_mean'])
    assert row['score_scaled_s'] == pytest.approx(row['score_s'] * check['scale'])
  first = m['batches'][0]['rcp_check']
  assert first['how'] == 'the smallest RCP (none below this batch)'
  assert first['reference'] == m['batches'][1]['rcp']
  assert m['batches'][-1]['rcp_check']['how'].startswith('missing RCP')
  for row in m['batches'][1:-1]:   # on the line between the RCPs below and above its batch
    assert row['rcp_check']['how'] == 'RCP interpolation'
    assert row['rcp_check']['reference']['batch'] == row['batch']
  passing = [r for r in m['batches'] if r['rcp_check']['passed']]
  assert m['fastest'] == min(passing, key=lambda r: r['score_scaled_s'])['batch']


def test_report_md_states_mlperfs_terms_beside_the_protocols(workdir, report):
  with open(os.path.join(workdir, 'report.md')) as f:
    text = f.read()
  section = text[text.index("## MLPerf's terms"):text.index('## Plots')]
  assert text.index('## Decision') < text.index("## MLPerf's terms")
  assert 'B x ceil(2.5 + 10240 / B)' in section and 'exceeds 0.6' in section
  assert 'mlperf_logging/result_summarizer/result_summarizer.py' in section
  assert f"the protocol recommends batch {report['recommended']}" in section
  assert section.count('\n| ') == 1 + len(TRUTH)   # the header and a row per batch


def test_the_protocols_own_analysis_reads_its_grid_and_each_runs_last_eval(workdir, report,
                                                                         tmp_path):
  """The same runs with only the grid evals and each run's last: the same protocol report."""
  thin = tmp_path / 'thin'
  for dirpath, _, files in os.walk(workdir):
    for name in files:
      src = os.path.join(dirpath, name)
      dst = thin / os.path.relpath(src, workdir)
      dst.parent.mkdir(parents=True, exist_ok=True)
      rows = raw_rows(dirpath) if name == 'metrics.jsonl' else None
      if rows is None:
        dst.write_bytes(open(src, 'rb').read())
        continue
      last = max(i for i, r in enumerate(rows) if r.get('eval'))
      kept = [r for i, r in enumerate(rows) if not r.get('eval') or i == last
              or r['samples'] % MODEL.eval_every == 0]
      dst.write_text(''.join(json.dumps(r) + '\n' for r in kept))
  protocol = json.loads((thin / 'protocol.json').read_text())
  protocol['protocol']['mlperf'] = ''
  (thin / 'protocol.json').write_text(json.dumps(protocol))
  plain = report_lib.build_report(str(thin))
  assert 'mlperf' not in plain
  for a, b in zip(report['arms'], plain['arms']):
    assert a['samples_to_target_per_seed'] == pytest.approx(b['samples_to_target_per_seed'])
  assert report['recommended'] == plain['recommended']
