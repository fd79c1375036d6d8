"""Analysis of logged runs: the numbers and pictures behind "align, then accelerate".

Everything here reads what the trainer and the protocol wrote and never trains: pure functions over
numpy arrays and dicts, plus a CLI that rebuilds the report of a protocol workdir:

  python -m rljax.analysis --workdir=DIR

Protocol workdir layout (the contract):
  DIR/protocol.json                     {"target", "base_arm", "rn_tolerance", "algo", ...}
  DIR/arms/<arm>/arm.json               {"name", "P", "G", "batch", "lr", "lr_rule", "control"}
  DIR/arms/<arm>/seed_<k>/metrics.jsonl (+ optional eval_correct.jsonl)
  DIR/throughput/<batch>.json           {"batch", "samples_per_s", "rollout_time_s", ...}
  DIR/confirm/                          optional run at the recommended batch
Optional protocol.json keys read here: smooth_window (1), n_boot (1000), seed (0),
allow_extrapolated (false).

Conventions:
- Runs are compared against cumulative retained training responses ("samples"), never steps.
- Batch sizes are in responses (GRPO: P*G, PPO: B), the unit in which the paper finds alignment.
- A run that never reaches the target gives nan; a mean over seeds that includes such a run is
  inf (unbounded), and so is rN. report.json writes non-finite numbers as null, next to a status.
"""

import json
import os
import sys

from absl import app
from absl import flags
import matplotlib
from matplotlib.figure import Figure
import numpy as np

from rljax import metrics
from rljax.stats import noise_scale

NOISE_DOMINATED_SLOPE = -0.5
NOISE_DOMINATED_DOUBLING = 2**-0.5  # grad norm ratio per doubling of batch when noise dominates.
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
# Curves and first crossings.
# ----------------------------------------------------------------------------------------------


def smooth(y, window):
  """Centred moving average over `window` points (rounded down to odd), along axis 0.

  Centred, not trailing: a trailing average lags by (window - 1) / 2 evals, and evals k steps
  apart are more samples apart at a larger batch, so a lag would bias rN against large batches.
  Near the ends the window shrinks symmetrically, so it stays centred (end points are kept).
  """
  y = np.asarray(y, float)
  half = max(int(window), 1) // 2
  if half == 0 or len(y) == 0:
    return y
  n = len(y)
  cumsum = np.concatenate([np.zeros((1,) + y.shape[1:]), np.cumsum(y, axis=0)])
  i = np.arange(n)
  h = np.minimum(np.minimum(i, n - 1 - i), half)
  width = (2 * h + 1).reshape((n,) + (1,) * (y.ndim - 1))
  return (cumsum[i + h + 1] - cumsum[i - h]) / width


def first_crossing(x, y, target):
  """x where y first reaches `target`, linearly interpolated between the two bracketing points.

  nan if y never reaches it; x[0] if y starts at or above it. y may be 2-D (points x curves):
  one crossing per column, which is how the bootstrap evaluates many curves at once.
  """
  x, y = np.asarray(x, float), np.asarray(y, float)
  y_TxC = y[:, None] if y.ndim == 1 else y
  if len(y) == 0:
    return np.nan if y.ndim == 1 else np.full(y_TxC.shape[1], np.nan)
  above_TxC = y_TxC >= target
  i = np.argmax(above_TxC, axis=0)
  prev = np.maximum(i - 1, 0)
  cols = np.arange(y_TxC.shape[1])
  y0, y1 = y_TxC[prev, cols], y_TxC[i, cols]
  with np.errstate(invalid='ignore', divide='ignore'):
    frac = np.where(i > 0, (target - y0) / (y1 - y0), 0.0)
  crossing = np.where(above_TxC.any(axis=0), x[prev] + frac * (x[i] - x[prev]), np.nan)
  return float(crossing[0]) if y.ndim == 1 else crossing


def _eval_xy(run, x_key):
  """An eval curve (x, accuracy) with unlogged points dropped."""
  ev = run['eval']
  ok = np.isfinite(ev['eval_accuracy']) & np.isfinite(ev[x_key])
  return ev[x_key][ok], ev['eval_accuracy'][ok]


