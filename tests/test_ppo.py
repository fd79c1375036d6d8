"""rljax.model.critic and rljax.ppo against float64 numpy references with explicit loops,
on a tiny MoE.

The values must be read at the state that chose each token; the PPO batch (token rewards, KL in
the reward, GAE, whitening, explained variance) must match a plain loop; actor and critic
gradients must not depend on the micro-batch split; a shared trunk must receive the sum of both
losses' gradients.
"""
import math
import os
import re
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from rljax.algos import ppo
from rljax import losses
from rljax.model import critic as critic_lib
from rljax.model import transformer as model_lib
from rljax import policy_loss
from rljax.rollout import sampler as sampler_lib
from rljax import sharding
from rljax import update

import random_params as random_params_lib

V, T, L = 16, 5, 6


def tiny_cfg():
  return model_lib.ModelConfig(vocab_size=V, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2,
                               head_dim=8, num_experts=4, experts_per_token=2, expert_hidden=24,
                               dense_hidden=40, moe_impl='dense')


def random_tree(shapes, rng):
  return random_params_lib.redraw(shapes, rng, wide=('router', 'value_head'))


def setup(seed=0):
  cfg = tiny_cfg()
  rng = np.random.default_rng(seed)
  policy = random_tree(nn.unbox(jax.eval_shape(
      lambda: model_lib.init_params(cfg, jax.random.PRNGKey(0)))), rng)
  critic_params = random_tree(nn.unbox(jax.eval_shape(
      lambda: critic_lib.init_params(cfg, jax.random.PRNGKey(0)))), rng)
  return cfg, model_lib.Transformer(cfg), critic_lib.Critic(cfg), policy, critic_params


def rollout_data(seed, batch=8, rewards=None):
  """Left-padded prompts, right-padded responses of varied lengths (an empty and a full row)."""
  rng = np.random.default_rng(seed)
  prompt_lens = rng.integers(2, T + 1, size=batch)
  prompt = np.zeros((batch, T), np.int32)
  valid = np.zeros((batch, T), bool)
  for i, n in enumerate(prompt_lens):
    prompt[i, T - n:] = rng.integers(1, V, size=n)
    valid[i, T - n:] = True
  lengths = rng.integers(1, L + 1, size=batch)
  lengths[:2] = [0, L]
  mask = np.arange(L)[None, :] < lengths[:, None]
  response = np.where(mask, rng.integers(1, V, size=(batch, L)), 0).astype(np.int32)
  logp = np.where(mask, -rng.uniform(0.1, 3.0, size=(batch, L)), 0.0).astype(np.float32)
  rollout = sampler_lib.Rollout(jnp.asarray(response), jnp.asarray(logp), jnp.asarray(mask),
                                jnp.asarray(lengths))
  if rewards is None:
    rewards = rng.integers(0, 2, size=batch).astype(np.float32)
  return jnp.asarray(prompt), jnp.asarray(valid), rollout, jnp.asarray(rewards), lengths


def ppo_cfg(**overrides):
  values = dict(clip_low=0.2, clip_high=0.2, kl_coef=0.0, kl_estimator='k3', kl_reward_coef=0.0,
                kl_reward_estimator='k1', loss_agg='token-mean', moe_aux_coef=0.0, gamma=1.0,
                lam=0.95, whiten_advantages=True, whiten_rewards=False, value_clip=0.2,
                share_trunk=False, vf_coef=0.5)
  values.update(overrides)
  return ml_collections.ConfigDict(values)


def close(actual, expected, rtol=1e-5, atol=1e-5):
  np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


# ------------------------------------------------------------------ the critic


