"""Batched on-device generation: one prefill, then decode in ONE `lax.while_loop` over a KV cache.

Prompts are left-padded to a common length T, so every row's next token goes to the same cache slot
T + t; position ids count real tokens only. The loop stops once every row has emitted a stop token
(or after `max_new_tokens`). Log-probs are those of the sampled tokens under the temperature-scaled
FULL distribution, i.e. exactly what the trainer recomputes (top-k / top-p only choose the token).
"""
import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rljax import gumbel
from rljax import model as model_lib
from rljax import sharding


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  max_new_tokens: int
  eos_id: int
  pad_id: int = 0
  temperature: float = 1.0
  top_k: int = 0        # 0: no top-k filter
  top_p: float = 1.0    # 1.0: no nucleus filter
  greedy: bool = False


class Rollout(NamedTuple):
  tokens_BxL: jax.Array   # sampled response tokens, PAD after the stop token
  logp_BxL: jax.Array     # sampler log-probs of those tokens (0 on padding)
  mask_BxL: jax.Array     # True on response tokens, the stop token included
  lengths_B: jax.Array


def filter_logits(logits_BxV, top_k, top_p):
  """Sets logits outside the top-k and outside the top-p nucleus to -inf (the best token stays)."""
  if top_k:
    kth_B1 = jax.lax.top_k(logits_BxV, top_k)[0][:, -1:]
    logits_BxV = jnp.where(logits_BxV < kth_B1, -jnp.inf, logits_BxV)
  if top_p < 1.0:
    sorted_BxV = jnp.sort(logits_BxV, axis=-1)[:, ::-1]
    probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
    mass_before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV
    keep_BxV = mass_before_BxV < top_p
    threshold_B1 = jnp.min(jnp.where(keep_BxV, sorted_BxV, jnp.inf), axis=-1, keepdims=True)
    logits_BxV = jnp.where(logits_BxV < threshold_B1, -jnp.inf, logits_BxV)
  return logits_BxV


def first_argmax(x_BxV):
  """`jnp.argmax` over the last axis (the first index of the maximum, or of the first NaN) as a max
  and a min: XLA:CPU runs argmax as a variadic reduce, and fused with what feeds it, slowly
  (docs/performance.md)."""
  top_Bx1 = jnp.max(x_BxV, axis=-1, keepdims=True)   # NaN where the row has one
  is_top_BxV = (x_BxV == top_Bx1) | jnp.isnan(x_BxV)
  return jnp.min(jnp.where(is_top_BxV, jnp.arange(x_BxV.shape[-1]), x_BxV.shape[-1]), axis=-1)


def categorical(key, logits_BxV):
  """`jax.random.categorical` on float32 logits, the same tokens for the same key (Gumbel-max),
  faster on CPU (bench/sampling.py): `first_argmax`, and the noise's hash unrolled (rljax.gumbel)."""
  return first_argmax(logits_BxV + gumbel.gumbel(key, logits_BxV.shape))


def sample_token(logits_BxV, key, cfg: SamplingConfig):
  """Returns (token_B, logp_B) with logp under softmax(logits / temperature)."""
  scaled_BxV = logits_BxV.astype(jnp.float32) / cfg.temperature
  logp_BxV = jax.nn.log_softmax(scaled_BxV, axis=-1)
  if cfg.greedy:
    token_B = first_argmax(scaled_BxV)
  else:
    token_B = categorical(key, filter_logits(scaled_BxV, cfg.top_k, cfg.top_p))
  token_B = token_B.astype(jnp.int32)
  return token_B, jnp.take_along_axis(logp_BxV, token_B[:, None], axis=-1)[:, 0]


