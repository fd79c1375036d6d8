"""Checkpoints under WORKDIR/checkpoints/ with orbax: the training state (a pytree of arrays) and
a small JSON of everything else needed to continue exactly (step, counters, data position, config).

Crash safety: orbax writes each step into a temporary directory and renames it when complete, so a
kill at any instant leaves the latest *complete* checkpoint restorable; temporary directories left
by a killed save are removed when the next run opens the directory. Steps beyond `keep` are first
renamed into checkpoints/deleted/ (atomic) and only then removed, in the background: deleting
them in place left half-deleted steps when killed (tests/test_checkpoint.py).
"""
import os
import shutil
import threading

import jax
import orbax.checkpoint as ocp

DELETED = 'deleted'   # under WORKDIR/checkpoints/: steps beyond `keep`, on their way out


def _directory(workdir):
  return os.path.join(os.path.abspath(workdir), 'checkpoints')


def _manager(workdir, keep=None, read_only=False):
  return ocp.CheckpointManager(
      _directory(workdir),
      options=ocp.CheckpointManagerOptions(
          max_to_keep=keep, create=not read_only, cleanup_tmp_directories=not read_only,
          read_only=read_only, todelete_subdir=None if read_only else DELETED),
      item_names=('state', 'meta'))


def read_latest_meta(workdir):
  """The JSON meta of the latest complete checkpoint in `workdir`, or None; reads no arrays."""
  if not os.path.isdir(_directory(workdir)):
    return None
  manager = _manager(workdir, read_only=True)
  try:
    step = manager.latest_step()
    if step is None:
      return None
    return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
  finally:
    manager.close()


class Checkpointer:
  """Saves every `every` steps (async) and keeps the last `keep`; restores the latest."""

  def __init__(self, workdir, every, keep):
    self.every = every
    self.manager = _manager(workdir, keep)
    self._deleted = os.path.join(_directory(workdir), DELETED)
    self._sweeper = None
    self._sweep()

  def _remove_deleted(self):
    for name in os.listdir(self._deleted) if os.path.isdir(self._deleted) else []:
      shutil.rmtree(os.path.join(self._deleted, name), ignore_errors=True)

  def _sweep(self, wait=False):
    """Removes the steps orbax renamed away, in a background thread (one at a time). A kill
    midway leaves only more of them for the next sweep; nothing ever reads that directory."""
    if jax.process_index() != 0:
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
    if force or (self.every and step % self.every == 0):
      self.manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=force)
      self._sweep()

  def restore(self, state_template, step=None):
    """Returns (state, meta) of `step` (default: latest), or None when there is no checkpoint.

    The template fixes structure, shapes, dtypes and shardings; its values are not used.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      return None
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state_template)
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    return restored.state, restored.meta

  def close(self):
    """Waits for the in-flight async save to commit and for old steps to be deleted."""
    self.manager.wait_until_finished()
    self.manager.close()
    self._sweep(wait=True)