def test_values_are_read_at_the_state_that_chose_each_token():
  cfg, _, critic, _, critic_params = setup()
  prompt, valid, rollout, _, _ = rollout_data(1)
  values = np.asarray(critic_lib.response_values(critic, critic_params, prompt, valid,
                                                 rollout.tokens_BxL)[0])
  # V(prompt + response[:t]) is the critic's last value on that prefix alone, (left-padded to one
  # width: the model is left-padding invariant, tests/test_model.py).
  width = T + L
  prefixes, prefix_valid = np.zeros((prompt.shape[0] * L, width), np.int32), np.zeros(
      (prompt.shape[0] * L, width), bool)
  for i in range(prompt.shape[0]):
    real_prompt = np.asarray(prompt[i])[np.asarray(valid[i])]
    for t in range(L):
      prefix = np.concatenate([real_prompt, np.asarray(rollout.tokens_BxL[i, :t])])
      prefixes[i * L + t, width - len(prefix):] = prefix
      prefix_valid[i * L + t, width - len(prefix):] = True
  prefix_values, _ = jax.jit(critic.apply)({'params': critic_params}, prefixes, prefix_valid)
  close(values, np.asarray(prefix_values)[:, -1].reshape(values.shape), rtol=2e-5, atol=2e-5)


def test_critic_from_policy_copies_the_trunk_with_a_fresh_head():
  cfg, model, critic, policy, _ = setup()
  params = critic_lib.from_policy(policy, jax.random.PRNGKey(3), cfg)
  assert 'lm_head' not in params['trunk'] and 'lm_head' in policy
  assert all(np.all(np.asarray(x) == 0) for x in jax.tree.leaves(params['value_head']))
  prompt, valid, rollout, _, _ = rollout_data(2)
  tokens = jnp.concatenate([prompt, rollout.tokens_BxL], axis=1)
  kv_valid = jnp.concatenate([valid, jnp.ones_like(rollout.mask_BxL)], axis=1)
  h_policy = model.apply({'params': policy}, tokens, kv_valid, method='hidden')[0]
  h_critic = critic.apply({'params': params}, tokens, kv_valid,
                          method=lambda m, t, v: m.trunk.hidden(t, v))[0]
  np.testing.assert_array_equal(np.asarray(h_policy), np.asarray(h_critic))
  # Its own buffers: donating the policy in an update must not free the critic.
  assert all(a is not b for a, b in zip(jax.tree.leaves(params['trunk']),
                                        jax.tree.leaves(critic_lib.trunk_of(policy))))


def test_critic_params_carry_logical_axis_names():
  boxed = jax.eval_shape(lambda: critic_lib.init_params(tiny_cfg(), jax.random.PRNGKey(0)))
  specs = nn.get_partition_spec(boxed)
  assert tuple(specs['value_head']['w']) == ('embed',)
  assert tuple(specs['trunk']['blocks']['attn']['w_q']) == ('layers', 'embed', 'heads', 'head_dim')
  assert tuple(specs['trunk']['embed']['embedding']) == ('vocab', 'embed')
  # Same tree as the policy's minus the vocabulary head: placed by the same rules on the same mesh.
  policy_specs = nn.get_partition_spec(jax.eval_shape(
      lambda: model_lib.init_params(tiny_cfg(), jax.random.PRNGKey(0))))
  assert specs['trunk'] == critic_lib.trunk_of(policy_specs)


# ------------------------------------------------------------------ the PPO batch


def test_terminal_rewards():
  # Rows: padded, empty, full, one token, and two turns with an observation between and after.
  mask = np.array([[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 1, 0]],
                  np.float32)
  rewards = np.array([2.0, 5.0, -1.0, 0.5, 3.0], np.float32)
  expected = np.zeros(mask.shape)
  for i, row in enumerate(mask):
    actions = np.flatnonzero(row)
    if len(actions):
      expected[i, actions[-1]] = rewards[i]
  close(ppo.terminal_rewards(rewards, mask), expected, rtol=0, atol=0)


def np_var(x):
  mean = sum(x) / len(x)
  return sum((v - mean)**2 for v in x) / len(x)


