"""rljax.update: the GRPO policy loss accumulated over 1, 2 or 4 micro-batches gives the same loss,
gradients and updated parameters; noise-scale metrics; a non-finite batch skips the update."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from rljax import losses
from rljax.model import transformer as model_lib
from rljax import optim
from rljax import policy_loss
from rljax import update

import random_params as random_params_lib

V, B, PROMPT_LEN, RESP_LEN = 16, 8, 5, 6
TEMPERATURE, CLIP_LOW, CLIP_HIGH, KL_COEF = 0.8, 0.2, 0.28, 0.3
MODES = ('token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum-norm')
# A dense feed-forward keeps the six compiles affordable on CPU. (With MoE the token routing is
# per token, hence split-invariant too, but the load-balancing loss is not additive over
# micro-batches: see the report.)
CFG = model_lib.ModelConfig(vocab_size=V, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2,
                            head_dim=8, num_experts=0, dense_hidden=48)
MODEL = model_lib.Transformer(CFG)
OPT = ml_collections.ConfigDict(dict(lr=1e-2, base_batch=B, lr_rule='sqrt', warmup_steps=0,
                                     decay='constant', max_grad_norm=0.0, clip_rule='constant',
                                     b1=0.9, b2=0.999, eps=1e-3, weight_decay=0.0, max_bad_steps=3))


def random_params(seed):
  return random_params_lib.for_model(CFG, seed, norm_std=0.3, wide=())


def loss_cfg(kl_coef):
  return ml_collections.ConfigDict(dict(clip_low=CLIP_LOW, clip_high=CLIP_HIGH, kl_coef=kl_coef,
                                        kl_estimator='k3', moe_aux_coef=1e-3))


@functools.lru_cache(maxsize=None)
def step_fn(kl_coef, num_micro):
  """Jitted apply_update with the project's optimizer (one compile per (kl_coef, num_micro))."""
  loss_fn = policy_loss.make_policy_loss(MODEL, loss_cfg(kl_coef), TEMPERATURE, num_micro)
  tx, _ = optim.make_optimizer(OPT, B)

  def step(params, opt_state, batch, ref_params):
    micro_loss = lambda p, b: loss_fn(p, b, ref_params if kl_coef else None)
    return update.apply_update(micro_loss, tx, params, opt_state, batch, num_micro)
  return jax.jit(step), tx


@functools.lru_cache(maxsize=None)
def logprobs_fn():
  return jax.jit(functools.partial(policy_loss.response_logprobs, MODEL))


def make_setup(seed=0):
  rng = np.random.default_rng(seed)
  params = random_params(seed)
  ref_params = jax.tree.map(lambda p: p + 0.05 * jnp.asarray(rng.normal(size=p.shape), p.dtype),
                            params)
  prompt = rng.integers(2, V, size=(B, PROMPT_LEN)).astype(np.int32)
  valid = np.zeros((B, PROMPT_LEN), bool)
  for b, n in enumerate([5, 2, 4, 1, 5, 3, 5, 2]):
    valid[b, PROMPT_LEN - n:] = True
  prompt[~valid] = 0
  lengths = np.array([6, 1, 3, 0, 6, 4, 2, 5])   # one empty row (e.g. a filtered group)
  mask = (np.arange(RESP_LEN)[None] < lengths[:, None]).astype(np.float32)
  response = np.where(mask > 0, rng.integers(1, V, size=(B, RESP_LEN)), 0).astype(np.int32)
  logp, *_ = logprobs_fn()(params, jnp.asarray(prompt), jnp.asarray(valid),
                           jnp.asarray(response), jnp.float32(TEMPERATURE))
  old_logp = (np.asarray(logp) + 0.25 * rng.normal(size=logp.shape)) * mask  # ratios around 1
  advantages = rng.normal(size=(B, 1)) * mask
  batch = policy_loss.PolicyBatch(
      prompt_BxT=jnp.asarray(prompt), prompt_valid_BxT=jnp.asarray(valid),
      response_BxL=jnp.asarray(response), mask_BxL=jnp.asarray(mask),
      old_logp_BxL=jnp.asarray(old_logp, jnp.float32),
      advantages_BxL=jnp.asarray(advantages, jnp.float32),
      weights_BxL=jnp.zeros((B, RESP_LEN), jnp.float32))
  return params, ref_params, batch


