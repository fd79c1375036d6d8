"""The protocol's directory: one declared schema, written by rljax.protocol.driver and read back by
the report (rljax.protocol.report).

Layout of a protocol workdir D (SCHEMA names each JSON file and the fields it must hold):
  D/protocol.json                        the protocol's settings
  D/calibration.json                     lr0 and where it came from ('calibrated' or 'given'); the
                                         budgets it derived (protocol.budget_scales)
  D/<group>/<arm>/arm.json               one arm: a batch at an lr; group is one of GROUPS
  D/<group>/<arm>/seed_<k>/metrics.jsonl an ordinary training run of that arm
  D/throughput/<batch>/round_<r>.json    one steady-state throughput measurement
  D/timing.json                          seconds each phase took
  D/report.json, D/report.md, D/PLOTS    the report, rebuilt from the rest
A run directory with reused.json is a copy of another group's run (archives written before the
calibration's runs were kept out of the base arm): read as a run of its arm, its samples counted
once.
"""
import functools
import os

import numpy as np

from rljax import files

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
  files.write_json_atomic(target, _checked(kind, jsonable(value), target))


def read(workdir, kind, **where):
  """One record of the schema, or None when there is none; ValueError if it lacks a field."""
  source = path(workdir, kind, **where)
  value = files.read_json(source)
  return None if value is None else _checked(kind, value, source)


def jsonable(x):
  """Plain JSON: numpy scalars to Python, non-finite floats to null (statuses carry meaning)."""
  if isinstance(x, (np.ndarray, np.generic)):
    x = x.tolist()
  if isinstance(x, dict):
    return {str(k): jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [jsonable(v) for v in x]
  if isinstance(x, float) and not np.isfinite(x):
    return None
  return x


def _last_per_step(rows):
  """One row per step, the last logged: a resumed run re-logs the steps after its checkpoint."""
  by_step = {row['step']: row for row in rows if 'step' in row}
  return [by_step[step] for step in sorted(by_step)]


_NUMBER_OR_NONE = {int, float, type(None)}


def _columns(rows, required):
  """Numeric fields as float arrays (nan where a row lacks one); `required` ones always exist."""
  columns = {key: np.zeros(0) for key in required}
  for key in sorted({key for row in rows for key in row}):
    values = [row.get(key) for row in rows]
    if {type(v) for v in values} <= _NUMBER_OR_NONE:   # bool is not a number here
      columns[key] = np.array(values, float)   # None -> nan
  return columns


def load_run(directory):
  """One run's metrics.jsonl as numpy columns: {'dir', 'train', 'eval'}, one row per step each
  (training and eval rows are told apart by the `"eval": true` marker). A log read before and
  unchanged since (same size and mtime) is not parsed again: the driver rebuilds the report after
  every stage of seeds. Its arrays are read-only."""
  log = os.stat(os.path.join(directory, 'metrics.jsonl'))
  return dict(_parsed_run(directory, log.st_size, log.st_mtime_ns),
              reused=os.path.exists(os.path.join(directory, 'reused.json')))   # another group's


@functools.lru_cache(maxsize=4096)
def _parsed_run(directory, size, mtime_ns):
  del size, mtime_ns   # the cache key: the log as it is now
  rows = files.read_jsonl(os.path.join(directory, 'metrics.jsonl'))
  run = {
      'dir': directory,
      'train': _columns(_last_per_step([r for r in rows if not r.get('eval')]),
                        ('step', 'samples', 'step_time_s', 'grad_norm')),
      'eval': _columns(_last_per_step([r for r in rows if r.get('eval')]),
                       ('step', 'samples', 'eval_accuracy')),
  }
  for array in (*run['train'].values(), *run['eval'].values()):
    array.flags.writeable = False
  return run


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