def test_explained_variance():
  rng = np.random.default_rng(4)
  lengths = [3, 0, 5, 1]
  mask = (np.arange(5)[None] < np.array(lengths)[:, None]).astype(np.float32)
  returns = rng.normal(size=mask.shape).astype(np.float32)
  values = (returns + 0.5 * rng.normal(size=mask.shape)).astype(np.float32)
  r = [float(returns[i, t]) for i, n in enumerate(lengths) for t in range(n)]
  e = [float(returns[i, t] - values[i, t]) for i, n in enumerate(lengths) for t in range(n)]
  close(losses.explained_variance(values, returns, mask), 1 - np_var(e) / np_var(r))
  close(losses.explained_variance(returns, returns, mask), 1.0)
  close(losses.explained_variance(np.full_like(returns, 7.0), returns, mask), 0.0, atol=1e-6)
  close(losses.explained_variance(values, np.ones_like(returns), mask), 0.0)  # nothing to explain


def np_whiten(x, lengths, shift_mean):
  vals = [float(x[i, t]) for i, n in enumerate(lengths) for t in range(n)]
  mean = sum(vals) / len(vals)
  std = math.sqrt(np_var(vals) + 1e-8)
  out = np.zeros(x.shape)
  for i, n in enumerate(lengths):
    for t in range(n):
      out[i, t] = (x[i, t] - mean) / std + (0.0 if shift_mean else mean)
  return out


def np_ppo_batch(values, rewards, ref_logp, logp, lengths, cfg):
  """The PPO batch with plain loops: token rewards, KL in the reward, GAE, whitening."""
  b = len(lengths)
  token_rewards = np.zeros(values.shape)
  for i, n in enumerate(lengths):
    for t in range(n):
      kl = logp[i, t] - ref_logp[i, t]   # k1
      token_rewards[i, t] = (rewards[i] if t == n - 1 else 0.0) - cfg.kl_reward_coef * kl
  if cfg.whiten_rewards:
    token_rewards = np_whiten(token_rewards, lengths, shift_mean=False)
  adv, ret = np.zeros(values.shape), np.zeros(values.shape)
  for i, n in enumerate(lengths):
    next_adv = 0.0
    for t in reversed(range(n)):
      next_value = values[i, t + 1] if t + 1 < n else 0.0
      delta = token_rewards[i, t] + cfg.gamma * next_value - values[i, t]
      next_adv = delta + cfg.gamma * cfg.lam * next_adv
      adv[i, t], ret[i, t] = next_adv, next_adv + values[i, t]
  r = [ret[i, t] for i, n in enumerate(lengths) for t in range(n)]
  e = [ret[i, t] - values[i, t] for i, n in enumerate(lengths) for t in range(n)]
  stats = dict(explained_variance=1 - np_var(e) / np_var(r), return_mean=sum(r) / len(r),
               value_mean=sum(values[i, t] for i, n in enumerate(lengths)
                              for t in range(n)) / len(r))
  if cfg.whiten_advantages:
    adv = np_whiten(adv, lengths, shift_mean=True)
  assert b == values.shape[0]
  return adv, ret, stats


@pytest.mark.parametrize('overrides', [
    dict(),
    dict(gamma=0.0, lam=0.0, whiten_advantages=False),
    dict(gamma=1.0, lam=1.0, kl_reward_coef=0.1),
    dict(gamma=0.9, lam=0.8, kl_reward_coef=0.05, whiten_rewards=True),
])
def test_ppo_batch_matches_numpy(overrides):
  cfg, model, critic, policy, critic_params = setup()
  ppo_config = ppo_cfg(**overrides)
  prompt, valid, rollout, rewards, lengths = rollout_data(5)
  ref_policy = random_tree(policy, np.random.default_rng(6))
  state = dict(params=policy, critic_params=critic_params)
  batch, stats = jax.jit(lambda s, r: ppo.ppo_batch(
      s, rollout, r, prompt, valid, ref_policy, model=model, critic=critic, cfg=ppo_config,
      temperature=1.0, num_micro=2))(state, rewards)

  mask = np.asarray(rollout.mask_BxL, np.float64)
  values = np.asarray(critic_lib.response_values(critic, critic_params, prompt, valid,
                                                 rollout.tokens_BxL)[0], np.float64) * mask
  ref_logp = np.asarray(policy_loss.response_logprobs(model, ref_policy, prompt, valid,
                                                      rollout.tokens_BxL, 1.0)[0], np.float64)
  adv, ret, expected = np_ppo_batch(values, np.asarray(rewards), ref_logp,
                                    np.asarray(rollout.logp_BxL, np.float64), lengths, ppo_config)
  close(batch.critic.old_values_BxL, values)
  close(batch.policy.advantages_BxL, adv, rtol=2e-5, atol=2e-5)
  close(batch.critic.returns_BxL, ret, rtol=2e-5, atol=2e-5)
  for key, value in expected.items():
    close(stats[key], value, rtol=2e-5, atol=2e-5)
  assert int(stats['retained']) == prompt.shape[0]
  np.testing.assert_array_equal(batch.policy.old_logp_BxL, rollout.logp_BxL)
  np.testing.assert_array_equal(batch.policy.mask_BxL, mask)


