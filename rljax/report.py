"""The protocol's report: one declared schema of its directory, read back into numbers and words.

The protocol (rljax.protocol) writes the directory and this module reads it; both use the paths
and fields declared here.
"""
import json
import os

import numpy as np

from rljax import metrics
from rljax import stats

PLOTS = ('eval_vs_samples.png', 'eval_vs_steps.png', 'eval_vs_wallclock.png',
         'grad_norm_vs_batch.png', 'throughput_vs_batch.png', 'time_to_target_vs_batch.png')


# ----------------------------------------------------------------------------------------------
# Loading runs.
# ----------------------------------------------------------------------------------------------


def _read_json(path):
  with open(path) as f:
    return json.load(f)


def _last_per_step(rows):
  """One row per step, the last logged: a resumed run re-logs the steps after its checkpoint."""
  by_step = {row['step']: row for row in rows if 'step' in row}
  return [by_step[step] for step in sorted(by_step)]


def _is_number(value):
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _columns(rows, required):
  """Numeric fields as float arrays (nan where a row lacks one); `required` ones always exist."""
  columns = {key: np.zeros(0) for key in required}
  for key in sorted({key for row in rows for key in row}):
    values = [row.get(key) for row in rows]
    if all(v is None or _is_number(v) for v in values):
      columns[key] = np.array([np.nan if v is None else v for v in values], float)
  return columns


def load_run(run_dir):
  """One run's logs as numpy columns: {'dir', 'train', 'eval', 'eval_correct'}.

  Training and eval rows of metrics.jsonl are told apart by the `"eval": true` marker; each keeps
  one row per step. eval_correct is {'step', 'samples', 'correct_TxM'} (T evals x M held-out
  prompts, bool) when eval_correct.jsonl exists, so that held-out prompts can be resampled.
  """
  rows = metrics.read_jsonl(os.path.join(run_dir, 'metrics.jsonl'))
  run = {
      'dir': run_dir,
      'train': _columns(_last_per_step([r for r in rows if not r.get('eval')]),
                        ('step', 'samples', 'step_time_s', 'grad_norm')),
      'eval': _columns(_last_per_step([r for r in rows if r.get('eval')]),
                       ('step', 'samples', 'eval_accuracy')),
      'eval_correct': None,
  }
  path = os.path.join(run_dir, 'eval_correct.jsonl')
  if os.path.exists(path):
    rows = _last_per_step(metrics.read_jsonl(path))
    if len({len(row['correct']) for row in rows}) > 1:
      raise ValueError(f'{path}: rows score different numbers of prompts')
    if rows:
      run['eval_correct'] = {
          'step': np.array([row['step'] for row in rows], float),
          'samples': np.array([row['samples'] for row in rows], float),
          'correct_TxM': np.array([[c == '1' for c in row['correct']] for row in rows]),
      }
  return run


# ----------------------------------------------------------------------------------------------


def _seed_number(name):
  suffix = name[len('seed_'):]
  return (0, int(suffix), '') if suffix.isdigit() else (1, 0, suffix)


def load_workdir(workdir):
  """Specs, runs, throughput and the confirm run of a protocol workdir (layout: module doc)."""
  if not workdir or not os.path.isdir(workdir):
    raise FileNotFoundError(f'protocol workdir {workdir!r} does not exist')
  arms_dir = os.path.join(workdir, 'arms')
  arms = []
  for name in sorted(os.listdir(arms_dir)) if os.path.isdir(arms_dir) else []:
    arm_dir = os.path.join(arms_dir, name)
    spec_path = os.path.join(arm_dir, 'arm.json')
    if not os.path.isfile(spec_path):
      continue
    seeds = sorted((d for d in os.listdir(arm_dir) if d.startswith('seed_') and
                    os.path.isfile(os.path.join(arm_dir, d, 'metrics.jsonl'))), key=_seed_number)
    spec = {'name': name, **_read_json(spec_path)}
    if 'batch' not in spec:
      raise ValueError(f'{spec_path} has no "batch"')
    if seeds:
      arms.append({'spec': spec,
                   'runs': [load_run(os.path.join(arm_dir, d)) for d in seeds]})
  if not arms:
    raise ValueError(f'no arms with logged runs in {arms_dir} (expected '
                     'arms/<arm>/arm.json and arms/<arm>/seed_<k>/metrics.jsonl)')
  protocol_path = os.path.join(workdir, 'protocol.json')
  if not os.path.isfile(protocol_path):
    raise FileNotFoundError(f'{protocol_path} not found')
  throughput_dir = os.path.join(workdir, 'throughput')
  throughput = [_read_json(os.path.join(throughput_dir, f))
                for f in sorted(os.listdir(throughput_dir)) if f.endswith('.json')
                ] if os.path.isdir(throughput_dir) else []
  confirm_dir = os.path.join(workdir, 'confirm')
  has_confirm = os.path.isfile(os.path.join(confirm_dir, 'metrics.jsonl'))
  confirm_spec = os.path.join(confirm_dir, 'arm.json')
  return {
      'workdir': workdir,
      'protocol': _read_json(protocol_path),
      'arms': arms,
      'throughput': {int(t['batch']): t for t in throughput},
      'confirm': load_run(confirm_dir) if has_confirm else None,
      'confirm_spec': _read_json(confirm_spec) if os.path.isfile(confirm_spec) else None,
  }





