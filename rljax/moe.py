"""Mixture-of-experts feed-forward layer (Qwen3-MoE style): softmax router, top-k, SwiGLU experts.

Dropless: every token reaches all of its k experts, whatever the load. Two exact implementations:
- 'ragged': sort the (token, expert) pairs by expert and run grouped matmuls with
  `jax.lax.ragged_dot` (FLOPs proportional to k; the choice for real models on accelerators);
- 'dense': run every expert on every token and combine with the (mostly zero) routing weights
  (E/k times the FLOPs, but plain matmuls: faster for tiny models on CPU, where ragged_dot is slow).
Both equal a naive per-token loop (tests/test_moe.py).
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

from rljax import layers


def route(router_logits_TxE, k):
  """Top-k experts per token with renormalised softmax weights, and the load-balancing loss.

  The loss is Switch/Qwen3-MoE's E * sum_e f_e * p_e (f_e: share of assignments to expert e,
  p_e: mean router probability); it equals 1 when the load is perfectly balanced.
  """
  num_experts = router_logits_TxE.shape[-1]
  probs_TxE = jax.nn.softmax(router_logits_TxE.astype(jnp.float32), axis=-1)
  weights_TxK, experts_TxK = jax.lax.top_k(probs_TxE, k)
  weights_TxK = weights_TxK / jnp.sum(weights_TxK, axis=-1, keepdims=True)
  assigned_TxE = jnp.sum(jax.nn.one_hot(experts_TxK, num_experts), axis=1)
  load_E = jnp.mean(assigned_TxE, axis=0) / k
  aux_loss = num_experts * jnp.sum(load_E * jnp.mean(probs_TxE, axis=0))
  return weights_TxK, experts_TxK, aux_loss


def experts_ragged(x_TxD, weights_TxK, experts_TxK, w_gate_ExDxF, w_up_ExDxF, w_down_ExFxD):
  """Sort token copies by expert, grouped matmuls, unsort, weight and sum over k."""
  num_tokens, k = experts_TxK.shape
  num_experts = w_gate_ExDxF.shape[0]
  flat_experts_N = experts_TxK.reshape(-1)
  order_N = jnp.argsort(flat_experts_N, stable=True)
  x_NxD = x_TxD[order_N // k]
  group_sizes_E = jnp.bincount(flat_experts_N, length=num_experts).astype(jnp.int32)
  gate_NxF = jax.lax.ragged_dot(x_NxD, w_gate_ExDxF, group_sizes_E)
  up_NxF = jax.lax.ragged_dot(x_NxD, w_up_ExDxF, group_sizes_E)
  y_NxD = jax.lax.ragged_dot(nn.silu(gate_NxF) * up_NxF, w_down_ExFxD, group_sizes_E)
  y_NxD = jnp.zeros_like(y_NxD).at[order_N].set(y_NxD)
  y_TxKxD = y_NxD.reshape(num_tokens, k, -1)
  return jnp.einsum('tkd,tk->td', y_TxKxD, weights_TxK.astype(y_TxKxD.dtype))


def experts_dense(x_TxD, weights_TxK, experts_TxK, w_gate_ExDxF, w_up_ExDxF, w_down_ExFxD):
  """Every expert on every token; non-selected experts get weight 0."""
  num_experts = w_gate_ExDxF.shape[0]
  combine_TxE = jnp.einsum('tk,tke->te', weights_TxK, jax.nn.one_hot(experts_TxK, num_experts))
  gate_TxExF = jnp.einsum('td,edf->tef', x_TxD, w_gate_ExDxF)
  up_TxExF = jnp.einsum('td,edf->tef', x_TxD, w_up_ExDxF)
  y_TxExD = jnp.einsum('tef,efd->ted', nn.silu(gate_TxExF) * up_TxExF, w_down_ExFxD)
  return jnp.einsum('ted,te->td', y_TxExD, combine_TxE.astype(y_TxExD.dtype))


EXPERT_IMPLS = {'ragged': experts_ragged, 'dense': experts_dense}


class MoE(nn.Module):
  """Routed SwiGLU experts. Returns the output and the load-balancing loss."""
  cfg: 'rljax.model.ModelConfig'

  @nn.compact
  def __call__(self, x_BxTxD):
    cfg = self.cfg
    batch, length, d_model = x_BxTxD.shape
    x_TxD = x_BxTxD.reshape(batch * length, d_model)
    router_DxE = layers.param(self, 'router', (d_model, cfg.num_experts), ('embed', 'expert'), cfg)
    shape = (cfg.num_experts, d_model, cfg.expert_hidden)
    w_gate = layers.param(self, 'w_gate', shape, ('expert', 'embed', 'mlp'), cfg)
    w_up = layers.param(self, 'w_up', shape, ('expert', 'embed', 'mlp'), cfg)
    w_down = layers.param(self, 'w_down', (cfg.num_experts, cfg.expert_hidden, d_model),
                          ('expert', 'mlp', 'embed'), cfg)
    router_logits_TxE = jnp.dot(x_TxD.astype(jnp.float32), router_DxE.astype(jnp.float32))
    weights_TxK, experts_TxK, aux_loss = route(router_logits_TxE, cfg.experts_per_token)
    x_TxD = x_TxD.astype(cfg.dtype)
    y_TxD = EXPERT_IMPLS[cfg.moe_impl](x_TxD, weights_TxK, experts_TxK, w_gate.astype(cfg.dtype),
                                       w_up.astype(cfg.dtype), w_down.astype(cfg.dtype))
    return y_TxD.reshape(batch, length, d_model), aux_loss