def shard_cache(cache):
  """On a mesh: KV cache rows split like the batch, kv heads over 'tensor' (rljax.sharding)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return cache
  names = ('batch', 'kv_heads', 'length', 'head_dim')[-cache.k[0].ndim:]   # no batch axis at 1
  spec = sharding.spec_for(cache.k[0].shape, names, mesh)
  return jax.lax.with_sharding_constraint(cache, jax.tree.map(lambda _: spec, cache))


def prefill(model, params, prompt_BxT, prompt_valid_BxT, max_new_tokens):
  """The decoding setup of `generate`: the unrolled model, its parameters split by layer (once per
  call, rljax.model), and the KV cache holding every prompt column but the last, which the decode
  loop feeds first. Returns (decoder, variables, cache, kv_valid_BxS, positions_BxT)."""
  batch, prompt_len = prompt_BxT.shape
  decoder = model_lib.Transformer(model.cfg, unrolled=True)
  variables = {'params': model_lib.decoding_params(params, model.cfg)}
  cache = shard_cache(model_lib.KVCache.zeros(model.cfg, batch, prompt_len + max_new_tokens))
  kv_valid_BxS = jnp.concatenate([prompt_valid_BxT, jnp.ones((batch, max_new_tokens), bool)],
                                 axis=1)
  positions_BxT = model_lib.positions_from_valid(prompt_valid_BxT)
  if prompt_len > 1:
    _, cache, _ = decoder.apply(variables, prompt_BxT[:, :-1], kv_valid_BxS, cache, 0,
                                positions_BxT[:, :-1], method='hidden')
  return decoder, variables, cache, kv_valid_BxS, positions_BxT


def generate(model, params, prompt_BxT, prompt_valid_BxT, rng, cfg: SamplingConfig) -> Rollout:
  """Samples up to `cfg.max_new_tokens` tokens for every prompt. Jit with model and cfg static.

  After `prefill`, each loop step feeds one token (the last prompt column first: a real token in
  every row, prompts are left-padded) and samples the next, so there is exactly one decode per
  sampled token and no branch in the loop.
  """
  batch, prompt_len = prompt_BxT.shape
  max_len = cfg.max_new_tokens
  decoder, variables, cache, kv_valid_BxS, positions_BxT = prefill(
      model, params, prompt_BxT, prompt_valid_BxT, max_len)

  def body(state):
    t, cache, token_B, tokens_BxL, logp_BxL, mask_BxL, done_B, rng = state
    logits_Bx1xV, cache, _ = decoder.apply(variables, token_B[:, None], kv_valid_BxS, cache,
                                           prompt_len - 1 + t, (positions_BxT[:, -1] + t)[:, None])
    rng, key = jax.random.split(rng)
    token_B, logp_B = sample_token(logits_Bx1xV[:, 0], key, cfg)
    token_B = jnp.where(done_B, cfg.pad_id, token_B)
    tokens_BxL = tokens_BxL.at[:, t].set(token_B)
    logp_BxL = logp_BxL.at[:, t].set(jnp.where(done_B, 0.0, logp_B))
    mask_BxL = mask_BxL.at[:, t].set(~done_B)
    done_B = done_B | (token_B == cfg.eos_id)
    return t + 1, cache, token_B, tokens_BxL, logp_BxL, mask_BxL, done_B, rng

  def cond(state):
    t, done_B = state[0], state[6]
    return (t < max_len) & ~jnp.all(done_B)

  state = (jnp.int32(0), cache, prompt_BxT[:, -1], jnp.full((batch, max_len), cfg.pad_id, jnp.int32),
           jnp.zeros((batch, max_len), jnp.float32), jnp.zeros((batch, max_len), bool),
           jnp.zeros((batch,), bool), rng)
  _, _, _, tokens_BxL, logp_BxL, mask_BxL, _, _ = jax.lax.while_loop(cond, body, state)
  return Rollout(tokens_BxL, logp_BxL, mask_BxL, jnp.sum(mask_BxL, axis=-1))


def make_sampler(model, cfg: SamplingConfig):
  """A jitted `(params, prompt_BxT, prompt_valid_BxT, rng) -> Rollout` (compiled once per shape)."""
  return jax.jit(lambda params, prompt, valid, rng: generate(model, params, prompt, valid, rng, cfg))
