"""The protocol's report in MLPerf's terms (docs/guide/mlperf.md), beside its own, for a workdir run
under MLPerf's rules (protocol.mlperf): per batch each run's samples to converge as MLPerf counts
them, the RCP record they make (rljax.protocol.rcp), whether the batch's runs would pass the RCP
check against the other batches' records, and the time to train as MLPerf aggregates it.

MLPerf's time to train (mlperf_logging/result_summarizer/result_summarizer.py,
_compute_strong_score_standalone and _compute_olympic_average; the count of runs in
mlperf_logging/benchmark_meta.py): each run's minutes from run_start to run_stop, then the olympic
mean over the submission's runs (3 for qwen35_397b_grpo): sorted, the fastest and the slowest
dropped, a run that did not converge counting as the slowest dropped (two fail the submission);
times the RCP check's scaling factor. Here a run's time is its training seconds to its convergence
point, compiling steps at its steady step time (MLPerf's untimed initialisation may compile) and
evaluations left out (their cost is the eval set's, not MLPerf's); with more seeds than a
submission has runs, the score is the mean over every choice of that many of them.
"""
import itertools
import math
import os

import numpy as np

from rljax import files
from rljax.protocol import curves
from rljax.protocol import layout
from rljax.protocol import mlperf
from rljax.protocol import prose
from rljax.protocol import rcp

num = prose._num  # pylint: disable=protected-access  (report.md's number format)


def count(x):
  """Samples as MLPerf logs them: whole numbers (k-rounding would hide the RCP margins)."""
  return 'not converged' if x == math.inf else num(x, '.0f')


SOURCES = (
    'mlperf_logging/compliance_checker/training_6.1.0/closed_qwen35_397b_grpo.yaml',
    'mlperf_logging/rcp_checker/rcp_checker.py',
    'mlperf_logging/rcp_checker/training_6.1.0/rcps_qwen35_397b_grpo.json',
    'mlperf_logging/result_summarizer/result_summarizer.py',
    'mlperf_logging/benchmark_meta.py')


def protocol_view(data):
  """The runs as the protocol's own analysis reads them under MLPerf's rules: the evals on its
  sample grid (every eval_every_samples) and each run's last, which stopped it. MLPerf validates
  after every step from a start that depends on the batch; smoothing those evals would span fewer
  samples at a smaller batch, so every arm is smoothed on one grid as without the rules."""
  every = data['protocol']['protocol']['eval_every_samples']

  def thin(run):
    ev = run['eval']
    n = len(ev['samples'])
    keep = (ev['samples'] % every == 0) | (np.arange(n) == n - 1)
    return dict(run, eval={k: v[keep] if len(v) == n else v for k, v in ev.items()})

  return dict(data, **{group: [dict(arm, runs=[thin(r) for r in arm['runs']])
                               for arm in data[group]] for group in layout.GROUPS})


def converged_at(run, batch, start, target):
  """MLPerf's samples to converge: those of the run's first validation (an eval at start + k x
  batch samples) whose accuracy exceeds the target; inf when none does."""
  x, y = curves.eval_xy(run, 'samples')
  at = (x >= start) & ((x - start) % batch == 0) & (y > target)
  return float(x[at][0]) if at.any() else math.inf


def boundaries_missed(run, batch, start, until):
  """Validation boundaries from `start` to `until` (the run's last eval when inf) without an eval:
  where the run was evaluated more coarsely than MLPerf validates."""
  x, _ = curves.eval_xy(run, 'samples')
  last = until if math.isfinite(until) else (x[-1] if len(x) else 0.0)
  return int(len(np.setdiff1d(np.arange(start, last + 1, batch), x)))


def submission_score(seconds, runs):
  """(MLPerf's score of a submission of `runs` of these runs, averaged over every choice of them;
  the share of choices that score): olympic mean, inf for a run that did not converge."""
  choices = list(itertools.combinations(seconds, runs))
  scores = [rcp.olympic_mean(c) for c in choices
            if sum(not math.isfinite(s) for s in c) <= rcp.DROPPED]
  return (float(np.mean(scores)) if scores else math.nan,
          len(scores) / len(choices) if choices else 0.0)


