"""The protocol's report as numbers (report.json), built from a protocol workdir as
rljax.protocol.layout reads it; rljax.protocol.prose puts it in words (report.md) and
rljax.protocol.plots draws it."""
import json
import os

import numpy as np

from rljax import stats
from rljax.protocol import align
from rljax.protocol import calibration
from rljax.protocol import confirmation
from rljax.protocol import curves
from rljax.protocol import decision as decision_lib
from rljax.protocol import gradients
from rljax.protocol import layout
from rljax.protocol import mlperf
from rljax.protocol import mlperf_report
from rljax.protocol import prose


def _settings(protocol):
  return dict(window=int(protocol['smooth_window']), level=float(protocol['level']),
              tolerance=float(protocol['rn_tolerance']), n_draws=int(protocol['n_draws']),
              seed=int(protocol['seed']), warmup=int(protocol['throughput_warmup']))


def _targets(protocol, base_runs, window):
  """The report's targets (user-given, else by the rule of curves.targets_from_base); the primary
  one, on which the decision rests, is the middle one."""
  targets = [float(t) for t in protocol['targets']] or curves.targets_from_base(
      base_runs, protocol['target_fractions'], window)
  rule = 'given' if protocol['targets'] else (
      f"start + f x (top - start) of the base arm, f = {list(protocol['target_fractions'])}")
  if not targets:   # the base arm never rose: fall back to the stop target, stated
    targets, rule = [float(protocol['target'])], 'the stop target (the base arm did not rise)'
  return dict(targets=targets, primary=targets[len(targets) // 2], rule=rule)


def _own_throughput(runs, warmup):
  """Steady-state samples/s of each align run (the same rule as the throughput rounds)."""
  values = []
  for r in runs:
    per_step = np.diff(np.concatenate([[0.0], r['train']['samples']]))
    values.append(stats.steady_throughput(per_step, r['train']['step_time_s'], warmup))
  return values


def _noise_terms(runs, window):
  """Per run, the four noise-scale columns over the matched sample window."""
  lo, hi = window
  keep = lambda r: (r['train']['samples'] > lo) & (r['train']['samples'] <= hi)
  return [[r['train'][k][keep(r)] for k in stats.NOISE_KEYS] for r in runs
          if all(k in r['train'] for k in stats.NOISE_KEYS)]


def _median_in_window(runs, key, window):
  lo, hi = window
  values = np.concatenate([r['train'][key][(r['train']['samples'] > lo) &
                                           (r['train']['samples'] <= hi)]
                           for r in runs if key in r['train']] or [np.zeros(0)])
  values = values[np.isfinite(values)]
  return float(np.median(values)) if len(values) else np.nan


def _rn_at(base_n, arm, per_seed, target, settings):
  """rN of an arm against the base from per-seed samples to one target, with interval and
  alignment."""
  result = align.rn_interval(base_n, per_seed, settings['level'],
                             [curves.samples_reached(r) for r in arm['runs']])
  geo = stats.log_mean_interval(per_seed) if np.isfinite(per_seed).all() else {'mean': np.inf}
  return dict(target=target, samples_to_target=geo['mean'], samples_to_target_per_seed=per_seed,
              rN=result['rN'], rN_ci=[result['lo'], result['hi']], rN_df=result['df'],
              rN_status=result['status'],
              alignment=align.alignment(result['lo'], result['hi'], settings['tolerance']))


def _crossings(runs, target, settings):
  return [curves.to_target(r, target, settings['window']) for r in runs]


def _stretched(runs, target, settings, shape):
  """Samples to target per seed from the whole curve (curves.log_stretch); crossings when the
  base arm has no curve shape to stretch."""
  if shape is None:
    return _crossings(runs, target, settings)
  return curves.stretch_samples_to_target(runs, shape, target, settings['window'])


def _arm_summary(arm, base, targets, settings, window, shape):
  spec, runs, primary_target = arm['spec'], arm['runs'], targets['primary']
  per_target = [_rn_at(_crossings(base['runs'], t, settings), arm,
                       _crossings(runs, t, settings), t, settings) for t in targets['targets']]
  primary = _rn_at(_stretched(base['runs'], primary_target, settings, shape), arm,
                   _stretched(runs, primary_target, settings, shape), primary_target, settings)
  wallclock = [curves.wallclock_to_target(r, primary_target, settings['window']) for r in runs]
  noise = stats.noise_scale_interval(_noise_terms(runs, window), rng=settings['seed'],
                                     level=settings['level'])
  own = _own_throughput(runs, settings['warmup'])
  return dict(
      {k: spec.get(k) for k in ('name', 'batch', 'value', 'P', 'G', 'lr', 'lr_rule')},
      control=bool(spec['control']), base=arm is base, n_seeds=len(runs),
      seeds_reached=int(np.isfinite(primary['samples_to_target_per_seed']).sum()),
      **{k: v for k, v in primary.items() if k != 'target'},
      steps_to_target=float(np.mean([curves.to_target(r, primary_target, settings['window'],
                                                     'step') for r in runs])),
      wallclock_to_target_s=float(np.mean(wallclock)), per_target=per_target,
      grad_norm_median=_median_in_window(runs, 'grad_norm', window),
      critic_grad_norm_median=_median_in_window(runs, 'critic_grad_norm', window),
      noise_scale=noise['value'], noise_scale_ci=[noise['lo'], noise['hi']],
      own_throughput_per_seed=own, own_throughput=stats.throughput_interval(own, settings['level']))


def _matched_sample_window(arms):
  """(0, S]: S = the fewest samples any run logged, so every arm's gradients are summarised over
  the same stretch of training in samples (the grad norm drifts as the policy learns)."""
  ends = [r['train']['samples'][-1] for a in arms for r in a['runs'] if len(r['train']['samples'])]
  return (0.0, float(min(ends)) if ends else 0.0)


def _throughput_table(data, arms, settings):
  """Per batch: the throughput rounds when measured, else each align seed's own steady state."""
  table = {}
  for batch, records in data['throughput'].items():
    rounds = [r['samples_per_s'] for r in records]
    table[batch] = dict(batch=batch, source='throughput rounds', per_round=rounds,
                        rollout_time_s=float(np.median([r['rollout_time_s'] for r in records])),
                        update_time_s=float(np.median([r['update_time_s'] for r in records])),
                        **stats.throughput_interval(rounds, settings['level']))
  for a in arms:
    if a['batch'] not in table and not a['control']:
      rounds = a['own_throughput_per_seed']
      table[a['batch']] = dict(batch=a['batch'], source='align runs (one value per seed)',
                               per_round=rounds, rollout_time_s=np.nan, update_time_s=np.nan,
                               **stats.throughput_interval(rounds, settings['level']))
  return dict(sorted(table.items()))


def _decision(arms, throughput, base_batch, settings, per_seed):
  """The decision over the batches timed, with samples to target per seed from `per_seed(arm)`."""
  sqrt_arms = {a['batch']: a for a in arms if not a['control']}
  candidates = [dict(batch=b, throughput_rounds=t['per_round'],
                     samples_per_seed=per_seed(sqrt_arms[b]) if b in sqrt_arms else [])
                for b, t in throughput.items()]
  return decision_lib.decide(candidates, base_batch, settings['level'], settings['n_draws'],
                      settings['seed'])


def _decisions(arms, throughput, targets, base_batch, settings):
  """The decision (samples from the whole curve, at the primary target) and, as a check that it
  does not hang on one target or on the estimator, the decision from first crossings at each."""
  primary = dict(target=targets['primary'], method='stretch', **_decision(
      arms, throughput, base_batch, settings, lambda a: a['samples_to_target_per_seed']))
  by_crossing = [dict(target=t, method='first crossing', **_decision(
      arms, throughput, base_batch, settings,
      lambda a, i=i: a['per_target'][i]['samples_to_target_per_seed']))
                 for i, t in enumerate(targets['targets'])]
  return primary, by_crossing


def _calibration(data, settings):
  """lr0: the calibration's choice recomputed from its logs (rljax.protocol.calibration), beside
  calibration.json; the target is the setting (given) or placed on the runs' curves again."""
  choice = data['calibration_choice'] or {'lr0': None, 'source': 'not recorded'}
  runs = data['calibration']
  if not runs:
    return dict(choice, lrs=[])
  setting = data['protocol'].get('protocol', {})
  sweep = calibration.choose({a['spec']['lr']: a['runs'] for a in runs},
                             float(setting.get('target', data['protocol']['target'])),
                             setting.get('calibration_fraction', 0.5), settings['window'],
                             settings['level'], choice.get('calibration_budget'),
                             setting.get('calibration_ceiling', 0.0))
  return dict(choice, target=sweep['target'], target_rule=sweep['target_rule'],
              **({} if sweep['ceiling'] is None else dict(ceiling=sweep['ceiling'])),
              method=sweep['method'], recomputed_lr0=sweep['lr0'], at_edge=sweep['at_edge'],
              lrs=sweep['lrs'])


def _confirm(data, decision, targets, settings, throughput):
  """Measured time and samples to the primary target of the confirmation runs, per batch; the
  steady time counts the compiling steps at the steady step time, as the prediction does. The
  gap to the prediction splits into samples (predicted: seconds x the rounds' samples/s) and
  throughput (the runs' own steady samples/s over the rounds')."""
  rows = {c['batch']: c for c in decision['candidates']}
  result = []
  for arm in data['confirm']:
    batch, t, window = arm['spec']['batch'], targets['primary'], settings['window']
    measured = [curves.wallclock_to_target(r, t, window) for r in arm['runs']]
    steady = [curves.wallclock_to_target(r, t, window, settings['warmup']) for r in arm['runs']]
    predicted_s = rows.get(batch, {}).get('predicted_wallclock_s')
    rounds = throughput.get(batch, {}).get('mean', np.nan)
    own = stats.throughput_interval(_own_throughput(arm['runs'], settings['warmup']))['mean']
    samples = [curves.to_target(r, t, window) for r in arm['runs']]
    predicted_samples = predicted_s * rounds if predicted_s else None
    result.append(dict(batch=batch, n_seeds=len(arm['runs']), measured_wallclock_per_seed=measured,
                       measured_samples_per_seed=samples,
                       measured_wallclock_s=float(np.mean(measured)),
                       steady_wallclock_per_seed=steady, steady_wallclock_s=float(np.mean(steady)),
                       predicted_wallclock_s=predicted_s, predicted_samples=predicted_samples,
                       samples_vs_predicted=stats.log_mean_interval(samples)['mean'] /
                       predicted_samples if predicted_samples else np.nan,
                       throughput_vs_rounds=own / rounds))
  return sorted(result, key=lambda c: c['batch'])


def _confirmation_ratio(confirm, decision, base_batch, level):
  """The pick's measured seconds to target over the base's (steady, per seed), with Welch's
  t-interval on the logs (align.rn_interval on times), beside the predicted relative time:
  whether the measured ratio lies inside the decision's interval, and inside the range a
  confirmation of these seeds lands in if the prediction holds (confirmation.expected). The
  gap to the prediction splits into samples (the pick's over the base's, against the predicted
  ratio) and throughput (the base's runs' samples/s over the rounds', against the pick's)."""
  by_batch = {c['batch']: c for c in confirm}
  pick = decision_lib.to_confirm(decision)
  if pick == base_batch or pick not in by_batch or base_batch not in by_batch:
    return None
  base, chosen = by_batch[base_batch], by_batch[pick]
  ratio = align.rn_interval(base['steady_wallclock_per_seed'],
                            chosen['steady_wallclock_per_seed'], level)
  row = next(c for c in decision['candidates'] if c['batch'] == pick)
  lo, hi = row['relative_wallclock_ci']
  e_lo, e_hi, e_df = confirmation.expected(
      row['relative_wallclock'], [lo, hi], np.log(base['steady_wallclock_per_seed']),
      np.log(chosen['steady_wallclock_per_seed']), level)
  return dict(batch=pick, ratio=ratio['rN'], ci=[ratio['lo'], ratio['hi']], df=ratio['df'],
              predicted=row['relative_wallclock'], predicted_ci=[lo, hi],
              inside_predicted_ci=bool(lo <= ratio['rN'] <= hi),
              expected_ci=[e_lo, e_hi], expected_df=e_df,
              inside_expected_ci=bool(e_lo <= ratio['rN'] <= e_hi),
              gap=dict(total=ratio['rN'] / row['relative_wallclock'],
                       samples=chosen['samples_vs_predicted'] / base['samples_vs_predicted'],
                       throughput=base['throughput_vs_rounds'] / chosen['throughput_vs_rounds']))


def _samples_run(run):
  """Training samples a run spent: 0 for a run reused from another group (counted there)."""
  if run['reused'] or not len(run['train']['samples']):
    return 0.0
  return float(run['train']['samples'][-1])


def _cost(data, base_arm):
  """Training samples each phase spent; quick mode runs only calibration, base arm, throughput."""
  group = lambda name, only=None: sum((_samples_run(r) for a in data[name] for r in a['runs']
                                       if only is None or a['spec']['name'] == only), 0.0)
  cost = dict(calibration=group('calibration'), arms=group('arms'),
              base_arm=group('arms', base_arm), confirm=group('confirm'),
              throughput=float(sum(r['batch'] * (r['steps_measured'] + r['warmup_steps'])
                                   for records in data['throughput'].values() for r in records)))
  cost['full_sweep'] = cost['calibration'] + cost['arms'] + cost['throughput']
  cost['quick'] = cost['calibration'] + cost['base_arm'] + cost['throughput']
  cost['calibration_vs_arms'] = cost['calibration'] / cost['arms'] if cost['arms'] else np.nan
  eval_s = sum(np.nansum(r['eval'].get('eval_time_s', np.nan)) for a in data['arms']
               for r in a['runs'] if not r['reused'])
  if eval_s > 0:   # logged since rljax timed its evaluations; older archives rebuild unchanged
    train_s = sum(np.nansum(r['train']['step_time_s']) for a in data['arms'] for r in a['runs']
                  if not r['reused'])
    cost['arms_eval_share'] = float(eval_s / (eval_s + train_s))
  return cost


def _quick(raw_base, base, arms, throughput, settings):
  """The quick answer, from the base arm alone: every batch's rN predicted from its B_simple
  (decision.rn_from_noise_scale), and, where arms measured rN, whether each lies in the prediction's
  interval: the test of the noise-scale model's assumption."""
  terms = _noise_terms(raw_base['runs'], _matched_sample_window([raw_base]))
  noise = stats.noise_scale_interval(terms, rng=settings['seed'], level=settings['level'])
  decision = decision_lib.decide_from_noise_scale(
      [dict(batch=b, throughput_rounds=t['per_round']) for b, t in throughput.items()],
      base['batch'], base['samples_to_target'], noise['value'], noise['draws'], settings['level'],
      settings['n_draws'], settings['seed'])
  predicted = {c['batch']: c for c in decision['candidates'] if 'rN_predicted' in c}
  checks = []
  for a in arms:
    p = predicted.get(a['batch'])
    if a['base'] or a['control'] or p is None or a['rN_status'] != 'ok':
      continue
    lo, hi = p['rN_predicted_ci']
    checks.append(dict(batch=a['batch'], rN=a['rN'], rN_ci=a['rN_ci'], rN_predicted=p[
        'rN_predicted'], rN_predicted_ci=[lo, hi], consistent=bool(
            a['rN_ci'][0] <= hi and lo <= a['rN_ci'][1])))
  return dict(decision=decision, noise_scale=noise['value'],
              noise_scale_ci=[noise['lo'], noise['hi']], checks=checks)


def _gradients(arms, aligned):
  """Grad-norm slopes (over the aligned range, and over every sqrt batch), doubling ratios and the
  critical batch from the grad-norm curve."""
  sqrt_arms = [a for a in arms if not a['control']]
  inside = [a for a in sqrt_arms if a['batch'] in aligned['batches']]
  column = lambda rows, key: ([a['batch'] for a in rows], [a[key] for a in rows])
  return dict(
      grad_norm_fit_batches=sorted({a['batch'] for a in inside}),
      grad_norm_slope=gradients.grad_norm_slope(*column(inside, 'grad_norm_median')),
      grad_norm_slope_all=gradients.grad_norm_slope(*column(sqrt_arms, 'grad_norm_median')),
      critic_grad_norm_slope=gradients.grad_norm_slope(*column(inside, 'critic_grad_norm_median')),
      doubling_ratios=gradients.doubling_ratios(*column(sqrt_arms, 'grad_norm_median')),
      noise_scale_from_grad_norms=gradients.noise_scale_from_grad_norms(
          *column(sqrt_arms, 'grad_norm_median')))


def _controls(arms):
  """Each fixed-lr control's rN against the sqrt arm at the same batch (ratio of rNs)."""
  sqrt_by_batch = {a['batch']: a for a in arms if not a['control']}
  for a in arms:
    twin = sqrt_by_batch.get(a['batch']) if a['control'] else None
    a['rN_vs_same_batch_sqrt'] = (a['rN'] / twin['rN'] if twin and np.isfinite(twin['rN'])
                                  else np.nan)


def build(data):
  """The report, as a dict, from load_workdir's data (non-finite floats kept: inf = unbounded);
  under MLPerf's rules (protocol.mlperf) with MLPerf's terms beside the protocol's own."""
  if mlperf.rules_of(data['protocol'].get('protocol', {})) is None:
    return _protocol_report(data)
  report = _protocol_report(mlperf_report.protocol_view(data))
  return dict(report, mlperf=mlperf_report.build(data, report))


def _protocol_report(data):
  protocol, settings = data['protocol'], _settings(data['protocol'])
  base = next((a for a in data['arms'] if a['spec']['name'] == protocol['base_arm']), None)
  if base is None:
    raise ValueError(f"base arm {protocol['base_arm']!r} from protocol.json has no logged runs")
  targets = _targets(protocol, base['runs'], settings['window'])
  window = _matched_sample_window(data['arms'])
  shape = curves.fit_curve_shape(base['runs'])
  arms = [_arm_summary(a, base, targets, settings, window, shape) for a in data['arms']]
  arms.sort(key=lambda a: (a['control'], a['batch'], a['name']))
  _controls(arms)
  aligned = align.aligned_range(arms, settings['tolerance'])
  throughput = _throughput_table(data, arms, settings)
  quick = _quick(base, next(a for a in arms if a['base']), arms, throughput, settings)
  quick_mode = bool(protocol.get('protocol', {}).get('quick', False))
  if quick_mode:   # no arm but the base: the decision is the noise-scale one
    primary, decisions = dict(target=targets['primary'], method='noise scale',
                              **quick['decision']), []
  else:
    primary, decisions = _decisions(arms, throughput, targets, int(protocol['base_batch']),
                                    settings)
  report = dict(
      algo=protocol['algo'], stop_target=float(protocol['target']),
      **targets, base_arm=protocol['base_arm'], base_batch=int(protocol['base_batch']),
      level=settings['level'], smooth_window=settings['window'],
      curve_shape=shape, calibration=_calibration(data, settings), arms=arms,
      aligned_range=aligned,
      grad_norm_window_samples=list(window), **_gradients(arms, aligned),
      throughput=list(throughput.values()), decision=primary, decisions=decisions,
      recommended=primary['recommended'], confirm=_confirm(data, primary, targets, settings,
                                                           throughput),
      mode='quick' if quick_mode else 'full', quick=quick, cost=_cost(data, protocol['base_arm']),
      timing=data.get('timing') or {})
  report['confirmation_ratio'] = _confirmation_ratio(report['confirm'], primary,
                                                     report['base_batch'], settings['level'])
  confirm_plan = confirmation.plan(report, protocol.get('protocol', {}))
  if confirm_plan:   # only where protocol.confirm_power is set: earlier archives rebuild as run
    report['confirm_plan'] = confirm_plan
  report['summary'] = prose.summary(report)
  return report


def build_report(workdir):
  return build(layout.load_workdir(workdir))


def write_report(workdir, with_plots=True):
  """Writes report.json, report.md and the PNG plots into the workdir; returns the report."""
  data = layout.load_workdir(workdir)
  report = dict(build(data), plots=list(layout.PLOTS) if with_plots else [])
  with open(os.path.join(workdir, 'report.json'), 'w') as f:
    json.dump(layout.jsonable(report), f, indent=2)
  with open(os.path.join(workdir, 'report.md'), 'w') as f:
    f.write(prose.markdown(report, mlperf_report.markdown(report['mlperf'])
                           if 'mlperf' in report else ''))
  if 'mlperf' in report:
    mlperf_report.write_rcps(workdir, report['mlperf'])
  if with_plots:
    from rljax.protocol import plots  # pylint: disable=g-import-not-at-top  (matplotlib only here)
    plots.write_plots(workdir, data, report)
  return report