def np_weights(mask, mode):
  mask = np.asarray(mask, np.float64)
  lengths = mask.sum(1, keepdims=True)
  if mode == 'token-mean':
    return mask / mask.sum()
  if mode == 'seq-mean-token-mean':
    return np.where(lengths > 0, mask / np.maximum(lengths, 1) / (lengths > 0).sum(), 0.0)
  return mask / mask.size


def np_grpo_loss(logp, old_logp, ref_logp, advantages, weights, kl_coef):
  """Clipped surrogate + kl_coef * k3 estimate, summed with the aggregation weights (float64)."""
  logp, old_logp, ref_logp, advantages = (np.asarray(x, np.float64)
                                          for x in (logp, old_logp, ref_logp, advantages))
  ratio = np.exp(logp - old_logp)
  surrogate = np.minimum(ratio * advantages,
                         np.clip(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH) * advantages)
  log_r = ref_logp - logp
  k3 = np.exp(log_r) - 1 - log_r
  return float(np.sum(weights * (-surrogate + kl_coef * k3)))


def grads_from(opt_state):
  """The gradient of the (first) Adam step, read back from Adam's first moment: mu = (1 - b1) g."""
  return jax.tree.map(lambda mu: np.asarray(mu, np.float64) / (1 - OPT.b1),
                      optax.tree_utils.tree_get(opt_state, 'mu'))


def assert_trees_close(a, b, rtol, what, atol=None):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if atol is None:
      # f32 sums in another order: entries that are ~0 by cancellation get the rounding error
      # of their (much larger) terms, so they are compared at rtol x the leaf's largest entry.
      atol = rtol * np.abs(y).max()
    np.testing.assert_allclose(x, y, rtol=rtol, atol=atol,
                               err_msg=f'{what} {jax.tree_util.keystr(path)}')


