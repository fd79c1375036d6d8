"""The protocol's directory (one declared schema, written by rljax.protocol.driver and read back here) and
the report built from it: numbers (report.json) and words (report.md).

Layout of a protocol workdir D (SCHEMA names each JSON file and the fields it must hold):
  D/protocol.json                        the protocol's settings
  D/calibration.json                     lr0 and where it came from ('calibrated' or 'given')
  D/<group>/<arm>/arm.json               one arm: a batch at an lr; group is one of GROUPS
  D/<group>/<arm>/seed_<k>/metrics.jsonl an ordinary training run of that arm
  D/throughput/<batch>/round_<r>.json    one steady-state throughput measurement
  D/timing.json                          seconds each phase took
A run directory with reused.json is a copy of another group's run (archives written before the
calibration's runs were kept out of the base arm): read as a run of its arm, its samples counted
once.
"""
import json
import os

import numpy as np

from rljax import stats
from rljax.protocol import decision as decision_lib
from rljax.train import metrics
from rljax.train import workdir as workdir_lib

SCHEMA = {
    'protocol': ('protocol.json', (
        'algo', 'target', 'targets', 'target_fractions', 'base_arm', 'base_batch', 'rn_tolerance',
        'smooth_window', 'level', 'n_draws', 'seed', 'throughput_warmup')),
    'calibration': ('calibration.json', ('lr0', 'source')),
    'timing': ('timing.json', ()),   # seconds per phase, as the driver spent them
    'arm': ('{group}/{arm}/arm.json', ('name', 'batch', 'value', 'lr', 'lr_rule', 'control')),
    'throughput': ('throughput/{batch}/round_{round}.json', (
        'batch', 'round', 'samples_per_s', 'step_time_s', 'rollout_time_s', 'update_time_s',
        'steps_measured', 'warmup_steps')),
}
GROUPS = ('calibration', 'arms', 'confirm')   # calibration: lr0 at the base batch; arms: align
PLOTS = ('eval_vs_samples.png', 'eval_vs_steps.png', 'eval_vs_wallclock.png', 'lr0_calibration.png',
         'grad_norm_vs_batch.png', 'throughput_vs_batch.png', 'time_to_target_vs_batch.png')

# ------------------------------------------------------------------------------------------------
# The schema: one writer (rljax.protocol.driver) and one reader (below) of the same paths and fields.
# ------------------------------------------------------------------------------------------------


def path(workdir, kind, **where):
  """The file of `kind` (a SCHEMA key), e.g. path(D, 'arm', group='arms', arm='P16')."""
  return os.path.join(workdir, SCHEMA[kind][0].format(**where))


def run_dir(workdir, group, arm, seed):
  return os.path.join(workdir, group, arm, f'seed_{seed}')


def _checked(kind, value, where):
  missing = [k for k in SCHEMA[kind][1] if k not in value]
  if missing:
    raise ValueError(f'{where}: {kind} record lacks {missing}')
  return value


def write(workdir, kind, value, **where):
  """Writes one record of the schema, atomically; ValueError if it lacks a declared field."""
  target = path(workdir, kind, **where)
  os.makedirs(os.path.dirname(target), exist_ok=True)
  workdir_lib.write_json_atomic(target, _checked(kind, _jsonable(value), target))


def read(workdir, kind, **where):
  """One record of the schema, or None when there is none; ValueError if it lacks a field."""
  source = path(workdir, kind, **where)
  value = workdir_lib.read_json(source)
  return None if value is None else _checked(kind, value, source)


def _last_per_step(rows):
  """One row per step, the last logged: a resumed run re-logs the steps after its checkpoint."""
  by_step = {row['step']: row for row in rows if 'step' in row}
  return [by_step[step] for step in sorted(by_step)]


def _columns(rows, required):
  """Numeric fields as float arrays (nan where a row lacks one); `required` ones always exist."""
  is_number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
  columns = {key: np.zeros(0) for key in required}
  for key in sorted({key for row in rows for key in row}):
    values = [row.get(key) for row in rows]
    if all(v is None or is_number(v) for v in values):
      columns[key] = np.array([np.nan if v is None else v for v in values], float)
  return columns