def _throughput_table(data):
  """Steady-state throughput per batch: throughput/ files, else the align runs' own logs."""
  table = {b: dict(t, source='throughput/') for b, t in data['throughput'].items()}
  for arm in data['arms']:
    batch = int(arm['spec']['batch'])
    if batch not in table:
      table[batch] = dict(stats.steady_state(arm['runs']), batch=batch)
  return dict(sorted(table.items()))


def _find_base(arms, base_name):
  if base_name is None:
    raise ValueError('protocol.json has no "base_arm"')
  for arm in arms:
    if arm['spec']['name'] == base_name:
      return arm
  raise ValueError(f'base arm {base_name!r} from protocol.json has no logged runs in arms/')


def _arm_summary(arm, base, settings, window, throughput):
  spec, runs = arm['spec'], arm['runs']
  target, smooth_window = settings['target'], settings['smooth_window']
  n = [stats.samples_to_target(r, target, smooth_window) for r in runs]
  rn, lo, hi = stats.rn_with_ci(base['runs'], runs, target, settings['n_boot'], settings['rng'],
                          smooth_window)
  status = 'ok' if np.isfinite(rn) else ('not reached' if np.isinf(rn) else 'base not reached')
  return {
      'name': spec['name'],
      'batch': int(spec['batch']),
      'P': spec.get('P'),
      'G': spec.get('G'),
      'lr': spec.get('lr'),
      'lr_rule': spec.get('lr_rule'),
      'control': bool(spec.get('control', False)),
      'base': arm is base,
      'n_seeds': len(runs),
      'seeds_reached': int(np.isfinite(n).sum()),
      'samples_to_target': stats.mean_over_seeds(n),
      'samples_to_target_per_seed': n,
      'steps_to_target': stats.mean_over_seeds([stats.steps_to_target(r, target, smooth_window)
                                           for r in runs]),
      'wallclock_to_target_s': stats.mean_over_seeds([stats.wallclock_to_target(r, target, smooth_window)
                                                 for r in runs]),
      'rN': rn,
      'rN_ci': [lo, hi],
      'rN_status': status,
      'throughput_samples_per_s': float(throughput[int(spec['batch'])]['samples_per_s']),
      'grad_norm_median': stats.median_in_window(runs, 'grad_norm', window),
      'critic_grad_norm_median': stats.median_in_window(runs, 'critic_grad_norm', window),
      'noise_scale': stats.runs_noise_scale(runs, window),
  }


def _candidates(arms, throughput):
  """One candidate per batch: the best-rN sqrt arm measured there, plus throughput-only batches."""
  candidates = {}
  for a in arms:
    best = candidates.get(a['batch'])
    if not a['control'] and (best is None or a['rN'] < best['rN']):
      candidates[a['batch']] = {'batch': a['batch'], 'arm': a['name'], 'rN': a['rN'],
                                'rN_ci': a['rN_ci'],
                                'throughput_samples_per_s': a['throughput_samples_per_s']}
  for batch, t in throughput.items():
    candidates.setdefault(batch, {'batch': batch, 'arm': None, 'rN': None, 'rN_ci': None,
                                  'throughput_samples_per_s': float(t['samples_per_s'])})
  return list(candidates.values())


