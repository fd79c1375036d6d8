"""Checkpoints under WORKDIR/checkpoints/ with orbax: the training state (a pytree of arrays), a
small JSON of everything else needed to continue exactly (step, counters, data position, config),
and a manifest: a checksum of every array and of the JSON, saved in the same step.

Crash safety: orbax writes each step into a temporary directory and renames it when complete, so a
kill at any instant leaves the latest *complete* checkpoint restorable; temporary directories left
by a killed save are removed when the next run opens the directory. Steps beyond `keep` are first
renamed into checkpoints/deleted/ (atomic) and only then removed, in the background: deleting
them in place left half-deleted steps when killed (tests/test_checkpoint.py).

Integrity: a restore checks each array and the JSON against the manifest. When a step does not
restore or does not match, the step before it is tried; the damaged steps after the one restored
are moved to checkpoints/damaged/ with one warning line each, and with no intact step nothing
moves (Damaged) (tests/test_faults.py). A state that is not finite is never saved, so every step
kept is finite. Steps saved before manifests existed restore unchecked, with one warning line.

Several processes: each reads a step as it sees it and the first process's failure counts for
all (collectives below), so every process restores the same step, sets aside the same steps, or
stops with the same line. The trainer, `rljax.hf_export` and the warm-start cache all read
through `Checkpointer.restore`.
"""
import hashlib
import json
import os
import re
import shutil
import sys
import threading

from absl import logging
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from rljax import collective
from rljax.train import upgrades

DELETED = 'deleted'   # under WORKDIR/checkpoints/: steps beyond `keep`, on their way out
DAMAGED = 'damaged'   # under WORKDIR/checkpoints/: steps that failed their check, kept to inspect
ITEMS = ('state', 'meta', 'manifest')


class Damaged(Exception):
  """The workdir has checkpoints, but none restores and matches its manifest."""


class WriteFailed(Exception):
  """A checkpoint could not be written (read-only or vanished folder, full disk)."""


def check(train_cfg):
  """ValueError for a bad train.checkpoint_every or train.keep_checkpoints."""
  if train_cfg.checkpoint_every < 0:
    raise ValueError(f'train.checkpoint_every must be >= 0 (0: only at the end), got '
                     f'{train_cfg.checkpoint_every}')
  if train_cfg.keep_checkpoints < 1:
    raise ValueError(f'train.keep_checkpoints must be >= 1, got {train_cfg.keep_checkpoints}')


def _directory(workdir):
  return os.path.join(os.path.abspath(workdir), 'checkpoints')


def _manager(workdir, keep=None, read_only=False):
  """The manager that saves (every process takes part), or with `read_only` one that reads what
  this process sees with no collective: one process failing a read must not leave the others
  waiting in orbax's barrier (checks are agreed on afterwards, `_agreed`)."""
  alone = ocp.options.MultiprocessingOptions(
      primary_host=jax.process_index(), active_processes={jax.process_index()},
      barrier_sync_key_prefix=f'rljax_read_{jax.process_index()}')
  verbosity = logging.get_verbosity()
  if read_only:   # orbax warns, at every start, that a manager made to read only reads
    logging.set_verbosity(logging.ERROR)
  try:
    return ocp.CheckpointManager(
        _directory(workdir),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=not read_only, cleanup_tmp_directories=not read_only,
            read_only=read_only, todelete_subdir=None if read_only else DELETED,
            save_interval_steps=0 if read_only else 1,
            multiprocessing_options=alone if read_only else ocp.options.MultiprocessingOptions()),
        item_names=ITEMS)
  finally:
    logging.set_verbosity(verbosity)


def _bits(x):
  """The array's bits as uint32 (floats bitcast, so a NaN or -0.0 counts like any value)."""
  if x.dtype.itemsize == 4:
    return jax.lax.bitcast_convert_type(x, jnp.uint32)
  if x.dtype.itemsize == 2:
    return jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
  return x.astype(jnp.uint32)