def load_run(directory):
  """One run's metrics.jsonl as numpy columns: {'dir', 'train', 'eval'}, one row per step each
  (training and eval rows are told apart by the `"eval": true` marker)."""
  rows = metrics.read_jsonl(os.path.join(directory, 'metrics.jsonl'))
  return {
      'dir': directory,
      'reused': os.path.exists(os.path.join(directory, 'reused.json')),   # another group's run
      'train': _columns(_last_per_step([r for r in rows if not r.get('eval')]),
                        ('step', 'samples', 'step_time_s', 'grad_norm')),
      'eval': _columns(_last_per_step([r for r in rows if r.get('eval')]),
                       ('step', 'samples', 'eval_accuracy')),
  }


def _seed_number(name):
  suffix = name[len('seed_'):]
  return (0, int(suffix), '') if suffix.isdigit() else (1, 0, suffix)


def load_group(workdir, group):
  """[{'spec': arm.json, 'runs': [load_run per seed]}] of one run group, arms with logs only."""
  root = os.path.join(workdir, group)
  arms = []
  for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    spec = read(workdir, 'arm', group=group, arm=name)
    if spec is None:
      continue
    seeds = sorted((d for d in os.listdir(os.path.join(root, name)) if d.startswith('seed_') and
                    os.path.isfile(os.path.join(root, name, d, 'metrics.jsonl'))),
                   key=_seed_number)
    if seeds:
      arms.append({'spec': spec, 'runs': [load_run(os.path.join(root, name, d)) for d in seeds]})
  return arms


def load_throughput(workdir):
  """{batch: [round records, by round]} from D/throughput/<batch>/round_<r>.json."""
  root, table = os.path.join(workdir, 'throughput'), {}
  for batch in sorted(os.listdir(root), key=lambda b: (len(b), b)) if os.path.isdir(root) else []:
    rounds = sorted(f for f in os.listdir(os.path.join(root, batch)) if f.startswith('round_')
                    and f.endswith('.json')) if os.path.isdir(os.path.join(root, batch)) else []
    records = [read(workdir, 'throughput', batch=batch, round=f[len('round_'):-len('.json')])
               for f in rounds]
    if records:
      table[int(batch)] = records
  return table


def load_workdir(workdir):
  """Everything the report reads from a protocol workdir."""
  if not workdir or not os.path.isdir(workdir):
    raise FileNotFoundError(f'protocol workdir {workdir!r} does not exist')
  data = {group: load_group(workdir, group) for group in GROUPS}
  if not data['arms']:
    raise ValueError(f"no arms with logged runs in {os.path.join(workdir, 'arms')} (expected "
                     'arms/<arm>/arm.json and arms/<arm>/seed_<k>/metrics.jsonl)')
  protocol = read(workdir, 'protocol')
  if protocol is None:
    raise FileNotFoundError(f"{path(workdir, 'protocol')} not found")
  return dict(data, workdir=workdir, protocol=protocol,
              calibration_choice=read(workdir, 'calibration'), timing=read(workdir, 'timing'),
              throughput=load_throughput(workdir))


# ------------------------------------------------------------------------------------------------
# Numbers.
# ------------------------------------------------------------------------------------------------


def _settings(protocol):
  return dict(window=int(protocol['smooth_window']), level=float(protocol['level']),
              tolerance=float(protocol['rn_tolerance']), n_draws=int(protocol['n_draws']),
              seed=int(protocol['seed']), warmup=int(protocol['throughput_warmup']))


