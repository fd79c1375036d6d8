"""Resume at several points of each rollout schedule, through the public `loop.train` only.

An uninterrupted run keeps a checkpoint of every step. For each point k, a copy of it loses the
checkpoints after k (what a kill after step k's checkpoint leaves: the rows logged after k are
dropped on resume) and is resumed. Each continuation must log the uninterrupted run's rows and
end with its arrays (policy, optimizer, the pool of partial rollouts, the batch drawn ahead) and
its position in the prompt stream, so every prompt was drawn as often as without the kill.
The plain schedule is killed at random moments in tests/test_reliability.py.
"""
import shutil

import pytest

import rljax_cli as cli
from configs import grpo as grpo_config
from rljax.train import loop
from test_auto_batch import tiny_auto

pytestmark = pytest.mark.e2e   # several short trainings each


def tiny(tmp_path, **rollout):
  """A random tiny policy on 1-digit addition, P=4 x G=4, 3 steps, a checkpoint each step."""
  config = grpo_config.get_config('runlocal,P=4,G=4')
  config.data.update(dir=str(tmp_path / 'data'), digits=1, num_train=200, num_test=20)
  config.warmstart.enabled = False
  config.metrics.update(tensorboard=False, progress=False)
  config.optimizer.decay = 'constant'
  config.rollout.update(rollout)
  config.train.update(max_samples=0, max_steps=3, eval_every=2, eval_size=8, micro_batch=8,
                      checkpoint_every=1, keep_checkpoints=10)
  return config


# name: (config, the points resumed from)
SCHEDULES = {
    'partial': (lambda tmp: tiny(tmp, slots=6, partial=True, max_new_tokens=8), (1, 2)),
    'drawn_ahead': (lambda tmp: tiny(tmp, devices=4, slots=6, max_new_tokens=8), (1, 2)),
    'auto_batch': (tiny_auto, (3, 6)),   # P 4 -> 8 at step 6: before, and right after the change
}


def stream(meta):
  """Where a run is in the prompt stream and its running totals."""
  return {key: meta[key] for key in ('step', 'samples', 'tokens', 'data')}


@pytest.mark.parametrize('name', sorted(SCHEDULES))
def test_resumed_at_any_point_the_run_equals_the_uninterrupted_one(tmp_path, name):
  make_config, points = SCHEDULES[name]
  reference = tmp_path / 'reference'
  loop.train(make_config(tmp_path), str(reference))
  last = cli.last_step(reference)
  (ref_state, ref_meta), = [cli.checkpoints(reference)[0][last]]
  for point in points:
    resumed = tmp_path / f'from{point}'
    shutil.copytree(reference, resumed)
    for step in range(point + 1, last + 1):
      shutil.rmtree(resumed / 'checkpoints' / str(step))
    loop.train(make_config(tmp_path), str(resumed))
    assert cli.rows(resumed) == cli.rows(reference), point
    state, meta = cli.checkpoints(resumed)[0][last]
    assert stream(meta) == stream(ref_meta), point
    assert cli.same_arrays(state, ref_state), point