def fingerprint(state):
  """(a checksum per array, whether every float is finite): `device_fingerprint` once per set of
  devices the state lives on (the sampler may have devices of its own, rollout.devices)."""
  leaves, treedef = jax.tree.flatten(state)
  by_devices = {}
  for i, leaf in enumerate(leaves):
    where = getattr(leaf, 'sharding', None)   # None: a host array
    by_devices.setdefault(where and frozenset(where.device_set), []).append(i)
  sums, finite = [None] * len(leaves), True
  for indices in by_devices.values():
    group_sums, group_finite = device_fingerprint([leaves[i] for i in indices])
    for i, checksum in zip(indices, group_sums):
      sums[i] = checksum
    finite = finite and bool(group_finite)
  return jax.tree.unflatten(treedef, sums), finite


@jax.jit
def device_fingerprint(state):
  """`fingerprint` on device. Each element's bits, mixed with its position, go through murmur3's
  finalizer (a bijection of uint32) and are summed mod 2^32: any one changed element changes the
  sum, round numbers do not collide, and an integer sum depends on neither the sharding nor the
  reduction order."""
  def checksum(x):
    h = _bits(x) ^ (jnp.arange(x.size, dtype=jnp.uint32).reshape(x.shape) * jnp.uint32(0x9E3779B9))
    h = (h ^ (h >> 16)) * jnp.uint32(0x85EBCA6B)
    h = (h ^ (h >> 13)) * jnp.uint32(0xC2B2AE35)
    return jnp.sum(h ^ (h >> 16), dtype=jnp.uint32)
  leaves = jax.tree.leaves(state)
  finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves
                              if jnp.issubdtype(x.dtype, jnp.floating)] or [jnp.bool_(True)]))
  return jax.tree.map(checksum, state), finite


def _checksums(sums):
  """{'params/layers/0/w': checksum} of a tree of checksums."""
  return {jax.tree_util.keystr(path, simple=True, separator='/'): int(value)
          for path, value in jax.tree_util.tree_flatten_with_path(jax.device_get(sums))[0]}


def _json_hash(value):
  return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _mismatch(state, meta, manifest):
  """What in a restored step differs from its manifest, in a few words; None when nothing."""
  saved, restored = manifest['arrays'], _checksums(fingerprint(state)[0])
  differ = sorted(key for key in set(saved) | set(restored) if saved.get(key) != restored.get(key))
  if differ:
    return f'{len(differ)} array(s) differ from the manifest, first {differ[0]}'
  if _json_hash(meta) != manifest['meta']:
    return 'meta differs from its manifest'
  return None


def _unparsable_json(step_dir):
  """The first of a step's JSON files (all but array data, ocdbt indexes, commit markers) that does
  not parse, relative to `step_dir`; None when all do."""
  for root, _, names in sorted(os.walk(step_dir)):
    for name in sorted(names):
      path = os.path.join(root, name)
      if (os.path.basename(root) == 'd' or name.endswith('.ocdbt') or
          name == 'commit_success.txt'):
        continue
      try:
        with open(path, encoding='utf-8') as f:
          json.load(f)
      except ValueError:
        return os.path.relpath(path, step_dir)
  return None


def _short(error):
  """The error's text on one line, without the tensorstore specs it quotes (~3 KB each)."""
  return ' '.join(str(error).split()).split(' [tensorstore_spec')[0]


def _reason(error, step_dir):
  """A short line from a restore error (tensorstore's quote whole specs): the file and the cause
  (the innermost error: orbax wraps a read that fails on one process of several)."""
  while error.__cause__ or error.__context__:
    error = error.__cause__ or error.__context__
  text = _short(error)
  text = re.sub(r'^(\w+: )?(Error opening "\w+" driver: )+', '', text)
  files = list(re.finditer(re.escape(step_dir) + r'/[^\s"\']*[^\s"\'/.]', text))
  if files:
    cause = text[files[-1].end():].strip(' "/:')
    return f'{os.path.relpath(files[-1].group(), step_dir)}: {cause[:160] or type(error).__name__}'
  if isinstance(error, ValueError) and _unparsable_json(step_dir):   # JSON or UTF-8 decoding
    return f'{_unparsable_json(step_dir)}: not valid JSON'
  return f'{type(error).__name__}: {text[:160]}'


def _steps(directory):
  """The step numbers of the complete steps in `directory`, newest first (orbax's names)."""
  names = os.listdir(directory) if os.path.isdir(directory) else []
  return sorted((int(name) for name in names if name.isdigit()), reverse=True)