def _eval_curve(run, x_key, window):
  """An eval curve, smoothed."""
  x, y = _eval_xy(run, x_key)
  return x, smooth(y, window)


def _wallclock_at(run, samples):
  """Training seconds (cumulative step_time_s) when the run had consumed `samples` responses."""
  train = run['train']
  seconds = np.concatenate([[0.0], np.cumsum(np.nan_to_num(train['step_time_s']))])
  return np.interp(samples, np.concatenate([[0.0], train['samples']]), seconds)


def samples_to_target(run, target, window=1):
  """Cumulative training responses at which the (smoothed) eval curve first reaches target."""
  return first_crossing(*_eval_curve(run, 'samples', window), target)


def steps_to_target(run, target, window=1):
  """Update steps at which the (smoothed) eval curve first reaches target."""
  return first_crossing(*_eval_curve(run, 'step', window), target)


def wallclock_to_target(run, target, window=1):
  """Training seconds at the samples-to-target crossing, interpolated in cumulative step time.

  step_time_s excludes eval and includes the first step's compilation, as the trainer logs it.
  """
  samples = samples_to_target(run, target, window)
  return float(_wallclock_at(run, samples)) if np.isfinite(samples) else np.nan


def _mean_over_seeds(values):
  """Mean of per-seed values where a seed that never got there (nan) makes the mean inf."""
  values = np.asarray(values, float)
  return float(np.mean(np.where(np.isnan(values), np.inf, values))) if len(values) else np.nan


# ----------------------------------------------------------------------------------------------
# The sample penalty rN and its bootstrap confidence interval.
# ----------------------------------------------------------------------------------------------


def _ratio(arm_n, base_n):
  """arm / base: inf when only the arm never gets there, nan when the base never does."""
  arm_n, base_n = np.asarray(arm_n, float), np.asarray(base_n, float)
  with np.errstate(invalid='ignore', divide='ignore'):
    return np.where(np.isinf(base_n) | np.isnan(base_n), np.nan, arm_n / base_n)


def _prompt_weights(runs, n_boot, rng):
  """How often each held-out prompt is drawn in each replicate (n_boot x M), or None.

  Only when every run scored the same M prompts: one draw per replicate is shared by all runs,
  since all runs are graded on the same prompts and their prompt-level errors are paired.
  """
  widths = {None if r['eval_correct'] is None else r['eval_correct']['correct_TxM'].shape[1]
            for r in runs}
  if len(widths) != 1 or None in widths:
    return None
  m = widths.pop()
  return rng.multinomial(m, np.full(m, 1.0 / m), size=n_boot)


def _boot_samples_to_target(run, target, window, weights_NxM, n_boot):
  """Samples-to-target of one run under each replicate's prompt resample (constant without)."""
  if weights_NxM is None:
    return np.full(n_boot, samples_to_target(run, target, window))
  ec = run['eval_correct']
  # Integer matmul: exact counts, and no BLAS threads contending with training on the same host.
  acc_TxN = ec['correct_TxM'].astype(np.int64) @ weights_NxM.T / weights_NxM.shape[1]
  return first_crossing(ec['samples'], smooth(acc_TxN, window), target)


def _seed_resampled_means(n_RxN, rng):
  """Per replicate, the mean over R seeds drawn with replacement from that replicate's column."""
  r, n = n_RxN.shape
  pick_NxR = rng.integers(0, r, size=(n, r))
  values = np.where(np.isnan(n_RxN), np.inf, n_RxN)
  return values[pick_NxR, np.arange(n)[:, None]].mean(axis=1)


