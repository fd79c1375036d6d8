"""Losses and advantage estimators for RL post-training, as pure jittable functions.

Shapes: P prompts x G responses per prompt for rewards; B sequences x L response tokens for
per-token quantities (right-padded, mask 1 then 0); V vocabulary size.

Per-token losses are aggregated through *weights* computed once on the full batch: summing
`weights * loss` over any split of the batch into micro-batches gives the same number, so gradient
accumulation never changes the objective.
"""

import jax
import jax.numpy as jnp

AGGREGATION_MODES = ('token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum',
                     'seq-mean-token-sum-norm')
KL_KINDS = ('k1', 'k2', 'k3')
OFF_POLICY_MODES = ('none', 'tis', 'mis')
POLICY_LOSSES = ('clip', 'gspo', 'cispo')
# |log pi/pi_old| beyond this cannot come from a trust-region step; clamping it keeps the ratio
# finite in float32 (exp overflows above ~88.7, and inf * 0 is NaN). The bound is verl's.
LOG_RATIO_LIMIT = 20.0


def _safe_div(num, den):
  """num / den, with 0 where den == 0 (every numerator we pass is 0 there too)."""
  return num / jnp.where(den == 0, 1.0, den)


# ----------------------------------------------------------------------------------------------
# Group-relative advantages (GRPO).
# ----------------------------------------------------------------------------------------------


def zero_variance_groups(rewards_PxG):
  """Groups whose rewards are all equal: they carry no learning signal under GRPO."""
  return jnp.all(rewards_PxG == rewards_PxG[:, :1], axis=1)


def group_advantages(rewards_PxG, normalize_std=True, eps=1e-6):
  """GRPO advantages: reward relative to its group, optionally in units of the group's std.

  The std is unbiased (ddof=1), as in verl and TRL. normalize_std=False is Dr. GRPO, which drops
  the std to avoid over-weighting near-unanimous groups. Zero-variance groups get exactly 0
  (not a rounding residue of r - mean), so they contribute nothing.
  """
  rewards_PxG = jnp.asarray(rewards_PxG, jnp.float32)
  g = rewards_PxG.shape[1]
  mean_Px1 = jnp.mean(rewards_PxG, axis=1, keepdims=True)
  centered_PxG = rewards_PxG - mean_Px1
  advantages_PxG = centered_PxG
  if normalize_std:
    var_Px1 = jnp.sum(centered_PxG**2, axis=1, keepdims=True) / max(g - 1, 1)
    advantages_PxG = centered_PxG / (jnp.sqrt(var_Px1) + eps)
  return jnp.where(zero_variance_groups(rewards_PxG)[:, None], 0.0, advantages_PxG)


# ----------------------------------------------------------------------------------------------
# Aggregation of per-token losses.
# ----------------------------------------------------------------------------------------------


def token_weights(mask_BxL, mode):
  """Weights such that sum(weights * per_token_loss) is the loss aggregated by `mode`.

  Compute them on the FULL batch before splitting into micro-batches: the per-micro-batch sums
  then add up to exactly the full-batch loss, whatever the split.
    token-mean:              every valid token in the batch counts the same.
    seq-mean-token-mean:     mean over tokens within a sequence, then over non-empty sequences.
    seq-mean-token-sum:      sum over tokens within a sequence, then mean over non-empty sequences.
    seq-mean-token-sum-norm: token sum divided by the constant B * L (Dr. GRPO): no length bias.
      B counts every row, empty or masked out (filter_zero_variance) ones included: each token's
      weight is then one constant for the whole run, and since filtered rows have advantage 0,
      filtering leaves the policy-gradient loss exactly as without it.
  """
  mask_BxL = jnp.asarray(mask_BxL, jnp.float32)
  b, l = mask_BxL.shape
  if mode == 'token-mean':
    return _safe_div(mask_BxL, jnp.sum(mask_BxL))
  len_Bx1 = jnp.sum(mask_BxL, axis=1, keepdims=True)
  num_seqs = jnp.sum(len_Bx1 > 0)
  if mode == 'seq-mean-token-mean':
    return _safe_div(mask_BxL, len_Bx1 * num_seqs)
  if mode == 'seq-mean-token-sum':
    return _safe_div(mask_BxL, num_seqs)
  if mode == 'seq-mean-token-sum-norm':
    return mask_BxL / (b * l)
  raise ValueError(f'Unknown aggregation mode {mode!r}; valid modes: {AGGREGATION_MODES}.')


