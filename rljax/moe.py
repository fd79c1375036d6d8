"""Mixture-of-experts feed-forward layer (Qwen3-MoE style): softmax router, top-k, SwiGLU experts.

Dropless: every token reaches all of its k experts, whatever the load. Exact implementations:
- 'ragged': sort the (token, expert) pairs by expert and run grouped matmuls with
  `jax.lax.ragged_dot` (FLOPs proportional to k; the choice for real models on accelerators);
- 'dense': run every expert on every token and combine with the (mostly zero) routing weights
  (E/k times the FLOPs, but plain matmuls);
- 'blocked': sort as 'ragged', then one batched matmul over (row block, expert) work items, one
  expert's weights per item: the grouped matmul for XLA:CPU, which lowers `ragged_dot` to a dense
  dot against every expert (E times the FLOPs; docs/performance.md).
- 'gather' (not a config choice): pick each token's k experts and apply them (reads T*k expert
  matrices, not all E); used automatically whenever T*k <= E, i.e. when decoding a small batch, where reading every
  expert would multiply the bytes per step, the quantity that bounds decoding, by up to E/k.
All equal a naive per-token loop (tests/test_moe.py).
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

from rljax import layers


def route(router_logits_TxE, k):
  """Top-k experts per token with renormalised softmax weights, and the load statistics.

  Returns (weights_TxK, experts_TxK, load_stats); `load_stats` are sums over tokens, so shards
  of a batch can add theirs before `load_balance_loss` (the loss is the same on any mesh).
  """
  num_experts = router_logits_TxE.shape[-1]
  probs_TxE = jax.nn.softmax(router_logits_TxE.astype(jnp.float32), axis=-1)
  weights_TxK, experts_TxK = jax.lax.top_k(probs_TxE, k)
  weights_TxK = weights_TxK / jnp.sum(weights_TxK, axis=-1, keepdims=True)
  assigned_E = jnp.sum(jax.nn.one_hot(experts_TxK, num_experts), axis=(0, 1))
  load_stats = (assigned_E, jnp.sum(probs_TxE, axis=0), jnp.float32(probs_TxE.shape[0]))
  return weights_TxK, experts_TxK, load_stats


def load_balance_loss(load_stats, k):
  """Switch / Qwen3-MoE auxiliary loss E * sum_e f_e * p_e (f_e: share of assignments to expert
  e, p_e: mean router probability); 1 when the load is perfectly balanced."""
  assigned_E, probs_sum_E, num_tokens = load_stats
  num_experts = assigned_E.shape[0]
  return num_experts * jnp.sum((assigned_E / (num_tokens * k)) * (probs_sum_E / num_tokens))


def sort_by_expert(x_TxD, experts_TxK):
  """Token copies (one per chosen expert) in expert order: (order_N, x_NxD, sorted experts_N)."""
  flat_experts_N = experts_TxK.reshape(-1)
  order_N = jnp.argsort(flat_experts_N, stable=True)
  return order_N, x_TxD[order_N // experts_TxK.shape[1]], flat_experts_N[order_N]


def combine(y_NxD, weights_TxK):
  """Each token's k expert outputs (rows in token order, k per token) summed with its routing
  weights."""
  y_TxKxD = y_NxD.reshape(*weights_TxK.shape, -1)
  return jnp.einsum('tkd,tk->td', y_TxKxD, weights_TxK.astype(y_TxKxD.dtype))


def unsort_and_combine(y_NxD, order_N, weights_TxK):
  """Back to token order, then `combine`."""
  return combine(jnp.zeros_like(y_NxD).at[order_N].set(y_NxD), weights_TxK)


def experts_ragged(x_TxD, weights_TxK, experts_TxK, w_gate_ExDxF, w_up_ExDxF, w_down_ExFxD):
  """Sort token copies by expert, grouped matmuls, unsort, weight and sum over k."""
  num_experts = w_gate_ExDxF.shape[0]
  order_N, x_NxD, _ = sort_by_expert(x_TxD, experts_TxK)
  group_sizes_E = jnp.bincount(experts_TxK.reshape(-1), length=num_experts).astype(jnp.int32)
  gate_NxF = jax.lax.ragged_dot(x_NxD, w_gate_ExDxF, group_sizes_E)
  up_NxF = jax.lax.ragged_dot(x_NxD, w_up_ExDxF, group_sizes_E)
  y_NxD = jax.lax.ragged_dot(nn.silu(gate_NxF) * up_NxF, w_down_ExFxD, group_sizes_E)
  return unsort_and_combine(y_NxD, order_N, weights_TxK)


def experts_dense(x_TxD, weights_TxK, experts_TxK, w_gate_ExDxF, w_up_ExDxF, w_down_ExFxD):
  """Every expert on every token, non-selected experts weighted 0: three plain matmuls against all
  experts side by side ([D, E*F] and [E*F, D]), no sorting, no gathers."""
  num_experts, d_model, hidden = w_gate_ExDxF.shape
  combine_TxE = jnp.sum(weights_TxK[..., None] * jax.nn.one_hot(experts_TxK, num_experts), axis=1)
  side_by_side = lambda w_ExDxF: jnp.transpose(w_ExDxF, (1, 0, 2)).reshape(d_model, -1)
  gate_TxExF = (x_TxD @ side_by_side(w_gate_ExDxF)).reshape(-1, num_experts, hidden)
  up_TxExF = (x_TxD @ side_by_side(w_up_ExDxF)).reshape(-1, num_experts, hidden)
  hidden_TxExF = nn.silu(gate_TxExF) * up_TxExF * combine_TxE[..., None].astype(x_TxD.dtype)
  return hidden_TxExF.reshape(x_TxD.shape[0], -1) @ w_down_ExFxD.reshape(-1, d_model)


def experts_gather(x_TxD, weights_TxK, experts_TxK, w_gate_ExDxF, w_up_ExDxF, w_down_ExFxD):
  """Each token's k experts picked out and applied: only the experts in use are read.

  The picks are dynamic slices (one per (token, expert) pair, T*k <= E when chosen; on XLA:CPU a
  `jnp.take` of whole expert matrices ran ~10x slower), stacked so that each matrix is applied
  to all pairs by ONE batched product: 3 products per layer instead of 3 per pair (each product
  was a kernel launch of its own in the H200 decode profile, docs/performance.md).
  """
  experts_N = experts_TxK.reshape(-1)
  pick = lambda w_ExAxB: jnp.stack(
      [jax.lax.dynamic_index_in_dim(w_ExAxB, experts_N[n], 0, keepdims=False)
       for n in range(experts_N.shape[0])])
  x_NxD = jnp.repeat(x_TxD, experts_TxK.shape[1], axis=0)
  hidden_NxF = (nn.silu(jnp.einsum('nd,ndf->nf', x_NxD, pick(w_gate_ExDxF)))
                * jnp.einsum('nd,ndf->nf', x_NxD, pick(w_up_ExDxF)))
  return combine(jnp.einsum('nf,nfd->nd', hidden_NxF, pick(w_down_ExFxD)), weights_TxK)


def block_rows(pairs, num_experts):
  """Rows of a 'blocked' work item: about two experts' shares of the pairs (a power of two from 8
  to 128), so decoding batches pad few rows and training batches run big matmuls."""
  rows = 8
  while rows < 128 and rows * num_experts <= pairs:
    rows *= 2
  return rows


def block_schedule(sorted_experts_N, num_experts, block):
  """Work items of a blocked grouped matmul: (block, expert) for every expert present in a block.

  Rows are sorted by expert, so block b holds a contiguous range of experts and there are at most
  N / block + E - 1 items; the schedule has that static length, the unused tail marked invalid.
  """
  first_B = sorted_experts_N[::block]
  last_B = jnp.minimum(sorted_experts_N.reshape(-1, block).max(axis=1), num_experts - 1)
  count_B = jnp.where(first_B < num_experts, last_B - first_B + 1, 0)
  ends_B = jnp.cumsum(count_B)
  items = sorted_experts_N.shape[0] // block + num_experts - 1
  item_W = jnp.arange(items)
  block_W = jnp.minimum(jnp.searchsorted(ends_B, item_W, side='right'), first_B.shape[0] - 1)
  expert_W = first_B[block_W] + item_W - (ends_B - count_B)[block_W]
  valid_W = item_W < ends_B[-1]
  return block_W, jnp.where(valid_W, expert_W, 0), valid_W


def experts_blocked(x_TxD, weights_TxK, experts_TxK, w_gate_ExDxF, w_up_ExDxF, w_down_ExFxD,
                    block=None):
  """Sort token copies by expert, then batched matmuls over (row block, expert) work items.

  A grouped matmul for backends without one (XLA:CPU turns `ragged_dot` into one dense dot
  against every expert, E times the FLOPs): item w multiplies a block of sorted rows by ONE
  expert's weights and keeps the rows of that expert, so FLOPs are at most (N + E * block) / N
  times the real work. All items run as one batched matmul on gathered blocks and weights (no
  loop: a scan over items copied its carry every item), which holds every item's expert weights
  at once, (N / block + E) x D x F per matrix: the CPU path for small models, not for large E.
  """
  num_experts, d_model = w_gate_ExDxF.shape[:2]
  n = experts_TxK.size
  block = min(block or block_rows(n, num_experts), n)
  blocks = -(-n // block)
  order_N, x_NxD, sorted_experts_N = sort_by_expert(x_TxD, experts_TxK)
  sorted_experts_N = jnp.pad(sorted_experts_N, (0, blocks * block - n), constant_values=num_experts)
  x_NxD = jnp.pad(x_NxD, ((0, blocks * block - n), (0, 0)))
  block_W, expert_W, valid_W = block_schedule(sorted_experts_N, num_experts, block)
  x_WxBxD = x_NxD.reshape(blocks, block, d_model)[block_W]
  mine_WxB = (sorted_experts_N.reshape(blocks, block)[block_W] == expert_W[:, None]) & valid_W[:, None]
  # Rematerialised: the backward gathers the weights again instead of keeping [W, D, F] copies
  # (which a layer scan would stack over layers as residuals).
  apply = jax.checkpoint(lambda x, w_ExAxB: jnp.einsum('wba,wac->wbc', x, w_ExAxB[expert_W]))
  hidden_WxBxF = nn.silu(apply(x_WxBxD, w_gate_ExDxF)) * apply(x_WxBxD, w_up_ExDxF)
  out_WxBxD = apply(jnp.where(mine_WxB[..., None], hidden_WxBxF, 0), w_down_ExFxD)
  y_NxD = jnp.zeros((blocks, block, d_model), out_WxBxD.dtype).at[block_W].add(out_WxBxD)
  return unsort_and_combine(y_NxD.reshape(-1, d_model)[:n], order_N, weights_TxK)


# The config's choices; 'gather' is chosen by size (expert_impl).
EXPERT_IMPLS = {'ragged': experts_ragged, 'dense': experts_dense, 'blocked': experts_blocked}


def expert_impl(cfg, num_tokens):
  """'gather' when the tokens touch at most E expert slots (small-batch decoding), else config's."""
  if num_tokens * cfg.experts_per_token <= cfg.num_experts:
    return experts_gather
  return EXPERT_IMPLS[cfg.moe_impl]


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
    weights = (router_DxE, w_gate, w_up, w_down)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.shape.get('expert', 1) * mesh.shape.get('tensor', 1) == 1:
      y_TxD, load_stats = moe_local(cfg, x_TxD, *weights)
    else:
      y_TxD, load_stats = moe_expert_parallel(cfg, mesh, x_TxD, *weights)
    aux_loss = load_balance_loss(load_stats, cfg.experts_per_token)
    return y_TxD.reshape(batch, length, d_model), aux_loss


