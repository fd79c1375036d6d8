"""Decoder-only MoE transformer, architecturally compatible with Qwen3 / Qwen3-MoE.

Pre-norm blocks (RMSNorm), rotary positions, grouped-query attention with RMSNorm on q and k,
SwiGLU feed-forward that is either dense or a routed mixture of experts (rljax.model.moe). Layers
are stacked and scanned for training (compile time flat in depth); the same module, `unrolled`,
serves sampling (an explicit KV cache passed in and out) on those same parameter arrays split by
layer (`unstack_layers`), so sampler and trainer compute the same function.

Sequences are LEFT-padded prompts followed by responses. `kv_valid_BxS` marks real tokens;
positions count real tokens only, so a prompt's position ids do not depend on its padding.
"""
import dataclasses
import math
from typing import Any, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from rljax.model import layers
from rljax.model import lora
from rljax.model import moe
from rljax import sharding


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  vocab_size: int = 16
  d_model: int = 128
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 32
  num_experts: int = 4          # 0: dense SwiGLU feed-forward
  experts_per_token: int = 2
  expert_hidden: int = 256
  dense_hidden: int = 512
  moe_impl: str = 'dense'       # 'ragged' | 'dense' | 'bucketed' (see rljax.model.moe)
  tie_embeddings: bool = False
  rope_theta: float = 10000.0
  norm_eps: float = 1e-6
  init_std: float = 0.02         # Qwen3's initializer_range
  dtype: Any = 'float32'        # compute dtype
  param_dtype: Any = 'float32'  # master weights
  remat: str = 'none'           # 'none' | 'full' | 'dots' (save matmul outputs)
  max_seq_len: int = 4096       # prompt + response tokens the model is meant for (validated)
  router_replay: bool = False   # the policy loss routes response tokens as the sampler did

  @classmethod
  def from_config(cls, config):
    """Builds from a ConfigDict (or dict), rejecting unknown fields."""
    values = dict(config)
    unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise ValueError(f'unknown model config fields: {sorted(unknown)}')
    return cls(**values)


DTYPES = ('float32', 'bfloat16')   # compute and master-weight dtypes


def check(model):
  """ValueError naming the first bad field of a config's `model` section (a ConfigDict or a
  ModelConfig): sizes, numbers and choices, its LoRA adapters' included, before anything is
  built from them."""
  sizes = ['vocab_size', 'd_model', 'num_layers', 'num_heads', 'num_kv_heads', 'head_dim',
           'max_seq_len', 'expert_hidden' if model.num_experts else 'dense_hidden']
  for name in sizes + ['num_experts']:
    value, low = getattr(model, name), 0 if name == 'num_experts' else 1
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
      raise ValueError(f'model.{name} must be an integer >= {low}, got {value!r}')
  for name in ('rope_theta', 'norm_eps', 'init_std'):
    value = getattr(model, name)
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
      raise ValueError(f'model.{name} must be a positive number, got {value!r}')
  for name, choices in (('dtype', DTYPES), ('param_dtype', DTYPES), ('moe_impl', moe.EXPERT_IMPLS),
                        ('remat', ('none', *REMAT_POLICIES))):
    if getattr(model, name) not in choices:
      raise ValueError(f'model.{name} must be one of {sorted(choices)}, got '
                       f'{getattr(model, name)!r}')
  if model.num_experts and not 0 < model.experts_per_token <= model.num_experts:
    raise ValueError(f'model.experts_per_token ({model.experts_per_token}) must be in '
                     f'[1, num_experts={model.num_experts}]')
  if model.router_replay and not model.num_experts:
    raise ValueError('model.router_replay needs a mixture of experts (model.num_experts > 0): a '
                     'dense model routes nothing')
  if model.num_heads % model.num_kv_heads:
    raise ValueError(f'model.num_heads ({model.num_heads}) must be a multiple of '
                     f'num_kv_heads ({model.num_kv_heads})')
  lora.check(getattr(model, 'lora', None))