def aggregate(per_token_BxL, mask_BxL, mode):
  """Aggregated scalar loss (or metric) of per-token values under `mode`."""
  return jnp.sum(token_weights(mask_BxL, mode) * per_token_BxL)


def masked_mean(x, mask):
  """Mean of x over valid entries; 0 when there are none."""
  mask = jnp.asarray(mask, jnp.float32)
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


# ----------------------------------------------------------------------------------------------
# Policy objective and KL.
# ----------------------------------------------------------------------------------------------


def clipped_surrogate(logp_BxL, old_logp_BxL, advantages_BxL, clip_low, clip_high,
                      clip_ratio_c=0.0):
  """PPO/GRPO clipped objective as a per-token loss, and where a clip is active.

  The pessimistic min stops the update once the ratio has moved past the trust region in the
  direction the advantage favours. Asymmetric bounds (clip_high > clip_low, DAPO "clip-higher")
  leave more room to raise the probability of unlikely tokens. For A < 0 the min alone leaves
  the loss unbounded as the ratio grows; dual-clip (clip_ratio_c = c > 1, Ye et al. 2020) caps
  it at -c * A. 0 turns dual-clip off. The log-ratio is clamped to +-LOG_RATIO_LIMIT.
  `clipped_BxL` is 1.0 where a clipped branch was taken, i.e. where the token gets no gradient.
  """
  return _clipped_objective(logp_BxL - old_logp_BxL, advantages_BxL, clip_low, clip_high,
                            clip_ratio_c)