def _confirm(data, report, settings):
  """Predicted vs measured time to target for the confirmation run, if there is one."""
  run = data['confirm']
  if run is None:
    return None
  spec = data['confirm_spec'] or {}
  batch = spec.get('batch', (report['recommended'] or {}).get('batch'))
  match = [d for d in report['candidates'] if d['batch'] == batch]
  predicted = match[0]['predicted_wallclock_s'] if match else np.nan
  rn = match[0]['rN_used'] if match else np.nan
  target, window = settings['target'], settings['smooth_window']
  measured = stats.wallclock_to_target(run, target, window)
  return {
      'batch': batch,
      'predicted_wallclock_s': predicted,
      'measured_wallclock_s': measured,
      'measured_over_predicted': measured / predicted if predicted else np.nan,
      'predicted_samples_to_target': report['base_samples_to_target'] * rn,
      'measured_samples_to_target': stats.samples_to_target(run, target, window),
  }


def _report(data):
  """The report from loaded workdir data (see build_report)."""
  protocol = data['protocol']
  if 'target' not in protocol:
    raise ValueError('protocol.json has no "target"')
  settings = {
      'target': float(protocol['target']),
      'smooth_window': int(protocol.get('smooth_window', 1)),
      'n_boot': int(protocol.get('n_boot', 1000)),
      'rng': np.random.default_rng(protocol.get('seed', 0)),
  }
  base = _find_base(data['arms'], protocol.get('base_arm'))
  window = stats.matched_sample_window([r for arm in data['arms'] for r in arm['runs']])
  throughput = _throughput_table(data)
  arms = [_arm_summary(arm, base, settings, window, throughput) for arm in data['arms']]
  arms.sort(key=lambda a: (a['control'], a['batch'], a['name']))
  base_summary = next(a for a in arms if a['base'])
  for a in arms:
    a['rel_throughput'] = a['throughput_samples_per_s'] / base_summary['throughput_samples_per_s']
    a['steps_ratio'] = stats.ratio(a['steps_to_target'], base_summary['steps_to_target']).item()
  tolerance = float(protocol.get('rn_tolerance', 0.1))
  aligned = stats.aligned_range(arms, tolerance)
  sqrt_arms = [a for a in arms if not a['control']]
  fit_arms = [a for a in sqrt_arms if a['batch'] in aligned['batches']]
  slope, stderr = stats.grad_norm_slope([a['batch'] for a in fit_arms],
                                  [a['grad_norm_median'] for a in fit_arms])
  critic_slope, critic_stderr = stats.grad_norm_slope([a['batch'] for a in fit_arms],
                                                [a['critic_grad_norm_median'] for a in fit_arms])
  base_n = base_summary['samples_to_target']
  candidates = stats.decide(_candidates(arms, throughput), base_n,
                      bool(protocol.get('allow_extrapolated', False)))
  base_seconds = stats.predict_wallclock(base_n, 1.0, base_summary['throughput_samples_per_s'])
  for d in candidates:
    d['relative_wallclock'] = d['predicted_wallclock_s'] / base_seconds
  report = {
      'workdir': data['workdir'],
      'algo': protocol.get('algo'),
      'target': settings['target'],
      'base_arm': base_summary['name'],
      'base_batch': base_summary['batch'],
      'base_samples_to_target': base_n,
      'smooth_window': settings['smooth_window'],
      'n_boot': settings['n_boot'],
      'arms': arms,
      'aligned_range': aligned,
      'grad_norm_window_samples': list(window),
      'grad_norm_fit_batches': sorted({a['batch'] for a in fit_arms}),
      'grad_norm_slope': slope,
      'grad_norm_slope_stderr': stderr,
      'critic_grad_norm_slope': critic_slope,
      'critic_grad_norm_slope_stderr': critic_stderr,
      'doubling_ratios': stats.doubling_ratios([a['batch'] for a in sqrt_arms],
                                         [a['grad_norm_median'] for a in sqrt_arms]),
      'noise_scale': base_summary['noise_scale'],
      'throughput': list(throughput.values()),
      'candidates': candidates,
      'recommended': next((d for d in candidates if d['recommended']), None),
  }
  report['confirm'] = _confirm(data, report, settings)
  report['summary'] = _summary(report)
  return report


