"""The policy-gradient objective shared by GRPO and PPO, on one micro-batch.

The trainer recomputes the log-probs of the sampled responses with the same model, the same
parameter arrays and the same left-padded layout the sampler used, so on-policy ratios start at 1
(`logprob_mismatch` measures how close).
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rljax import losses
from rljax import update


class PolicyBatch(NamedTuple):
  prompt_BxT: jax.Array        # left-padded prompts
  prompt_valid_BxT: jax.Array
  response_BxL: jax.Array      # sampled tokens, PAD after the stop token
  mask_BxL: jax.Array          # float: 1 on trained response tokens
  old_logp_BxL: jax.Array      # sampler log-probs (behaviour policy)
  advantages_BxL: jax.Array
  weights_BxL: jax.Array       # aggregation weights from the FULL batch (losses.token_weights)
  is_weights_BxL: jax.Array | None = None   # off-policy correction (losses.importance_weights)
  experts_BxLxYxK: jax.Array | None = None  # MoE: the sampler's expert ids (sampler.Rollout)


def prompt_and_response(prompt_BxT, prompt_valid_BxT, response_BxL):
  """The sequences a policy or critic reads: left-padded prompt, then the response."""
  tokens_BxS = jnp.concatenate([prompt_BxT, response_BxL], axis=1)
  valid_BxS = jnp.concatenate([prompt_valid_BxT, jnp.ones_like(response_BxL, bool)], axis=1)
  return tokens_BxS, valid_BxS


def at_response(x_BxS, prompt_len, response_len):
  """The positions that predict (or, for a critic, choose) the response tokens: position t - 1
  reads the state before token t."""
  return x_BxS[:, prompt_len - 1:prompt_len - 1 + response_len]


def mean_mismatch(metrics):
  """The update's summed |logp - old_logp| as a per-token mean, and for a MoE the fraction of
  (response token, layer) routing decisions whose top-k differs from the sampler's: how closely
  the trainer computes what the sampler did."""
  metrics = dict(metrics)
  metrics['logprob_mismatch'] = metrics.pop('logprob_mismatch_sum') / jnp.maximum(
      metrics['num_tokens'], 1)
  if 'router_decisions' in metrics:
    metrics['router_mismatch'] = metrics.pop('router_mismatch_sum') / jnp.maximum(
        metrics.pop('router_decisions'), 1)
  return metrics


def recorded_routes(experts_BxLxYxK, prompt_len):
  """The sampler's expert ids over the trainer's prompt + response positions, [Y, B, S, K]:
  position T - 1 + t holds those of the decoding step that sampled token t (the positions
  `at_response` reads); the other prompt positions and the last hold -1 (routed as computed)."""
  batch, _, num_layers, k = experts_BxLxYxK.shape
  none = lambda n: jnp.full((batch, n, num_layers, k), -1, experts_BxLxYxK.dtype)
  return jnp.moveaxis(jnp.concatenate([none(prompt_len - 1), experts_BxLxYxK, none(1)], axis=1),
                      2, 0)


def response_logprobs(model, params, prompt_BxT, prompt_valid_BxT, response_BxL, temperature,
                      logits_chunk=0, experts_BxLxYxK=None):
  """Log-probs and entropies of the response tokens under softmax(logits / temperature), the MoE
  aux loss and the routing decisions whose top-k differs from the sampler's `experts_BxLxYxK`
  (its ids, routed by with model.cfg.router_replay; None: 0).

  With `logits_chunk` = C > 0 the vocabulary projection runs over C response positions at a time
  under `jax.checkpoint`, so the full [B, L, V] logits never exist at once, in the forward or the
  backward pass (with a real vocabulary they are the largest tensor of an RL step).
  """
  response_len = response_BxL.shape[1]
  variables = {'params': params}
  recorded = (None if experts_BxLxYxK is None else
              recorded_routes(experts_BxLxYxK, prompt_BxT.shape[1]))
  (h_BxSxD, _, aux_loss), sown = model.apply(
      variables, *prompt_and_response(prompt_BxT, prompt_valid_BxT, response_BxL),
      recorded_YxBxSxK=recorded, method='hidden', mutable=['intermediates'])
  mismatch = sown.get('intermediates', {}).get('router_mismatch', (jnp.int32(0),))[0]
  h_BxLxD = at_response(h_BxSxD, prompt_BxT.shape[1], response_len)

  def logp_and_entropy(h_BxCxD, tokens_BxC):
    logits_BxCxV = model.apply(variables, h_BxCxD, method='logits') / temperature
    return (losses.logprobs_from_logits(logits_BxCxV, tokens_BxC),
            losses.entropy_from_logits(logits_BxCxV))

  if not logits_chunk or logits_chunk >= response_len:
    logp_BxL, entropy_BxL = logp_and_entropy(h_BxLxD, response_BxL)
    return logp_BxL, entropy_BxL, aux_loss, mismatch
  if response_len % logits_chunk:
    raise ValueError(f'logits_chunk {logits_chunk} must divide the response length {response_len}')
  batch, num_chunks = h_BxLxD.shape[0], response_len // logits_chunk
  chunks = lambda x: jnp.moveaxis(x.reshape(batch, num_chunks, logits_chunk, *x.shape[2:]), 1, 0)
  logp_NxBxC, entropy_NxBxC = jax.lax.map(lambda a: jax.checkpoint(logp_and_entropy)(*a),
                                          (chunks(h_BxLxD), chunks(response_BxL)))
  unchunk = lambda x: jnp.moveaxis(x, 0, 1).reshape(batch, response_len)
  return unchunk(logp_NxBxC), unchunk(entropy_NxBxC), aux_loss, mismatch


def micro_map(fn, num_micro, *arrays_B):
  """fn over `num_micro` row chunks in turn (`lax.map`), concatenated: memory of one chunk."""
  outputs = jax.lax.map(lambda chunk: fn(*chunk), update.split_micro(arrays_B, num_micro))
  return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), outputs)


def off_policy_correction(model, params, batch, cfg, temperature, num_micro, logits_chunk=0):
  """`batch` with the trainer's own log-probs as the surrogate's old policy and per-token weights
  pi_old / mu against the sampler's (behaviour) log-probs it held, per cfg.off_policy ('none':
  `batch` as it is). The sampler's policy may be older (partial rollouts) or computed otherwise
  (bf16 on a mesh); the clipped surrogate then stays a trust region around the trainer's policy.
  Returns (batch, stats)."""
  mode = cfg.get('off_policy', 'none')
  if mode == 'none':
    return batch, {}
  old_logp_BxL = micro_map(
      lambda p, v, r, e: response_logprobs(model, params, p, v, r, temperature, logits_chunk,
                                           e)[0],
      num_micro, batch.prompt_BxT, batch.prompt_valid_BxT, batch.response_BxL,
      batch.experts_BxLxYxK)
  is_weights_BxL, keep_BxL, stats = losses.importance_weights(
      old_logp_BxL, batch.old_logp_BxL, batch.mask_BxL, mode, cfg.is_low, cfg.is_high)
  return batch._replace(old_logp_BxL=old_logp_BxL, mask_BxL=keep_BxL,
                        advantages_BxL=batch.advantages_BxL * keep_BxL,
                        is_weights_BxL=is_weights_BxL), stats


def make_policy_loss(model, cfg, temperature, num_micro, logits_chunk=0):
  """`loss_fn(params, batch, ref_params) -> (loss, metric sums)` for rljax.update.

  cfg: policy_loss (losses.POLICY_LOSSES; absent: 'clip'), clip_low, clip_high, clip_ratio_c
  (dual-clip; absent or 0: off), kl_coef, kl_estimator, moe_aux_coef. With kl_coef == 0 no
  reference model exists at all (ref_params is None).
  """
  def loss_fn(params, batch, ref_params=None):
    logp_BxL, entropy_BxL, aux_loss, router_mismatch = response_logprobs(
        model, params, batch.prompt_BxT, batch.prompt_valid_BxT, batch.response_BxL, temperature,
        logits_chunk, batch.experts_BxLxYxK)
    pg_BxL, clipped_BxL = losses.policy_objective(
        cfg.get('policy_loss', 'clip'), logp_BxL, batch.old_logp_BxL, batch.mask_BxL,
        batch.advantages_BxL, cfg.clip_low, cfg.clip_high, cfg.get('clip_ratio_c', 0.0))
    if batch.is_weights_BxL is not None:
      pg_BxL = batch.is_weights_BxL * pg_BxL
    weights_BxL, mask_BxL = batch.weights_BxL, batch.mask_BxL
    pg_loss = jnp.sum(weights_BxL * pg_BxL)
    loss = pg_loss + cfg.moe_aux_coef * aux_loss / num_micro
    metrics = dict(
        pg_loss=pg_loss,
        moe_aux_loss=aux_loss / num_micro,
        entropy=jnp.sum(weights_BxL * entropy_BxL),
        clipfrac=jnp.sum(weights_BxL * clipped_BxL),
        logprob_mismatch_sum=jnp.sum(mask_BxL * jnp.abs(logp_BxL - batch.old_logp_BxL)),
        approx_kl=jnp.sum(weights_BxL * losses.kl_penalty(batch.old_logp_BxL, logp_BxL, 'k3')),
        num_tokens=jnp.sum(mask_BxL))
    if batch.experts_BxLxYxK is not None:   # every sampled token's decision in every layer
      metrics.update(router_mismatch_sum=router_mismatch,
                     router_decisions=jnp.sum(batch.experts_BxLxYxK[..., 0] >= 0))
    if cfg.kl_coef:
      ref_logp_BxL = response_logprobs(
          model, jax.lax.stop_gradient(ref_params), batch.prompt_BxT, batch.prompt_valid_BxT,
          batch.response_BxL, temperature, logits_chunk)[0]
      kl = jnp.sum(weights_BxL * losses.kl_penalty(logp_BxL, ref_logp_BxL, cfg.kl_estimator))
      loss = loss + cfg.kl_coef * kl
      metrics['kl'] = kl
    return loss, metrics

  return loss_fn


def policy_update(loss_fn, optimizer, loss_agg, num_micro, params, opt_state, batch, ref_params):
  """Weights from this (mini)batch, then one accumulated gradient step."""
  batch = batch._replace(weights_BxL=losses.token_weights(batch.mask_BxL, loss_agg))
  micro_loss = lambda p, b: loss_fn(p, b, ref_params)
  params, opt_state, metrics = update.apply_update(micro_loss, optimizer, params, opt_state, batch,
                                                   num_micro)
  return params, opt_state, mean_mismatch(metrics)
