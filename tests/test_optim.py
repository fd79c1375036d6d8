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
  values = dict(lr=1e-3, base_batch=128, lr_rule='sqrt', warmup_steps=0, decay='constant',
                max_grad_norm=1.0, clip_rule='constant', b1=0.9, b2=0.999, eps=1e-8,
                weight_decay=0.0, max_bad_steps=5)
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


def reference_clip(max_grad_norm, batch, base_batch, rule):
  """The clip rule written out in numpy: MLPerf v6.1 GRPO's 0.125 * sqrt(256 / B) at 0.125, 256."""
  return max_grad_norm * {'constant': 1.0, 'inverse_sqrt': np.sqrt(base_batch / batch)}[rule]


@pytest.mark.parametrize('rule', ['constant', 'inverse_sqrt'])
@pytest.mark.parametrize('batch', [16, 256, 512, 1024, 3000])
def test_scaled_clip_matches_the_numpy_rule(rule, batch):
  assert optim.scaled_clip(0.125, batch, 256, rule) == pytest.approx(
      reference_clip(0.125, batch, 256, rule), rel=1e-12)
  assert optim.scaled_clip(0.0, batch, 256, rule) == 0.0   # no clipping at any batch


def test_an_optimizer_section_at_a_batch_is_its_lr_and_clip_rules():
  opt = opt_cfg(lr=1e-3, base_batch=128, max_grad_norm=0.5, clip_rule='inverse_sqrt')
  lr, clip = optim.at_batch(opt, 512)
  assert lr == pytest.approx(1e-3 * np.sqrt(512 / 128), rel=1e-12)
  assert clip == pytest.approx(reference_clip(0.5, 512, 128, 'inverse_sqrt'), rel=1e-12)


def test_mlperf_clip_values():
  """The clip norms of MLPerf's reference convergence points (rcps_qwen35_397b_grpo.json)."""
  got = [optim.scaled_clip(0.125, b, 256, 'inverse_sqrt') for b in (256, 512, 1024)]
  np.testing.assert_allclose(got, [0.125, 0.08838834765, 0.0625], rtol=1e-10)


@pytest.mark.parametrize('args,match', [
    ((1.0, 128, 128, 'sqrt'), 'clip_rule'),
    ((-1.0, 128, 128, 'constant'), 'max_grad_norm'),
    ((float('nan'), 128, 128, 'constant'), 'max_grad_norm'),
])
def test_scaled_clip_rejects_bad_input(args, match):
  with pytest.raises(ValueError, match=match):
    optim.scaled_clip(*args)
  with pytest.raises(ValueError, match=f'optimizer.{match}'):
    optim.check('optimizer', opt_cfg(max_grad_norm=args[0], clip_rule=args[3]), 128)


@pytest.mark.parametrize('rule', ['constant', 'inverse_sqrt'])
@pytest.mark.parametrize('grad', [[3.0, -4.0], [0.01, 0.02]])
def test_optimizer_clips_at_the_rule_s_norm(rule, grad):
  """Adam's first moment after one update is (1 - b1) x the clipped gradient, clipped to the
  rule's norm at this batch (numpy: g x min(1, clip / |g|))."""
  cfg, batch = opt_cfg(max_grad_norm=1.0, base_batch=128, clip_rule=rule), 512
  tx, _ = optim.make_optimizer(cfg, batch)
  params = {'w': jnp.zeros(2, jnp.float32)}
  _, state = tx.update({'w': jnp.array(grad, jnp.float32)}, tx.init(params), params)
  g = np.array(grad)
  clip = reference_clip(1.0, batch, 128, rule)
  clipped = g * min(1.0, clip / np.linalg.norm(g))
  mu = optax.tree_utils.tree_get(state, 'mu')['w']
  np.testing.assert_allclose(np.asarray(mu), (1 - cfg.b1) * clipped, rtol=1e-5)


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
    # Adam's first step is lr * sign(g), whatever |g| (clipped or not)
    ('sqrt', 512, 3.0, 2e-3),
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


def reference_lr(decay, peak, warmup, total, update):
  """Warmup then decay to 0 at `total`, written out by hand (numpy)."""
  if update < warmup:
    return peak * (update + 1) / (warmup + 1)
  frac = min((update - warmup) / (total - warmup), 1.0)
  return {'constant': peak, 'linear': peak * (1 - frac),
          'cosine': peak * 0.5 * (1 + np.cos(np.pi * frac))}[decay]


@pytest.mark.parametrize('decay', ['constant', 'linear', 'cosine'])
@pytest.mark.parametrize('warmup', [0, 3])
def test_decay_schedules(decay, warmup):
  total = 20   # peak 2e-3 (sqrt rule at 512), annealed over updates warmup .. 20
  _, schedule = optim.make_optimizer(opt_cfg(lr=1e-3, warmup_steps=warmup, decay=decay), 512, total)
  got = [float(schedule(update)) for update in range(total + 5)]
  expected = [reference_lr(decay, 2e-3, warmup, total, update) for update in range(total + 5)]
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-12)
  if decay != 'constant':
    assert got[total] == 0 and got[total - 1] > 0


def test_optimizer_steps_by_the_decayed_lr():
  """Adam on a constant gradient moves each update by exactly that update's lr: the displacement
  after n updates is the sum of the schedule's first n values."""
  tx, _ = optim.make_optimizer(opt_cfg(lr=1e-3, lr_rule='constant', decay='linear'), 128, 10)
  params = {'w': jnp.array([0.5], jnp.float32)}
  state = tx.init(params)
  for _ in range(6):
    updates, state = tx.update({'w': jnp.array([0.3], jnp.float32)}, state, params)
    params = optax.apply_updates(params, updates)
  expected = sum(reference_lr('linear', 1e-3, 0, 10, update) for update in range(6))
  assert 0.5 - float(params['w'][0]) == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize('train,batch,expected', [
    (dict(max_samples=100_000, max_steps=0), 128, 782),            # ceil(100000 / 128)
    (dict(max_samples=100_000, max_steps=500), 128, 500),          # the smaller budget ends the run
    (dict(max_samples=0, max_steps=40), 128, 40),
    (dict(max_samples=1024, max_steps=0, num_minibatches=4, num_epochs=2), 128, 64),
])
def test_planned_updates(train, batch, expected):
  cfg = ml_collections.ConfigDict(dict(dict(num_minibatches=1, num_epochs=1), **train))
  assert optim.planned_updates(cfg, batch) == expected


def test_decay_rejects_bad_input():
  with pytest.raises(ValueError, match='decay'):
    optim.make_optimizer(opt_cfg(decay='step'), 128, 100)
  with pytest.raises(ValueError, match='warmup_steps'):
    optim.make_optimizer(opt_cfg(decay='linear', warmup_steps=10), 128, 10)
