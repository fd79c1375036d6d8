"""The numerical guard of rljax.update.apply_update + rljax.optim: a non-finite loss or gradient
skips the update (params and optimizer moments bit-for-bit unchanged) and is counted; a finite one
is applied as plain numpy computes it."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rljax import optim
from rljax import update


def _loss(params, batch):
  """Linear in params: the gradient is batch['x'] summed over rows, finite even when the loss is
  made NaN by batch['poison']."""
  loss = jnp.sum(batch['x'] @ params['w']) + jnp.sum(batch['poison'])
  return loss, {'rows': jnp.float32(batch['x'].shape[0])}


def _optimizer(lr=0.1):
  cfg = ml_collections.ConfigDict(dict(lr=lr, base_batch=4, lr_rule='constant', warmup_steps=0,
                                       max_grad_norm=0.0, b1=0.9, b2=0.999, eps=1e-8,
                                       weight_decay=0.0, max_bad_steps=3))
  return optim.make_optimizer(cfg, batch=4)[0]


def _batch(poison=0.0, scale=1.0, corrupt=0.0):
  x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 * scale
  x[1, 1] += corrupt
  return {'x': jnp.asarray(x), 'poison': jnp.full((4,), poison, jnp.float32)}


@pytest.mark.parametrize('batch', [_batch(poison=np.nan), _batch(poison=np.inf),
                                   _batch(corrupt=np.inf)], ids=['nan-loss', 'inf-loss', 'inf-grad'])
def test_non_finite_update_is_skipped_and_counted(batch):
  optimizer = _optimizer()
  params = {'w': jnp.asarray([0.5, -1.0, 2.0], jnp.float32)}
  state = optimizer.init(params)
  params, state, _ = update.apply_update(_loss, optimizer, params, state, _batch(), num_micro=2)
  before_params, before_state = jax.device_get((params, state))
  params, state, metrics = update.apply_update(_loss, optimizer, params, state, batch, num_micro=2)
  assert int(metrics['skipped']) == 1
  assert int(state.notfinite_count) == 1 and int(state.total_notfinite) == 1
  assert np.asarray(params['w']).tobytes() == before_params['w'].tobytes()
  for new, old in zip(jax.tree.leaves(state.inner_state), jax.tree.leaves(before_state.inner_state)):
    assert np.asarray(new).tobytes() == np.asarray(old).tobytes()
  # The next finite update applies and resets the in-a-row count (not the total).
  params, state, metrics = update.apply_update(_loss, optimizer, params, state, _batch(), 2)
  assert int(metrics['skipped']) == 0 and int(state.notfinite_count) == 0
  assert int(state.total_notfinite) == 1
  assert not np.array_equal(params['w'], before_params['w'])


def test_finite_update_matches_numpy_adam():
  lr, b1, b2, eps = 0.1, 0.9, 0.999, 1e-8
  optimizer = _optimizer(lr)
  w = np.asarray([0.5, -1.0, 2.0], np.float64)
  params = {'w': jnp.asarray(w, jnp.float32)}
  state = optimizer.init(params)
  m = v = np.zeros(3)
  for t in range(1, 4):
    batch = _batch(scale=t)
    params, state, _ = update.apply_update(_loss, optimizer, params, state, batch, num_micro=2)
    g = np.asarray(batch['x'], np.float64).sum(0)
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    w = w - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
  np.testing.assert_allclose(params['w'], w, rtol=1e-5)