def _targets(protocol, base_runs, window):
  """The report's targets (user-given, else by the rule of stats.targets_from_base); the primary
  one, on which the decision rests, is the middle one."""
  targets = [float(t) for t in protocol['targets']] or stats.targets_from_base(
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
  result = stats.rn_interval(base_n, per_seed, settings['level'],
                             [stats.samples_reached(r) for r in arm['runs']])
  geo = stats.log_mean_interval(per_seed) if np.isfinite(per_seed).all() else {'mean': np.inf}
  return dict(target=target, samples_to_target=geo['mean'], samples_to_target_per_seed=per_seed,
              rN=result['rN'], rN_ci=[result['lo'], result['hi']], rN_df=result['df'],
              rN_status=result['status'],
              alignment=stats.alignment(result['lo'], result['hi'], settings['tolerance']))


def _crossings(runs, target, settings):
  return [stats.to_target(r, target, settings['window']) for r in runs]


def _stretched(runs, target, settings, shape):
  """Samples to target per seed from the whole curve (stats.log_stretch); crossings when the
  base arm has no curve shape to stretch."""
  if shape is None:
    return _crossings(runs, target, settings)
  return stats.stretch_samples_to_target(runs, shape, target, settings['window'])


def _arm_summary(arm, base, targets, settings, window, shape):
  spec, runs, primary_target = arm['spec'], arm['runs'], targets['primary']
  per_target = [_rn_at(_crossings(base['runs'], t, settings), arm,
                       _crossings(runs, t, settings), t, settings) for t in targets['targets']]
  primary = _rn_at(_stretched(base['runs'], primary_target, settings, shape), arm,
                   _stretched(runs, primary_target, settings, shape), primary_target, settings)
  wallclock = [stats.wallclock_to_target(r, primary_target, settings['window']) for r in runs]
  noise = stats.noise_scale_interval(_noise_terms(runs, window), rng=settings['seed'],
                                     level=settings['level'])
  own = _own_throughput(runs, settings['warmup'])
  return dict(
      {k: spec.get(k) for k in ('name', 'batch', 'value', 'P', 'G', 'lr', 'lr_rule')},
      control=bool(spec['control']), base=arm is base, n_seeds=len(runs),
      seeds_reached=int(np.isfinite(primary['samples_to_target_per_seed']).sum()),
      **{k: v for k, v in primary.items() if k != 'target'},
      steps_to_target=float(np.mean([stats.to_target(r, primary_target, settings['window'],
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
  """lr0: the calibration sweep's choice recomputed from its logs, beside calibration.json."""
  choice = data['calibration_choice'] or {'lr0': None, 'source': 'not recorded'}
  runs = data['calibration']
  if not runs:
    return dict(choice, lrs=[])
  target = float(data['protocol']['target'])
  sweep = stats.choose_lr([a['spec']['lr'] for a in runs],
                          [[stats.to_target(r, target, settings['window']) for r in a['runs']]
                           for a in runs], settings['level'])
  return dict(choice, target=target, recomputed_lr0=sweep['lr0'], at_edge=sweep['at_edge'],
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
    measured = [stats.wallclock_to_target(r, t, window) for r in arm['runs']]
    steady = [stats.wallclock_to_target(r, t, window, settings['warmup']) for r in arm['runs']]
    predicted_s = rows.get(batch, {}).get('predicted_wallclock_s')
    rounds = throughput.get(batch, {}).get('mean', np.nan)
    own = stats.throughput_interval(_own_throughput(arm['runs'], settings['warmup']))['mean']
    result.append(dict(batch=batch, n_seeds=len(arm['runs']), measured_wallclock_per_seed=measured,
                       measured_samples_per_seed=[stats.to_target(r, t, window)
                                                  for r in arm['runs']],
                       measured_wallclock_s=float(np.mean(measured)),
                       steady_wallclock_per_seed=steady, steady_wallclock_s=float(np.mean(steady)),
                       predicted_wallclock_s=predicted_s,
                       predicted_samples=predicted_s * rounds if predicted_s else None,
                       throughput_vs_rounds=own / rounds))
  return sorted(result, key=lambda c: c['batch'])


def _confirmation_ratio(confirm, decision, base_batch, level):
  """The pick's measured seconds to target over the base's (steady, per seed), with Welch's
  t-interval on the logs (stats.rn_interval on times), beside the predicted relative time."""
  by_batch = {c['batch']: c for c in confirm}
  pick = decision.get('fastest')
  if pick == base_batch or pick not in by_batch or base_batch not in by_batch:
    return None
  ratio = stats.rn_interval(by_batch[base_batch]['steady_wallclock_per_seed'],
                            by_batch[pick]['steady_wallclock_per_seed'], level)
  predicted = next(c for c in decision['candidates'] if c['batch'] == pick)['relative_wallclock']
  return dict(batch=pick, ratio=ratio['rN'], ci=[ratio['lo'], ratio['hi']], df=ratio['df'],
              predicted=predicted)


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
      grad_norm_slope=stats.grad_norm_slope(*column(inside, 'grad_norm_median')),
      grad_norm_slope_all=stats.grad_norm_slope(*column(sqrt_arms, 'grad_norm_median')),
      critic_grad_norm_slope=stats.grad_norm_slope(*column(inside, 'critic_grad_norm_median')),
      doubling_ratios=stats.doubling_ratios(*column(sqrt_arms, 'grad_norm_median')),
      noise_scale_from_grad_norms=stats.noise_scale_from_grad_norms(
          *column(sqrt_arms, 'grad_norm_median')))


def _controls(arms):
  """Each fixed-lr control's rN against the sqrt arm at the same batch (ratio of rNs)."""
  sqrt_by_batch = {a['batch']: a for a in arms if not a['control']}
  for a in arms:
    twin = sqrt_by_batch.get(a['batch']) if a['control'] else None
    a['rN_vs_same_batch_sqrt'] = (a['rN'] / twin['rN'] if twin and np.isfinite(twin['rN'])
                                  else np.nan)


def build(data):
  """The report, as a dict, from load_workdir's data (non-finite floats kept: inf = unbounded)."""
  protocol, settings = data['protocol'], _settings(data['protocol'])
  base = next((a for a in data['arms'] if a['spec']['name'] == protocol['base_arm']), None)
  if base is None:
    raise ValueError(f"base arm {protocol['base_arm']!r} from protocol.json has no logged runs")
  targets = _targets(protocol, base['runs'], settings['window'])
  window = _matched_sample_window(data['arms'])
  shape = stats.fit_curve_shape(base['runs'])
  arms = [_arm_summary(a, base, targets, settings, window, shape) for a in data['arms']]
  arms.sort(key=lambda a: (a['control'], a['batch'], a['name']))
  _controls(arms)
  aligned = stats.aligned_range(arms, settings['tolerance'])
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
  report['summary'] = summary(report)
  return report


def build_report(workdir):
  return build(load_workdir(workdir))


# ------------------------------------------------------------------------------------------------
# Words.
# ------------------------------------------------------------------------------------------------


def _num(x, spec='.3g'):
  if x is None or (isinstance(x, float) and np.isnan(x)):
    return 'n/a'
  return 'unbounded' if np.isinf(x) else format(x, spec)


def _count(x):
  if x is not None and np.isinf(x):
    return 'not reached'
  return _num(x) if not np.isfinite(x) else (f'{x / 1e3:.1f}k' if x >= 1e3 else f'{x:.0f}')


def _ci(ci, spec='.2f'):
  return f'[{_num(ci[0], spec)}, {_num(ci[1], spec)}]'


def _calibration_sentence(c):
  if c['source'] == 'given':
    return f"lr0 = {_num(c['lr0'])} was given, not calibrated."
  if not c['lrs']:
    return 'No lr0 calibration in this workdir.'
  rows = ', '.join(f"{_num(r['lr'])}: {_count(r['samples_to_target'])}" for r in c['lrs'])
  edge = (' It is at the edge of the sweep: the best lr may lie beyond it.' if c.get('at_edge')
          else '')
  return (f"lr0 calibration at the base batch (samples to J = {c['target']:g}, geometric mean "
          f"over seeds): {rows}; chosen lr0 = {_num(c['lr0'])}.{edge}")


def _arm_sentence(a):
  if a['rN_status'] == 'base not reached':
    return f"`{a['name']}`: rN undefined, the base arm does not reach the target on every seed."
  twin = (f"; against the sqrt arm at the same batch {_num(a['rN_vs_same_batch_sqrt'], '.2f')}"
          if a['control'] else '')
  missed = (f" ({a['n_seeds'] - a['seeds_reached']}/{a['n_seeds']} seeds did not reach it)"
            if a['rN_status'] == 'not reached' else '')
  return (f"`{a['name']}` (batch {a['batch']}, lr {_num(a['lr'])}): rN {_num(a['rN'], '.2f')} "
          f"{_ci(a['rN_ci'])}{missed}, {a['alignment']}{twin}.")


def _aligned_sentence(aligned):
  t = aligned['tolerance']
  text = (f"Aligned range (rN's interval inside [{1 - t:g}, {1 + t:g}]): batches "
          f"{aligned['batches']}")
  if aligned['batches'] == [aligned['lo']]:
    text += ' (the base alone)'
  if aligned['undetermined']:
    text += (f"; undetermined (the interval straddles the band, more seeds would tell): "
             f"{aligned['undetermined']}")
  not_aligned = [b for b, s in aligned['status'].items() if s == 'not aligned']
  return text + (f'; not aligned: {not_aligned}.' if not_aligned else '.')


def _gradient_sentence(report):
  fits = [('the aligned range', report['grad_norm_slope']), ('all sqrt arms',
                                                         report['grad_norm_slope_all'])]
  parts = [f"over {name}: {_num(f['slope'])} {_ci(f['ci'], '.3f')} (t, df {f['df']}; "
           f"{f['verdict']})" for name, f in fits if np.isfinite(f['slope'])]
  noise = ', '.join(f"{a['name']} {_num(a['noise_scale'])} {_ci(a['noise_scale_ci'], '.3g')}"
                    for a in report['arms'] if not a['control'])
  return (f"Grad norm vs batch, log-log slope {'; '.join(parts) or 'n/a'}. B_simple per arm "
          f"(block bootstrap over steps): {noise}; from the grad-norm curve: "
          f"{_num(report['noise_scale_from_grad_norms'])}.")


def _robustness_sentence(report):
  """Whether the verdict (not only the recommendation) holds by first crossings at each target."""
  primary = report['decision']
  by_target = {round(d['target'], 4): f"{d['verdict']} ({d['recommended']})"
               for d in report['decisions']}
  same = all((d['verdict'], d['recommended']) == (primary['verdict'], primary['recommended'])
             for d in report['decisions'])
  if same:
    return 'The verdict is the same by first crossings at every target.'
  return (f"By first crossings the verdict differs at some target: {by_target}; it rests on "
          'the whole-curve estimate.')


def _quick_sentence(report):
  """The quick answer beside the full one, with both costs, and which assumption failed if any."""
  q, cost = report['quick'], report['cost']
  d = q['decision']
  answer = (f"batch {d['recommended']} ({d['verdict']})" if d['recommended'] else
            d['statement'][0].lower() + d['statement'][1:-1])
  text = (f"From the base arm alone (B_simple {_num(q['noise_scale'])} "
          f"{_ci(q['noise_scale_ci'], '.3g')}, rN = (1 + B/B_simple) / (1 + B0/B_simple)), the "
          f"quick answer is {answer}, for "
          f"{_count(cost['quick'])} training samples against the full sweep's "
          f"{_count(cost['full_sweep'])}.")
  if report['mode'] == 'quick':
    return text
  failed = [c for c in q['checks'] if not c['consistent']]
  agree = (d['verdict'], d['recommended']) == (report['decision']['verdict'],
                                              report['recommended'])
  text += ' It agrees with the full sweep.' if agree else ' It differs from the full sweep.'
  if failed:
    text += (' The noise-scale model fails at batch ' + ', '.join(
        f"{c['batch']} (measured rN {_num(c['rN'], '.2f')} {_ci(c['rN_ci'])}, predicted "
        f"{_num(c['rN_predicted'], '.2f')} {_ci(c['rN_predicted_ci'])})" for c in failed) +
             ": B_simple at the base does not carry over to that batch.")
  elif not agree:
    text += (" Every measured rN's interval overlaps its predicted one, so these logs cannot "
             "reject the model; the quick answer's interval counts B_simple's sampling noise, "
             "not the model's error.")
  return text


def _confirm_sentence(c):
  """Measured vs predicted time, split into samples and throughput (seconds = samples / rate)."""
  samples = np.asarray(c['measured_samples_per_seed'], float)
  ratio = (_num(float(np.exp(np.mean(np.log(samples)))) / c['predicted_samples'], '.2f')
           if c.get('predicted_samples') and np.isfinite(samples).all() else 'n/a')
  return (f"Confirmation at batch {c['batch']} ({c['n_seeds']} seeds): measured "
          f"{_num(c['steady_wallclock_s'])} s to J at its steady step time vs predicted "
          f"{_num(c['predicted_wallclock_s'])} s ({_num(c['measured_wallclock_s'])} s with "
          f"compilation); samples {ratio}x the predicted, throughput "
          f"{_num(c.get('throughput_vs_rounds'), '.2f')}x the rounds'.")


def summary(report):
  """A plain-language paragraph: what exceeds the noise and what does not."""
  base = next(a for a in report['arms'] if a['base'])
  lines = [_calibration_sentence(report['calibration'])]
  lines.append(f"Targets ({report['rule']}): {[round(t, 4) for t in report['targets']]}; the "
               f"decision uses J = {report['primary']:.4g}. Base `{base['name']}` (batch "
               f"{base['batch']}) needs {_count(base['samples_to_target'])} samples "
               f"({_num(base['steps_to_target'], '.0f')} steps).")
  lines += [_arm_sentence(a) for a in report['arms'] if not a['base']]
  lines.append(_aligned_sentence(report['aligned_range']))
  lines.append(_gradient_sentence(report))
  lines.append(report['decision']['statement'])
  if report['decisions']:
    lines.append(_robustness_sentence(report))
  lines.append(_quick_sentence(report))
  lines += [_confirm_sentence(c) for c in report['confirm']]
  ratio = report['confirmation_ratio']
  if ratio:
    lines.append(f"Measured, batch {ratio['batch']} took {_num(ratio['ratio'], '.2f')}x the "
                 f"base's seconds to J {_ci(ratio['ci'])} (Welch, df {ratio['df']}; predicted "
                 f"{_num(ratio['predicted'], '.2f')}x).")
  lines.append(_cost_sentence(report))
  return ' '.join(lines)


def _cost_sentence(report):
  cost, timing = report['cost'], report['timing']
  text = (f"Training samples: calibration {_count(cost['calibration'])} "
          f"({_num(cost['calibration_vs_arms'], '.0%')} of the arms'), arms "
          f"{_count(cost['arms'])}, throughput rounds {_count(cost['throughput'])}, confirmation "
          f"{_count(cost['confirm'])}.")
  if timing:
    text += (' Wall-clock: ' + ', '.join(f'{k} {v / 60:.1f} min' for k, v in timing.items()) +
             f', {sum(timing.values()) / 60:.1f} min in all.')
  return text


def _arms_table(report):
  rows = ['| arm | batch | lr | samples to J | rN [CI] | alignment | rN by crossing at ' +
          ', '.join(f'{t:.3g}' for t in report['targets']) + ' | B_simple [CI] | own samples/s |',
          '|' + '---|' * 9]
  for a in report['arms']:
    tag = ' (base)' if a['base'] else (' (control)' if a['control'] else '')
    at = ', '.join(_num(p['rN'], '.2f') for p in a['per_target'])
    rows.append(f"| {a['name']}{tag} | {a['batch']} | {_num(a['lr'])} | "
                f"{_count(a['samples_to_target'])} | {_num(a['rN'], '.2f')} {_ci(a['rN_ci'])} | "
                f"{a['alignment']} | {at} | {_num(a['noise_scale'])} "
                f"{_ci(a['noise_scale_ci'], '.3g')} | "
                f"{_num(a['own_throughput']['median'], '.4g')} |")
  return rows


def _decision_table(report):
  thr = {t['batch']: t for t in report['throughput']}
  rows = ['| batch | samples/s median [CI] | rounds | predicted s to J | relative [CI] | '
          'P(fastest) | note |', '|' + '---|' * 7]
  for c in report['decision']['candidates']:
    t, star = thr[c['batch']], ' **recommended**' if c['batch'] == report['recommended'] else ''
    rows.append(f"| {c['batch']}{star} | {_num(t['median'], '.4g')} "
                f"{_ci([t['lo'], t['hi']], '.4g')}"
                f" | {t['rounds']} | {_num(c.get('predicted_wallclock_s'), '.4g')} | "
                f"{_num(c.get('relative_wallclock'), '.2f')} "
                f"{_ci(c.get('relative_wallclock_ci', [None, None]))} | "
                f"{_num(c.get('p_fastest'), '.2f')} | {c['why_not']} |")
  return rows


def markdown(report):
  figures = '\n'.join(f'![{p}]({p})' for p in report.get('plots', PLOTS))
  return (f"# Align, then accelerate: {report['algo']} from batch {report['base_batch']}\n\n"
          f"## Arms (decision target J = {report['primary']:.4g})\n\n" +
          '\n'.join(_arms_table(report)) +
          '\n\n## Decision\n\n' + '\n'.join(_decision_table(report)) + '\n\n' +
          report['decision']['statement'] + '\n\n## What exceeds the noise\n\n' +
          report['summary'] + '\n\n## Plots\n\n' + figures + '\n')


def _jsonable(x):
  """Plain JSON: numpy scalars to Python, non-finite floats to null (statuses carry meaning)."""
  if isinstance(x, (np.ndarray, np.generic)):
    x = x.tolist()
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, float) and not np.isfinite(x):
    return None
  return x


def write_report(workdir, with_plots=True):
  """Writes report.json, report.md and the PNG plots into the workdir; returns the report."""
  data = load_workdir(workdir)
  report = dict(build(data), plots=list(PLOTS) if with_plots else [])
  with open(os.path.join(workdir, 'report.json'), 'w') as f:
    json.dump(_jsonable(report), f, indent=2)
  with open(os.path.join(workdir, 'report.md'), 'w') as f:
    f.write(markdown(report))
  if with_plots:
    from rljax.protocol import plots  # pylint: disable=g-import-not-at-top  (matplotlib only here)
    plots.write_plots(workdir, data, report)
  return report