@pytest.mark.parametrize('kl_coef', [pytest.param(0.0, marks=pytest.mark.e2e), KL_COEF])
def test_micro_batch_split_invariance(kl_coef):
  params, ref_params, batch = make_setup()
  logp, *_ = logprobs_fn()(params, batch.prompt_BxT, batch.prompt_valid_BxT, batch.response_BxL,
                           jnp.float32(TEMPERATURE))
  ref_logp, *_ = logprobs_fn()(ref_params, batch.prompt_BxT, batch.prompt_valid_BxT,
                               batch.response_BxL, jnp.float32(TEMPERATURE))
  for mode in MODES:
    weights = losses.token_weights(batch.mask_BxL, mode)
    np.testing.assert_allclose(np.asarray(weights), np_weights(batch.mask_BxL, mode), rtol=1e-6)
    full = batch._replace(weights_BxL=weights)
    results = {}
    for num_micro in (1, 2, 4):
      step, tx = step_fn(kl_coef, num_micro)
      new_params, opt_state, metrics = step(params, tx.init(params), full, ref_params)
      assert int(metrics['skipped']) == 0
      results[num_micro] = (jax.device_get(new_params), grads_from(opt_state),
                            jax.device_get(metrics))
      has_noise_terms = {'grad_sq_small', 'grad_sq_big', 'b_small', 'b_big'} <= set(metrics)
      assert has_noise_terms == (num_micro > 1), sorted(metrics)
      assert ('kl' in metrics) == bool(kl_coef)

    # The loss against an independent numpy computation from the model's log-probs.
    expected = np_grpo_loss(logp, batch.old_logp_BxL, ref_logp, batch.advantages_BxL,
                            np_weights(batch.mask_BxL, mode), kl_coef)
    np.testing.assert_allclose(float(results[1][2]['loss']), expected, rtol=1e-5)
    base_params, base_grads, base_metrics = results[1]
    assert max(np.abs(g).max() for g in jax.tree.leaves(base_grads)) > 1e-3
    np.testing.assert_allclose(float(base_metrics['grad_norm']),
                               np.sqrt(sum(np.sum(g ** 2) for g in jax.tree.leaves(base_grads))),
                               rtol=1e-5)
    for num_micro in (2, 4):
      new_params, grads, metrics = results[num_micro]
      for key in ('loss', 'pg_loss', 'entropy', 'clipfrac', 'approx_kl', 'num_tokens',
                  'logprob_mismatch_sum', 'grad_norm') + (('kl',) if kl_coef else ()):
        np.testing.assert_allclose(float(metrics[key]), float(base_metrics[key]), rtol=1e-5,
                                   atol=1e-7, err_msg=f'{mode} {num_micro} {key}')
      assert_trees_close(grads, base_grads, 1e-5, f'{mode} micro={num_micro} grad')
      # Adam divides by |g| + eps: an entry whose gradient is ~0 by cancellation (absolute
      # error ~1e-7) moves by up to lr * 1e-7 / eps differently; allow 2e-4 * lr for that.
      assert_trees_close(new_params, base_params, 1e-5, f'{mode} micro={num_micro} params',
                         atol=2e-4 * OPT.lr)
    # The update did move the parameters (by ~lr per weight for Adam's first step).
    moved = max(np.abs(np.asarray(a) - np.asarray(b)).max()
                for a, b in zip(jax.tree.leaves(base_params), jax.tree.leaves(params)))
    assert 0.5 * OPT.lr < moved <= 1.01 * OPT.lr


def test_noise_scale_terms():
  """grad_sq_big = |g|^2 of the batch gradient; grad_sq_small = num_micro * sum_i |g_i|^2."""
  params, ref_params, batch = make_setup(seed=1)
  full = batch._replace(weights_BxL=losses.token_weights(batch.mask_BxL, 'token-mean'))
  step1, tx = step_fn(0.0, 1)
  for num_micro in (2, 4):
    step, _ = step_fn(0.0, num_micro)
    _, _, metrics = step(params, tx.init(params), full, ref_params)
    # Per-micro-batch gradients g_i: the full-batch gradient with the other rows' weights zeroed.
    micro_sq = 0.0
    rows = B // num_micro
    for i in range(num_micro):
      only_i = np.zeros((B, 1), np.float32)
      only_i[i * rows:(i + 1) * rows] = 1.0
      micro = full._replace(weights_BxL=full.weights_BxL * only_i)
      _, opt_state, _ = step1(params, tx.init(params), micro, ref_params)
      micro_sq += sum(np.sum(g ** 2) for g in jax.tree.leaves(grads_from(opt_state)))
    np.testing.assert_allclose(float(metrics['grad_sq_big']), float(metrics['grad_norm']) ** 2,
                               rtol=1e-6)
    np.testing.assert_allclose(float(metrics['grad_sq_small']), num_micro * micro_sq, rtol=1e-5)
    assert float(metrics['b_small']) == B // num_micro and float(metrics['b_big']) == B
    assert float(metrics['grad_sq_small']) > float(metrics['grad_sq_big']) > 0