# The residual stream: rows split like the batch, features whole on every device.
ACTIVATION_AXES = ('batch', 'length', 'activation_embed')


class KVCache(NamedTuple):
  """Keys and values, one [batch, kv_heads, slots, head_dim] array per layer: a layer's slice of a
  stacked array would be copied out of it at every decoding step, and with the slots ahead of the
  kv heads XLA:CPU transposes each layer's cache before its attention products
  (docs/design/unrolled_decoding.md). At batch 1 the arrays are [kv_heads, slots, head_dim]: XLA
  drops a size-1 batch axis from the attention products, and with that axis in the cache it fuses
  each in-place update twice and copies the cache every step (docs/design/kv_cache_batch1.md)."""
  k: tuple
  v: tuple

  @classmethod
  def zeros(cls, cfg, batch, slots):
    shape = (batch,) * (batch > 1) + (cfg.num_kv_heads, slots, cfg.head_dim)
    per_layer = lambda: tuple(jnp.zeros(shape, cfg.dtype) for _ in range(cfg.num_layers))
    return cls(per_layer(), per_layer())


def positions_from_valid(valid_BxS):
  """Position ids that count real tokens only (left padding does not shift them)."""
  return jnp.maximum(jnp.cumsum(valid_BxS.astype(jnp.int32), axis=-1) - 1, 0)


def write_kv_cache(layer_cache, k_BxTxKxH, v_BxTxKxH, cache_index):
  """The layer's (keys, values) cache with this chunk written at slot `cache_index` (one per row
  under continuous batching). Attention then reads the updated cache: if it read the old one too,
  the cache would have two users and XLA would copy it to update it in place
  (docs/design/unrolled_decoding.md)."""
  length, head_dim = k_BxTxKxH.shape[1], k_BxTxKxH.shape[-1]
  write_at = lambda cache, new, index: jax.lax.dynamic_update_slice(
      cache, new.astype(cache.dtype), (0,) * (cache.ndim - 2) + (index, 0))
  if jnp.ndim(cache_index) == 1:   # a cache column per row (continuous batching)
    write_at = jax.vmap(write_at)
  write = lambda cache, new_BxTxKxH: write_at(
      cache, jnp.swapaxes(new_BxTxKxH, 1, 2).reshape(*cache.shape[:-2], length, head_dim),
      cache_index)
  return write(layer_cache[0], k_BxTxKxH), write(layer_cache[1], v_BxTxKxH)