def _run_config(arm):
  """The first run's config.json (the arm's training config), or {} when not kept."""
  runs = [r for r in arm['runs'] if os.path.isfile(os.path.join(r['dir'], 'config.json'))]
  return files.read_json(os.path.join(runs[0]['dir'], 'config.json')) if runs else {}


def _hyperparams(spec, config):
  """The RCP record's Hyperparams, in the compliance checker's names."""
  micro = config.get('train', {}).get('micro_batch')
  return dict(opt_base_learning_rate=spec['lr'], opt_gradient_clip_norm=spec.get('clip'),
              num_prompts_per_step=spec.get('P'), num_generations_per_prompt=spec.get('G'),
              gradient_accumulation_steps=spec['batch'] // micro if micro else None)


def _batch_row(arm, rules, target, warmup):
  """One batch: each run's samples and seconds to converge, and their RCP record."""
  spec, batch = arm['spec'], arm['spec']['batch']
  start = mlperf.start_at(rules, batch)
  samples = [converged_at(r, batch, start, target) for r in arm['runs']]
  seconds = [float(curves.wallclock_at(r, s, warmup)) if math.isfinite(s) else math.inf
             for r, s in zip(arm['runs'], samples)]
  done = [s for s in samples if math.isfinite(s)]
  score, scored = submission_score(seconds, rules.runs)
  config = _run_config(arm)
  return dict(
      batch=batch, validation_start=start, samples_per_run=samples, seconds_per_run=seconds,
      runs=len(samples), converged=len(done), score_s=score, scored_share=scored,
      boundaries_missed=sum(boundaries_missed(r, batch, start, s)
                            for r, s in zip(arm['runs'], samples)),
      hyperparams=_hyperparams(spec, config),
      precision=str(config.get('model', {}).get('dtype', 'not recorded')).upper(),
      rcp=rcp.record(batch, done, rules.runs) if len(done) > 2 * rcp.DROPPED else None)


def rcp_json(rows, rules):
  """The batches' RCP records in the layout of mlperf_logging/rcp_checker/training_6.1.0/
  rcps_<benchmark>.json (what its --custom_rcps reads): converged runs only. Nothing in it names
  the workdir's path, so the records rebuilt from a moved workdir are the same."""
  return {f"{rules.benchmark}_ref_{r['batch']}": {
      'Benchmark': rules.benchmark, 'Creator': 'rljax protocol',
      'When': 'the align runs of a protocol workdir',
      'Platform': 'not recorded', 'Precision': r['precision'], 'BS': r['batch'],
      'Hyperparams': r['hyperparams'],
      'Epochs to converge': [int(s) for s in r['samples_per_run'] if math.isfinite(s)]}
          for r in rows if r['converged']}


def _checks(rows, rules):
  """Each batch's runs checked as a submission against the other batches' RCP records."""
  for row in rows:
    others = [r['rcp'] for r in rows if r is not row and r['rcp']]
    check = rcp.check(row['batch'], row['samples_per_run'], others, rules.runs)
    row.update(rcp_check=check, score_scaled_s=row['score_s'] * check['scale'])
  return rows


def build(data, report):
  """report['mlperf']: MLPerf's terms for the workdir `data` (all evals, layout.load_workdir) whose
  protocol report is `report`."""
  setting = data['protocol']['protocol']
  rules = mlperf.rules_of(setting)
  target = setting.get('target') or rules.target   # the rules' unless an open run gave its own
  arms = [a for a in data['arms'] if not a['spec']['control']]
  rows = _checks([_batch_row(a, rules, target, int(data['protocol']['throughput_warmup']))
                  for a in sorted(arms, key=lambda a: a['spec']['batch'])], rules)
  scored = [r for r in rows if np.isfinite(r['score_scaled_s']) and r['rcp_check']['passed']]
  return dict(
      rules=setting['mlperf'], benchmark=rules.benchmark, division=setting['division'],
      target=target, reference_batch=rules.batch, lr=rules.lr, clip=rules.clip,
      start_steps=rules.start_steps, start_samples=rules.start_samples, runs=rules.runs,
      batches=rows, rcps=rcp_json(rows, rules), sources=list(SOURCES),
      fastest=min(scored, key=lambda r: r['score_scaled_s'])['batch'] if scored else None,
      protocol_recommended=report['recommended'])


def _check_cell(check):
  verdict = 'passes' if check['passed'] else 'fails'
  ref = check['reference']
  against = f" (mean {count(ref['mean'])}, fastest acceptable {count(ref['min_mean'])})" if ref \
      else ''
  scale = f", scaled x{check['scale']:.3f}" if check['scale'] > 1 else ''
  return f"{verdict}: {check['how']}{against}{scale}"


def _table(m):
  rows = ['| batch | lr | clip | validation start | converged | samples to converge per run | '
          'RCP mean (olympic) [stdev] | fastest acceptable mean | RCP check against the other '
          f"batches | training s per run | time to train ({m['runs']}-run olympic, scaled) |",
          '|' + '---|' * 11]
  for r in m['batches']:
    record, hp = r['rcp'] or dict(mean=math.nan, stdev=math.nan, min_mean=math.nan), \
        r['hyperparams']
    seconds = ', '.join(count(t) if t == math.inf else num(t, '.4g') for t in r['seconds_per_run'])
    rows.append(
        f"| {r['batch']} | {num(hp['opt_base_learning_rate'])} | "
        f"{num(hp['opt_gradient_clip_norm'])} | {count(r['validation_start'])} | "
        f"{r['converged']}/{r['runs']} | {', '.join(count(s) for s in r['samples_per_run'])} | "
        f"{count(record['mean'])} [{count(record['stdev'])}] | "
        f"{count(record['min_mean'])} | {_check_cell(r['rcp_check'])} | "
        f"{seconds} | {num(r['score_scaled_s'], '.4g')} |")
  return rows


def _sentences(m):
  """How the numbers were counted, with their sources, and what MLPerf's score favours."""
  missed = sum(r['boundaries_missed'] for r in m['batches'])
  text = (f"MLPerf {m['benchmark']} ({m['division']} division, rules '{m['rules']}'): a run "
          f"converges at its first validation whose accuracy exceeds {m['target']:g}; validations "
          f"come after every step from B x ceil({m['start_steps']:g} + {m['start_samples']:g} / "
          "B) samples on. An RCP's mean drops its fastest and slowest run; a batch's runs pass "
          "the RCP check when their olympic mean is no faster than the fastest mean a one-sided "
          't-test at 0.05 accepts against the other batches\' pruned RCPs (at its batch or '
          "interpolated). Time to train: each run's training seconds to its convergence point, "
          f"aggregated as MLPerf scores a submission of {m['runs']} runs (olympic mean: the "
          'fastest and slowest dropped), averaged over every choice of runs, times the RCP '
          'scaling factor. Sources (github.com/mlcommons/logging): ' + ', '.join(m['sources']) +
          '.')
  if missed:
    text += (f' {missed} validation boundaries before the runs converged have no eval (the runs '
             'were evaluated more coarsely than MLPerf validates): samples to converge are upper '
             'bounds there.')
  if m['fastest'] is not None:
    text += (f" By MLPerf's score, batch {m['fastest']} trains fastest among the batches that "
             f"pass; the protocol recommends batch {m['protocol_recommended']} (its interval is in "
             "the decision above; MLPerf's score is a point).")
  return text


def markdown(m):
  return ("## MLPerf's terms\n\n" + '\n'.join(_table(m)) + '\n\n' + _sentences(m) +
          f"\n\nRCP records: `rcps_{m['benchmark']}.json` (the rcp_checker's layout).\n\n")


def write_rcps(workdir, m):
  """D/rcps_<benchmark>.json: the records, for mlperf_logging.rcp_checker --custom_rcps."""
  files.write_json_atomic(os.path.join(workdir, f"rcps_{m['benchmark']}.json"),
                                layout.jsonable(m['rcps']))