# ------------------------------------------------------------------ losses and updates


def test_ppo_policy_loss_hand_cases():
  """Ratios and advantages set by hand: loss -min(r A, clip(r) A) averaged over 5 valid tokens."""
  cfg, model, _, policy, _ = setup()
  prompt, valid, rollout, _, _ = rollout_data(7, batch=2)
  response = jnp.asarray(np.array([[3, 4, 5, 0, 0, 0], [6, 7, 0, 0, 0, 0]], np.int32))
  mask = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]], np.float32)
  logprobs = jax.jit(lambda p: policy_loss.response_logprobs(model, p, prompt, valid, response,
                                                             1.0)[0])
  logp = logprobs(policy)
  ratio = np.array([[1.5, 0.5, 1.5, 1, 1, 1], [0.5, 1.0, 1, 1, 1, 1]], np.float32)
  adv = np.array([[1.0, 1.0, -1.0, 0, 0, 0], [-1.0, 2.0, 0, 0, 0, 0]], np.float32)
  # per token: -min(1.5, 1.2) = -1.2 (clipped); -min(0.5, 0.8) = -0.5; -min(-1.5, -1.2) = 1.5;
  #            -min(-0.5, -0.8) = 0.8 (clipped); -min(2, 2) = -2.
  expected_loss, expected_clipfrac = (-1.2 - 0.5 + 1.5 + 0.8 - 2.0) / 5, 2 / 5
  batch = policy_loss.PolicyBatch(prompt, valid, response, jnp.asarray(mask),
                                  (logp - jnp.log(jnp.asarray(ratio))) * mask, jnp.asarray(adv),
                                  losses.token_weights(mask, 'token-mean'))
  loss_fn = policy_loss.make_policy_loss(model, ppo_cfg(), 1.0, 1)
  loss, metrics = jax.jit(loss_fn)(policy, batch)
  close(loss, expected_loss, rtol=1e-5)
  close(metrics['clipfrac'], expected_clipfrac)
  # With the KL-in-loss term on, the loss rises by kl_coef * k3(pi, ref) averaged over tokens.
  ref_policy = random_tree(policy, np.random.default_rng(8))
  ref_logp = np.asarray(logprobs(ref_policy), np.float64)
  log_ratio = np.asarray(logp, np.float64) - ref_logp
  k3 = sum(math.exp(-log_ratio[i, t]) - 1 + log_ratio[i, t]
           for i in range(2) for t in range(L) if mask[i, t]) / 5
  loss_kl, metrics_kl = jax.jit(policy_loss.make_policy_loss(model, ppo_cfg(kl_coef=0.3), 1.0, 1))(
      policy, batch, ref_policy)
  close(metrics_kl['kl'], k3, rtol=1e-5)
  close(loss_kl, expected_loss + 0.3 * k3, rtol=1e-5)