class Attention(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD, rope_tables, kv_valid_BxS, layer_cache, cache_index):
    """Returns (output, this layer's (keys, values) cache with the chunk written in, or None)."""
    cfg = self.cfg
    d_model = x_BxTxD.shape[-1]
    heads, kv_heads, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    w_q = layers.param(self, 'w_q', (d_model, heads, head_dim), ('embed', 'heads', 'head_dim'), cfg)
    w_k = layers.param(self, 'w_k', (d_model, kv_heads, head_dim),
                       ('embed', 'kv_heads', 'head_dim'), cfg)
    w_v = layers.param(self, 'w_v', (d_model, kv_heads, head_dim),
                       ('embed', 'kv_heads', 'head_dim'), cfg)
    w_o = layers.param(self, 'w_o', (heads, head_dim, d_model), ('heads', 'head_dim', 'embed'), cfg)
    q_BxTxNxH = jnp.einsum('btd,dnh->btnh', x_BxTxD, w_q.astype(cfg.dtype))
    k_BxTxKxH = jnp.einsum('btd,dkh->btkh', x_BxTxD, w_k.astype(cfg.dtype))
    v_BxTxKxH = jnp.einsum('btd,dkh->btkh', x_BxTxD, w_v.astype(cfg.dtype))
    q_BxTxNxH = layers.RMSNorm(cfg, 'head_dim', name='q_norm')(q_BxTxNxH)
    k_BxTxKxH = layers.RMSNorm(cfg, 'head_dim', name='k_norm')(k_BxTxKxH)
    q_BxTxNxH = layers.rope(q_BxTxNxH, rope_tables)
    k_BxTxKxH = layers.rope(k_BxTxKxH, rope_tables)

    length = x_BxTxD.shape[1]
    if layer_cache is not None:
      layer_cache = write_kv_cache(layer_cache, k_BxTxKxH, v_BxTxKxH, cache_index)
    if layer_cache is None or (isinstance(cache_index, int) and cache_index == 0):
      # This chunk's own keys (training, prefill): causal, real tokens only. A prefill starting at
      # slot 0 does not score the rest of the cache: wasted work that XLA also spends seconds
      # constant-folding.
      own_valid_BxT = jax.lax.dynamic_slice_in_dim(kv_valid_BxS, cache_index, length, axis=1)
      causal_TxT = jnp.tril(jnp.ones((length, length), bool))
      visible_BxTxS = causal_TxT[None] & own_valid_BxT[:, None, :]
      keys, values, layout = k_BxTxKxH, v_BxTxKxH, 'bskh'
    else:
      # Decoding: the whole cache, this chunk's slots included, up to each query's own slot.
      (keys, values), layout = [c.reshape(-1, kv_heads, *c.shape[-2:]) for c in layer_cache], 'bksh'
      slots_S = jnp.arange(keys.shape[2])
      last_BxT = jnp.reshape(cache_index, (-1, 1)) + jnp.arange(length)   # B or 1 rows
      visible_BxTxS = (slots_S <= last_BxT[..., None]) & kv_valid_BxS[:, None, :]
    q_BxTxKxGxH = q_BxTxNxH.reshape(*q_BxTxNxH.shape[:2], kv_heads, heads // kv_heads, head_dim)
    scores_BxKxGxTxS = jnp.einsum(f'btkgh,{layout}->bkgts', q_BxTxKxGxH, keys,
                                  preferred_element_type=jnp.float32) * head_dim ** -0.5
    scores_BxKxGxTxS = jnp.where(visible_BxTxS[:, None, None], scores_BxKxGxTxS,
                                 jnp.finfo(jnp.float32).min)
    weights_BxKxGxTxS = jnp.exp(scores_BxKxGxTxS - jnp.max(scores_BxKxGxTxS, -1, keepdims=True))
    weights_BxKxGxTxS = (weights_BxKxGxTxS / jnp.sum(weights_BxKxGxTxS, -1, keepdims=True)
                         ).astype(cfg.dtype)
    # Heads-major output, one transpose after: with a token-major output XLA:CPU runs the product
    # against a [batch, kv_heads, slots, head_dim] cache as a plain, unfused dot.
    out_BxKxGxTxH = jnp.einsum(f'bkgts,{layout}->bkgth', weights_BxKxGxTxS, values)
    # Contracted over (head_dim, heads), the order `jnp.einsum('btnh,nhd->btd')` contracts in (so
    # training's sums are the same, bit for bit), with w_o transposed to it explicitly. XLA folds
    # that transpose into the dot and then makes it a copy inside the decoding loop, every step;
    # behind the barrier it is loop-invariant and leaves the loop
    # (docs/design/optimization_barriers.md).
    out_BxTxHxN = jnp.transpose(out_BxKxGxTxH, (0, 3, 4, 1, 2)).reshape(
        *x_BxTxD.shape[:2], head_dim, heads)
    w_o_HxNxD = jax.lax.optimization_barrier(jnp.swapaxes(w_o, 0, 1))
    out_BxTxD = jax.lax.dot_general(out_BxTxHxN, w_o_HxNxD.astype(cfg.dtype),
                                    (((2, 3), (0, 1)), ((), ())))
    return out_BxTxD, layer_cache


class Block(nn.Module):
  """One pre-norm layer; scanned over depth, carrying the residual stream and the MoE aux loss.
  `decoding`: the unrolled model's layer (rljax.model.moe.MoE). Besides the carry it returns its
  KV cache and rljax.model.moe.Routed (None for a dense layer): the experts it chose when
  decoding, and how many tokens chose otherwise than `recorded_BxTxK` says the sampler did."""
  cfg: ModelConfig
  decoding: bool = False

  @nn.compact
  def __call__(self, carry, layer_cache, rope_tables, kv_valid_BxS, cache_index,
               recorded_BxTxK=None):
    cfg = self.cfg
    x_BxTxD, aux_loss = carry
    h_BxTxD = layers.RMSNorm(cfg, name='attn_norm')(x_BxTxD)
    attn_BxTxD, layer_cache = Attention(cfg, name='attn')(
        h_BxTxD, rope_tables, kv_valid_BxS, layer_cache, cache_index)
    x_BxTxD = x_BxTxD + attn_BxTxD
    h_BxTxD = layers.RMSNorm(cfg, name='ffn_norm')(x_BxTxD)
    routed = None
    if cfg.num_experts:
      ffn_BxTxD, layer_aux, routed = moe.MoE(cfg, self.decoding, name='moe')(h_BxTxD,
                                                                             recorded_BxTxK)
      aux_loss = aux_loss + layer_aux / cfg.num_layers
    else:
      ffn_BxTxD = layers.SwiGLU(cfg, name='ffn')(h_BxTxD)
    x_BxTxD = sharding.constrain(x_BxTxD + ffn_BxTxD, ACTIVATION_AXES)
    return (x_BxTxD, aux_loss), (layer_cache, routed)


# 'dots' keeps the outputs of the matmuls by weights (those without batch dimensions, and the
# experts' grouped products, named in rljax.model.moe.grouped_matmul) and recomputes the rest.
REMAT_POLICIES = {
    'full': None,
    'dots': jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
        jax.checkpoint_policies.save_only_these_names('expert_products')),
}


