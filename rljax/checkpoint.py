"""Checkpoints under WORKDIR/checkpoints/ with orbax: the training state (a pytree of arrays) and
a small JSON of everything else needed to continue exactly (step, counters, data position, config).

Crash safety: orbax writes each step into a temporary directory and renames it when complete, so a
kill at any instant leaves the latest *complete* checkpoint restorable; temporary directories left
by a killed save are removed when the next run opens the directory. (Deleting a step beyond
`keep` is not atomic: a kill then can leave that older, already superseded step half-deleted; it is
never the latest, and the next save deletes it.)
"""
import os

import jax
import orbax.checkpoint as ocp


def _manager(workdir, keep=None, read_only=False):
  return ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), 'checkpoints'),
      options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only,
                                           cleanup_tmp_directories=not read_only,
                                           read_only=read_only),
      item_names=('state', 'meta'))


def read_latest_meta(workdir):
  """The JSON meta of the latest complete checkpoint in `workdir`, or None; reads no arrays."""
  if not os.path.isdir(os.path.join(workdir, 'checkpoints')):
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

  def latest_step(self):
    return self.manager.latest_step()

  def save(self, step, state, meta, force=False):
    if force or (self.every and step % self.every == 0):
      self.manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=force)

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
    """Waits for the in-flight async save to commit."""
    self.manager.wait_until_finished()
    self.manager.close()
