"""Mixture-of-experts feed-forward layer (Qwen3-MoE style): softmax router and top-k
(rljax.model.router), SwiGLU experts.

Dropless: every token reaches all of its k experts, whatever the load. Exact implementations:
- 'ragged': sort the (token, expert) pairs by expert and run grouped matmuls (`grouped_matmul`:
  `jax.lax.ragged_dot`, the megablox kernels on TPU, `tiled_matmul` on GPU), FLOPs proportional
  to k: the choice for real models on accelerators;
- 'dense': run every expert on every token and combine with the (mostly zero) routing weights
  (E/k times the FLOPs, but plain matmuls);
- 'bucketed': sort as 'ragged', lay the pairs out as [E, C] slots, C the smallest of a few static
  capacities that holds the busiest expert (chosen at run time), and run one batched matmul against
  the expert weights in place: the grouped matmul for XLA:CPU, which lowers `ragged_dot` to a dense
  dot against every expert (E times the FLOPs);
- 'gather' (not a config choice): pick each token's k experts and apply them (reads T*k expert
  matrices, not all E); used automatically whenever T*k <= E/2, i.e. when decoding a small batch,
  where reading every expert would multiply the bytes per step, the quantity that bounds
  decoding, by up to E/k.
All equal a naive per-token loop (tests/test_moe.py). Why four: docs/design/moe_expert_paths.md.
Each takes (tokens, routing weights, experts,
w_in, w_down), `w_in` the gate and up matrices apart, (gate, up), or joined for decoding,
(`gate_up`,).
"""
import functools
from typing import NamedTuple

import flax.linen as nn
import jax
from jax.ad_checkpoint import checkpoint_name
from jax.experimental.pallas.ops.tpu import megablox
import jax.numpy as jnp

from rljax.model import layers
from rljax.model import router
from rljax import sharding


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


def gate_up(w_gate_ExDxF, w_up_ExDxF):
  """The gate and up matrices side by side, [E, D, 2F]: one product instead of two, for
  decoding, where XLA hoists the join out of the loop. Training keeps two products: there the join
  would be one more copy of both per step, and it would round the input gradient differently (one
  sum over 2F).

  Joined by two zero pads and an add, not a concatenate: XLA:CPU fuses pads with the per-layer
  slice that feeds them (the sampler's `unstack_layers`) into ONE copy, where it runs a slice and a
  concatenate as two. docs/design/gate_up_pads.md
  """
  hidden = w_gate_ExDxF.shape[-1]
  zero = jnp.zeros((), w_gate_ExDxF.dtype)
  pad = lambda w_ExDxF, before, after: jax.lax.pad(w_ExDxF, zero,
                                                   ((0, 0, 0), (0, 0, 0), (before, after, 0)))
  return pad(w_gate_ExDxF, 0, hidden) + pad(w_up_ExDxF, hidden, 0)


def swiglu(*products):
  """silu(gate) * up, from the products with `w_in`: (gate, up), or one [..., 2F] of both."""
  gate, up = products if len(products) == 2 else jnp.split(products[0], 2, axis=-1)
  return nn.silu(gate) * up


MEGABLOX_ROWS = 128   # the Pallas kernel's row tile: it takes a whole number of tiles


def megablox_matmul(x_NxD, w_ExDxF, group_sizes_E, interpret=False):
  """`ragged_dot` by the Pallas TPU kernels gmm (forward, input gradient) and tgmm (weight
  gradient); `interpret` runs them on any backend (tests)."""
  rows = x_NxD.shape[0]
  padded_MxD = jnp.pad(x_NxD, ((0, -rows % MEGABLOX_ROWS), (0, 0)))   # rows in no group
  y_MxF = megablox.gmm(padded_MxD, w_ExDxF, group_sizes_E, preferred_element_type=x_NxD.dtype,
                       interpret=interpret)
  return y_MxF[:rows]


