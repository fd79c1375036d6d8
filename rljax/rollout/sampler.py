"""Batched on-device generation: one prefill, then decode in ONE `lax.while_loop` over a KV cache.

Prompts are left-padded to a common length T, so every row's next token goes to cache column
T + t; position ids count real tokens only. Log-probs are those of the sampled tokens under the
temperature-scaled FULL distribution, i.e. exactly what the trainer recomputes (top-k / top-p only
choose the token).

Two schedules, one jitted call each:
- static (`slots` 0): every row decodes until the LAST row stops (or `max_new_tokens`);
- continuous (`slots` S > 0, `generate_continuous`): S decode slots, each refilled with the next
  pending prompt as soon as its response stops, so finished rows do not ride along as padding.
With per-response keys (`response_keys`: token t of response n draws with fold_in(key_n, t)) both
schedules return the same tokens and log-probs, whatever order the rows finish in.

With `group` G > 1 (GRPO's G responses per prompt) the sampler takes P prompts and returns P x G
responses, group-major (prompt p's are rows p*G .. p*G+G-1): each prompt is prefilled once and its
KV cache rows are repeated (static) or copied into each slot it is decoded in (continuous), so the
decode loop, its keys and its tokens are those of the P x G repeated prompts.
"""
import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rljax.model import router
from rljax.model import transformer as model_lib
from rljax.rollout import gumbel
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
  slots: int = 0        # 0: static batching; S > 0: S continuous-batching decode slots
  group: int = 1        # responses per prompt: P prompts in, P x group responses out

  def __post_init__(self):
    if self.slots < 0:
      raise ValueError(f'rollout.slots must be >= 0 (0: static batching), got {self.slots}')
    if self.group < 1:
      raise ValueError(f'the sampler group (responses per prompt) must be >= 1, got {self.group}')


class Rollout(NamedTuple):
  tokens_BxL: jax.Array   # sampled response tokens, PAD after the stop token
  logp_BxL: jax.Array     # sampler log-probs of those tokens (0 on padding)
  mask_BxL: jax.Array     # True on response tokens, the stop token included
  lengths_B: jax.Array
  decode_steps: jax.Array = None   # decoding loop iterations (int32 scalar)
  utilization: jax.Array = None    # response tokens / (decode slots x decode steps)
  # MoE: the experts each layer (Y) routed the decoding step that sampled token t to (its k ids,
  # -1 on padding; rljax.model.router): what router replay and its mismatch metric read
  experts_BxLxYxK: jax.Array = None


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
  and a min: XLA:CPU lowers argmax to a variadic reduce, which it fuses poorly with what feeds it
  (docs/design/argmax_max_min.md)."""
  top_Bx1 = jnp.max(x_BxV, axis=-1, keepdims=True)   # NaN where the row has one
  is_top_BxV = (x_BxV == top_Bx1) | jnp.isnan(x_BxV)
  return jnp.min(jnp.where(is_top_BxV, jnp.arange(x_BxV.shape[-1]), x_BxV.shape[-1]), axis=-1)


def categorical(key, logits_BxV):
  """`jax.random.categorical` on float32 logits, the same tokens for the same key (Gumbel-max),
  through `first_argmax` and the unrolled hash of rljax.rollout.gumbel (both measured by
  bench/sampling.py)."""
  return first_argmax(logits_BxV + gumbel.gumbel(key, logits_BxV.shape))


def categorical_per_row(keys_Bx2, logits_BxV):
  """`categorical` with one key per row: a row's draw depends on its own key only."""
  noise_BxV = jax.vmap(lambda key: gumbel.gumbel(key, logits_BxV.shape[-1:]))(keys_Bx2)
  return first_argmax(logits_BxV + noise_BxV)


def response_keys(rng, num_responses):
  """One key per response (fold_in of its index), so its draws do not depend on the schedule."""
  return jax.vmap(lambda n: jax.random.fold_in(rng, n))(jnp.arange(num_responses))


