"""A workdir belongs to one run: re-running the same command resumes it, and a different config
is refused before anything is built (ValueError: the main's one-line error) unless
`config.train.overwrite`, which deletes the other run's checkpoints and logs and starts afresh.

The run's config lives in every checkpoint's meta and in WORKDIR/config.json (written when the run
starts training, so a run killed before its first checkpoint is recognised too). Fields that change
how long a run goes or where its inputs live, not what it computes, may differ on resume
(RESUMABLE); the mesh may differ too, so a preempted run can continue on a different slice.

Upgrades: a field added to the config since a workdir was written is missing from its record;
it counts as unchanged when the config holds the value that computes what rljax computed before
the field existed (rljax.train.upgrades.INTRODUCED), so a run started by an earlier rljax resumes.
"""
import json
import os
import shutil
import tempfile

from rljax import files
from rljax.train import upgrades

# jax, orbax (rljax.train.checkpoint) are imported in the functions that use them: comparing two
# configs (rljax.train.upgrades) needs neither.

RESUMABLE = ('train.max_samples', 'train.max_steps', 'train.target', 'train.log_every',
             'train.checkpoint_every', 'train.keep_checkpoints', 'train.overwrite', 'data.dir',
             'warmstart.dir', 'mesh')
RUN_FILES = ('metrics.jsonl', 'eval_correct.jsonl', 'prompts.jsonl', 'config.json')
WRITTEN_FOLDERS = ('checkpoints', 'tensorboard')   # checked at start-up with the workdir
_MISSING = '<missing>'


def config_json(config):
  """The config as plain JSON values (tuples become lists), as stored in checkpoints."""
  return json.loads(config.to_json())


def flat(tree, prefix=''):
  """{'a.b': leaf} of a nested dict."""
  if not isinstance(tree, dict):
    return {prefix[:-1]: tree}
  items = {}
  for key, value in tree.items():
    items.update(flat(value, f'{prefix}{key}.'))
  return items


def changed_keys(saved, current, resumable=RESUMABLE):
  """The dotted keys of flat `saved` and `current` that differ, leaving out `resumable` fields
  and fields added by an upgrade that hold their value from before it."""
  changed = []
  for key in sorted(set(saved) | set(current)):
    if saved.get(key, _MISSING) == current.get(key, _MISSING):
      continue
    if any((key + '.').startswith(field + '.') for field in resumable):
      continue
    if (key in saved) != (key in current) and upgrades.as_before(
        key, saved if key in saved else current):
      continue
    changed.append(key)
  return changed


def differences(saved, current):
  """'key: saved -> current' for each dotted key that differs and may not differ on resume."""
  saved, current = upgrades.renamed(flat(saved)), flat(current)
  return [f'{key}: {saved.get(key, _MISSING)!r} -> {current.get(key, _MISSING)!r}'
          for key in changed_keys(saved, current)]


def _clear(workdir):
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  if jax.process_index() == 0:
    shutil.rmtree(os.path.join(workdir, 'checkpoints'), ignore_errors=True)
    for name in RUN_FILES:
      if os.path.exists(os.path.join(workdir, name)):
        os.remove(os.path.join(workdir, name))
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('rljax_workdir_cleared')


def check_writable(folder):
  """Raises ValueError unless a file can be created in `folder` (when it exists): the real test,
  where permission bits say nothing (root, a read-only mount, an immutable folder)."""
  if not os.path.lexists(folder):
    return
  if not os.path.isdir(folder):
    raise ValueError(f'{folder} exists and is not a directory')
  try:
    with tempfile.TemporaryFile(dir=folder):
      pass
  except OSError as error:
    raise ValueError(f'{folder} is not writable ({error.strerror})') from None


def prepare(workdir, config):
  """Checks that `workdir` holds no other run (or clears it on overwrite); returns the latest
  checkpoint's meta, or None for a fresh run. Writes nothing else: see `claim`."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f'workdir {workdir} exists and is not a directory')
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as error:
    raise ValueError(f'cannot create workdir {workdir}: {error}') from None
  for folder in (workdir, *(os.path.join(workdir, name) for name in WRITTEN_FOLDERS)):
    check_writable(folder)
  from rljax.train import checkpoint  # pylint: disable=g-import-not-at-top
  current = config_json(config)
  meta = checkpoint.read_latest_meta(workdir)
  saved = meta.get('config', {'<config>': 'not recorded'}) if meta else files.read_json(
      os.path.join(workdir, 'config.json'))
  changed = differences(saved, current) if saved is not None else []
  if changed:
    if not config.train.overwrite:
      shown = '; '.join(changed[:3]) + (f'; and {len(changed) - 3} more' if len(changed) > 3
                                        else '')
      raise ValueError(
          f'workdir {workdir} holds another run, with a different config ({shown}). Re-run with '
          'that config to resume it, use another workdir, or pass --config.train.overwrite=True '
          'to delete it and start afresh')
    _clear(workdir)
    meta = None
  return meta


def claim(workdir, config):
  """Records the run's config in WORKDIR/config.json once it passed every check and starts."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_index() == 0:
    files.write_json_atomic(os.path.join(workdir, 'config.json'), config_json(config))


def record_or_check(workdir, config):
  """For runs a driver re-enters (the protocol's): records WORKDIR/config.json, or raises
  ValueError unless `config` equals the recorded one in every field, budgets included (a field an
  upgrade added counts as equal while it holds its value from before the upgrade)."""
  path = os.path.join(workdir, 'config.json')
  saved, current = files.read_json(path), config_json(config)
  if saved is None:
    os.makedirs(workdir, exist_ok=True)
    files.write_json_atomic(path, current)
    return
  saved, current = upgrades.renamed(flat(saved)), flat(current)
  changed = changed_keys(saved, current, resumable=())
  if changed:
    k = changed[0]
    raise ValueError(f'{workdir} was started with {k}={saved.get(k, _MISSING)!r}, the config now '
                     f'says {current.get(k, _MISSING)!r} ({len(changed)} field(s) differ): use a '
                     'new --workdir or the original config')