def test_non_finite_batch_skips_update():
  params, ref_params, batch = make_setup(seed=2)
  full = batch._replace(weights_BxL=losses.token_weights(batch.mask_BxL, 'token-mean'))
  step, tx = step_fn(0.0, 2)
  opt_state = tx.init(params)
  bad = full._replace(advantages_BxL=full.advantages_BxL.at[B - 1, 0].set(jnp.nan))
  new_params, new_state, metrics = step(params, opt_state, bad, ref_params)
  assert not np.isfinite(float(metrics['loss']))
  assert int(metrics['skipped']) == 1 and int(new_state.notfinite_count) == 1
  for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The next good batch updates as usual (and resets the consecutive-failure count).
  good_params, good_state, metrics = step(new_params, new_state, full, ref_params)
  assert int(metrics['skipped']) == 0 and int(good_state.notfinite_count) == 0
  assert any(np.any(np.asarray(a) != np.asarray(b))
             for a, b in zip(jax.tree.leaves(good_params), jax.tree.leaves(params)))


# ----- the numerical guard: a non-finite loss or gradient skips the update, counted -----


def _loss(params, batch):
  """Linear in params: the gradient is batch['x'] summed over rows, finite even when the loss is
  made NaN by batch['poison']."""
  loss = jnp.sum(batch['x'] @ params['w']) + jnp.sum(batch['poison'])
  return loss, {'rows': jnp.float32(batch['x'].shape[0])}


def _optimizer(lr=0.1):
  cfg = ml_collections.ConfigDict(dict(lr=lr, base_batch=4, lr_rule='constant', warmup_steps=0,
                                       decay='constant', max_grad_norm=0.0, clip_rule='constant',
                                       b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0,
                                       max_bad_steps=3))
  return optim.make_optimizer(cfg, batch=4)[0]


def _batch(poison=0.0, scale=1.0, corrupt=0.0):
  x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 * scale
  x[1, 1] += corrupt
  return {'x': jnp.asarray(x), 'poison': jnp.full((4,), poison, jnp.float32)}


@pytest.mark.parametrize('batch', [_batch(poison=np.nan), _batch(poison=np.inf),
                                   _batch(corrupt=np.inf)],
                         ids=['nan-loss', 'inf-loss', 'inf-grad'])
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
  for new, old in zip(jax.tree.leaves(state.inner_state),
                      jax.tree.leaves(before_state.inner_state)):
    assert np.asarray(new).tobytes() == np.asarray(old).tobytes()
  # The next finite update applies and resets the in-a-row count (not the total).
  params, state, metrics = update.apply_update(_loss, optimizer, params, state, _batch(), 2)
  assert int(metrics['skipped']) == 0 and int(state.notfinite_count) == 0
  assert int(state.total_notfinite) == 1
  assert not np.array_equal(params['w'], before_params['w'])


def _nan_moment(state):
  """`state` with a NaN in Adam's first moment, as a damaged restore would leave it."""
  return jax.tree.map(lambda x: x.at[0].set(jnp.nan) if x.shape == (3,) else x, state)


@pytest.mark.parametrize('scale, damage', [(1e30, lambda state: state), (1.0, _nan_moment)],
                         ids=['finite-gradient-overflows-a-moment', 'restored-state-not-finite'])
def test_non_finite_state_after_an_update_is_caught_on_that_step(scale, damage):
  optimizer = _optimizer()
  params = {'w': jnp.asarray([0.5, -1.0, 2.0], jnp.float32)}
  state = damage(optimizer.init(params))
  before_params, before_state = jax.device_get((params, state))
  params, state, metrics = update.apply_update(_loss, optimizer, params, state,
                                               _batch(scale=scale), num_micro=2)
  assert np.isfinite(float(metrics['loss'])) and int(metrics['skipped']) == 1
  assert int(state.notfinite_count) == 1 and int(state.total_notfinite) == 1
  assert np.asarray(params['w']).tobytes() == before_params['w'].tobytes()
  for new, old in zip(jax.tree.leaves(state.inner_state),
                      jax.tree.leaves(before_state.inner_state)):
    assert np.asarray(new).tobytes() == np.asarray(old).tobytes()


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


# ------------------------------------------------------------------ epochs x minibatches