def token_keys(keys_Bx2, t_B):
  """The key of each row's token t: fold_in(response key, t)."""
  return jax.vmap(jax.random.fold_in)(keys_Bx2, t_B)


def sample_token(logits_BxV, key, cfg: SamplingConfig):
  """Returns (token_B, logp_B) with logp under softmax(logits / temperature). `key`: one key for
  the batch, or one per row ([B, 2])."""
  scaled_BxV = logits_BxV.astype(jnp.float32) / cfg.temperature
  logp_BxV = jax.nn.log_softmax(scaled_BxV, axis=-1)
  if cfg.greedy:
    token_B = first_argmax(scaled_BxV)
  else:
    draw = categorical_per_row if key.ndim == 2 else categorical
    token_B = draw(key, filter_logits(scaled_BxV, cfg.top_k, cfg.top_p))
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


def repeat_rows(x_PxN, group):
  """Each row `group` times in a row: row p becomes rows p*G .. p*G+G-1 (group-major)."""
  return x_PxN if group == 1 else jnp.repeat(x_PxN, group, axis=0)


def repeat_cache(cache, rows, group):
  """A KV cache of `rows` rows with each row repeated `group` times (KVCache has no batch axis at
  one row)."""
  def repeat(x):
    x_RxKxSxH = repeat_rows(x.reshape(rows, *x.shape[-3:]), group)
    return x_RxKxSxH.reshape((rows * group,) * (rows * group > 1) + x.shape[-3:])
  return jax.tree.map(repeat, cache)


def prefill(model, params, prompt_PxT, prompt_valid_PxT, max_new_tokens, group=1):
  """The decoding setup of `generate`: the unrolled model, its parameters split by layer (once per
  call, rljax.model.transformer), and the KV cache holding every prompt column but the last, which
  the decode loop feeds first. Each prompt is prefilled once; its cache row is then repeated
  `group` times. Returns (decoder, variables, cache, kv_valid_BxS, positions_BxT), B = P x group."""
  num_prompts, prompt_len = prompt_PxT.shape
  decoder = model_lib.Transformer(model.cfg, unrolled=True)
  variables = {'params': model_lib.decoding_params(params, model.cfg)}
  cache = shard_cache(model_lib.KVCache.zeros(model.cfg, num_prompts, prompt_len + max_new_tokens))
  kv_valid_PxS = jnp.concatenate(
      [prompt_valid_PxT, jnp.ones((num_prompts, max_new_tokens), bool)], axis=1)
  positions_PxT = model_lib.positions_from_valid(prompt_valid_PxT)
  if prompt_len > 1:
    _, cache, _ = decoder.apply(variables, prompt_PxT[:, :-1], kv_valid_PxS, cache, 0,
                                positions_PxT[:, :-1], method='hidden')
  if group > 1:
    cache = shard_cache(repeat_cache(cache, num_prompts, group))
  return (decoder, variables, cache, repeat_rows(kv_valid_PxS, group),
          repeat_rows(positions_PxT, group))