def tile_rows(rows, num_groups):
  """Rows per tile of `tiled_matmul`: the largest power of two up to 512 with at most a quarter
  of `rows` in the groups' padding (num_groups tiles, at most); 0 where that is under 16 rows
  (a few decoded tokens): too few rows for tiles to pay for their copies of the weights."""
  tile = 512
  while tile >= 16 and 4 * num_groups * tile > rows:
    tile //= 2
  return tile if tile >= 16 else 0


def tiled_matmul(x_NxD, w_ExDxF, group_sizes_E, tile):
  """`ragged_dot` as ONE batched matmul over tiles of `tile` rows, each tile one group's: each
  group's rows padded to whole tiles, each tile times its group's matrix (gathered). Static
  shapes for any split of the rows: the groups' tiles number at most (N + E (tile - 1)) / tile,
  so the FLOPs are at most (N + E tile) / N times the routed ones, whatever the load, and nothing
  is dropped. XLA:GPU runs `ragged_dot` as a dense product against every group.
  docs/design/moe_expert_paths.md"""
  rows, num_groups = x_NxD.shape[0], group_sizes_E.shape[0]
  num_tiles = max((rows + num_groups * (tile - 1)) // tile, 1)
  tiles_E = -(-group_sizes_E // tile)
  tile_ends_E, row_ends_E = jnp.cumsum(tiles_E), jnp.cumsum(group_sizes_E)
  tile_starts_E, row_starts_E = tile_ends_E - tiles_E, row_ends_E - group_sizes_E
  # Each tile's group, each slot the row of that group it holds (past the group: any row, its
  # product never read back, so no gradient either).
  group_G = jnp.minimum(jnp.searchsorted(tile_ends_E, jnp.arange(num_tiles), side='right'),
                        num_groups - 1)
  rank_GxM = (jnp.arange(num_tiles) - tile_starts_E[group_G])[:, None] * tile + jnp.arange(tile)
  source_GxM = jnp.minimum(row_starts_E[group_G][:, None] + rank_GxM, rows - 1)
  y_GxMxF = jnp.einsum('gmd,gdf->gmf', x_NxD[source_GxM], w_ExDxF[group_G])
  # Each row's slot; rows past the groups' (another device's pairs) are zeros, as ragged_dot's.
  group_N = jnp.searchsorted(row_ends_E, jnp.arange(rows), side='right')
  in_group_N = group_N < num_groups
  group_N = jnp.minimum(group_N, num_groups - 1)
  slot_N = tile_starts_E[group_N] * tile + jnp.arange(rows) - row_starts_E[group_N]
  y_NxF = y_GxMxF.reshape(num_tiles * tile, -1)[jnp.where(in_group_N, slot_N, 0)]
  return jnp.where(in_group_N[:, None], y_NxF, 0)


def gpu_matmul(x_NxD, w_ExDxF, group_sizes_E):
  """`tiled_matmul` where there are rows enough for tiles, else `ragged_dot` (densified by
  XLA:GPU: every group's matrix read once, the bytes that bound decoding a few tokens)."""
  tile = tile_rows(x_NxD.shape[0], group_sizes_E.shape[0])
  if not tile:
    return jax.lax.ragged_dot(x_NxD, w_ExDxF, group_sizes_E)
  return tiled_matmul(x_NxD, w_ExDxF, group_sizes_E, tile)


def grouped_matmul(x_NxD, w_ExDxF, group_sizes_E):
  """Rows sorted by group, times their group's matrix. XLA:TPU lowers the weight gradient of
  `ragged_dot` as a dense product against every group, so TPU runs the megablox kernels
  (docs/design/moe_expert_paths.md) where it can: not where XLA partitions the arrays (a mesh
  outside `shard_map`), which it cannot do for a kernel. XLA:GPU lowers all of `ragged_dot`
  densely: GPUs run `gpu_matmul`. Elsewhere `ragged_dot`. The products are named
  'expert_products' for remat policies (rljax.model.transformer.REMAT_POLICIES)."""
  mesh = jax.sharding.get_abstract_mesh()
  if any(mesh.shape[axis] > 1 for axis in mesh.auto_axes):
    y_NxF = jax.lax.ragged_dot(x_NxD, w_ExDxF, group_sizes_E)
  else:
    y_NxF = jax.lax.platform_dependent(x_NxD, w_ExDxF, group_sizes_E, default=jax.lax.ragged_dot,
                                       tpu=megablox_matmul, cuda=gpu_matmul)
  return checkpoint_name(y_NxF, 'expert_products')


def experts_ragged(x_TxD, weights_TxK, experts_TxK, w_in, w_down_ExFxD):
  """Sort token copies by expert, grouped matmuls, unsort, weight and sum over k."""
  num_experts = w_down_ExFxD.shape[0]
  order_N, x_NxD, _ = sort_by_expert(x_TxD, experts_TxK)
  group_sizes_E = jnp.bincount(experts_TxK.reshape(-1), length=num_experts).astype(jnp.int32)
  hidden_NxF = swiglu(*[grouped_matmul(x_NxD, w, group_sizes_E) for w in w_in])
  y_NxD = grouped_matmul(hidden_NxF, w_down_ExFxD, group_sizes_E)
  return unsort_and_combine(y_NxD, order_N, weights_TxK)


def experts_dense(x_TxD, weights_TxK, experts_TxK, w_in, w_down_ExFxD):
  """Every expert on every token, non-selected experts weighted 0: plain matmuls against all
  experts side by side ([D, E*F] or [D, E*2F], and [E*F, D]), no sorting, no gathers.

  The side-by-side layout is a transpose, behind an optimization barrier: without it XLA moves
  that copy of every expert's input matrices into the sampler's decoding loop, once per step.
  Behind it the copy is loop-invariant and made once per call, as `w_o`'s in rljax.model.transformer
  (docs/design/optimization_barriers.md)."""
  num_experts, hidden, d_model = w_down_ExFxD.shape
  combine_TxE = jnp.sum(weights_TxK[..., None] * jax.nn.one_hot(experts_TxK, num_experts), axis=1)
  side_by_side = lambda w_ExDxF: jax.lax.optimization_barrier(
      jnp.transpose(w_ExDxF, (1, 0, 2))).reshape(d_model, -1)
  hidden_TxExF = swiglu(*[(x_TxD @ side_by_side(w)).reshape(-1, num_experts, w.shape[-1])
                          for w in w_in])
  hidden_TxExF = hidden_TxExF * combine_TxE[..., None].astype(x_TxD.dtype)
  return hidden_TxExF.reshape(x_TxD.shape[0], -1) @ w_down_ExFxD.reshape(-1, d_model)


def experts_gather(x_TxD, weights_TxK, experts_TxK, w_in, w_down_ExFxD):
  """Each token's k experts picked out and applied: only the experts in use are read.

  The picks are dynamic slices (one per (token, expert) pair, T*k <= E/2 when chosen; XLA:CPU
  runs a `jnp.take` of whole expert matrices far slower), stacked so that each matrix is applied
  to all pairs by ONE batched product: 2-3 products per layer, not 2-3 per pair (on a GPU each
  product is a kernel launch of its own). docs/design/moe_expert_paths.md
  """
  experts_N = experts_TxK.reshape(-1)
  pick = lambda w_ExAxB: jnp.stack(
      [jax.lax.dynamic_index_in_dim(w_ExAxB, experts_N[n], 0, keepdims=False)
       for n in range(experts_N.shape[0])])
  x_NxD = jnp.repeat(x_TxD, experts_TxK.shape[1], axis=0)
  hidden_NxF = swiglu(*[jnp.einsum('nd,ndf->nf', x_NxD, pick(w)) for w in w_in])
  return combine(jnp.einsum('nf,nfd->nd', hidden_NxF, pick(w_down_ExFxD)), weights_TxK)


GROWTH = 1.25   # a finer ladder pads fewer rows but compiles more branches


def capacities(pairs, tokens, num_experts):
  """The static per-expert capacities 'bucketed' picks from: from the balanced share of the pairs,
  each GROWTH times the last, up to `tokens`, the most one expert can get (a token picks an expert
  at most once): the last bucket holds any load, so nothing is ever dropped.

  In steps of 2 rows up to 8, then of 8: decoding a few tokens, the busiest expert has a few
  pairs, and on XLA:CPU every padding row of a small product costs time; larger ladders keep
  their fewer branches. docs/design/capacity_ladder.md"""
  def round_up(rows):
    step = 2 if rows <= 8 else 8
    return min(tokens, -(-rows // step) * step)
  buckets = [round_up(-(-pairs // num_experts))]
  while buckets[-1] < tokens:
    buckets.append(round_up(int(buckets[-1] * GROWTH) + 1))
  return buckets


def experts_bucketed(x_TxD, weights_TxK, experts_TxK, w_in, w_down_ExFxD):
  """Token copies laid out by expert as [E, C] slots, then ONE batched matmul per matrix against
  the weights in place: no copies of expert weights.

  C is the smallest capacity of `capacities` that holds the busiest expert, chosen at run time
  by `lax.switch`: dropless, and FLOPs E * C / (T * k) times the real work. Each branch is
  rematerialised: a switch's backward otherwise keeps every branch's residuals (zeros for the
  branches not taken). docs/design/capacity_ladder.md. Expert indices >= E (the
  expert-parallel path's pairs of other devices, weight 0) take no slot and read a clamped one.
  """
  num_experts = w_down_ExFxD.shape[0]
  tokens, k = experts_TxK.shape
  experts_N = experts_TxK.reshape(-1)
  order_N = jnp.argsort(experts_N, stable=True)
  counts_E = jnp.bincount(experts_N, length=num_experts)
  starts_E = jnp.cumsum(counts_E) - counts_E
  sorted_position_N = jnp.zeros_like(order_N).at[order_N].set(jnp.arange(order_N.shape[0]))
  slot_expert_N = jnp.minimum(experts_N, num_experts - 1)   # an off-device pair reads any slot
  rank_N = sorted_position_N - starts_E[slot_expert_N]

  def run(capacity, x_TxD, w_in, w_down_ExFxD):
    sorted_ExC = jnp.minimum(starts_E[:, None] + jnp.arange(capacity), order_N.shape[0] - 1)
    x_ExCxD = x_TxD[order_N[sorted_ExC] // k]   # slots past an expert's count: rows never read
    hidden_ExCxF = swiglu(*[jnp.einsum('ecd,edf->ecf', x_ExCxD, w) for w in w_in])
    y_ExCxD = jnp.einsum('ecf,efd->ecd', hidden_ExCxF, w_down_ExFxD)
    return y_ExCxD[slot_expert_N, jnp.clip(rank_N, 0, capacity - 1)]

  buckets = capacities(experts_N.shape[0], tokens, num_experts)
  branches = [jax.checkpoint(functools.partial(run, capacity)) for capacity in buckets]
  index = jnp.searchsorted(jnp.array(buckets), jnp.max(counts_E))
  y_NxD = jax.lax.switch(index, branches, x_TxD, w_in, w_down_ExFxD)
  return combine(y_NxD, weights_TxK)


# The config's choices; 'gather' is chosen by size (expert_impl).
EXPERT_IMPLS = {'ragged': experts_ragged, 'dense': experts_dense, 'bucketed': experts_bucketed}


def expert_impl(cfg, num_tokens):
  """'gather' when the tokens pick at most half the experts' worth of matrices (small-batch
  decoding), else the config's. Each pick is a copy, written and read again: at T*k = E the picks
  move about 3x the bytes of reading every expert in place. docs/design/moe_expert_paths.md"""
  if 2 * num_tokens * cfg.experts_per_token <= cfg.num_experts:
    return experts_gather
  return EXPERT_IMPLS[cfg.moe_impl]


class Routed(NamedTuple):
  """What a MoE layer says of its routing, besides its output."""
  experts_BxTxK: jax.Array   # each token's top-k ids (route_dtype) when decoding: the sampler's
  mismatch: jax.Array        # tokens whose top-k set differs from the recorded ids (int32)


class MoE(nn.Module):
  """Routed SwiGLU experts. Returns the output, the load-balancing loss and `Routed`.

  `decoding`: gate and up as one product (`gate_up`), the sampler's form; the same function.
  `recorded_BxTxK`: the experts the sampler chose (rows of -1: none), compared with this layer's
  top-k and, with cfg.router_replay, routed by (`route`).
  """
  cfg: 'rljax.model.transformer.ModelConfig'  # noqa: F821  (a name: transformer imports this)
  decoding: bool = False

  @nn.compact
  def __call__(self, x_BxTxD, recorded_BxTxK=None):
    cfg = self.cfg
    batch, length, d_model = x_BxTxD.shape
    x_TxD = x_BxTxD.reshape(batch * length, d_model)
    recorded_TxK = (None if recorded_BxTxK is None else
                    recorded_BxTxK.reshape(batch * length, cfg.experts_per_token))
    router_DxE = layers.param(self, 'router', (d_model, cfg.num_experts), ('embed', 'expert'), cfg)
    shape = (cfg.num_experts, d_model, cfg.expert_hidden)
    w_gate = layers.param(self, 'w_gate', shape, ('expert', 'embed', 'mlp'), cfg)
    w_up = layers.param(self, 'w_up', shape, ('expert', 'embed', 'mlp'), cfg)
    w_down = layers.param(self, 'w_down', (cfg.num_experts, cfg.expert_hidden, d_model),
                          ('expert', 'mlp', 'embed'), cfg)
    weights = (router_DxE, w_gate, w_up, w_down)
    mesh = jax.sharding.get_abstract_mesh()
    if self.decoding and splits_hidden_for_decoding(cfg, mesh, x_TxD.shape[0]):
      run = functools.partial(moe_expert_parallel, cfg, True, mesh, split_hidden=True)
    elif splits_tokens(mesh, x_TxD.shape[0]):
      run = functools.partial(moe_expert_parallel, cfg, self.decoding, mesh)
    else:
      run = functools.partial(moe_local, cfg, self.decoding)
    y_TxD, load_stats, experts_TxK, mismatch = run(x_TxD, recorded_TxK, *weights)
    aux_loss = router.load_balance_loss(load_stats, cfg.experts_per_token)
    experts_BxTxK = None if experts_TxK is None else experts_TxK.reshape(batch, length, -1)
    return y_TxD.reshape(batch, length, d_model), aux_loss, Routed(experts_BxTxK, mismatch)


def expert_matrices(w_gate, w_up, w_down, dtype, join):
  """(w_in, w_down) in the compute dtype, w_in the gate and up matrices: joined, or apart."""
  w_gate, w_up, w_down = (w.astype(dtype) for w in (w_gate, w_up, w_down))
  return ((gate_up(w_gate, w_up),) if join else (w_gate, w_up)), w_down


def moe_local(cfg, decoding, x_TxD, recorded_TxK, router_DxE, w_gate, w_up, w_down):
  """All experts on this device (no mesh, or one device), or left to the compiler (a batch the
  mesh does not divide): route, then run the experts. Returns (y_TxD, load_stats, the top-k ids
  when `decoding` else None, the routing mismatch)."""
  router_logits_TxE = jnp.dot(x_TxD.astype(jnp.float32), router_DxE.astype(jnp.float32))
  weights_TxK, experts_TxK, load_stats, mismatch = router.route(
      router_logits_TxE, cfg.experts_per_token, recorded_TxK, cfg.router_replay)
  y_TxD = expert_impl(cfg, x_TxD.shape[0])(
      x_TxD.astype(cfg.dtype), weights_TxK, experts_TxK,
      *expert_matrices(w_gate, w_up, w_down, cfg.dtype, decoding))
  recorded = experts_TxK.astype(router.route_dtype(cfg.num_experts)) if decoding else None
  return y_TxD, load_stats, recorded, mismatch


# The sampler's layout of the MoE weights on a mesh with an 'fsdp' axis (the logical names of their
# training layout -> those of decoding; rljax.model.transformer.decoding_params lays them out once
# per call): the router whole, each expert's hidden dimension split over 'tensor' and 'fsdp' and its
# model dimension whole, so that a decoding step multiplies by its own columns of gate and up and
# its own rows of down with no weight moving (Megatron's split of an MLP).
DECODING_NAMES = {('embed', 'expert'): ('replicated', 'replicated'),
                  ('expert', 'embed', 'mlp'): ('expert', 'replicated', 'decoding_mlp'),
                  ('expert', 'mlp', 'embed'): ('expert', 'decoding_mlp', 'replicated')}


def splits_tokens(mesh, num_tokens):
  """Whether a mesh of several devices divides `num_tokens` evenly over its batch axes: then each
  device runs the experts on its own tokens (`moe_expert_parallel`)."""
  return not mesh.empty and mesh.size > 1 and num_tokens % sharding.data_parallel_size(mesh) == 0


def splits_hidden_for_decoding(cfg, mesh, num_tokens=None):
  """Whether the sampler runs the experts with their hidden dimension split over 'fsdp' (and
  'tensor'): on a mesh with an 'fsdp' axis whose split of the hidden dimension (and of
  `num_tokens`, the batch's rows) divides evenly. Otherwise the weights keep their training
  layout and the compiler reduces partial sums over the split model dimension."""
  if mesh.empty or mesh.shape.get('fsdp', 1) == 1 or not cfg.num_experts:
    return False
  if num_tokens is not None and not splits_tokens(mesh, num_tokens):
    return False
  shape = (cfg.num_experts, cfg.d_model, cfg.expert_hidden)
  spec = sharding.spec_for(shape, DECODING_NAMES[('expert', 'embed', 'mlp')], mesh)
  return 'fsdp' in jax.tree.leaves(tuple(spec)[2])


def gather_dim(w, w_spec, dim):
  """`w` (a shard_map block) gathered whole along `dim` over the mesh axes `w_spec` splits it by
  (its gradient: a reduce-scatter)."""
  axes = tuple(w_spec)[dim] if dim < len(tuple(w_spec)) else None
  return jax.lax.all_gather(w, axes, axis=dim, tiled=True) if axes else w


def _expert_layout(mesh, weights, split_hidden):
  """(the expert weights' specs, the axes an expert group spans, the axes their hidden dimension
  is split over): as stored (the model dimension may be split over 'fsdp', gathered for the
  call), or in decoding's layout."""
  names = [('expert', 'embed', 'mlp'), ('expert', 'embed', 'mlp'), ('expert', 'mlp', 'embed')]
  names = [DECODING_NAMES[n] for n in names] if split_hidden else names
  w_specs = [sharding.spec_for(w.shape, n, mesh) for w, n in zip(weights, names)]
  if split_hidden:
    return w_specs, ('fsdp', 'expert'), jax.tree.leaves(tuple(w_specs[0])[2])
  return w_specs, ('expert',), ('tensor',)


def moe_expert_parallel(cfg, decoding, mesh, x_TxD, recorded_TxK, router_DxE, w_gate, w_up,
                        w_down, split_hidden=False):
  """The experts on any mesh, in `jax.shard_map` (XLA cannot partition the TPU grouped-matmul
  kernel itself): split over the 'expert' axis (their width over 'tensor'), their model dimension
  gathered over 'fsdp' for the call, as FSDP gathers a layer. Still dropless.

  Inside `jax.shard_map` each device all-gathers the tokens of its expert group, routes them,
  runs only its own experts on the tokens sent to them (others get weight 0), and a
  reduce-scatter returns to each device the summed outputs of its own tokens (the all-gather
  token dispatcher of Megatron-Core: exact, no capacity factor, no dropped tokens).
  `split_hidden` (decoding, `splits_hidden_for_decoding`): the weights in the DECODING_NAMES
  layout, the group gathered over 'fsdp' and 'expert': each device's outputs are partial sums over
  its slice of the hidden dimension, summed by the same reduce-scatter after the top-k combine.
  The recorded ids are gathered with their tokens; returns as `moe_local`.
  """
  batch_axes = tuple(a for a in ('data', 'fsdp', 'expert') if a in mesh.shape)
  spec = jax.sharding.PartitionSpec
  w_specs, group_axes, hidden_axes = _expert_layout(mesh, (w_gate, w_up, w_down), split_hidden)

  def local(x_TxD, recorded_TxK, router_DxE, w_gate, w_up, w_down):
    if not split_hidden:   # FSDP: the layer's experts whole, in the compute dtype, for this call
      w_gate, w_up, w_down = (gather_dim(w.astype(cfg.dtype), w_spec, dim) for w, w_spec, dim in
                              zip((w_gate, w_up, w_down), w_specs, (1, 1, 2)))
    gather = lambda x: jax.lax.all_gather(x, group_axes, tiled=True)
    x_NxD = gather(x_TxD)
    router_logits_NxE = jnp.dot(x_NxD.astype(jnp.float32), router_DxE.astype(jnp.float32))
    weights_NxK, experts_NxK, load_stats, mismatch = router.route(
        router_logits_NxE, cfg.experts_per_token,
        None if recorded_TxK is None else gather(recorded_TxK), cfg.router_replay)
    num_local = w_gate.shape[0]
    local_NxK = experts_NxK - jax.lax.axis_index('expert') * num_local
    is_local_NxK = (local_NxK >= 0) & (local_NxK < num_local)
    local_NxK = jnp.where(is_local_NxK, local_NxK, num_local)   # off-device: a group of none
    weights_NxK = jnp.where(is_local_NxK, weights_NxK, 0.0)
    impl = expert_impl(cfg, x_NxD.shape[0]) if split_hidden else EXPERT_IMPLS[cfg.moe_impl]
    y_NxD = impl(   # joined here: this device's columns of gate and up
        x_NxD.astype(cfg.dtype), weights_NxK, local_NxK,
        *expert_matrices(w_gate, w_up, w_down, cfg.dtype, decoding))
    reduce_axes = tuple(a for a in hidden_axes if a not in group_axes)
    y_NxD = jax.lax.psum(y_NxD, reduce_axes) if reduce_axes else y_NxD
    y_TxD = jax.lax.psum_scatter(y_NxD, group_axes, scatter_dimension=0, tiled=True)
    other_batch_axes = tuple(a for a in batch_axes if a not in group_axes)
    if other_batch_axes:
      load_stats, mismatch = jax.lax.psum((load_stats, mismatch), other_batch_axes)
    # This device's tokens' ids: its block of the group's gathered rows.
    own_TxK = jax.lax.dynamic_slice_in_dim(
        experts_NxK, jax.lax.axis_index(group_axes) * x_TxD.shape[0], x_TxD.shape[0])
    return y_TxD, load_stats, own_TxK.astype(router.route_dtype(cfg.num_experts)), mismatch

  rows = spec(batch_axes, None)
  y_TxD, load_stats, experts_TxK, mismatch = jax.shard_map(
      local, mesh=mesh, in_specs=(rows, rows, spec(), *w_specs),
      out_specs=(rows, spec(), rows, spec()), check_vma=False)(
          x_TxD, recorded_TxK, router_DxE, w_gate, w_up, w_down)
  return y_TxD, load_stats, experts_TxK if decoding else None, mismatch