class Transformer(nn.Module):
  """Returns (logits or hidden states, updated KV cache or None, MoE load-balancing loss).

  `unrolled`: one module per layer (parameters 'blocks_0', 'blocks_1', ...: `unstack_layers`), the
  decoding form: inside a scan each step copies every layer's weights and cache out of the stacked
  arrays before a matmul reads them. Only the unrolled model takes a KV cache; its MoE layers
  multiply by gate and up joined (rljax.model.moe.gate_up).
  """
  cfg: ModelConfig
  unrolled: bool = False

  def setup(self):
    cfg = self.cfg
    self.embed = nn.Embed(
        cfg.vocab_size, cfg.d_model, param_dtype=cfg.param_dtype, dtype=cfg.dtype,
        embedding_init=nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std),
                                                    ('vocab', 'embed')))
    if self.unrolled:
      self.blocks = [Block(cfg, decoding=True) for _ in range(cfg.num_layers)]
    else:
      block = Block
      if cfg.remat != 'none':
        block = nn.remat(Block, policy=REMAT_POLICIES[cfg.remat], prevent_cse=False)
      self.blocks = nn.scan(
          block, variable_axes={'params': 0}, split_rngs={'params': True},
          in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, 0), length=cfg.num_layers,
          metadata_params={nn.PARTITION_NAME: 'layers'})(cfg, name='blocks')
    self.final_norm = layers.RMSNorm(cfg)
    if not cfg.tie_embeddings:
      self.lm_head = self.param(
          'lm_head', nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std),
                                                  ('embed', 'vocab')),
          (cfg.d_model, cfg.vocab_size), cfg.param_dtype)

  def hidden(self, tokens_BxT, kv_valid_BxS, cache: Optional[KVCache] = None, cache_index=0,
             positions_BxT=None, recorded_YxBxSxK=None):
    """Final-norm hidden states. Without a cache, S == T and positions come from `kv_valid_BxS`.

    MoE models sow into 'intermediates' (`apply(..., mutable=['intermediates'])` collects them):
    the unrolled model 'experts', each token's top-k ids per layer [B, T, Y, K] (Y: layers;
    `apply_recording`); given the sampler's ids `recorded_YxBxSxK` (-1: none), 'router_mismatch',
    the (token, layer) decisions whose top-k differs from them (rljax.model.router.route).
    """
    if positions_BxT is None:
      positions_BxT = positions_from_valid(kv_valid_BxS)
    # Look up in the whole table (as FSDP gathers any weight it uses): a gather from a table split
    # over both dimensions is one XLA cannot partition well.
    table_VxD = sharding.constrain(self.embed.embedding, ('replicated', 'replicated'))
    x_BxTxD = jnp.take(table_VxD, tokens_BxT, axis=0).astype(self.cfg.dtype)
    x_BxTxD = sharding.constrain(x_BxTxD, ACTIVATION_AXES)
    rope_tables = layers.rope_tables(positions_BxT, self.cfg.head_dim, self.cfg.rope_theta)
    carry = (x_BxTxD, jnp.zeros((), jnp.float32))
    if not self.unrolled:
      if cache is not None:
        raise ValueError('a KV cache needs the unrolled model: Transformer(cfg, unrolled=True)')
      (x_BxTxD, aux_loss), (_, routed) = self.blocks(carry, None, rope_tables, kv_valid_BxS,
                                                     cache_index, recorded_YxBxSxK)
      self._sow_routing([routed], recorded_YxBxSxK is not None)
      return self.final_norm(x_BxTxD), None, aux_loss
    new_layer_caches, routed = [], []
    for layer, block in enumerate(self.blocks):
      layer_cache = None if cache is None else (cache.k[layer], cache.v[layer])
      recorded = None if recorded_YxBxSxK is None else recorded_YxBxSxK[layer]
      carry, (layer_cache, layer_routed) = block(carry, layer_cache, rope_tables, kv_valid_BxS,
                                                 cache_index, recorded)
      new_layer_caches.append(layer_cache)
      routed.append(layer_routed)
    self._sow_routing(routed, recorded_YxBxSxK is not None)
    x_BxTxD, aux_loss = carry
    new_cache = None if cache is None else KVCache(*map(tuple, zip(*new_layer_caches)))
    return self.final_norm(x_BxTxD), new_cache, aux_loss

  def _sow_routing(self, routed, recorded):
    """Sows the routing of `routed` (one rljax.model.moe.Routed per layer, or one stacked over
    the layers): the decoding layers' experts and, where the sampler's ids were given, the
    mismatch."""
    if not self.cfg.num_experts:
      return
    if routed[0].experts_BxTxK is not None:
      self.sow('intermediates', 'experts', jnp.stack([r.experts_BxTxK for r in routed], axis=2))
    if recorded:
      self.sow('intermediates', 'router_mismatch', sum(jnp.sum(r.mismatch) for r in routed))

  def logits(self, h_BxTxD):
    """Vocabulary logits in float32 (log-probs and sampling need the precision)."""
    if self.cfg.tie_embeddings:
      return self.embed.attend(h_BxTxD).astype(jnp.float32)
    return jnp.dot(h_BxTxD, self.lm_head.astype(self.cfg.dtype),
                   preferred_element_type=jnp.float32)

  def __call__(self, tokens_BxT, kv_valid_BxS, cache=None, cache_index=0, positions_BxT=None):
    h_BxTxD, new_cache, aux_loss = self.hidden(tokens_BxT, kv_valid_BxS, cache, cache_index,
                                               positions_BxT)
    return self.logits(h_BxTxD), new_cache, aux_loss