def _clipped_objective(log_ratio_BxL, advantages_BxL, clip_low, clip_high, clip_ratio_c):
  """clipped_surrogate's loss and clip indicator from the log-ratio itself."""
  ratio_BxL = jnp.exp(jnp.clip(log_ratio_BxL, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
  unclipped_BxL = ratio_BxL * advantages_BxL
  clipped_obj_BxL = jnp.clip(ratio_BxL, 1.0 - clip_low, 1.0 + clip_high) * advantages_BxL
  objective_BxL = jnp.minimum(unclipped_BxL, clipped_obj_BxL)
  dual_BxL = jnp.maximum(objective_BxL, clip_ratio_c * advantages_BxL)
  objective_BxL = jnp.where((advantages_BxL < 0) & (clip_ratio_c > 0), dual_BxL, objective_BxL)
  clipped_BxL = (objective_BxL != unclipped_BxL).astype(jnp.float32)
  return -objective_BxL, clipped_BxL


def gspo_surrogate(logp_BxL, old_logp_BxL, mask_BxL, advantages_BxL, clip_low, clip_high,
                   clip_ratio_c=0.0):
  """GSPO (Zheng et al. 2025, arXiv 2507.18071): clipped_surrogate on each sequence's
  length-normalised ratio s = exp(mean over its tokens of log pi/pi_old) instead of each token's.

  A MoE's token ratios are noisy when routing shifts between two policies; their geometric mean
  over a sequence is not. Token form ("GSPO-token"): every token carries the value s, and the
  gradient s * grad log pi(token); averaged over a sequence's tokens
  (loss_agg 'seq-mean-token-mean') that is exactly the gradient of the sequence objective, and
  each token may keep its own advantage. Clipping acts per sequence, so its bounds are about three
  orders of magnitude tighter than a token ratio's (the paper: 3e-4 below, 4e-4 above).
  """
  mask_BxL = jnp.asarray(mask_BxL, jnp.float32)
  seq_log_ratio_Bx1 = _safe_div(jnp.sum(mask_BxL * (logp_BxL - old_logp_BxL), 1, keepdims=True),
                                jnp.sum(mask_BxL, 1, keepdims=True))
  log_ratio_BxL = (jax.lax.stop_gradient(seq_log_ratio_Bx1) +
                   (logp_BxL - jax.lax.stop_gradient(logp_BxL)))
  return _clipped_objective(log_ratio_BxL, advantages_BxL, clip_low, clip_high, clip_ratio_c)


def cispo_loss(logp_BxL, old_logp_BxL, advantages_BxL, clip_low, clip_high):
  """CISPO (MiniMax-M1, arXiv 2506.13585): REINFORCE weighted by each token's ratio clipped to
  [1 - clip_low, 1 + clip_high] and held constant, -sg(clip(r)) * A * log pi.

  The clipped surrogate gives a token past its clip bound no gradient at all; rare tokens whose
  probability jumps (often the ones that fork a reasoning path) are then never learned from after
  the first update. CISPO keeps every token's gradient and bounds only its weight. `clipped_BxL`
  is 1.0 where the weight was clipped (the token still has a gradient).
  """
  ratio_BxL = jnp.exp(jnp.clip(logp_BxL - old_logp_BxL, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
  weight_BxL = jax.lax.stop_gradient(jnp.clip(ratio_BxL, 1.0 - clip_low, 1.0 + clip_high))
  clipped_BxL = (weight_BxL != jax.lax.stop_gradient(ratio_BxL)).astype(jnp.float32)
  return -weight_BxL * advantages_BxL * logp_BxL, clipped_BxL


def policy_objective(kind, logp_BxL, old_logp_BxL, mask_BxL, advantages_BxL, clip_low, clip_high,
                     clip_ratio_c=0.0):
  """The per-token policy loss and its clip indicator for a `policy_loss` kind."""
  if kind == 'clip':
    return clipped_surrogate(logp_BxL, old_logp_BxL, advantages_BxL, clip_low, clip_high,
                             clip_ratio_c)
  if kind == 'gspo':
    return gspo_surrogate(logp_BxL, old_logp_BxL, mask_BxL, advantages_BxL, clip_low, clip_high,
                          clip_ratio_c)
  if kind == 'cispo':
    return cispo_loss(logp_BxL, old_logp_BxL, advantages_BxL, clip_low, clip_high)
  raise ValueError(f'Unknown policy loss {kind!r}; valid kinds: {POLICY_LOSSES}.')


def importance_weights(old_logp_BxL, behaviour_logp_BxL, mask_BxL, mode, low, high):
  """Per-token weights pi_old / mu of the tokens the behaviour policy mu (the sampler) drew, and
  which tokens the loss keeps: the correction for sampling from another policy than the trainer's.

  'tis' (truncated IS): weight min(ratio, high), every token kept. 'mis' (masked IS): weight
  ratio, tokens with a ratio outside [low, high] dropped from the mask (so from the aggregation's
  denominator too). 'none': weight 1, every token kept. The log-ratio is clamped as in
  clipped_surrogate. Returns (weights_BxL, keep_BxL, stats over the masked tokens).
  """
  mask_BxL = jnp.asarray(mask_BxL, jnp.float32)
  log_ratio_BxL = jnp.clip(old_logp_BxL - behaviour_logp_BxL, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
  ratio_BxL = jnp.exp(log_ratio_BxL)
  if mode == 'tis':
    outside_BxL = (ratio_BxL > high).astype(jnp.float32)
    weights_BxL, keep_BxL = jnp.minimum(ratio_BxL, high), mask_BxL
  elif mode == 'mis':
    outside_BxL = ((ratio_BxL < low) | (ratio_BxL > high)).astype(jnp.float32)
    weights_BxL, keep_BxL = ratio_BxL * (1 - outside_BxL), mask_BxL * (1 - outside_BxL)
  elif mode == 'none':
    outside_BxL = jnp.zeros_like(ratio_BxL)
    weights_BxL, keep_BxL = jnp.ones_like(ratio_BxL), mask_BxL
  else:
    raise ValueError(f'Unknown off-policy mode {mode!r}; valid modes: {OFF_POLICY_MODES}.')
  stats = dict(is_weight_mean=masked_mean(weights_BxL, keep_BxL),
               is_weight_max=jnp.max(jnp.where(keep_BxL > 0, weights_BxL, 0.0)),
               is_outside_frac=masked_mean(outside_BxL, mask_BxL),
               behaviour_mismatch=masked_mean(jnp.abs(log_ratio_BxL), mask_BxL))
  return weights_BxL, keep_BxL, stats


def kl_penalty(logp_BxL, ref_logp_BxL, kind):
  """Per-token estimate of KL(pi || ref) from tokens sampled from pi (Schulman's k1, k2, k3).

  As values: k1 is unbiased but noisy and can be negative; k2 is low-variance but biased; k3 is
  unbiased, low-variance and always >= 0 (computed with expm1 so that it stays accurate near 0).
  As loss terms their expected gradients differ: k1 gives 0 (no regularisation at all), k2 the
  gradient of KL(pi || ref), k3 that of KL(ref || pi) (docs/reference/losses.md).
  """
  log_ratio_BxL = logp_BxL - ref_logp_BxL
  if kind == 'k1':
    return log_ratio_BxL
  if kind == 'k2':
    return 0.5 * log_ratio_BxL**2
  if kind == 'k3':
    return jnp.expm1(-log_ratio_BxL) + log_ratio_BxL
  raise ValueError(f'Unknown KL estimator {kind!r}; valid kinds: {KL_KINDS}.')


def logprobs_from_logits(logits_BxLxV, tokens_BxL):
  """Log-probability of each token; the softmax is in float32 whatever the logits' dtype."""
  logp_BxLxV = jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp_BxLxV, tokens_BxL[..., None], axis=-1)[..., 0]


def entropy_from_logits(logits_BxLxV):
  """Entropy of each next-token distribution, in float32; -inf logits (banned tokens) are fine."""
  logp_BxLxV = jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
  p_BxLxV = jnp.exp(logp_BxLxV)
  # 0 * log 0 = 0, without a NaN in the value or the gradient.
  logp_BxLxV = jnp.where(p_BxLxV > 0, logp_BxLxV, 0.0)
  return -jnp.sum(p_BxLxV * logp_BxLxV, axis=-1)


# ----------------------------------------------------------------------------------------------
# PPO with a critic: GAE, whitening, value loss.
# ----------------------------------------------------------------------------------------------


def gae(rewards_BxL, values_BxL, mask_BxL, gamma, lam):
  """Generalised advantage estimation over the response's actions, as a reverse scan over L.

  The masked-out positions are not actions: padding after the end, and an environment's
  observations between turns (rljax.rollout.turns). The scan steps over them, so an action's
  next value and advantage are those of the next action, and each turn-end bootstraps from the
  model's next turn. After the last action the value is 0. Returns (advantages, returns =
  advantages + values), both 0 where masked.
  """
  mask_BxL = jnp.asarray(mask_BxL, jnp.float32)
  rewards_BxL = rewards_BxL.astype(jnp.float32)
  values_BxL = values_BxL.astype(jnp.float32) * mask_BxL

  def step(next_B, inputs):   # next_B: (value, advantage) of the next action, 0 past the last
    next_value_B, next_adv_B = next_B
    reward_B, value_B, action_B = inputs
    adv_B = reward_B + gamma * next_value_B - value_B + gamma * lam * next_adv_B
    keep = lambda new_B, old_B: jnp.where(action_B > 0, new_B, old_B)
    return (keep(value_B, next_value_B), keep(adv_B, next_adv_B)), adv_B

  zeros_B = jnp.zeros(mask_BxL.shape[0], jnp.float32)
  _, advantages_LxB = jax.lax.scan(
      step, (zeros_B, zeros_B), (rewards_BxL.T, values_BxL.T, mask_BxL.T), reverse=True)
  advantages_BxL = advantages_LxB.T * mask_BxL
  return advantages_BxL, advantages_BxL + values_BxL


def whiten(x_BxL, mask_BxL, shift_mean=True, eps=1e-8):
  """Scale x to unit variance over valid tokens (and zero mean, unless shift_mean=False).

  Keeping the mean preserves the sign balance of advantages, as OpenRLHF/TRL do in some modes.
  The variance is the population (biased) one over valid tokens.
  """
  mask_BxL = jnp.asarray(mask_BxL, jnp.float32)
  mean = masked_mean(x_BxL, mask_BxL)
  var = masked_mean((x_BxL - mean)**2, mask_BxL)
  whitened_BxL = (x_BxL - mean) * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    whitened_BxL = whitened_BxL + mean
  return whitened_BxL * mask_BxL


def value_loss(values_BxL, old_values_BxL, returns_BxL, clip):
  """Per-token critic loss, optionally clipped around the old values as in PPO.

  With clip, the pessimistic max keeps the value from moving more than `clip` per update.
  """
  loss_BxL = (values_BxL - returns_BxL)**2
  if clip is not None:
    clipped_values_BxL = old_values_BxL + jnp.clip(values_BxL - old_values_BxL, -clip, clip)
    loss_BxL = jnp.maximum(loss_BxL, (clipped_values_BxL - returns_BxL)**2)
  return 0.5 * loss_BxL


def explained_variance(values_BxL, returns_BxL, mask_BxL):
  """1 - Var(returns - values) / Var(returns) over valid tokens: 1 is a perfect critic, 0 is no
  better than predicting the mean return, negative is worse. 0 when the returns do not vary."""
  mask_BxL = jnp.asarray(mask_BxL, jnp.float32)

  def var(x_BxL):
    return masked_mean((x_BxL - masked_mean(x_BxL, mask_BxL))**2, mask_BxL)
  var_returns = var(returns_BxL)
  return jnp.where(var_returns > 0,
                   1.0 - _safe_div(var(returns_BxL - values_BxL), var_returns), 0.0)