def _latest_meta(workdir):
  """The JSON meta of the newest step whose meta reads, None without steps, or why none reads."""
  steps = _steps(_directory(workdir))
  if not steps:
    return None
  manager = _manager(workdir, read_only=True)
  try:
    for step in steps:
      try:
        return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
      except Exception:  # pylint: disable=broad-except  (the restore says which step and why)
        continue
  finally:
    manager.close()
  return (f'no checkpoint in {_directory(workdir)} has a readable meta (steps '
          f'{", ".join(map(str, steps))}); move that folder away to start afresh')


def read_latest_meta(workdir):
  """The JSON meta of the newest step whose meta reads as process 0 sees it, on every process
  (so all start afresh or all resume), or None without steps; reads no arrays. Raises Damaged
  when there are steps but no meta reads."""
  found = collective.from_process_0(_latest_meta(workdir) if jax.process_index() == 0 else None)
  if isinstance(found, str):
    raise Damaged(found)
  return found


def _agreed(outcome):
  """`outcome` when it is no str (a reason) on any process, else the first process's reason.
  Collective: one process's view of a step decides for all, so every process restores the same
  step (or none)."""
  if jax.process_count() == 1:
    return outcome
  reasons = collective.from_every_process(outcome if isinstance(outcome, str) else '')
  failed = [(i, why) for i, why in enumerate(reasons) if why]
  return f'on process {failed[0][0]}: {failed[0][1]}' if failed else outcome


def _seen_by_any(steps):
  """The steps that any process sees, newest first: a step one process misses is damaged there
  (collective)."""
  if jax.process_count() > 1:
    steps = {step for seen in collective.from_every_process(list(steps)) for step in seen}
  return sorted(steps, reverse=True)