def _recording_step(state, minibatch):
  """A fake optimizer update that records which rows it saw and counts its calls."""
  return state + 1, dict(rows=minibatch['id'], grad_norm=jnp.float32(state),
                         entropy=jnp.float32(10 + state), skipped=jnp.int32(state % 2))


@pytest.mark.parametrize('epochs, minibatches, group', [(1, 1, 4), (2, 3, 4), (3, 2, 1)])
def test_minibatch_epochs_visit_every_row_once_per_epoch_in_whole_groups(epochs, minibatches,
                                                                         group):
  batch = dict(id=jnp.arange(24))
  step = jax.jit(lambda s, b, r: update.minibatch_epochs(
      _recording_step, s, b, r, num_epochs=epochs, num_minibatches=minibatches, group_size=group,
      averaged=('grad_norm',)))
  state, metrics = step(jnp.int32(0), batch, jax.random.PRNGKey(0))
  num_updates = epochs * minibatches
  assert int(state) == num_updates
  assert float(metrics['grad_norm']) == pytest.approx(np.mean(np.arange(num_updates)))  # averaged
  assert float(metrics['entropy']) == 10.0   # the first (on-policy) update's
  assert int(metrics['skipped']) == sum(u % 2 for u in range(num_updates))   # counted
  rows = np.asarray(metrics['rows'])   # the first update's rows
  assert len(rows) == 24 // minibatches
  assert all(set(rows[i:i + group]) == set(range(rows[i] // group * group,
                                                 rows[i] // group * group + group))
             for i in range(0, len(rows), group))   # whole, consecutive groups


def test_minibatch_epochs_cover_the_batch_each_epoch_and_shuffle_between_calls():
  def counting_step(counts_B, minibatch):   # the state counts how often each row was trained on
    return counts_B.at[minibatch['id']].add(1), dict(rows=minibatch['id'], skipped=jnp.int32(0))

  run = jax.jit(lambda b, r: update.minibatch_epochs(
      counting_step, jnp.zeros(12, jnp.int32), b, r, num_epochs=2, num_minibatches=3,
      group_size=2, averaged=()))
  batch = dict(id=jnp.arange(12))
  firsts = set()
  for seed in range(4):
    counts_B, metrics = run(batch, jax.random.PRNGKey(seed))
    np.testing.assert_array_equal(counts_B, 2)   # every row once per epoch
    firsts.add(tuple(np.asarray(metrics['rows'])))
  assert len(firsts) > 1   # the minibatch order depends on the key


def off_policy_cfg(mode):
  return ml_collections.ConfigDict(dict(loss_cfg(0.0).to_dict(), off_policy=mode, is_low=0.9,
                                        is_high=1.1))


@functools.lru_cache(maxsize=None)
def correction_fn(mode):
  """Jitted policy_loss.off_policy_correction in two row chunks."""
  return jax.jit(lambda params, batch: policy_loss.off_policy_correction(
      MODEL, params, batch, off_policy_cfg(mode), TEMPERATURE, 2))


@pytest.mark.parametrize('mode', ['tis', 'mis'])
def test_off_policy_loss_matches_numpy(mode):
  """The sampler's log-probs (make_setup's old_logp: the trainer's + noise) become importance
  weights against the trainer's own log-probs; the loss after a first update (old != current) is
  sum(token weight over kept tokens * IS weight * clipped surrogate), in float64 numpy."""
  params, _, batch = make_setup(seed=3)
  corrected, stats = correction_fn(mode)(params, batch)
  logp, *_ = logprobs_fn()(params, batch.prompt_BxT, batch.prompt_valid_BxT, batch.response_BxL,
                           jnp.float32(TEMPERATURE))
  logp, mask = np.asarray(logp, np.float64), np.asarray(batch.mask_BxL, np.float64)
  np.testing.assert_allclose(np.asarray(corrected.old_logp_BxL), logp, rtol=1e-6, atol=1e-6)
  ratio = np.exp(logp - np.asarray(batch.old_logp_BxL, np.float64))
  inside = (ratio >= 0.9) & (ratio <= 1.1)
  is_weights = np.minimum(ratio, 1.1) if mode == 'tis' else np.where(inside, ratio, 0.0)
  keep = mask * inside if mode == 'mis' else mask
  np.testing.assert_array_equal(np.asarray(corrected.mask_BxL), keep)
  np.testing.assert_allclose(np.asarray(corrected.is_weights_BxL) * keep, is_weights * keep,
                             rtol=1e-5)
  outside = ~inside if mode == 'mis' else ratio > 1.1
  assert 0.1 < float(stats['is_outside_frac']) < 0.9
  np.testing.assert_allclose(float(stats['is_outside_frac']), outside[mask > 0].mean(), rtol=1e-6)

  # As after an update: the policy moved away from the trainer's old log-probs.
  rng = np.random.default_rng(4)
  moved_old = corrected.old_logp_BxL + 0.2 * jnp.asarray(rng.normal(size=logp.shape), jnp.float32)
  weights = losses.token_weights(corrected.mask_BxL, 'token-mean')
  step, tx = step_fn(0.0, 1)
  _, _, metrics = step(params, tx.init(params),
                       corrected._replace(old_logp_BxL=moved_old, weights_BxL=weights), None)
  r = np.exp(logp - np.asarray(moved_old, np.float64))
  adv = np.asarray(corrected.advantages_BxL, np.float64)
  surrogate = np.minimum(r * adv, np.clip(r, 1 - CLIP_LOW, 1 + CLIP_HIGH) * adv)
  expected = np.sum(np_weights(keep, 'token-mean') * is_weights * -surrogate)
  np.testing.assert_allclose(float(metrics['pg_loss']), expected, rtol=1e-5, atol=1e-7)


def test_off_policy_at_staleness_zero_is_todays_loss_and_gradient():
  """Sampler log-probs equal to the trainer's: every weight is exactly 1, no token is dropped,
  and the loss and its gradient are bit-equal to the uncorrected loss's. Run op by op (not
  jitted), so both sides run the same compiled programs; the extra `* 1.0` is exact."""
  params, _, batch = make_setup(seed=5)
  trainer_logp = correction_fn('tis')(params, batch)[0].old_logp_BxL
  weights = losses.token_weights(batch.mask_BxL, 'token-mean')
  today = batch._replace(old_logp_BxL=trainer_logp, weights_BxL=weights)
  for mode in ('mis', 'tis'):   # the same program recomputes the same trainer log-probs
    corrected, stats = correction_fn(mode)(params, today)
    assert np.all(np.asarray(corrected.is_weights_BxL) == 1.0)
    np.testing.assert_array_equal(np.asarray(corrected.mask_BxL), np.asarray(batch.mask_BxL))
    np.testing.assert_array_equal(np.asarray(corrected.old_logp_BxL), np.asarray(trainer_logp))
    assert float(stats['behaviour_mismatch']) == 0.0
  # Moved old log-probs (a later minibatch): the surrogate is not trivially the advantage.
  moved = jnp.asarray(np.random.default_rng(6).normal(size=trainer_logp.shape), jnp.float32)
  today = today._replace(old_logp_BxL=trainer_logp + 0.2 * moved)
  corrected = corrected._replace(old_logp_BxL=trainer_logp + 0.2 * moved)
  loss_fn = policy_loss.make_policy_loss(MODEL, loss_cfg(0.0), TEMPERATURE, 1)
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  (loss_today, _), grads_today = grad_fn(params, today)
  (loss_corrected, _), grads_corrected = grad_fn(params, corrected)
  assert float(loss_today) == float(loss_corrected) and float(loss_today) != 0.0
  for a, b in zip(jax.tree.leaves(grads_today), jax.tree.leaves(grads_corrected)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