def test_value_loss_through_the_critic_with_and_without_clipping():
  cfg, _, critic, _, critic_params = setup()
  prompt, valid, rollout, _, lengths = rollout_data(9)
  mask = np.asarray(rollout.mask_BxL, np.float32)
  values = np.asarray(critic_lib.response_values(critic, critic_params, prompt, valid,
                                                 rollout.tokens_BxL)[0], np.float64)
  rng = np.random.default_rng(10)
  old = values + rng.uniform(-0.5, 0.5, size=values.shape)
  returns = rng.normal(size=values.shape)
  n = mask.sum()
  batch = critic_lib.CriticBatch(prompt, valid, rollout.tokens_BxL, jnp.asarray(mask),
                                 jnp.asarray(old, jnp.float32), jnp.asarray(returns, jnp.float32),
                                 losses.token_weights(mask, 'token-mean'))
  for clip in (0.0, 0.2):
    expected, clipped = 0.0, 0
    for i, length in enumerate(lengths):
      for t in range(length):
        v, o, r = values[i, t], old[i, t], returns[i, t]
        plain = 0.5 * (v - r)**2
        vc = o + min(max(v - o, -clip), clip)
        with_clip = max(plain, 0.5 * (vc - r)**2) if clip else plain
        expected += with_clip / n
        clipped += with_clip > plain
    loss, metrics = critic_lib.make_critic_loss(critic, clip, 0.0, 1)(critic_params, batch)
    close(loss, expected, rtol=1e-5)
    close(metrics['value_clipfrac'], clipped / n)
    assert (clipped > 0) == (clip > 0)


def tree_close(a, b, rtol=1e-5):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * max(1e-3, np.abs(y).max()))


def test_actor_and_critic_gradients_do_not_depend_on_the_micro_batch_split(num_micro=4):
  """Up to f32 sums. (The MoE load-balancing term is per micro-batch by design, so it is off.)"""
  cfg, model, critic, policy, critic_params = setup()
  prompt, valid, rollout, rewards, _ = rollout_data(13, batch=8)
  ref_policy = random_tree(policy, np.random.default_rng(14))
  batch, _ = ppo.ppo_batch(dict(params=policy, critic_params=critic_params), rollout, rewards,
                           prompt, valid, ref_policy, model=model, critic=critic,
                           cfg=ppo_cfg(kl_reward_coef=0.1), temperature=1.0, num_micro=1)
  weights = losses.token_weights(batch.policy.mask_BxL, 'token-mean')
  policy_batch = batch.policy._replace(weights_BxL=weights)
  critic_batch = batch.critic._replace(weights_BxL=weights)

  def grads(n):
    actor_loss = policy_loss.make_policy_loss(model, ppo_cfg(kl_coef=0.1), 1.0, n)
    critic_loss = critic_lib.make_critic_loss(critic, 0.2, 0.0, n)
    actor = update.accumulate_gradients(lambda q, m: actor_loss(q, m, ref_policy), policy,
                                        policy_batch, n)
    value = update.accumulate_gradients(critic_loss, critic_params, critic_batch, n)
    return actor[:2], value[:2]

  ((actor_1, loss_a1), (value_1, loss_v1)), ((actor_n, loss_an), (value_n, loss_vn)) = jax.jit(
      lambda: (grads(1), grads(num_micro)))()
  close(loss_an, float(loss_a1), rtol=1e-5)
  close(loss_vn, float(loss_v1), rtol=1e-5)
  tree_close(actor_n, actor_1, rtol=2e-5)
  tree_close(value_n, value_1, rtol=2e-5)
  assert np.abs(np.asarray(value_1['value_head']['w'])).max() > 0   # the test sees real gradients


def ppo_config(**ppo_overrides):
  """A full PPO config (configs/ppo.py, runlocal) with the tiny model."""
  from configs import ppo as ppo_config_file
  config = ppo_config_file.get_config('runlocal,B=8')
  config.model = dict(dataclasses_asdict(tiny_cfg()))
  config.ppo.update(ppo_overrides)
  config.train.micro_batch = 4
  return config


def dataclasses_asdict(cfg):
  import dataclasses
  return dataclasses.asdict(cfg)