def apply_recording(decoder, variables, *args, **kwargs):
  """`decoder.apply(variables, *args, **kwargs)` of the unrolled model, and the experts its MoE
  layers routed each token to, [B, T, Y, K] (rljax.model.router.route_dtype; None for a dense
  model): what the sampler records for router replay."""
  out, state = decoder.apply(variables, *args, mutable=['intermediates'], **kwargs)
  return out, state['intermediates']['experts'][0] if decoder.cfg.num_experts else None


def unstack_layers(params, num_layers):
  """The parameters of `Transformer(cfg, unrolled=True)`: the stacked 'blocks' split by layer.

  Inside a jitted sampler this is a transient copy of the block weights for one call (the same
  values, so no sampler/trainer mismatch), below the update's peak of parameters, gradients and two
  Adam moments. Why: docs/design/unrolled_decoding.md.
  """
  params = dict(params)
  blocks = params.pop('blocks')
  for layer in range(num_layers):
    params[f'blocks_{layer}'] = jax.tree.map(lambda x, layer=layer: x[layer], blocks)
  return params


def decoding_layout(box, cfg: ModelConfig, mesh):
  """(logical axis names, dtype) of a weight (an nn.Partitioned of the unrolled model) in
  `decoding_params` on `mesh`: outside the experts, whole along 'embed', in the compute dtype; the
  router whole, in float32 as it is read; the expert matrices in rljax.model.moe.DECODING_NAMES's
  layout in the compute dtype where the sampler splits their hidden dimension, else as stored."""
  if mesh.shape.get('fsdp', 1) == 1 or box.value.ndim < 2:
    return box.names, box.value.dtype
  if 'expert' not in box.names:
    return tuple('replicated' if name == 'embed' else name for name in box.names), jnp.dtype(
        cfg.dtype)
  if moe.splits_hidden_for_decoding(cfg, mesh):
    names = moe.DECODING_NAMES[box.names]
  elif box.value.ndim == 2:   # the router
    names = tuple('replicated' if name == 'embed' else name for name in box.names)
  else:
    return box.names, box.value.dtype
  return names, box.value.dtype if box.value.ndim == 2 else jnp.dtype(cfg.dtype)


