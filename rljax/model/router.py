"""The MoE router: each token's top-k experts and their weights, the load-balancing loss, and
router replay (the trainer routing a token as the sampler did: docs/guide/router_replay.md).

Recorded expert ids are small integers (`route_dtype`), -1 where a token has none: the sampler
records one [K] row per response token and layer; the trainer's tokens without one route by their
own top-k.
"""
import jax
import jax.numpy as jnp


def route(router_logits_TxE, k, recorded_TxK=None, replay=False):
  """Top-k experts per token with renormalised softmax weights, the load statistics, and the
  number of tokens whose top-k set differs from `recorded_TxK` (the sampler's ids; rows of -1
  are not counted; 0 without them).

  `replay`: the tokens with recorded ids route to those experts instead of their own top-k, with
  the softmax renormalised over them, so the router still gets gradients (router replay).
  Returns (weights_TxK, experts_TxK, load_stats, mismatch); `load_stats` are sums over tokens,
  so shards of a batch can add theirs before `load_balance_loss` (the loss is the same on any
  mesh).
  """
  num_experts = router_logits_TxE.shape[-1]
  probs_TxE = jax.nn.softmax(router_logits_TxE.astype(jnp.float32), axis=-1)
  weights_TxK, experts_TxK = jax.lax.top_k(probs_TxE, k)
  mismatch = jnp.int32(0)
  if recorded_TxK is not None:
    recorded_TxK = recorded_TxK.astype(jnp.int32)
    recorded_T = recorded_TxK[:, 0] >= 0
    same_T = jnp.all(jnp.sort(experts_TxK, axis=-1) == jnp.sort(recorded_TxK, axis=-1), axis=-1)
    mismatch = jnp.sum(recorded_T & ~same_T, dtype=jnp.int32)
    if replay:
      experts_TxK = jnp.where(recorded_T[:, None], recorded_TxK, experts_TxK)
      weights_TxK = jnp.take_along_axis(probs_TxE, experts_TxK, axis=-1)
  weights_TxK = weights_TxK / jnp.sum(weights_TxK, axis=-1, keepdims=True)
  assigned_E = jnp.sum(jax.nn.one_hot(experts_TxK, num_experts), axis=(0, 1))
  load_stats = (assigned_E, jnp.sum(probs_TxE, axis=0), jnp.float32(probs_TxE.shape[0]))
  return weights_TxK, experts_TxK, load_stats, mismatch


def route_dtype(num_experts):
  """The integer type of recorded expert ids: int8 up to 128 experts, else int16 (-1: none)."""
  return jnp.int8 if num_experts <= 128 else jnp.int16


def load_balance_loss(load_stats, k):
  """Switch / Qwen3-MoE auxiliary loss E * sum_e f_e * p_e (f_e: share of assignments to expert
  e, p_e: mean router probability); 1 when the load is perfectly balanced."""
  assigned_E, probs_sum_E, num_tokens = load_stats
  num_experts = assigned_E.shape[0]
  return num_experts * jnp.sum((assigned_E / (num_tokens * k)) * (probs_sum_E / num_tokens))


def unrecorded(cfg, rows, length):
  """Expert ids of `rows` responses of `length` tokens before any is sampled: -1 everywhere,
  [rows, length, Y, K] (Y: layers); None for a dense model (nothing is routed)."""
  if not cfg.num_experts:
    return None
  return jnp.full((rows, length, cfg.num_layers, cfg.experts_per_token), -1,
                  route_dtype(cfg.num_experts))