def test_shared_trunk_gets_the_sum_of_both_gradients():
  cfg, model, critic, policy, critic_params = setup()
  prompt, valid, rollout, rewards, _ = rollout_data(15, batch=8)
  config = ppo_config(share_trunk=True, vf_coef=0.7, moe_aux_coef=0.0)
  head = dict(value_head=critic_params['value_head'])
  state = dict(params=policy, critic_params=head)
  batch, _ = ppo.ppo_batch(state, rollout, rewards, prompt, valid, None, model=model,
                           critic=critic, cfg=config.ppo, temperature=1.0, num_micro=1)
  weights = losses.token_weights(batch.policy.mask_BxL, 'token-mean')
  actor_loss = policy_loss.make_policy_loss(model, config.ppo, 1.0, 2)
  critic_loss = critic_lib.make_critic_loss(critic, config.ppo.value_clip, 0.0, 2)
  policy_batch = batch.policy._replace(weights_BxL=weights)
  critic_batch = batch.critic._replace(weights_BxL=weights)

  @jax.jit
  def gradients(policy, value_head):
    g_pg = jax.grad(lambda p: actor_loss(p, policy_batch)[0])(policy)
    g_vf = jax.grad(lambda p, h: critic_loss(dict(trunk=critic_lib.trunk_of(p), value_head=h),
                                             critic_batch)[0], argnums=(0, 1))(policy, value_head)
    # What the shared update differentiates (ppo.shared_update's joint loss), micro-batched.
    state = dict(params=policy, critic_params=dict(value_head=value_head))
    tx = optax.apply_if_finite(optax.sgd(1.0), 5)   # a step of -1 x gradient exposes the gradient
    joint_tx = tx.init(dict(policy=policy, value_head=value_head))
    new_state, _ = ppo.shared_update(
        dict(state, opt_state=joint_tx), batch, None, actor_loss=actor_loss,
        critic_loss=critic_loss, tx=tx, loss_agg='token-mean', vf_coef=0.7, num_micro=2)
    grads = dict(policy=jax.tree.map(jnp.subtract, policy, new_state['params']),
                 value_head=jax.tree.map(jnp.subtract, value_head,
                                         new_state['critic_params']['value_head']))
    return g_pg, g_vf, grads

  g_pg, g_vf, grads = gradients(policy, head['value_head'])
  expected_policy = jax.tree.map(lambda a, b: a + 0.7 * b, g_pg,
                                 dict(g_vf[0], lm_head=jnp.zeros_like(policy['lm_head'])))
  tree_close(grads['policy'], expected_policy, rtol=2e-5)
  tree_close(grads['value_head'], jax.tree.map(lambda b: 0.7 * b, g_vf[1]), rtol=2e-5)
  assert np.abs(np.asarray(g_vf[0]['blocks']['attn']['w_q'])).max() > 0  # value loss reaches trunk


@pytest.mark.parametrize('share_trunk', [False, pytest.param(True, marks=pytest.mark.e2e)])
def test_one_ppo_update_moves_actor_and_critic_and_logs_both_norms(share_trunk):
  cfg, model, _, policy, _ = setup()
  config = ppo_config(share_trunk=share_trunk, kl_reward_coef=0.05, kl_coef=0.05)
  mesh = sharding.make_mesh(dict(data=1), devices=jax.devices()[:1])
  policy = sharding.place(policy, mesh)
  algo = ppo.make(config, model, policy, mesh, jax.random.PRNGKey(1))   # micro-batches of 4: 2
  assert algo.needs_reference and set(algo.schedules) == {'lr', 'critic_lr'}
  prompt, valid, rollout, rewards, _ = rollout_data(16, batch=8)
  ref = jax.tree.map(jnp.copy, policy)
  before = jax.tree.map(np.asarray, algo.state)
  batch, stats = algo.make_batch(algo.state, rollout, rewards, prompt, valid, ref)
  state, metrics = algo.update(algo.state, batch, ref, jax.random.PRNGKey(2))
  for key in ('grad_norm', 'critic_grad_norm', 'value_loss', 'clipfrac', 'approx_kl', 'kl'):
    assert np.isfinite(metrics[key]) and (metrics[key] > 0 or key in ('clipfrac', 'approx_kl')), key
  assert {'explained_variance', 'value_mean', 'return_mean', 'kl_reward'} <= set(stats)
  head_before = before['critic_params']['value_head']['w']
  assert np.abs(np.asarray(state['critic_params']['value_head']['w']) - head_before).max() > 0
  assert np.abs(np.asarray(state['params']['lm_head']) - before['params']['lm_head']).max() > 0
  if not share_trunk:   # the critic's own trunk moved; the policy's trunk got no value gradient
    assert state['critic_opt_state'] is not None
    moved = np.asarray(state['critic_params']['trunk']['blocks']['attn']['w_q'])
    assert np.abs(moved - before['critic_params']['trunk']['blocks']['attn']['w_q']).max() > 0
  else:
    assert set(state['critic_params']) == {'value_head'}