def moe_local(cfg, x_TxD, router_DxE, w_gate, w_up, w_down):
  """All experts on this device (or left to the compiler): route, then run the experts."""
  router_logits_TxE = jnp.dot(x_TxD.astype(jnp.float32), router_DxE.astype(jnp.float32))
  weights_TxK, experts_TxK, load_stats = route(router_logits_TxE, cfg.experts_per_token)
  y_TxD = expert_impl(cfg, x_TxD.shape[0])(x_TxD.astype(cfg.dtype), weights_TxK, experts_TxK,
                                            w_gate.astype(cfg.dtype), w_up.astype(cfg.dtype),
                                            w_down.astype(cfg.dtype))
  return y_TxD, load_stats


def moe_expert_parallel(cfg, mesh, x_TxD, router_DxE, w_gate, w_up, w_down):
  """Experts split over the 'expert' mesh axis (and their width over 'tensor'), still dropless.

  Inside `jax.shard_map` each device all-gathers the tokens of its expert group, routes them,
  runs only its own experts on the tokens sent to them (others get weight 0), and a
  reduce-scatter returns to each device the summed outputs of its own tokens (the all-gather
  token dispatcher of Megatron-Core: exact, no capacity factor, no dropped tokens).
  """
  batch_axes = tuple(a for a in ('data', 'fsdp', 'expert') if a in mesh.shape)
  spec = jax.sharding.PartitionSpec

  def local(x_TxD, router_DxE, w_gate, w_up, w_down):
    x_NxD = jax.lax.all_gather(x_TxD, 'expert', tiled=True)
    router_logits_NxE = jnp.dot(x_NxD.astype(jnp.float32), router_DxE.astype(jnp.float32))
    weights_NxK, experts_NxK, load_stats = route(router_logits_NxE, cfg.experts_per_token)
    num_local = w_gate.shape[0]
    local_NxK = experts_NxK - jax.lax.axis_index('expert') * num_local
    is_local_NxK = (local_NxK >= 0) & (local_NxK < num_local)
    local_NxK = jnp.where(is_local_NxK, local_NxK, num_local)   # off-device: a group of none
    weights_NxK = jnp.where(is_local_NxK, weights_NxK, 0.0)
    y_NxD = EXPERT_IMPLS[cfg.moe_impl](x_NxD.astype(cfg.dtype), weights_NxK, local_NxK,
                                       w_gate.astype(cfg.dtype), w_up.astype(cfg.dtype),
                                       w_down.astype(cfg.dtype))
    y_NxD = jax.lax.psum(y_NxD, 'tensor')
    y_TxD = jax.lax.psum_scatter(y_NxD, 'expert', scatter_dimension=0, tiled=True)
    other_batch_axes = tuple(a for a in batch_axes if a != 'expert')
    load_stats = jax.lax.psum(load_stats, other_batch_axes) if other_batch_axes else load_stats
    return y_TxD, load_stats

  return jax.shard_map(
      local, mesh=mesh,
      in_specs=(spec(batch_axes, None), spec(), spec('expert', None, 'tensor'),
                spec('expert', None, 'tensor'), spec('expert', 'tensor', None)),
      out_specs=(spec(batch_axes, None), spec()), check_vma=False)(
          x_TxD, router_DxE, w_gate, w_up, w_down)