def rn_with_ci(base_runs, arm_runs, target, n_boot=1000, rng=None, window=1, level=0.95):
  """rN = mean samples-to-target of the arm's seeds / of the base's seeds, with a bootstrap CI.

  Each replicate resamples seeds (with replacement, separately per side) and, when every run logged
  eval_correct for the same prompts, the held-out prompts too, recomputing every eval curve; so
  the CI covers both seed and eval-set noise. Otherwise only seeds are resampled.
  Returns (rN, lo, hi). rN is inf when an arm seed never reaches the target ("not reached"), nan
  when a base seed never does. Replicates where the base misses are left out of the quantiles.
  With very few seeds (3) a percentile bootstrap is too narrow (it under-covers: about 75-90% for
  a nominal 95% in the tests' synthetic sweeps), so read "beyond noise" from 3 seeds cautiously.
  """
  rng = np.random.default_rng(rng)
  point = _ratio(_mean_over_seeds([samples_to_target(r, target, window) for r in arm_runs]),
                 _mean_over_seeds([samples_to_target(r, target, window) for r in base_runs]))
  runs = list(base_runs) + list(arm_runs)
  weights_NxM = _prompt_weights(runs, n_boot, rng)
  n_RxN = np.stack([_boot_samples_to_target(r, target, window, weights_NxM, n_boot) for r in runs])
  base_N = _seed_resampled_means(n_RxN[:len(base_runs)], rng)
  arm_N = _seed_resampled_means(n_RxN[len(base_runs):], rng)
  ratios = _ratio(arm_N, base_N)
  if np.isnan(ratios).all():
    return float(point), np.nan, np.nan
  tail = (1 - level) / 2
  lo, hi = np.nanquantile(ratios, [tail, 1 - tail], method='nearest')
  return float(point), float(lo), float(hi)


def _ci_includes(ci, value):
  lo, hi = ci
  return bool(lo <= value <= hi)


def aligned_range(arms_summary, tolerance=0.1):
  """The contiguous batch range around the base where |rN - 1| <= tolerance.

  arms_summary: dicts with 'batch', 'rN', 'rN_ci', and optional 'base' (marks the base arm) and
  'control' (skipped: a fixed-lr control says nothing about where sqrt-scaled curves align).
  Walks outward from the base batch and stops, on each side, at the first batch where some arm is
  outside tolerance. 'within_noise' says whether every arm in the range also has a CI including 1:
  if not, "aligned" rests on the tolerance, not on the noise.
  """
  arms = sorted((a for a in arms_summary if not a.get('control')), key=lambda a: a['batch'])
  base_batch = next(a['batch'] for a in arms if a.get('base'))
  batches = sorted({a['batch'] for a in arms})
  ok = {b: all(abs(a['rN'] - 1) <= tolerance for a in arms if a['batch'] == b) for b in batches}
  ok[base_batch] = True
  lo = hi = batches.index(base_batch)
  while lo > 0 and ok[batches[lo - 1]]:
    lo -= 1
  while hi < len(batches) - 1 and ok[batches[hi + 1]]:
    hi += 1
  inside = batches[lo:hi + 1]
  per_arm = [{
      'name': a.get('name'),
      'base': bool(a.get('base')),
      'batch': a['batch'],
      'rN': a['rN'],
      'rN_ci': list(a['rN_ci']),
      'within_tolerance': bool(abs(a['rN'] - 1) <= tolerance),
      'ci_includes_1': _ci_includes(a['rN_ci'], 1.0),
  } for a in arms]
  return {
      'lo': inside[0],
      'hi': inside[-1],
      'batches': inside,
      'tolerance': tolerance,
      'within_noise': all(a['ci_includes_1'] for a in per_arm
                          if a['batch'] in inside and not a['base']),
      'arms': per_arm,
  }


# ----------------------------------------------------------------------------------------------
# Gradient diagnostics: grad norm vs batch, noise scale.
# ----------------------------------------------------------------------------------------------