# ------------------------------------------------------------------ configs


@pytest.mark.parametrize('arg,overrides,message', [
    ('runlocal', dict(rollout=dict(G=2)), 'rollout.G must be 1 for PPO'),
    ('runlocal,B=0', {}, 'rollout.P (PPO: B) must be >= 1'),
    ('runlocal,B=100', {}, 'train.micro_batch (64) must divide the minibatch of 100'),
    ('B=256', dict(train=dict(num_minibatches=3)), 'train.num_minibatches (3) must divide'),
    ('runlocal', dict(ppo=dict(lam=1.5)), 'ppo.lam must be in [0, 1]'),
    ('runlocal', dict(ppo=dict(gamma=-0.1)), 'ppo.gamma must be in [0, 1]'),
    ('runlocal', dict(ppo=dict(kl_reward_estimator='k9')), 'ppo.kl_reward_estimator'),
    ('runlocal', dict(ppo=dict(kl_reward_coef=-1.0)), 'ppo.kl_reward_coef must be >= 0'),
    ('runlocal', dict(ppo=dict(kl_reward_coef=float('nan'))), 'ppo.kl_reward_coef must be >= 0'),
    ('runlocal', dict(ppo=dict(value_clip=float('nan'))), 'ppo.value_clip must be a number'),
    ('runlocal', dict(critic_optimizer=dict(b2=1.0)), 'critic_optimizer.b1 and b2'),
    ('runlocal', dict(ppo=dict(loss_agg='sum')), 'ppo.loss_agg'),
    ('runlocal', dict(ppo=dict(share_trunk=True, vf_coef=0.0)), 'ppo.vf_coef must be > 0'),
    ('runlocal', dict(critic_optimizer=dict(lr=0.0)),
     'critic_optimizer.lr must be a positive number, got 0.0'),
    ('runlocal', dict(critic_optimizer=dict(lr_rule='cubic')),
     "critic_optimizer.lr_rule 'cubic' is unknown"),
])
def test_bad_ppo_configs_name_the_field(arg, overrides, message):
  from configs import ppo as ppo_config_file
  from rljax.train import config_checks
  config = ppo_config_file.get_config(arg)
  for section, values in overrides.items():
    config[section].update(values)
  with pytest.raises(ValueError, match=re.escape(message)):
    config_checks.check(config)


def test_default_ppo_configs_pass_the_checks():
  from configs import ppo as ppo_config_file
  from rljax.train import config_checks
  for arg in ('', 'runlocal', 'B=1024', 'B=64,runlocal'):
    config_checks.check(ppo_config_file.get_config(arg))


@pytest.mark.e2e
def test_cli_rejects_a_bad_ppo_config_with_one_line(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'rljax.main', '--config=configs/ppo.py:runlocal,B=0',
       f'--workdir={tmp_path}'], capture_output=True, text=True, timeout=300,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert result.returncode == 2
  assert 'rljax: error: rollout.P (PPO: B) must be >= 1, got 0' in result.stderr