def decoding_params(params, cfg: ModelConfig):
  """The sampler's parameters for one call: `unstack_layers`, and on a mesh with an 'fsdp' axis
  laid out once per call, before the decoding loop, so that a decoding step moves no weight
  (`decoding_layout`): every weight outside the experts all-gathered whole over 'fsdp' in the
  compute dtype, and the expert matrices, cast to it, re-split from their model dimension to
  their hidden one (an all-to-all; rljax.model.moe.DECODING_NAMES).

  XLA does not hoist an all-gather of a loop-invariant weight out of a while loop: with the
  weights split over 'fsdp', every decoding step gathered the embedding table, lm_head and each
  layer's attention and router weights. With the experts split over their model dimension, each
  layer's expert products were partial sums reduced every step ([tokens x k, 2F] and
  [tokens x k, D]); split over the hidden one, only the combined [tokens, D] output is
  (rljax.model.moe.moe_expert_parallel). The norm scales (vectors) stay split. The re-split experts
  are a transient of half the float32 shards they come from. The casts are the ones each weight gets
  where it is used, so the function computed is the same.
  """
  params = unstack_layers(params, cfg.num_layers)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.shape.get('fsdp', 1) == 1:
    return params

  def gathered(box, weight):
    names, dtype = decoding_layout(box, cfg, mesh)
    if names == box.names:
      return weight
    # Cast first, then lay out: the barrier keeps XLA from moving the float32 weights.
    return sharding.constrain(jax.lax.optimization_barrier(weight.astype(dtype)), names)

  return jax.tree.map(gathered, unrolled_boxes(cfg), params,
                      is_leaf=lambda x: isinstance(x, nn.Partitioned))


def unrolled_boxes(cfg: ModelConfig):
  """Abstract boxed parameters (shapes, dtypes, logical axis names) of the unrolled model; traced
  without the context mesh (its expert-parallel MoE would need the 4 tokens split over it)."""
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
    return jax.eval_shape(lambda: Transformer(cfg, unrolled=True).init(
        jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 4), bool))['params'])


def init_params(cfg: ModelConfig, rng):
  """Parameters (boxed with their logical axis names; see rljax.sharding for placement)."""
  tokens = jnp.zeros((1, 4), jnp.int32)
  return Transformer(cfg).init(rng, tokens, jnp.ones((1, 4), bool))['params']
