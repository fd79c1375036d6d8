"""rljax.optim: the learning-rate rule of the global batch, the warmup schedule, and that the
optimizer really steps with that learning rate."""

import math

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from rljax import optim


def opt_cfg(**overrides):
  values = dict(lr=1e-3, base_batch=128, lr_rule='sqrt', warmup_steps=0, max_grad_norm=1.0,
                b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, max_bad_steps=5)
  values.update(overrides)
  return ml_collections.ConfigDict(values)


@pytest.mark.parametrize('rule,batch,expected', [
    ('sqrt', 128, 1e-3),
    ('sqrt', 512, 2e-3),            # 1e-3 * sqrt(4)
    ('sqrt', 32, 5e-4),             # 1e-3 * sqrt(1/4)
    ('sqrt', 1024, 1e-3 * math.sqrt(8)),
    ('linear', 512, 4e-3),
    ('linear', 64, 5e-4),
    ('constant', 4096, 1e-3),
    ('constant', 1, 1e-3),
])
def test_scaled_lr_hand_values(rule, batch, expected):
  assert optim.scaled_lr(1e-3, batch, 128, rule) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize('args', [
    (1e-3, 128, 128, 'cubic'),      # unknown rule
    (1e-3, 128, 128, 'Sqrt'),
    (-1e-3, 128, 128, 'sqrt'),      # negative lr
    (0.0, 128, 128, 'sqrt'),
    (1e-3, 0, 128, 'sqrt'),         # empty batch
    (1e-3, 128, -1, 'linear'),
])
def test_scaled_lr_rejects_bad_input(args):
  with pytest.raises(ValueError):
    optim.scaled_lr(*args)


def test_make_optimizer_rejects_bad_config():
  with pytest.raises(ValueError, match='lr_rule'):
    optim.make_optimizer(opt_cfg(lr_rule='quadratic'), 128)
  with pytest.raises(ValueError):
    optim.make_optimizer(opt_cfg(lr=-1.0), 128)


def test_schedule_constant_without_warmup():
  _, schedule = optim.make_optimizer(opt_cfg(lr=1e-3, lr_rule='sqrt'), 512)
  for step in (0, 1, 10, 1000):
    assert float(schedule(step)) == pytest.approx(2e-3, rel=1e-6)


def test_warmup_schedule_values():
  # Peak 1e-3 * 512 / 128 = 4e-3 (linear rule); 4 warmup steps: peak * (step + 1) / 5, then peak.
  _, schedule = optim.make_optimizer(opt_cfg(lr=1e-3, lr_rule='linear', warmup_steps=4), 512)
  expected = [0.8e-3, 1.6e-3, 2.4e-3, 3.2e-3, 4e-3, 4e-3, 4e-3]
  got = [float(schedule(step)) for step in range(7)]
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  assert float(schedule(10_000)) == pytest.approx(4e-3, rel=1e-6)


def adam_first_step(cfg, batch, grad):
  tx, _ = optim.make_optimizer(cfg, batch)
  params = {'w': jnp.array([0.5], jnp.float32)}
  updates, _ = tx.update({'w': jnp.array([grad], jnp.float32)}, tx.init(params), params)
  return float(optax.apply_updates(params, updates)['w'][0]) - 0.5


@pytest.mark.parametrize('rule,batch,grad,lr', [
    ('sqrt', 512, 3.0, 2e-3),       # Adam's first step is lr * sign(g), whatever |g| (clipped or not)
    ('sqrt', 128, -0.02, 1e-3),
    ('linear', 256, 0.5, 2e-3),
    ('constant', 1024, -7.0, 1e-3),
])
def test_optimizer_steps_by_the_scaled_lr(rule, batch, grad, lr):
  delta = adam_first_step(opt_cfg(lr=1e-3, lr_rule=rule), batch, grad)
  assert delta == pytest.approx(-np.sign(grad) * lr, rel=1e-4)


def test_optimizer_first_step_uses_warmup_lr():
  delta = adam_first_step(opt_cfg(lr=1e-3, lr_rule='sqrt', warmup_steps=3), 512, 1.0)
  assert delta == pytest.approx(-2e-3 / 4, rel=1e-4)   # peak 2e-3, first warmup value peak / 4