def _loglog_fit(x, y):
  """(slope, intercept, stderr of slope) of log y on log x over the finite positive pairs."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
  lx, ly = np.log(x[ok]), np.log(y[ok])
  if len(lx) < 2 or np.ptp(lx) == 0:
    return np.nan, np.nan, np.nan
  dx = lx - lx.mean()
  slope = dx @ (ly - ly.mean()) / (dx @ dx)
  intercept = ly.mean() - slope * lx.mean()
  resid = ly - intercept - slope * lx
  stderr = np.sqrt(resid @ resid / (len(lx) - 2) / (dx @ dx)) if len(lx) > 2 else np.nan
  return float(slope), float(intercept), float(stderr)


def grad_norm_slope(batches, median_grad_norms):
  """(slope, stderr) of the least-squares line of log grad norm on log batch.

  -1/2 is the noise-dominated regime (the gradient is an average of B noisy per-sample terms);
  a flatter slope means more samples per step no longer buy a less noisy step. stderr is the
  usual OLS one, nan with fewer than 3 points (no residual degrees of freedom).
  """
  slope, _, stderr = _loglog_fit(batches, median_grad_norms)
  return slope, stderr


def doubling_ratios(batches, median_grad_norms):
  """Grad norm ratio between consecutive measured batches, per doubling, beside 2**-0.5 = 0.707.

  Arms sharing a batch are combined by geometric mean. For batches not exactly 2x apart the
  ratio is normalised to one doubling: (g2 / g1) ** (1 / log2(B2 / B1)).
  """
  logs = {}
  for b, g in zip(batches, median_grad_norms):
    if np.isfinite(g) and g > 0:
      logs.setdefault(b, []).append(np.log(g))
  points = sorted((b, float(np.exp(np.mean(v)))) for b, v in logs.items())
  return [{
      'from': b1,
      'to': b2,
      'ratio': g2 / g1,
      'per_doubling': (g2 / g1)**(1 / np.log2(b2 / b1)),
      'theory': NOISE_DOMINATED_DOUBLING,
  } for (b1, g1), (b2, g2) in zip(points, points[1:])]


def matched_sample_window(runs):
  """(0, S]: S = the fewest samples any run logged, so every arm is summarised over the same
  stretch of training measured in samples, where aligned runs are at the same point of learning
  (the grad norm drifts as the policy learns; a per-arm window would mix that drift in)."""
  ends = [r['train']['samples'][-1] for r in runs if len(r['train']['samples'])]
  return (0.0, float(min(ends)) if ends else 0.0)


def _in_window(runs, key, window):
  """Finite values of a training column over the steps whose samples fall in the window."""
  lo, hi = window
  values = [r['train'][key][(r['train']['samples'] > lo) & (r['train']['samples'] <= hi)]
            for r in runs if key in r['train']]
  values = np.concatenate(values) if values else np.zeros(0)
  return values[np.isfinite(values)]


def _median_in_window(runs, key, window):
  values = _in_window(runs, key, window)
  return float(np.median(values)) if len(values) else np.nan


def _stacked_in_window(runs, key, window):
  """Like _in_window but keeps nan rows, so the four noise-scale columns stay step-aligned."""
  lo, hi = window
  return np.concatenate([r['train'][key][(r['train']['samples'] > lo) &
                                         (r['train']['samples'] <= hi)] for r in runs])


def _runs_noise_scale(runs, window):
  keys = ('grad_sq_small', 'grad_sq_big', 'b_small', 'b_big')
  if not all(k in r['train'] for r in runs for k in keys):
    return np.nan
  return noise_scale(*(_stacked_in_window(runs, k, window) for k in keys))


# ----------------------------------------------------------------------------------------------
# The decision: predicted wall-clock to target per candidate batch.
# ----------------------------------------------------------------------------------------------


def predict_wallclock(base_samples_to_target, rn, throughput):
  """Seconds to target at a batch: the samples it needs (base N x rN) over samples per second."""
  with np.errstate(invalid='ignore', divide='ignore'):
    return np.asarray(base_samples_to_target, float) * np.asarray(rn, float) / np.asarray(
        throughput, float)


def _fill_rn(candidate, measured):
  """rN for a batch without an align measurement, from the nearest measured batch, as a bound.

  Assumes rN does not fall as the batch grows (a larger batch never needs fewer samples): the
  nearest measured batch below gives a LOWER bound; below the smallest measured batch, the
  smallest gives an UPPER bound. Never assumes 1.
  """
  below = [b for b in measured if b < candidate['batch']]
  source = max(below) if below else min(measured)
  bound = 'lower' if below else 'upper'
  return measured[source], bound, source


def decide(candidates, base_samples_to_target, allow_extrapolated=False):
  """Per-candidate predicted wall-clock to target, and the recommended (fastest) batch.

  candidates: dicts with 'batch', 'throughput_samples_per_s' and 'rN' (None where the batch was
  not in the align sweep; optional 'rN_ci'). Unmeasured batches are marked extrapolated, with a
  bounded rN from the nearest measured batch (see _fill_rn). The least predicted wall-clock among
  non-extrapolated candidates is recommended, unless allow_extrapolated.
  Returns new dicts, sorted by batch, with 'rN_used', 'rN_bound' ('measured' | 'lower' |
  'upper'), 'extrapolated', 'predicted_wallclock_s' (+ '_ci_s'), 'note' and 'recommended'.
  """
  measured = {c['batch']: c['rN'] for c in candidates if c.get('rN') is not None}
  decisions = []
  for c in sorted(candidates, key=lambda c: c['batch']):
    d = dict(c, extrapolated=c.get('rN') is None, recommended=False, note='')
    if not d['extrapolated']:
      d.update(rN_used=c['rN'], rN_bound='measured')
    elif measured:
      rn, bound, source = _fill_rn(c, measured)
      d.update(rN_used=rn, rN_bound=bound,
               note=f'not in the align sweep: rN of batch {source} used as a {bound} bound, so '
               f'the prediction is a {bound} bound on wall-clock')
    else:
      d.update(rN_used=np.nan, rN_bound='unknown', note='no measured rN to extrapolate from')
    thr = c['throughput_samples_per_s']
    d['predicted_wallclock_s'] = float(predict_wallclock(base_samples_to_target, d['rN_used'], thr))
    ci = c.get('rN_ci')
    d['predicted_wallclock_ci_s'] = (
        [float(predict_wallclock(base_samples_to_target, r, thr)) for r in ci]
        if ci is not None and not d['extrapolated'] else None)
    decisions.append(d)
  eligible = [d for d in decisions if np.isfinite(d['predicted_wallclock_s']) and
              (allow_extrapolated or not d['extrapolated'])]
  if eligible:
    min(eligible, key=lambda d: d['predicted_wallclock_s'])['recommended'] = True
  return decisions


# ----------------------------------------------------------------------------------------------
# The protocol report.
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


def _steady_state(runs):
  """Throughput from the align runs' own logs, skipping each first step (it compiles)."""
  samples, seconds, parts = 0.0, 0.0, {k: [] for k in ('rollout_time_s', 'update_time_s')}
  for r in runs:
    train = r['train']
    per_step = np.diff(np.concatenate([[0.0], train['samples']]))[1:]
    samples += np.nansum(per_step)
    seconds += np.nansum(train['step_time_s'][1:])
    for k in parts:
      parts[k].extend(train.get(k, np.zeros(0))[1:])
  median = lambda v: float(np.nanmedian(v)) if np.isfinite(v).any() else np.nan
  return {
      'samples_per_s': samples / seconds if seconds > 0 else np.nan,
      'rollout_time_s': median(np.array(parts['rollout_time_s'])),
      'update_time_s': median(np.array(parts['update_time_s'])),
      'source': 'align runs (no throughput/ file)',
  }