def build_report(workdir):
  """The report of a protocol workdir as a dict (non-finite floats kept: inf = not reached)."""
  return _report(load_workdir(workdir))


# ----------------------------------------------------------------------------------------------
# Words: what exceeds the noise and what does not.
# ----------------------------------------------------------------------------------------------


def _num(x, spec='.3g'):
  if x is None or (isinstance(x, float) and np.isnan(x)):
    return 'n/a'
  if np.isinf(x):
    return 'not reached'
  return format(x, spec)


def _count(x):
  return _num(x) if not np.isfinite(x) else (f'{x / 1e3:.1f}k' if x >= 1e3 else f'{x:.0f}')


def _arm_sentence(a):
  if a['rN_status'] == 'not reached':
    return (f"`{a['name']}` (batch {a['batch']}) did not reach the target on "
            f"{a['n_seeds'] - a['seeds_reached']}/{a['n_seeds']} seeds: rN is unbounded.")
  if a['rN_status'] != 'ok':
    return f"`{a['name']}`: rN undefined because the base arm does not reach the target."
  ci = a['rN_ci']
  verdict = ('within noise (the CI includes 1)' if stats.ci_includes(ci, 1.0) else
             'beyond noise: it needs ' + ('more' if ci[0] > 1 else 'fewer') +
             ' samples than the base (the CI excludes 1)')
  return (f"`{a['name']}` (batch {a['batch']}, lr {_num(a['lr'])}): rN {a['rN']:.2f} "
          f"[{_num(ci[0], '.2f')}, {_num(ci[1], '.2f')}], {verdict}.")


def _summary(report):
  """A plain-language paragraph: which differences exceed the noise and which do not."""
  base = next(a for a in report['arms'] if a['base'])
  if not np.isfinite(base['samples_to_target']):
    return (f"Target J = {report['target']:g} is not reached by every seed of the base "
            f"`{base['name']}` ({base['seeds_reached']}/{base['n_seeds']}): rN is undefined and "
            'nothing can be compared or recommended. Lower the target or train longer.')
  lines = []
  lines.append(f"Target J = {report['target']:g}. Base `{base['name']}` (batch "
               f"{base['batch']}) reaches it after {_count(base['samples_to_target'])} samples "
               f"({base['seeds_reached']}/{base['n_seeds']} seeds); resampling its own seeds "
               f"and prompts gives rN in [{_num(base['rN_ci'][0], '.2f')}, "
               f"{_num(base['rN_ci'][1], '.2f')}], the noise floor of this comparison.")
  lines += [_arm_sentence(a) for a in report['arms'] if not a['base']]
  aligned = report['aligned_range']
  lines.append(f"Aligned range (|rN - 1| <= {aligned['tolerance']:g}): batch {aligned['lo']} to "
               f"{aligned['hi']}; " + (
                   'every arm in it is also within noise of the base.' if aligned['within_noise']
                   else 'but some arm in it has a CI that excludes 1, so the overlap is only '
                   'within tolerance, not within noise.'))
  slope, stderr = report['grad_norm_slope'], report['grad_norm_slope_stderr']
  if np.isfinite(slope):
    gap = slope - stats.NOISE_DOMINATED_SLOPE
    verdict = ('no stderr with 2 batches' if not np.isfinite(stderr) else
               'consistent with it within 2 stderr' if abs(gap) <= 2 * stderr else
               ('flatter' if gap > 0 else 'steeper') + ' than it beyond 2 stderr')
    lines.append(f"Grad norm vs batch over the aligned range: log-log slope {slope:.3f} +- "
                 f"{_num(stderr, '.2g')} (noise-dominated theory -0.5: {verdict}).")
  if np.isfinite(report['noise_scale']):
    lines.append(f"Gradient noise scale B_simple of the base arm: {report['noise_scale']:.3g} "
                 'responses.')
  rec = report['recommended']
  if rec is None:
    lines.append('No batch can be recommended: no candidate has both a measured rN and a '
                 'finite predicted wall-clock.')
  else:
    ci = rec['predicted_wallclock_ci_s']
    base_s = rec['predicted_wallclock_s'] / rec['relative_wallclock']
    rel_ci = [c / base_s for c in ci] if ci else [np.nan, np.nan]
    robust = ('the base itself is fastest' if rec['batch'] == report['base_batch'] else
              'its rN is extrapolated, so this is a bound, not a measurement' if not ci else
              'the saving is beyond noise (the whole CI is below 1)' if rel_ci[1] < 1 else
              'the difference from the base is within noise')
    lines.append(f"Recommended batch {rec['batch']}: predicted {_num(rec['predicted_wallclock_s'])}"
                 f" s to target, {rec['relative_wallclock']:.2f}x the base wall-clock (rN CI gives "
                 f"[{_num(rel_ci[0], '.2f')}, {_num(rel_ci[1], '.2f')}]); {robust}. Throughputs "
                 'are single steady-state measurements, without a CI.')
  extrapolated = [d['batch'] for d in report['candidates'] if d['extrapolated']]
  if extrapolated:
    lines.append(f'Batches {extrapolated} were not in the align sweep: their rN is only a bound '
                 'from the nearest measured batch (see the decision table).')
  confirm = report['confirm']
  if confirm:
    lines.append(f"Confirmation run at batch {confirm['batch']}: measured "
                 f"{_num(confirm['measured_wallclock_s'])} s to target vs predicted "
                 f"{_num(confirm['predicted_wallclock_s'])} s (ratio "
                 f"{_num(confirm['measured_over_predicted'], '.2f')}; measured time includes "
                 'compilation, the prediction uses steady-state throughput).')
  return ' '.join(lines)