def generate(model, params, prompt_PxT, prompt_valid_PxT, rng, cfg: SamplingConfig,
             caps_B=None) -> Rollout:
  """Samples up to `cfg.max_new_tokens` tokens for each of `cfg.group` responses per prompt (B =
  P x group rows, group-major). Jit with model and cfg static.

  After `prefill`, each loop step feeds one token (the last prompt column first: a real token in
  every row, prompts are left-padded) and samples the next, so there is exactly one decode per
  sampled token and no branch in the loop. `rng`: one key (split every step), or one key per row
  ([B, 2], `response_keys`). `caps_B`: per-row response budgets (a row stops after that many).
  """
  prompt_len = prompt_PxT.shape[1]
  batch, max_len = prompt_PxT.shape[0] * cfg.group, cfg.max_new_tokens
  per_row_keys = rng.ndim == 2
  decoder, variables, cache, kv_valid_BxS, positions_BxT = prefill(
      model, params, prompt_PxT, prompt_valid_PxT, max_len, cfg.group)

  def body(state):
    t, cache, token_B, tokens_BxL, logp_BxL, mask_BxL, done_B, rng, experts_BxLxYxK = state
    (logits_Bx1xV, cache, _), experts_Bx1xYxK = model_lib.apply_recording(
        decoder, variables, token_B[:, None], kv_valid_BxS, cache, prompt_len - 1 + t,
        (positions_BxT[:, -1] + t)[:, None])
    if per_row_keys:
      key = token_keys(rng, jnp.full((batch,), t))
    else:
      rng, key = jax.random.split(rng)
    token_B, logp_B = sample_token(logits_Bx1xV[:, 0], key, cfg)
    token_B = jnp.where(done_B, cfg.pad_id, token_B)
    tokens_BxL = tokens_BxL.at[:, t].set(token_B)
    logp_BxL = logp_BxL.at[:, t].set(jnp.where(done_B, 0.0, logp_B))
    mask_BxL = mask_BxL.at[:, t].set(~done_B)
    if experts_BxLxYxK is not None:
      experts_BxLxYxK = experts_BxLxYxK.at[:, t].set(
          jnp.where(done_B[:, None, None], -1, experts_Bx1xYxK[:, 0]))
    done_B = done_B | (token_B == cfg.eos_id)
    if caps_B is not None:
      done_B = done_B | (t + 1 >= caps_B)
    return (t + 1, cache, token_B, tokens_BxL, logp_BxL, mask_BxL, done_B, rng,
            experts_BxLxYxK)

  def cond(state):
    t, done_B = state[0], state[6]
    return (t < max_len) & ~jnp.all(done_B)

  state = (jnp.int32(0), cache, repeat_rows(prompt_PxT[:, -1], cfg.group),
           jnp.full((batch, max_len), cfg.pad_id, jnp.int32),
           jnp.zeros((batch, max_len), jnp.float32), jnp.zeros((batch, max_len), bool),
           jnp.zeros((batch,), bool), rng, router.unrecorded(model.cfg, batch, max_len))
  steps, _, _, tokens_BxL, logp_BxL, mask_BxL, _, _, experts_BxLxYxK = jax.lax.while_loop(
      cond, body, state)
  return finish(tokens_BxL, logp_BxL, mask_BxL, steps, batch, experts_BxLxYxK)


def finish(tokens_BxL, logp_BxL, mask_BxL, steps, slots, experts_BxLxYxK=None) -> Rollout:
  """The Rollout, with the decode-slot utilization of the schedule that made it."""
  lengths_B = jnp.sum(mask_BxL, axis=-1)
  useful = jnp.sum(lengths_B).astype(jnp.float32)
  utilization = useful / jnp.maximum(steps * slots, 1).astype(jnp.float32)
  return Rollout(tokens_BxL, logp_BxL, mask_BxL, lengths_B, steps, utilization, experts_BxLxYxK)


@jax.jit
def rollout_metrics(rollout: Rollout):
  """The rollout's logged shape: decode-slot utilization, longest and mean response length."""
  lengths_B = rollout.lengths_B.astype(jnp.float32)
  return dict(slot_utilization=rollout.utilization, decode_steps=rollout.decode_steps,
              response_len_max=jnp.max(lengths_B), response_len_mean=jnp.mean(lengths_B))


class Slots(NamedTuple):
  """The continuous schedule's decode slots: which response each one holds, and where it is."""
  response_S: jax.Array   # response id, or N (none: idle, or drained)
  t_S: jax.Array          # tokens sampled so far for that response
  token_S: jax.Array      # the next token to feed
  active_S: jax.Array