def _throughput_table(data):
  """Steady-state throughput per batch: throughput/ files, else the align runs' own logs."""
  table = {b: dict(t, source='throughput/') for b, t in data['throughput'].items()}
  for arm in data['arms']:
    batch = int(arm['spec']['batch'])
    if batch not in table:
      table[batch] = dict(_steady_state(arm['runs']), batch=batch)
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
  n = [samples_to_target(r, target, smooth_window) for r in runs]
  rn, lo, hi = rn_with_ci(base['runs'], runs, target, settings['n_boot'], settings['rng'],
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
      'samples_to_target': _mean_over_seeds(n),
      'samples_to_target_per_seed': n,
      'steps_to_target': _mean_over_seeds([steps_to_target(r, target, smooth_window)
                                           for r in runs]),
      'wallclock_to_target_s': _mean_over_seeds([wallclock_to_target(r, target, smooth_window)
                                                 for r in runs]),
      'rN': rn,
      'rN_ci': [lo, hi],
      'rN_status': status,
      'throughput_samples_per_s': float(throughput[int(spec['batch'])]['samples_per_s']),
      'grad_norm_median': _median_in_window(runs, 'grad_norm', window),
      'critic_grad_norm_median': _median_in_window(runs, 'critic_grad_norm', window),
      'noise_scale': _runs_noise_scale(runs, window),
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
  measured = wallclock_to_target(run, target, window)
  return {
      'batch': batch,
      'predicted_wallclock_s': predicted,
      'measured_wallclock_s': measured,
      'measured_over_predicted': measured / predicted if predicted else np.nan,
      'predicted_samples_to_target': report['base_samples_to_target'] * rn,
      'measured_samples_to_target': samples_to_target(run, target, window),
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
  window = matched_sample_window([r for arm in data['arms'] for r in arm['runs']])
  throughput = _throughput_table(data)
  arms = [_arm_summary(arm, base, settings, window, throughput) for arm in data['arms']]
  arms.sort(key=lambda a: (a['control'], a['batch'], a['name']))
  base_summary = next(a for a in arms if a['base'])
  for a in arms:
    a['rel_throughput'] = a['throughput_samples_per_s'] / base_summary['throughput_samples_per_s']
    a['steps_ratio'] = _ratio(a['steps_to_target'], base_summary['steps_to_target']).item()
  tolerance = float(protocol.get('rn_tolerance', 0.1))
  aligned = aligned_range(arms, tolerance)
  sqrt_arms = [a for a in arms if not a['control']]
  fit_arms = [a for a in sqrt_arms if a['batch'] in aligned['batches']]
  slope, stderr = grad_norm_slope([a['batch'] for a in fit_arms],
                                  [a['grad_norm_median'] for a in fit_arms])
  critic_slope, critic_stderr = grad_norm_slope([a['batch'] for a in fit_arms],
                                                [a['critic_grad_norm_median'] for a in fit_arms])
  base_n = base_summary['samples_to_target']
  candidates = decide(_candidates(arms, throughput), base_n,
                      bool(protocol.get('allow_extrapolated', False)))
  base_seconds = predict_wallclock(base_n, 1.0, base_summary['throughput_samples_per_s'])
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
      'doubling_ratios': doubling_ratios([a['batch'] for a in sqrt_arms],
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
  verdict = ('within noise (the CI includes 1)' if _ci_includes(ci, 1.0) else
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
    gap = slope - NOISE_DOMINATED_SLOPE
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
  plots = '\n'.join(f'![{p}]({p})' for p in PLOTS)
  return (f"# Align, then accelerate: {report['workdir']}\n\n## Arms (target J = "
          f"{report['target']:g})\n\n" + '\n'.join(rows) + '\n\n## Decision\n\n' +
          '\n'.join(decision) + '\n\n## What exceeds the noise\n\n' + report['summary'] +
          '\n\n## Plots\n\n' + plots + '\n')


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
# Plots.
# ----------------------------------------------------------------------------------------------


def _mean_curve(curves):
  """Seed mean on the first seed's x grid, up to where every seed has data."""
  end = min(x[-1] for x, _ in curves)
  grid = curves[0][0][curves[0][0] <= end]
  return grid, np.mean([np.interp(grid, x, y) for x, y in curves], axis=0)


def _plot_xy(run, x_key):
  """An eval curve against samples, steps or training seconds."""
  if x_key == 'wallclock':
    x, y = _eval_xy(run, 'samples')
    return _wallclock_at(run, x), y
  return _eval_xy(run, x_key)


def _colors(batches):
  """One viridis colour per batch, small to large, so the sweep reads as a gradient."""
  batches = sorted(set(batches))
  cmap = matplotlib.colormaps['viridis']
  return {b: cmap(0.9 * i / max(len(batches) - 1, 1)) for i, b in enumerate(batches)}


def _batch_axis(ax, batches):
  """Log-scale batch axis ticked at the batches themselves."""
  ax.set_xscale('log')
  ax.set_xticks(sorted(set(batches)), labels=[str(b) for b in sorted(set(batches))])
  ax.minorticks_off()
  ax.set_xlabel('batch (responses)')


def _plot_curves(path, data, report, x_key, xlabel):
  """Eval accuracy of every arm: seeds faint, seed mean bold, controls dashed, target dotted."""
  colors = _colors(arm['spec']['batch'] for arm in data['arms'])
  fig = Figure(figsize=(7.5, 4.8), layout='constrained')
  ax = fig.subplots()
  for arm in sorted(data['arms'], key=lambda a: (bool(a['spec'].get('control')),
                                                 a['spec']['batch'])):
    spec = arm['spec']
    style = dict(color=colors[spec['batch']], ls='--' if spec.get('control') else '-')
    curves = [c for c in (_plot_xy(run, x_key) for run in arm['runs']) if len(c[0])]
    for x, y in curves:
      ax.plot(x, y, alpha=0.25, lw=0.8, **style)
    if curves:
      ax.plot(*_mean_curve(curves), lw=2, label=f"{spec['name']} (B={spec['batch']})", **style)
  ax.axhline(report['target'], color='k', ls=':', lw=1, label=f"target {report['target']:g}")
  ax.set(xlabel=xlabel, ylabel='eval accuracy')
  ax.legend(fontsize=8)
  fig.savefig(path, dpi=110)


def _plot_grad_norm(path, report):
  """Median grad norm vs batch, log-log, with the aligned-range fit and a -1/2 reference."""
  fig = Figure(figsize=(6.5, 4.8), layout='constrained')
  ax = fig.subplots()
  for key, marker, label in (('grad_norm_median', 'o', 'actor'),
                             ('critic_grad_norm_median', 's', 'critic')):
    for control in (False, True):
      arms = [a for a in report['arms'] if a['control'] == control and np.isfinite(a[key])]
      if arms:
        ax.scatter([a['batch'] for a in arms], [a[key] for a in arms], marker=marker,
                   facecolors='none' if control else None, edgecolors='C0' if control else None,
                   label=f"{label}{' (control)' if control else ''}")
  fit = [a for a in report['arms'] if a['batch'] in report['grad_norm_fit_batches'] and
         not a['control']]
  slope, intercept, _ = _loglog_fit([a['batch'] for a in fit], [a['grad_norm_median'] for a in fit])
  base = next(a for a in report['arms'] if a['base'])
  batches = np.array(sorted({a['batch'] for a in report['arms']}), float)
  if np.isfinite(slope):
    ax.plot(batches, np.exp(intercept) * batches**slope, 'C1-',
            label=f'fit over aligned range: slope {slope:.3f}')
  if np.isfinite(base['grad_norm_median']):
    ax.plot(batches, base['grad_norm_median'] * (batches / base['batch'])**NOISE_DOMINATED_SLOPE,
            'k--', lw=1, label='slope -1/2 through base')
  ax.set(yscale='log', ylabel='median grad norm (matched sample window)')
  _batch_axis(ax, batches.astype(int))
  ax.legend(fontsize=8)
  fig.savefig(path, dpi=110)


def _plot_throughput(path, report):
  """Seconds per step split into rollout and update (stacked), and samples per second."""
  rows = report['throughput']
  pos = np.arange(len(rows))
  rollout = np.array([t.get('rollout_time_s', np.nan) for t in rows], float)
  update = np.array([t.get('update_time_s', np.nan) for t in rows], float)
  fig = Figure(figsize=(10, 4.2), layout='constrained')
  left, right = fig.subplots(1, 2)
  left.bar(pos, rollout, label='rollout')
  left.bar(pos, update, bottom=np.nan_to_num(rollout), label='update')
  left.set_xticks(pos, labels=[str(t['batch']) for t in rows])
  left.set(xlabel='batch (responses)', ylabel='seconds per step')
  left.legend(fontsize=8)
  right.plot([t['batch'] for t in rows], [t['samples_per_s'] for t in rows], 'o-')
  right.set(ylabel='samples per second')
  _batch_axis(right, [t['batch'] for t in rows])
  fig.savefig(path, dpi=110)


def _plot_time_to_target(path, report):
  """Predicted seconds to target per batch: measured rN with CI, bounds hollow, choice starred."""
  fig = Figure(figsize=(6.5, 4.8), layout='constrained')
  ax = fig.subplots()
  for d in report['candidates']:
    y = d['predicted_wallclock_s']
    if not np.isfinite(y):
      continue
    if d['extrapolated']:
      ax.scatter([d['batch']], [y], marker='^' if d['rN_bound'] == 'lower' else 'v',
                 facecolors='none', edgecolors='C0')
      continue
    ci = d['predicted_wallclock_ci_s']
    yerr = [[y - ci[0]], [ci[1] - y]] if ci and np.isfinite(ci).all() else None
    ax.errorbar([d['batch']], [y], yerr=yerr, fmt='o', color='C0', capsize=3,
                label='predicted (rN 95% CI)' if d['batch'] == report['base_batch'] else None)
  if report['recommended']:
    ax.scatter([report['recommended']['batch']], [report['recommended']['predicted_wallclock_s']],
               marker='*', s=250, color='C3', zorder=3, label='recommended')
  measured = [a for a in report['arms'] if not a['control'] and
              np.isfinite(a['wallclock_to_target_s'])]
  ax.scatter([a['batch'] for a in measured], [a['wallclock_to_target_s'] for a in measured],
             marker='x', color='gray', label='measured in align runs')
  ax.scatter([], [], marker='^', facecolors='none', edgecolors='C0',
             label='extrapolated (bound)')
  ax.set(ylabel='seconds to target')
  _batch_axis(ax, [d['batch'] for d in report['candidates']])
  ax.legend(fontsize=8)
  fig.savefig(path, dpi=110)


def write_report(workdir):
  """Writes report.json, report.md and the PNG plots into the workdir; returns the report."""
  data = load_workdir(workdir)
  report = dict(_report(data), plots=list(PLOTS))
  with open(os.path.join(workdir, 'report.json'), 'w') as f:
    json.dump(_jsonable(report), f, indent=2)
  with open(os.path.join(workdir, 'report.md'), 'w') as f:
    f.write(_markdown(report))
  paths = [os.path.join(workdir, p) for p in PLOTS]
  _plot_curves(paths[0], data, report, 'samples', 'cumulative training responses (samples)')
  _plot_curves(paths[1], data, report, 'step', 'update steps')
  _plot_curves(paths[2], data, report, 'wallclock', 'training wall-clock (s)')
  _plot_grad_norm(paths[3], report)
  _plot_throughput(paths[4], report)
  _plot_time_to_target(paths[5], report)
  return report


# ----------------------------------------------------------------------------------------------
# CLI.
# ----------------------------------------------------------------------------------------------


def main(argv):
  """Rebuilds DIR/report.{json,md} and the plots from logged runs, without training."""
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not flags.FLAGS.workdir:
    sys.exit('rljax.analysis: --workdir is required')
  try:
    report = write_report(flags.FLAGS.workdir)
  except (OSError, ValueError) as e:
    sys.exit(f'rljax.analysis: {e}')
  rec = report['recommended']
  print(f"wrote {os.path.join(flags.FLAGS.workdir, 'report.md')}; recommended batch: "
        f"{rec['batch'] if rec else 'none'}")


if __name__ == '__main__':
  # Defined here, not at import: rljax.main defines its own --workdir and may import this module.
  flags.DEFINE_string('workdir', None, 'Protocol workdir with arms/, throughput/, protocol.json.')
  app.run(main)
