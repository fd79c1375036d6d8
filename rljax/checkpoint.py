"""Checkpoints under WORKDIR/checkpoints/ with orbax: the training state (a pytree of arrays) and
a small JSON of everything else needed to continue exactly (step, counters, data position).

orbax writes each step into a temporary directory and renames it when complete, so a crash or a
kill at any instant leaves the latest *complete* checkpoint restorable.
"""
import os

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves every `every` steps (async) and keeps the last `keep`; restores the latest."""

  def __init__(self, workdir, every, keep):
    self.every = every
    self.manager = ocp.CheckpointManager(
        os.path.join(os.path.abspath(workdir), 'checkpoints'),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        item_names=('state', 'meta'))

  def latest_step(self):
    return self.manager.latest_step()

  def save(self, step, state, meta, force=False):
    if force or (self.every and step % self.every == 0):
      self.manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=force)

  def restore(self, state_template, step=None):
    """Returns (state, meta) of `step` (default: latest), or None when there is no checkpoint."""
    step = self.latest_step() if step is None else step
    if step is None:
      return None
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state_template)
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    return restored.state, restored.meta

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()