def _markdown(report):
  rows = ['| arm | batch | P x G | lr | samples to target | wall-clock (s) | rN [95% CI] | '
          'rel. throughput | steps ratio |', '|' + '---|' * 9]
  for a in report['arms']:
    tag = ' (base)' if a['base'] else (' (control)' if a['control'] else '')
    p_by_g = f"{a['P']} x {a['G']}" if a['P'] is not None else '-'
    rows.append(f"| {a['name']}{tag} | {a['batch']} | {p_by_g} | {_num(a['lr'])} | "
                f"{_count(a['samples_to_target'])} | {_num(a['wallclock_to_target_s'], '.1f')} | "
                f"{_num(a['rN'], '.2f')} [{_num(a['rN_ci'][0], '.2f')}, "
                f"{_num(a['rN_ci'][1], '.2f')}] | {a['rel_throughput']:.2f} | "
                f"{_num(a['steps_ratio'], '.2f')} |")
  decision = ['| batch | samples/s | rN used | predicted wall-clock (s) | relative | note |',
              '|' + '---|' * 6]
  for d in report['candidates']:
    star = ' **recommended**' if d['recommended'] else ''
    decision.append(f"| {d['batch']}{star} | {d['throughput_samples_per_s']:.4g} | "
                    f"{_num(d['rN_used'], '.2f')} ({d['rN_bound']}) | "
                    f"{_num(d['predicted_wallclock_s'], '.4g')} | "
                    f"{_num(d['relative_wallclock'], '.2f')} | {d['note']} |")
  figures = '\n'.join(f'![{p}]({p})' for p in PLOTS)
  return (f"# Align, then accelerate: {report['workdir']}\n\n## Arms (target J = "
          f"{report['target']:g})\n\n" + '\n'.join(rows) + '\n\n## Decision\n\n' +
          '\n'.join(decision) + '\n\n## What exceeds the noise\n\n' + report['summary'] +
          '\n\n## Plots\n\n' + figures + '\n')


def _jsonable(x):
  """Plain JSON: numpy scalars to Python, non-finite floats to null (statuses carry meaning)."""
  if isinstance(x, (np.ndarray, np.generic)):
    x = x.tolist()
  if isinstance(x, dict):
    return {k: _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, float) and not np.isfinite(x):
    return None
  return x


# ----------------------------------------------------------------------------------------------


def write_report(workdir):
  """Writes report.json, report.md and the PNG plots into the workdir; returns the report."""
  data = load_workdir(workdir)
  report = dict(_report(data), plots=list(PLOTS))
  with open(os.path.join(workdir, 'report.json'), 'w') as f:
    json.dump(_jsonable(report), f, indent=2)
  with open(os.path.join(workdir, 'report.md'), 'w') as f:
    f.write(_markdown(report))
  from rljax import plots  # pylint: disable=g-import-not-at-top  (matplotlib only here)
  plots.write_plots(workdir, data, report)
  return report