def refill_rows(slots):
  """Prompts prefilled together, once that many slots are free: an eighth of the slots, so a slot
  waits for few others and a step that frees all takes 8 prefills; at least 4, as a prefill of
  fewer rows reads the same weights for less work."""
  return min(slots, max(4, slots // 8))


def prompt_cache(decoder, variables, prompt_RxT, valid_RxT):
  """Keys and values of every prompt column but the last: a KV cache of R rows, T - 1 slots."""
  rows, prompt_len = prompt_RxT.shape
  cache = model_lib.KVCache.zeros(decoder.cfg, rows, prompt_len - 1)
  _, cache, _ = decoder.apply(variables, prompt_RxT[:, :-1], valid_RxT[:, :-1], cache, 0,
                              model_lib.positions_from_valid(valid_RxT)[:, :-1], method='hidden')
  return cache


def prompt_rows(decoder, variables, prompt_PxT, valid_PxT, group):
  """`prompt_R -> those prompts' cache rows` for `refill`. With group > 1 every prompt is
  prefilled once, up front, and a refill copies its rows; at group 1 nothing is shared, so a
  refill prefills its own prompts and no cache of every prompt is held."""
  if group == 1:
    return lambda prompt_R: prompt_cache(decoder, variables, prompt_PxT[prompt_R],
                                         valid_PxT[prompt_R])
  num_prompts = prompt_PxT.shape[0]
  every = shard_cache(prompt_cache(decoder, variables, prompt_PxT, valid_PxT))
  return lambda prompt_R: jax.tree.map(
      lambda x: x.reshape(num_prompts, *x.shape[-3:])[prompt_R], every)


def fill_slots(cache, kv_valid_SxC, slots, response_K, prompt_kv_K, valid_KxT, token_K, waiting):
  """Puts the first of the K responses `response_K` (at most `waiting`, and as many as slots are
  free) into the first free slots, with their prompts' cache rows `prompt_kv_K` (None for
  one-column prompts), prompt validity and first token to feed: the one refill of continuous
  batching and of the partial pool. Returns (cache, kv_valid_SxC, slots, taken_K)."""
  rows, prompt_len = valid_KxT.shape
  num_slots = slots.active_S.shape[0]
  free_K = jnp.argsort(slots.active_S, stable=True)[:rows]   # free slots first
  count = jnp.minimum(jnp.minimum(jnp.sum(~slots.active_S), waiting), rows)
  taken_K = jnp.arange(rows) < count
  target_K = jnp.where(taken_K, free_K, num_slots)           # out of range: dropped
  if prompt_kv_K is not None:
    put = lambda big, small: big.at[target_K, :, :prompt_len - 1].set(
        small.reshape(rows, *small.shape[-3:]), mode='drop')
    cache = jax.tree.map(put, cache, prompt_kv_K)
  kv_valid_SxC = kv_valid_SxC.at[target_K, :prompt_len].set(valid_KxT, mode='drop')
  set_at = lambda x, value: x.at[target_K].set(value, mode='drop')
  slots = Slots(set_at(slots.response_S, response_K), set_at(slots.t_S, 0),
                set_at(slots.token_S, token_K), set_at(slots.active_S, True))
  return cache, kv_valid_SxC, slots, taken_K


def refill(prompt_kv, prompt_PxT, valid_PxT, group, cache, kv_valid_SxC, slots, pending, rows):
  """Puts the next `rows` pending responses, their prompts' cache rows from `prompt_kv`
  (`prompt_rows`), into the first free slots (fewer if fewer are free or pending). Response n is
  of prompt n // group. Returns (cache, kv_valid_SxC, slots, pending)."""
  num, prompt_len = prompt_PxT.shape[0] * group, prompt_PxT.shape[1]
  prompt_R = jnp.minimum(pending + jnp.arange(rows), num - 1) // group
  cache, kv_valid_SxC, slots, taken_R = fill_slots(
      cache, kv_valid_SxC, slots, pending + jnp.arange(rows),
      prompt_kv(prompt_R) if prompt_len > 1 else None, valid_PxT[prompt_R],
      prompt_PxT[prompt_R, -1], num - pending)
  return cache, kv_valid_SxC, slots, pending + jnp.sum(taken_R)


class Decoded(NamedTuple):
  """One decoding step of the slots: what each slot writes where (row N: nothing)."""
  row_S: jax.Array     # the response written, or N for an idle slot
  t_S: jax.Array       # its token index
  token_S: jax.Array
  logp_S: jax.Array
  stop_S: jax.Array    # the response is finished (stop token or cap): its slot is freed
  experts_SxYxK: jax.Array = None   # MoE: the experts each layer routed the step to (Rollout)


def decode_slots(decoder, variables, cache, kv_valid_SxC, slots, keys_Nx2, position0_N, caps_N,
                 prompt_len, cfg: SamplingConfig):
  """One token for every slot, each with its response's key and position: the decoding step of
  continuous batching and of the partial pool. Returns (cache, slots, Decoded)."""
  num = keys_Nx2.shape[0]
  response_S = jnp.minimum(slots.response_S, num - 1)
  t_S = jnp.minimum(slots.t_S, cfg.max_new_tokens - 1)
  (logits_Sx1xV, cache, _), experts_Sx1xYxK = model_lib.apply_recording(
      decoder, variables, slots.token_S[:, None], kv_valid_SxC, cache, prompt_len - 1 + t_S,
      (position0_N[response_S] + t_S)[:, None])
  token_S, logp_S = sample_token(logits_Sx1xV[:, 0], token_keys(keys_Nx2[response_S], t_S), cfg)
  row_S = jnp.where(slots.active_S, response_S, num)   # idle slots write nothing
  stop_S = (token_S == cfg.eos_id) | (slots.t_S + 1 >= caps_N[response_S])
  slots = Slots(slots.response_S, slots.t_S + 1, token_S, slots.active_S & ~stop_S)
  experts_SxYxK = None if experts_Sx1xYxK is None else experts_Sx1xYxK[:, 0]
  return cache, slots, Decoded(row_S, t_S, token_S, logp_S, stop_S, experts_SxYxK)


def cache_rows(num, slots):
  """KV-cache rows of a rollout of `num` responses, as generate_continuous lays them out: one per
  decode slot (min(slots, num), when that is >= 2), else one per response."""
  return min(slots, num) if min(slots, num) >= 2 else num


def prompt_cache_rows(num_prompts, group, slots):
  """Rows of the prompt-only cache (T - 1 slots) generate_continuous holds next to its slots: one
  per prompt with group > 1 (`prompt_rows`), none otherwise (or under static batching)."""
  return num_prompts if group > 1 and min(slots, num_prompts * group) >= 2 else 0


def generate_continuous(model, params, prompt_PxT, prompt_valid_PxT, keys_Nx2,
                        cfg: SamplingConfig, caps_N=None) -> Rollout:
  """`generate` with per-response keys (N = P x cfg.group), over min(cfg.slots, N) decode slots:
  once a chunk of `refill_rows` slots has stopped (stop token or cap), they take the next pending
  responses before the next step.

  Each slot's cache row holds its prompt in columns [0, T) and its response from T on, as
  `generate` lays out a row, so the two compute the same numbers for a response.
  """
  num, prompt_len = keys_Nx2.shape[0], prompt_PxT.shape[1]
  max_len, num_slots = cfg.max_new_tokens, min(cfg.slots, num)
  if num_slots < 2:   # one slot: the static schedule is the same schedule
    return generate(model, params, prompt_PxT, prompt_valid_PxT, keys_Nx2, cfg, caps_N)
  caps_N = jnp.full((num,), max_len) if caps_N is None else jnp.minimum(caps_N, max_len)
  decoder = model_lib.Transformer(model.cfg, unrolled=True)
  variables = {'params': model_lib.decoding_params(params, model.cfg)}
  cache = shard_cache(model_lib.KVCache.zeros(model.cfg, num_slots, prompt_len + max_len))
  kv_valid_SxC = jnp.ones((num_slots, prompt_len + max_len), bool)
  position0_N = repeat_rows(model_lib.positions_from_valid(prompt_valid_PxT)[:, -1], cfg.group)
  rows = refill_rows(num_slots)
  prompt_kv = (prompt_rows(decoder, variables, prompt_PxT, prompt_valid_PxT, cfg.group)
               if prompt_len > 1 else None)

  def fill(carry):
    cache, kv_valid_SxC, slots, pending = carry
    return refill(prompt_kv, prompt_PxT, prompt_valid_PxT, cfg.group, cache, kv_valid_SxC, slots,
                  pending, rows)

  def can_fill(carry):   # a whole chunk of free slots (or of the prompts left): no wasted rows
    free, left = jnp.sum(~carry[2].active_S), num - carry[3]
    return (left > 0) & (free >= jnp.minimum(rows, left))

  def body(state):
    steps, cache, kv_valid_SxC, slots, pending, out = state
    cache, kv_valid_SxC, slots, pending = jax.lax.while_loop(
        can_fill, fill, (cache, kv_valid_SxC, slots, pending))
    cache, slots, step = decode_slots(decoder, variables, cache, kv_valid_SxC, slots, keys_Nx2,
                                      position0_N, caps_N, prompt_len, cfg)
    at = lambda x, value: x.at[step.row_S, step.t_S].set(value, mode='drop')
    out = jax.tree.map(at, out, (step.token_S, step.logp_S, True, step.experts_SxYxK))
    return steps + 1, cache, kv_valid_SxC, slots, pending, out

  def cond(state):
    return (state[4] < num) | jnp.any(state[3].active_S)

  idle = Slots(jnp.full((num_slots,), num), jnp.zeros((num_slots,), jnp.int32),
               jnp.full((num_slots,), cfg.pad_id, jnp.int32), jnp.zeros((num_slots,), bool))
  out = (jnp.full((num, max_len), cfg.pad_id, jnp.int32), jnp.zeros((num, max_len), jnp.float32),
         jnp.zeros((num, max_len), bool), router.unrecorded(model.cfg, num, max_len))
  state = (jnp.int32(0), cache, kv_valid_SxC, idle, jnp.int32(0), out)
  steps, *_, (tokens_NxL, logp_NxL, mask_NxL, experts_NxLxYxK) = jax.lax.while_loop(
      cond, body, state)
  return finish(tokens_NxL, logp_NxL, mask_NxL, steps, num_slots, experts_NxLxYxK)


# On GPUs XLA runs the whole sampler, its decoding loop included, as ONE CUDA graph (a loop is a
# conditional node): one launch per call, not one per kernel of every step (hundreds per token).
# docs/performance.md
GPU_GRAPHS = dict(xla_gpu_enable_command_buffer='FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,WHILE,'
                                                'CONDITIONAL')


def make_sampler(model, cfg: SamplingConfig):
  """A jitted `(params, prompt_PxT, prompt_valid_PxT, rng, caps_B=None) -> Rollout` of B = P x
  cfg.group responses (compiled once per shape): static batching, or continuous batching over
  `cfg.slots` decode slots with per-response keys. On GPUs compiled with GPU_GRAPHS (a jit with
  compiler options cannot be called inside another jit: elsewhere it has none)."""
  jit = functools.partial(jax.jit, compiler_options=(
      GPU_GRAPHS if jax.default_backend() == 'gpu' else None))
  if cfg.slots:
    return jit(lambda params, prompt, valid, rng, caps=None: generate_continuous(
        model, params, prompt, valid, response_keys(rng, prompt.shape[0] * cfg.group), cfg, caps))
  return jit(lambda params, prompt, valid, rng, caps=None: generate(
      model, params, prompt, valid, rng, cfg, caps))
