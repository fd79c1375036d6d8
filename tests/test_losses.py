"""Tests for rljax.losses against independent float64 numpy references written with
explicit loops."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rljax.algos import grpo
from rljax import losses
from rljax.model import transformer as model_lib
from rljax import policy_loss
from rljax.rollout import sampler

RTOL, ATOL = 2e-6, 1e-6
MODES = ('token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum', 'seq-mean-token-sum-norm')


def close(actual, expected, rtol=RTOL, atol=ATOL):
  np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


def lengths_and_mask(rng, b=8, l=7):
  """Right-padded mask with varied lengths, always including an empty, a length-1 and a full row."""
  lengths = rng.integers(0, l + 1, size=b)
  lengths[:3] = [0, 1, l]
  rng.shuffle(lengths)
  mask = np.zeros((b, l), np.float32)
  for i, n in enumerate(lengths):
    mask[i, :n] = 1.0
  return lengths, mask


# ----------------------------------------------------------------------------------------------
# Group advantages.
# ----------------------------------------------------------------------------------------------


def ref_group_advantages(rewards, normalize_std, eps):
  out = np.zeros(rewards.shape)
  for p, group in enumerate(rewards.astype(np.float64)):
    g = len(group)
    mean = sum(group) / g
    if all(r == group[0] for r in group):
      continue  # zero-variance group: exactly 0
    std = math.sqrt(sum((r - mean)**2 for r in group) / (g - 1))
    for j, r in enumerate(group):
      out[p, j] = (r - mean) / (std + eps) if normalize_std else r - mean
  return out


@pytest.mark.parametrize('normalize_std', [True, False])
def test_group_advantages(normalize_std):
  rng = np.random.default_rng(0)
  rewards = rng.integers(0, 2, size=(16, 5)).astype(np.float32)
  rewards[:5] = rng.normal(size=(5, 5))
  rewards[5:10] = np.array([0.1, 0.9, 1 / 3, 1.0, 0.0])[:, None]  # constant groups
  got = losses.group_advantages(rewards, normalize_std=normalize_std, eps=1e-6)
  close(got, ref_group_advantages(rewards, normalize_std, 1e-6))
  # Exactly 0, although the float32 mean of five 0.9s is not exactly 0.9.
  assert np.all(np.asarray(got)[5:10] == 0.0)


def test_group_advantages_binary_values_and_size_one():
  # 1 correct out of 4: mean 0.25, unbiased std sqrt(0.25) = 0.5.
  got = losses.group_advantages(np.array([[1.0, 0.0, 0.0, 0.0]]), eps=0.0)
  close(got, [[1.5, -0.5, -0.5, -0.5]])
  single = losses.group_advantages(np.array([[3.0], [5.0]]))
  assert np.all(np.asarray(single) == 0.0)


def test_zero_variance_groups():
  rewards = np.array([[1, 1, 1], [0, 1, 0], [0.3, 0.3, 0.3], [2, 2, 2.5]], np.float32)
  expected = [all(r == row[0] for r in row) for row in rewards]
  np.testing.assert_array_equal(losses.zero_variance_groups(rewards), expected)


def group_rollout(b, l, lengths=None):
  """A sampler.Rollout of B responses of width L; `lengths` right-pads them (default: all full)."""
  lengths = np.full(b, l) if lengths is None else np.asarray(lengths)
  mask = np.arange(l)[None, :] < lengths[:, None]
  return sampler.Rollout(tokens_BxL=jnp.zeros((b, l), jnp.int32), logp_BxL=jnp.zeros((b, l)),
                         mask_BxL=jnp.asarray(mask), lengths_B=jnp.asarray(lengths))


def grpo_cfg(**overrides):
  return ml_collections.ConfigDict(
      {**dict(normalize_std=True, adv_eps=1e-6, filter_zero_variance=False), **overrides})


def run_group_batch(rewards_PxG, rollout, cfg):
  b = rewards_PxG.size
  prompt = jnp.zeros((b, 2), jnp.int32)
  return grpo.group_batch(rollout, jnp.asarray(rewards_PxG).reshape(-1), prompt,
                          jnp.ones((b, 2), bool), rewards_PxG.shape[1], cfg)


@pytest.mark.parametrize('eps', [1e-4, 0.5])
def test_group_batch_uses_the_configured_adv_eps(eps):
  """grpo.adv_eps is the epsilon added to the group std (TRL uses 1e-4, verl 1e-6)."""
  rewards = np.array([[1, 0, 0, 0], [.5, .5, .5, .5], [0, 1, 1, .3]], np.float32)
  batch, _ = run_group_batch(rewards, group_rollout(12, 3), grpo_cfg(adv_eps=eps))
  close(np.asarray(batch.advantages_BxL)[:, 0].reshape(3, 4),
        ref_group_advantages(rewards, True, eps), rtol=1e-5)

# ----------------------------------------------------------------------------------------------
# Aggregation.
# ----------------------------------------------------------------------------------------------


def ref_aggregate(per_token, lengths, l, mode):
  b = len(lengths)
  if mode == 'token-mean':
    total = sum(lengths)
    s = sum(per_token[i, t] for i in range(b) for t in range(lengths[i]))
    return s / total if total else 0.0
  if mode == 'seq-mean-token-mean':
    means = [sum(per_token[i, :n].astype(np.float64)) / n for i, n in enumerate(lengths) if n > 0]
    return sum(means) / len(means) if means else 0.0
  if mode == 'seq-mean-token-sum':
    sums = [sum(per_token[i, :n].astype(np.float64)) for i, n in enumerate(lengths) if n > 0]
    return sum(sums) / len(sums) if sums else 0.0
  if mode == 'seq-mean-token-sum-norm':
    return sum(per_token[i, t] for i in range(b) for t in range(lengths[i])) / (b * l)
  raise AssertionError(mode)


@pytest.mark.parametrize('mode', MODES)
def test_aggregate(mode):
  rng = np.random.default_rng(1)
  lengths, mask = lengths_and_mask(rng)
  per_token = rng.normal(size=mask.shape).astype(np.float32)
  close(losses.aggregate(per_token, mask, mode), ref_aggregate(per_token, lengths, 7, mode))
  # Weights are zero on padding and reproduce the aggregate of an all-ones loss.
  w = np.asarray(losses.token_weights(mask, mode))
  assert np.all(w[mask == 0] == 0)
  close(w.sum(), ref_aggregate(np.ones_like(per_token), lengths, 7, mode))


@pytest.mark.parametrize('mode', MODES)
def test_all_zero_mask_gives_zeros(mode):
  w = losses.token_weights(np.zeros((3, 5), np.float32), mode)
  assert np.all(np.asarray(w) == 0.0)
  assert float(losses.aggregate(np.ones((3, 5)), np.zeros((3, 5)), mode)) == 0.0


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('num_micro', [2, 4])
def test_split_invariance(mode, num_micro):
  rng = np.random.default_rng(2)
  _, mask = lengths_and_mask(rng, b=8, l=9)
  per_token = rng.normal(size=mask.shape).astype(np.float32)
  full = float(losses.aggregate(per_token, mask, mode))
  w = losses.token_weights(mask, mode)  # computed once, on the full batch
  split = sum(float(jnp.sum(w_mb * l_mb)) for w_mb, l_mb in
              zip(jnp.split(w, num_micro), np.split(per_token, num_micro)))
  close(split, full)
  # The naive alternative (token-mean per micro-batch, then average) depends on the split.
  if mode == 'token-mean':
    naive = np.mean([float(losses.aggregate(l_mb, m_mb, mode)) for l_mb, m_mb in
                     zip(np.split(per_token, num_micro), np.split(mask, num_micro))])
    assert abs(naive - full) > 1e-4


def test_seq_mean_token_sum_norm_counts_filtered_and_empty_rows():
  """Dr. GRPO's normaliser is B * L with every row of the batch counted, empty and filtered ones
  included: filter_zero_variance (whose rows have advantage 0) then leaves the policy-gradient
  loss and its gradient exactly as without filtering. token-mean, by contrast, renormalises."""
  rng = np.random.default_rng(11)
  p, g, l = 4, 4, 6
  rewards = np.array([[1, 0, 1, 1], [1, 1, 1, 1], [0, .5, 1, 0], [0, 0, 0, 0]], np.float32)
  lengths = rng.integers(1, l + 1, size=p * g)
  lengths[[2, 9]] = 0                          # empty responses in kept groups
  rollout = group_rollout(p * g, l, lengths)
  logp = jnp.asarray(rng.normal(-1, .3, size=(p * g, l)), jnp.float32)

  def pg_loss_and_grad(cfg, mode):
    batch, _ = run_group_batch(rewards, rollout, cfg)
    weights = losses.token_weights(batch.mask_BxL, mode)
    loss = lambda lp: jnp.sum(weights * losses.clipped_surrogate(
        lp, jnp.zeros_like(lp) - 1, batch.advantages_BxL, .2, .2)[0])
    return batch, weights, float(loss(logp)), np.asarray(jax.grad(loss)(logp))

  batch, weights, filtered, filtered_grad = pg_loss_and_grad(
      grpo_cfg(filter_zero_variance=True), 'seq-mean-token-sum-norm')
  kept = np.repeat([1, 0, 1, 0], g)[:, None] * (np.arange(l)[None, :] < lengths[:, None])
  np.testing.assert_array_equal(np.asarray(batch.mask_BxL), kept)
  close(weights, kept / (p * g * l))           # 16 * 6, not the 6 non-empty kept rows * 6
  _, _, unfiltered, unfiltered_grad = pg_loss_and_grad(grpo_cfg(), 'seq-mean-token-sum-norm')
  close(filtered, unfiltered)
  close(filtered_grad, unfiltered_grad)
  _, _, filtered_mean, _ = pg_loss_and_grad(grpo_cfg(filter_zero_variance=True), 'token-mean')
  _, _, unfiltered_mean, _ = pg_loss_and_grad(grpo_cfg(), 'token-mean')
  assert abs(filtered_mean - unfiltered_mean) > 1e-3


def test_masked_mean():
  rng = np.random.default_rng(3)
  lengths, mask = lengths_and_mask(rng)
  x = rng.normal(size=mask.shape).astype(np.float32)
  vals = [x[i, t] for i, n in enumerate(lengths) for t in range(n)]
  close(losses.masked_mean(x, mask), sum(vals) / len(vals))
  assert float(losses.masked_mean(x, np.zeros_like(mask))) == 0.0


def test_unknown_mode_and_kind_raise():
  with pytest.raises(ValueError, match='token-mean'):
    losses.token_weights(np.ones((2, 3)), 'sum')
  with pytest.raises(ValueError):
    losses.aggregate(np.ones((2, 3)), np.ones((2, 3)), 'mean')
  with pytest.raises(ValueError, match='k3'):
    losses.kl_penalty(np.zeros((2, 3)), np.zeros((2, 3)), 'k4')


# ----------------------------------------------------------------------------------------------
# Clipped surrogate.
# ----------------------------------------------------------------------------------------------


# (ratio, advantage, clip_low, clip_high, expected loss, expected clipped)
SURROGATE_CASES = [
    (1.10, 1.0, 0.2, 0.2, -1.10, 0.0),    # inside the trust region
    (1.50, 1.0, 0.2, 0.2, -1.20, 1.0),    # A > 0, ratio above 1 + high: capped
    (1.25, 1.0, 0.2, 0.28, -1.25, 0.0),   # clip-higher leaves room up to 1.28
    (1.50, 1.0, 0.2, 0.28, -1.28, 1.0),
    (0.50, 1.0, 0.2, 0.2, -0.50, 0.0),    # A > 0, ratio below 1 - low: unclipped is smaller
    (0.50, -1.0, 0.2, 0.2, 0.80, 1.0),    # A < 0, ratio below 1 - low: capped
    (0.75, -1.0, 0.3, 0.2, 0.75, 0.0),    # wider low bound: inside
    (1.50, -2.0, 0.2, 0.2, 3.00, 0.0),    # A < 0, ratio above 1 + high: unclipped is smaller
    (1.50, 0.0, 0.2, 0.2, 0.00, 0.0),     # no advantage, no loss
]


@pytest.mark.parametrize('ratio,adv,low,high,expected_loss,expected_clipped', SURROGATE_CASES)
def test_clipped_surrogate_hand_cases(ratio, adv, low, high, expected_loss, expected_clipped):
  old = np.array([[-1.3]], np.float32)
  logp = old + np.float32(np.log(ratio))
  loss, clipped = losses.clipped_surrogate(logp, old, np.array([[adv]], np.float32), low, high)
  close(loss, [[expected_loss]], rtol=1e-5)
  close(clipped, [[expected_clipped]], atol=0)


def random_tokens(rng, shape, spread):
  """(old log-probs, log-probs within +-spread of them, advantages), float32."""
  old = rng.normal(-2.0, 1.0, size=shape).astype(np.float32)
  logp = (old + rng.uniform(-spread, spread, size=shape)).astype(np.float32)
  return old, logp, rng.normal(size=shape).astype(np.float32)


def test_clipped_surrogate_random_and_gradient():
  shape, low, high = (6, 50), 0.2, 0.28
  old, logp, adv = random_tokens(np.random.default_rng(4), shape, 0.5)

  ref_loss, ref_clipped, ref_grad = (np.zeros(shape) for _ in range(3))
  for i in range(shape[0]):
    for t in range(shape[1]):
      r = math.exp(float(logp[i, t]) - float(old[i, t]))
      a = float(adv[i, t])
      unclipped, clipped = r * a, min(max(r, 1 - low), 1 + high) * a
      ref_loss[i, t] = -min(unclipped, clipped)
      ref_clipped[i, t] = float(clipped < unclipped)
      ref_grad[i, t] = 0.0 if clipped < unclipped else -r * a  # d(-r a)/dlogp = -r a
  assert 0.1 < ref_clipped.mean() < 0.9  # both regimes exercised

  loss, clipped = jax.jit(losses.clipped_surrogate)(logp, old, adv, low, high)
  close(loss, ref_loss, rtol=1e-5)
  np.testing.assert_array_equal(clipped, ref_clipped)
  grad = jax.grad(lambda lp: jnp.sum(losses.clipped_surrogate(lp, old, adv, low, high)[0]))(logp)
  close(grad, ref_grad, rtol=1e-5)
  assert np.all(np.asarray(grad)[ref_clipped == 1] == 0.0)


def ref_surrogate(log_ratio, a, low, high, c=0.0):
  """Float64 (loss, clipped, d loss / d logp) of one token: log-ratio clamped to +-20 (verl),
  dual-clip at c * A for A < 0 when c > 0 (Ye et al. 2020)."""
  clamped = min(max(log_ratio, -20.0), 20.0)
  r = math.exp(clamped)
  unclipped = r * a
  objective = min(unclipped, min(max(r, 1 - low), 1 + high) * a)
  if c and a < 0:
    objective = max(objective, c * a)
  clipped = float(objective != unclipped)
  grad = -r * a if objective == unclipped and clamped == log_ratio else 0.0
  return -objective, clipped, grad


def check_surrogate(log_ratio, adv, low, high, c, rtol=1e-5):
  old = np.full(log_ratio.shape, -1.5, np.float32)
  logp = (old + log_ratio).astype(np.float32)
  refs = [[ref_surrogate(float(logp[i, t]) - float(old[i, t]), float(adv[i, t]), low, high, c)
           for t in range(logp.shape[1])] for i in range(logp.shape[0])]
  ref_loss, ref_clipped, ref_grad = (np.array([[x[k] for x in row] for row in refs])
                                     for k in range(3))
  loss, clipped = jax.jit(losses.clipped_surrogate)(logp, old, adv, low, high, c)
  grad = jax.grad(lambda lp: jnp.sum(losses.clipped_surrogate(lp, old, adv, low, high, c)[0]))(logp)
  assert np.all(np.isfinite(loss)) and np.all(np.isfinite(grad))
  close(loss, ref_loss, rtol=rtol)
  np.testing.assert_array_equal(clipped, ref_clipped)
  close(grad, ref_grad, rtol=rtol)
  return ref_clipped


@pytest.mark.parametrize('c', [0.0, 3.0])
def test_clipped_surrogate_clamps_extreme_log_ratios(c):
  """exp(100) overflows float32: unclamped, A = 0 gives NaN and A < 0 gives +inf."""
  log_ratio = np.array([[-100, -30, -20.5, 20.5, 30, 88.8, 100]] * 3, np.float32)
  adv = np.array([[-1.0] * 7, [0.0] * 7, [0.7] * 7], np.float32)
  check_surrogate(log_ratio, adv, .2, .28, c)
  loss, _ = losses.clipped_surrogate(np.float32([[100.]]), np.float32([[0.]]), np.float32([[0.]]),
                                     .2, .28)
  assert float(loss[0, 0]) == 0.0


# (log-ratio, advantage, c, expected loss, expected clipped), clip_low = clip_high = 0.2
DUAL_CLIP_CASES = [
    (5.0, -1.0, 3.0, 3.0, 1.0),              # A < 0, ratio 148 > c: loss capped at -c A
    (5.0, -1.0, 0.0, math.exp(5.0), 0.0),    # off: unbounded
    (math.log(2.0), -1.0, 3.0, 2.0, 0.0),    # ratio below c: PPO's min as usual
    (math.log(5.0), 1.0, 3.0, -1.2, 1.0),    # A > 0: dual-clip does not apply
    (math.log(0.5), -1.0, 3.0, 0.8, 1.0),    # A < 0, ratio below 1 - low: ordinary clip
]


@pytest.mark.parametrize('log_ratio,adv,c,expected_loss,expected_clipped', DUAL_CLIP_CASES)
def test_dual_clip_hand_cases(log_ratio, adv, c, expected_loss, expected_clipped):
  old = np.array([[-1.3]], np.float32)
  loss, clipped = losses.clipped_surrogate(old + np.float32(log_ratio), old,
                                           np.array([[adv]], np.float32), .2, .2, c)
  close(loss, [[expected_loss]], rtol=1e-5)
  close(clipped, [[expected_clipped]], atol=0)


def test_dual_clip_random_and_gradient():
  rng = np.random.default_rng(12)
  log_ratio = rng.uniform(-2.5, 2.5, size=(8, 40)).astype(np.float32)
  adv = rng.normal(size=(8, 40)).astype(np.float32)
  ref_clipped = check_surrogate(log_ratio, adv, .2, .28, 3.0)
  assert np.any((adv < 0) & (np.exp(log_ratio) > 3.0) & (ref_clipped == 1))   # dual-clip active


def _tiny_policy_batch(rng, loss_agg, old_logp=None, b=4, t=3, l=5):
  """A tiny dense policy, its params and a PolicyBatch of random tokens: rows of uneven length,
  old log-probs `old_logp` (None: random near the policy's), one advantage per row."""
  cfg = model_lib.ModelConfig(vocab_size=16, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1,
                              head_dim=8, num_experts=0, dense_hidden=32)
  model = model_lib.Transformer(cfg)
  params = nn.unbox(model_lib.init_params(cfg, jax.random.PRNGKey(0)))
  mask = np.ones((b, l), np.float32) if old_logp is not None else lengths_and_mask(rng, b, l)[1]
  old = (np.full((b, l), old_logp) if old_logp is not None else
         rng.normal(-2.8, 0.3, (b, l)))   # about log(1/16): ratios both sides of the clip
  batch = policy_loss.PolicyBatch(
      prompt_BxT=jnp.asarray(rng.integers(0, 16, (b, t))), prompt_valid_BxT=jnp.ones((b, t), bool),
      response_BxL=jnp.asarray(rng.integers(0, 16, (b, l))), mask_BxL=jnp.asarray(mask),
      old_logp_BxL=jnp.asarray(old, jnp.float32),
      advantages_BxL=jnp.asarray(rng.choice([-1.0, 1.0], (b, 1)) * mask),
      weights_BxL=losses.token_weights(mask, loss_agg))
  return model, params, batch


@pytest.mark.parametrize('c', [0.0, 3.0])
def test_policy_loss_applies_the_configured_dual_clip(c):
  """cfg.clip_ratio_c reaches the loss of a real (tiny) model: its pg loss equals the float64
  reference of the surrogate on that model's own log-probs."""
  model, params, batch = _tiny_policy_batch(np.random.default_rng(14), 'token-mean',
                                            old_logp=-9.0)    # ratios of about e^6: far past c = 3
  b, l = batch.mask_BxL.shape
  loss_cfg = ml_collections.ConfigDict(dict(clip_low=.2, clip_high=.2, clip_ratio_c=c, kl_coef=0.0,
                                            kl_estimator='k3', moe_aux_coef=0.0))
  _, metrics = jax.jit(policy_loss.make_policy_loss(model, loss_cfg, 1.0, 1))(params, batch)
  logp, *_ = jax.jit(lambda p, b: policy_loss.response_logprobs(
      model, p, b.prompt_BxT, b.prompt_valid_BxT, b.response_BxL, 1.0))(params, batch)
  adv, logp = np.asarray(batch.advantages_BxL), np.asarray(logp, np.float64)
  expected = np.mean([ref_surrogate(logp[i, j] + 9.0, adv[i, j], .2, .2, c)[0]
                      for i in range(b) for j in range(l)])
  close(metrics['pg_loss'], expected, rtol=1e-5)
  assert np.any(adv < 0)


# ----------------------------------------------------------------------------------------------
# GSPO and CISPO.
# ----------------------------------------------------------------------------------------------


def ref_gspo(logp, old, mask, adv, low, high, c=0.0):
  """Float64, the sequence form of GSPO's objective, sequences averaged: (loss, d loss / d logp).
  Each sequence's advantage is its first token's (constant over a response, as in GRPO)."""
  b = logp.shape[0]
  rows = [i for i in range(b) if mask[i].sum() > 0]
  loss, grad = 0.0, np.zeros(logp.shape)
  for i in rows:
    n = mask[i].sum()
    seq_log_ratio = sum(float(logp[i, t]) - float(old[i, t]) for t in range(logp.shape[1])
                        if mask[i, t]) / n
    seq_loss, _, seq_grad = ref_surrogate(seq_log_ratio, float(adv[i, 0]), low, high, c)
    loss += seq_loss / len(rows)
    grad[i] = mask[i] * seq_grad / n / len(rows)   # d s / d logp_t = s / n on every token
  return loss, grad


@pytest.mark.parametrize('c', [0.0, 3.0])
def test_gspo_averaged_over_tokens_is_the_sequence_objective_and_its_gradient(c):
  rng = np.random.default_rng(31)
  _, mask = lengths_and_mask(rng, b=24, l=9)
  old = rng.normal(-2.0, 1.0, size=mask.shape).astype(np.float32)
  logp = (old + rng.uniform(-1.5, 1.5, size=mask.shape)).astype(np.float32)   # seq ratios 0.5-2
  adv = (rng.choice([-1.5, -0.5, 0.5, 1.5], (mask.shape[0], 1)) * mask).astype(np.float32)
  low, high = 0.1, 0.15
  weights = losses.token_weights(mask, 'seq-mean-token-mean')
  total = lambda lp: jnp.sum(weights * losses.gspo_surrogate(lp, old, mask, adv, low, high, c)[0])
  ref_loss, ref_grad = ref_gspo(logp, old, mask, adv, low, high, c)
  close(jax.jit(total)(logp), ref_loss, rtol=1e-5)
  close(jax.jit(jax.grad(total))(logp), ref_grad, rtol=1e-4, atol=1e-7)
  clipped = np.asarray(losses.gspo_surrogate(logp, old, mask, adv, low, high, c)[1])
  rows = mask.sum(1) > 0
  assert 0.1 < clipped[rows, 0].mean() < 0.9                 # both regimes exercised
  assert np.all((clipped == clipped[:, :1]) | (mask == 0))   # a sequence clips as a whole


def test_gspo_token_values_are_the_sequence_ratio_under_each_tokens_advantage():
  """The token form: every token of a sequence sees the sequence's ratio s, with its own A."""
  old = np.float32([[-1.0, -2.0, -0.5, 0.0]])
  logp = np.float32([[-0.8, -2.3, -0.3, 0.0]])
  mask = np.float32([[1, 1, 1, 0]])
  adv = np.float32([[1.0, -2.0, 0.5, 0.0]])
  s = math.exp((0.2 - 0.3 + 0.2) / 3)
  loss, _ = losses.gspo_surrogate(logp, old, mask, adv, 0.5, 0.5)
  close(loss, [[-s * 1.0, s * 2.0, -s * 0.5, 0.0]], rtol=1e-6)


def test_cispo_keeps_every_tokens_gradient_at_its_clipped_weight():
  low, high = 0.2, 0.28
  old, logp, adv = random_tokens(np.random.default_rng(32), (6, 40), 0.8)
  ratio = np.exp(logp.astype(np.float64) - old)
  weight = np.clip(ratio, 1 - low, 1 + high)
  loss, clipped = jax.jit(losses.cispo_loss)(logp, old, adv, low, high)
  grad = jax.grad(lambda lp: jnp.sum(losses.cispo_loss(lp, old, adv, low, high)[0]))(logp)
  close(loss, -weight * adv * logp, rtol=1e-5)
  close(grad, -weight * adv, rtol=1e-5)                     # the weight is a constant
  np.testing.assert_array_equal(clipped, (weight != ratio).astype(np.float32))
  assert 0.1 < np.mean(clipped) < 0.9 and np.all(np.asarray(grad) != 0)


def test_unknown_policy_loss_raises():
  with pytest.raises(ValueError, match='cispo'):
    losses.policy_objective('ppo', *(np.zeros((1, 2), np.float32),) * 4, 0.2, 0.2)


@pytest.mark.parametrize('kind', ['gspo', 'cispo'])
def test_policy_loss_computes_the_configured_kind_on_a_real_model(kind):
  """cfg.policy_loss reaches the loss of a real (tiny) model: its pg loss equals the float64
  reference on that model's own log-probs."""
  model, params, batch = _tiny_policy_batch(np.random.default_rng(33), 'seq-mean-token-mean')
  loss_cfg = ml_collections.ConfigDict(dict(policy_loss=kind, clip_low=.2, clip_high=.2,
                                            kl_coef=0.0, kl_estimator='k3', moe_aux_coef=0.0))
  _, metrics = jax.jit(policy_loss.make_policy_loss(model, loss_cfg, 1.0, 1))(params, batch)
  logp, *_ = jax.jit(lambda p, b: policy_loss.response_logprobs(
      model, p, b.prompt_BxT, b.prompt_valid_BxT, b.response_BxL, 1.0))(params, batch)
  logp, old = np.asarray(logp, np.float64), np.asarray(batch.old_logp_BxL, np.float64)
  mask, adv = np.asarray(batch.mask_BxL), np.asarray(batch.advantages_BxL)
  if kind == 'gspo':
    expected = ref_gspo(logp, old, mask, adv, .2, .2)[0]
  else:
    weight = np.clip(np.exp(logp - old), .8, 1.2)
    expected = np.sum(np.asarray(batch.weights_BxL) * -weight * adv * logp)
  close(metrics['pg_loss'], expected, rtol=1e-5)


# ----------------------------------------------------------------------------------------------
# Off-policy correction (importance weights against the sampler's log-probs).
# ----------------------------------------------------------------------------------------------


def ref_importance_weights(old_logp, behaviour_logp, mask, mode, low, high):
  """Explicit loop, float64: (weight, kept) of each token."""
  weights, keep = np.ones(mask.shape), np.array(mask, np.float64)
  for i, j in np.ndindex(mask.shape):
    ratio = math.exp(min(max(float(old_logp[i, j]) - float(behaviour_logp[i, j]), -20.0), 20.0))
    if mode == 'tis':
      weights[i, j] = min(ratio, high)
    elif mode == 'mis':
      inside = low <= ratio <= high
      weights[i, j] = ratio if inside else 0.0
      keep[i, j] *= inside
  return weights, keep


@pytest.mark.parametrize('mode', losses.OFF_POLICY_MODES)
def test_importance_weights_truncate_or_mask_as_numpy(mode):
  rng = np.random.default_rng(21)
  _, mask = lengths_and_mask(rng, b=16, l=9)
  old = rng.normal(-2, 1, mask.shape).astype(np.float32)
  behaviour = (old + rng.normal(0, 0.5, mask.shape)).astype(np.float32)
  behaviour[0, :2] = [old[0, 0] + 30.0, old[0, 1] - 30.0]   # log-ratios past the clamp
  low, high = 0.7, 1.5
  weights, keep, stats = losses.importance_weights(old, behaviour, mask, mode, low, high)
  ref_w, ref_keep = ref_importance_weights(old, behaviour, mask, mode, low, high)
  close(weights, ref_w, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(keep), ref_keep)
  ratio = np.exp(np.clip(old.astype(np.float64) - behaviour, -20, 20))
  outside = {'tis': ratio > high, 'mis': (ratio < low) | (ratio > high),
             'none': np.zeros(mask.shape, bool)}[mode]
  valid = mask > 0
  close(stats['is_outside_frac'], outside[valid].mean())
  close(stats['is_weight_mean'], ref_w[ref_keep > 0].mean(), rtol=1e-5)
  close(stats['is_weight_max'], ref_w[ref_keep > 0].max(), rtol=1e-5)
  close(stats['behaviour_mismatch'], np.abs(np.log(ratio))[valid].mean(), rtol=1e-5)
  if mode != 'none':   # the bounds bite on this data
    assert 0.05 < float(stats['is_outside_frac']) < 0.95


def test_importance_weights_at_staleness_zero_are_exactly_one():
  rng = np.random.default_rng(22)
  _, mask = lengths_and_mask(rng)
  logp = rng.normal(-2, 1, mask.shape).astype(np.float32)
  for mode in ('tis', 'mis'):
    weights, keep, stats = losses.importance_weights(logp, logp, mask, mode, 0.9, 1.1)
    assert np.all(np.asarray(weights) == 1.0) and np.array_equal(np.asarray(keep), mask)
    assert float(stats['is_outside_frac']) == 0.0 and float(stats['behaviour_mismatch']) == 0.0


# ----------------------------------------------------------------------------------------------
# KL estimators.
# ----------------------------------------------------------------------------------------------


def test_kl_estimators_match_formulas():
  rng = np.random.default_rng(5)
  logp = rng.normal(-2, 1, size=(4, 9)).astype(np.float32)
  ref = rng.normal(-2, 1, size=(4, 9)).astype(np.float32)
  k1, k2, k3 = (np.zeros(logp.shape) for _ in range(3))
  for i in range(logp.shape[0]):
    for t in range(logp.shape[1]):
      d = float(logp[i, t]) - float(ref[i, t])
      k1[i, t], k2[i, t], k3[i, t] = d, 0.5 * d * d, math.exp(-d) + d - 1
  close(losses.kl_penalty(logp, ref, 'k1'), k1)
  close(losses.kl_penalty(logp, ref, 'k2'), k2)
  close(losses.kl_penalty(logp, ref, 'k3'), k3, rtol=1e-5)


def test_k3_nonnegative():
  rng = np.random.default_rng(6)
  d = np.concatenate([rng.normal(0, 5, 1000), rng.normal(0, 1e-4, 1000), [0.0, 1e-8, -1e-8]])
  k3 = np.asarray(losses.kl_penalty(d.astype(np.float32), np.zeros_like(d, np.float32), 'k3'))
  assert np.all(k3 >= 0.0)


def test_kl_estimators_monte_carlo():
  p = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
  q = np.array([0.3, 0.3, 0.2, 0.1, 0.1])
  true_kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
  x = np.random.default_rng(7).choice(len(p), size=200_000, p=p)
  logp, ref = np.log(p)[x].astype(np.float32), np.log(q)[x].astype(np.float32)
  for kind in ('k1', 'k3'):  # the unbiased ones
    est = float(jnp.mean(losses.kl_penalty(logp, ref, kind)))
    assert abs(est - true_kl) < 0.05 * true_kl, (kind, est, true_kl)


def test_kl_estimator_gradients_as_loss_terms():
  """Expected gradient of each estimator used as a loss term, E_{x~pi}[d k(x) / d theta] with the
  samples held fixed (what autodiff of kl_coef * k gives), exactly over a 6-way categorical
  pi = softmax(theta): k1 -> 0, k2 -> grad KL(pi || ref), k3 -> grad KL(ref || pi)."""
  rng = np.random.default_rng(13)
  theta = rng.normal(size=6)
  q = rng.dirichlet(np.ones(6))
  pi = np.exp(theta - theta.max()) / np.exp(theta - theta.max()).sum()
  kl_pi_q = np.sum(pi * np.log(pi / q))
  grad_kl_pi_q = pi * (np.log(pi / q) - kl_pi_q)    # d/dtheta of sum pi log(pi / q)
  grad_kl_q_pi = pi - q                              # d/dtheta of -sum q log pi
  expected = {'k1': np.zeros(6), 'k2': grad_kl_pi_q, 'k3': grad_kl_q_pi}

  def expected_grad(kind):
    def loss(th):
      logp = jax.nn.log_softmax(th)
      weights = jax.lax.stop_gradient(jnp.exp(logp))   # sampling probabilities: no gradient
      return jnp.sum(weights * losses.kl_penalty(logp, jnp.log(jnp.float32(q)), kind))
    return np.asarray(jax.grad(loss)(jnp.float32(theta)))

  for kind, reference in expected.items():
    close(expected_grad(kind), reference, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# Log-probs and entropy.
# ----------------------------------------------------------------------------------------------


def ref_log_softmax(row):
  row = row.astype(np.float64)
  m = max(row)
  log_z = m + math.log(sum(math.exp(v - m) for v in row))
  return [v - log_z for v in row]


def test_logprobs_and_entropy():
  rng = np.random.default_rng(8)
  b, l, v = 3, 4, 11
  logits = (3 * rng.normal(size=(b, l, v))).astype(np.float32)
  tokens = rng.integers(0, v, size=(b, l))
  ref_logp, ref_ent = np.zeros((b, l)), np.zeros((b, l))
  for i in range(b):
    for t in range(l):
      ls = ref_log_softmax(logits[i, t])
      ref_logp[i, t] = ls[tokens[i, t]]
      ref_ent[i, t] = -sum(math.exp(x) * x for x in ls)
  logp = losses.logprobs_from_logits(logits, tokens)
  ent = losses.entropy_from_logits(logits)
  assert logp.dtype == jnp.float32 and ent.dtype == jnp.float32
  close(logp, ref_logp, rtol=1e-5)
  close(ent, ref_ent, rtol=1e-5)
  # bfloat16 logits still give float32 results.
  assert losses.logprobs_from_logits(jnp.asarray(logits, jnp.bfloat16), tokens).dtype == jnp.float32
  assert losses.entropy_from_logits(jnp.asarray(logits, jnp.bfloat16)).dtype == jnp.float32


def test_entropy_with_banned_tokens():
  logits = np.array([[[0.0, 0.0, -np.inf, -np.inf]]], np.float32)
  close(losses.entropy_from_logits(logits), [[math.log(2)]])
  grad = jax.grad(lambda z: jnp.sum(losses.entropy_from_logits(z)))(logits)
  assert np.all(np.isfinite(np.asarray(grad)))


# ----------------------------------------------------------------------------------------------
# GAE, whitening, value loss.
# ----------------------------------------------------------------------------------------------


def ref_gae(rewards, values, mask, gamma, lam):
  """GAE over each row's actions (mask 1) in order, the positions between them skipped."""
  adv, ret = np.zeros(rewards.shape), np.zeros(rewards.shape)
  for i in range(len(mask)):
    actions = [t for t in range(mask.shape[1]) if mask[i, t]]
    next_adv, next_value = 0.0, 0.0
    for t in reversed(actions):
      delta = float(rewards[i, t]) + gamma * next_value - float(values[i, t])
      next_adv, next_value = delta + gamma * lam * next_adv, float(values[i, t])
      adv[i, t], ret[i, t] = next_adv, next_adv + float(values[i, t])
  return adv, ret


def turn_mask(rng, b=8, l=12):
  """Rows of a multi-turn episode: actions, observations (0) between them, padding after."""
  mask = np.zeros((b, l), np.float32)
  for i in range(b):
    n = rng.integers(0, l + 1)
    mask[i, :n] = rng.random(n) < 0.6
  mask[0, :] = [1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 1, 0][:l]
  return mask


@pytest.mark.parametrize('gamma,lam', [(0.0, 0.0), (1.0, 1.0), (0.99, 0.95), (1.0, 0.9)])
@pytest.mark.parametrize('turns', [False, True])
def test_gae(gamma, lam, turns):
  rng = np.random.default_rng(9)
  mask = turn_mask(rng) if turns else lengths_and_mask(rng, b=8, l=12)[1]
  rewards = rng.normal(size=mask.shape).astype(np.float32)  # garbage off the actions must not leak
  values = rng.normal(size=mask.shape).astype(np.float32)
  adv, ret = jax.jit(losses.gae)(rewards, values, mask, gamma, lam)
  ref_adv, ref_ret = ref_gae(rewards, values, mask, gamma, lam)
  close(adv, ref_adv, rtol=1e-5, atol=2e-6)
  close(ret, ref_ret, rtol=1e-5, atol=2e-6)


def test_gae_special_cases():
  # gamma = lam = 0: one-step TD error r - V. gamma = lam = 1: reward-to-go minus V.
  rewards = np.array([[0.0, 0.0, 1.0, 9.0]], np.float32)
  values = np.array([[0.5, 0.25, 0.75, 9.0]], np.float32)
  mask = np.array([[1, 1, 1, 0]], np.float32)
  adv0, _ = losses.gae(rewards, values, mask, 0.0, 0.0)
  close(adv0, [[-0.5, -0.25, 0.25, 0.0]])
  adv1, ret1 = losses.gae(rewards, values, mask, 1.0, 1.0)
  close(adv1, [[0.5, 0.75, 0.25, 0.0]])
  close(ret1, [[1.0, 1.0, 1.0, 0.0]])
  # An observation between two turns is no step: the first turn's end bootstraps from the second.
  turns = np.array([[1, 0, 1, 0]], np.float32)
  close(losses.gae(rewards, values, turns, 1.0, 1.0)[0], [[0.5, 0.0, 0.25, 0.0]])
  close(losses.gae(rewards, values, turns, 0.0, 0.0)[0], [[-0.5, 0.0, 0.25, 0.0]])


@pytest.mark.parametrize('shift_mean', [True, False])
def test_whiten(shift_mean):
  rng = np.random.default_rng(10)
  lengths, mask = lengths_and_mask(rng, b=8, l=10)
  x = rng.normal(3.0, 2.0, size=mask.shape).astype(np.float32)
  vals = [float(x[i, t]) for i, n in enumerate(lengths) for t in range(n)]
  mean = sum(vals) / len(vals)
  std = math.sqrt(sum((v - mean)**2 for v in vals) / len(vals) + 1e-8)
  ref = np.zeros(x.shape)
  for i, n in enumerate(lengths):
    for t in range(n):
      ref[i, t] = (x[i, t] - mean) / std + (0.0 if shift_mean else mean)
  got = losses.whiten(x, mask, shift_mean=shift_mean)
  close(got, ref, rtol=1e-5, atol=2e-6)
  valid = np.asarray(got)[mask == 1]
  close(valid.mean(), 0.0 if shift_mean else mean, atol=1e-5)
  close(valid.std(), 1.0, rtol=1e-5)


@pytest.mark.parametrize('clip', [None, 0.2])
def test_value_loss(clip):
  rng = np.random.default_rng(11)
  values, old, returns = (rng.normal(size=(5, 8)).astype(np.float32) for _ in range(3))
  ref = np.zeros(values.shape)
  for i in range(values.shape[0]):
    for t in range(values.shape[1]):
      v, o, r = float(values[i, t]), float(old[i, t]), float(returns[i, t])
      ref[i, t] = 0.5 * (v - r)**2
      if clip is not None:
        vc = o + min(max(v - o, -clip), clip)
        ref[i, t] = max(ref[i, t], 0.5 * (vc - r)**2)
  close(losses.value_loss(values, old, returns, clip), ref, rtol=1e-5)


def test_value_loss_clip_hand_case():
  # v moved from 0 to 1 towards R = 2; clipped value 0.2 is farther from R, so the max picks it.
  args = (np.array([[1.0]]), np.array([[0.0]]), np.array([[2.0]]))
  close(losses.value_loss(*args, None), [[0.5]])
  close(losses.value_loss(*args, 0.2), [[0.5 * 1.8**2]])