class Checkpointer:
  """Saves every `every` steps (async) and keeps the last `keep`; restores the newest good one.
  `read_only`: restores only (exports, caches): leaves orbax's temporary folders of a run that may
  be saving now, and sets damaged steps aside as a restore for training would."""

  def __init__(self, workdir, every=0, keep=None, read_only=False):
    self.every, self.read_only = every, read_only
    self.directory = _directory(workdir)
    try:
      self.manager = None if read_only else _manager(workdir, keep)
      self._reader = _manager(workdir, read_only=True)
    except OSError as error:
      raise WriteFailed(f'cannot open {self.directory}: {error}') from None
    self.manager = self.manager or self._reader
    self._deleted = os.path.join(self.directory, DELETED)
    self._sweeper = None
    self._sweep()

  def _remove_deleted(self):
    for name in os.listdir(self._deleted) if os.path.isdir(self._deleted) else []:
      shutil.rmtree(os.path.join(self._deleted, name), ignore_errors=True)

  def _sweep(self, wait=False):
    """Removes the steps orbax renamed away, in a background thread (one at a time). A kill
    midway leaves only more of them for the next sweep; nothing ever reads that directory."""
    if jax.process_index() != 0 or self.read_only:
      return
    if self._sweeper and self._sweeper.is_alive():
      if not wait:
        return
      self._sweeper.join()
    self._sweeper = threading.Thread(target=self._remove_deleted, daemon=True)
    self._sweeper.start()
    if wait:
      self._sweeper.join()

  def latest_step(self):
    return self.manager.latest_step()

  def save(self, step, state, meta, force=False):
    """Saves when due (or `force`d) with its manifest. Raises FloatingPointError for a state that
    is not finite (not saved: the previous step stays the last good one) and WriteFailed when this
    or the previous save cannot be written."""
    if not (force or (self.every and step % self.every == 0)):
      return
    sums, finite = fingerprint(state)
    if not finite:
      raise FloatingPointError(
          f'the state after step {step} is not finite; not saved. The last good checkpoint is '
          f'step {self.latest_step()} in {self.directory}.')
    manifest = dict(arrays=_checksums(sums), meta=_json_hash(meta))
    try:
      self.manager.check_for_errors()   # the previous async save
      self.manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta),
          manifest=ocp.args.JsonSave(manifest)), force=force)
    except Exception as error:  # pylint: disable=broad-except
      raise WriteFailed(f'cannot write checkpoints in {self.directory}: {_short(error)}') from None
    self._sweep()

  def _set_aside(self, step, why):
    """Moves a damaged step out of orbax's sight (it would be the latest again) and says so."""
    if jax.process_index() == 0:
      target = os.path.join(self.directory, DAMAGED, str(step))
      try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.rmtree(target, ignore_errors=True)   # an earlier damaged step of that number
        os.replace(os.path.join(self.directory, str(step)), target)
        where = f'moved to {target}'
      except OSError as error:   # a read-only reader's (an export from read-only storage)
        where = f'left in place ({error.strerror})'
      print(f'rljax: warning: checkpoint step {step} is damaged ({why}); {where}',
            file=sys.stderr, flush=True)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices(f'rljax_set_aside_{step}')

  def _legacy(self, step):
    return upgrades.before_manifests(self.directory, _steps(self.directory), step)

  def restore_step(self, step, abstract=None):
    """(state, meta) of `step`, or why it does not restore or match its manifest on some process
    (a str). `abstract`: the state's jax.ShapeDtypeStructs (None: as saved). Collective: every
    process calls it for the same step, so all get the same answer."""
    legacy = self._legacy(step)
    items = dict(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
    if not legacy:
      items['manifest'] = ocp.args.JsonRestore()
    try:
      restored = self._reader.restore(step, args=ocp.args.Composite(**items))
    except Exception as error:  # pylint: disable=broad-except
      restored = _reason(error, os.path.join(self.directory, str(step)))
    restored = _agreed(restored)   # the state's check below is itself collective
    if isinstance(restored, str):
      return restored
    why = None if legacy else _mismatch(restored.state, restored.meta, restored.manifest)
    return _agreed(why or (restored.state, restored.meta))

  def restore(self, state_template=None, discard=False, legacy=None):
    """(state, meta) of the newest step that restores and matches its manifest on every process,
    or None when there is no checkpoint. The damaged steps after it are set aside. With no intact
    step: Damaged, leaving every step in place (a re-run must not start afresh on its own), or
    with `discard` (a cache that can be rebuilt) all set aside and None.

    The template fixes structure, shapes, dtypes and shardings (its values are not used); None
    restores the arrays as saved. `legacy`: (template of an older layout, (state, meta) in it ->
    (state, meta)), tried on a step that does not restore into `state_template`.
    """
    abstract = (None if state_template is None else
                jax.tree.map(ocp.utils.to_shape_dtype_struct, state_template))
    damaged = {}
    for step in _seen_by_any(self._reader.all_steps()):
      restored = self.restore_step(step, abstract)
      if isinstance(restored, str) and legacy:
        older = self.restore_step(step, jax.tree.map(ocp.utils.to_shape_dtype_struct, legacy[0]))
        restored = restored if isinstance(older, str) else legacy[1](*older)
      if isinstance(restored, str):
        damaged[step] = restored
        continue
      self._settle(damaged, step)
      return restored
    if damaged and not discard:
      reasons = '; '.join(f'step {step}: {why}' for step, why in damaged.items())
      raise Damaged(f'no checkpoint in {self.directory} is intact ({reasons}); move that folder '
                    'away to start afresh')
    self._settle(damaged, None)
    return None

  def _settle(self, damaged, step):
    """Sets aside the `damaged` steps; says when `step` (restored) had no manifest to check."""
    for bad, why in damaged.items():
      self._set_aside(bad, why)
    if step is not None and self._legacy(step) and jax.process_index() == 0:
      print(f'rljax: warning: checkpoint step {step} has no manifest (saved by an rljax before '
            'manifests); restored unchecked; the checkpoints saved from now on have one',
            file=sys.stderr, flush=True)
    self._reader.reload()
    if self.manager is not self._reader:
      self.manager.reload()

  def close(self):
    """Waits for the in-flight async save to commit and for old steps to be deleted."""
    try:
      if self.manager is not self._reader:
        self._reader.close()
      self.manager.close()
    except Exception as error:  # pylint: disable=broad-except
      raise WriteFailed(f'cannot write checkpoints in {self.directory}: {_short(error)}') from None
    finally:
      self._sweep(wait=True)
