"""Partial rollouts: continuous batching whose unfinished responses outlive the step.

The sampler holds a pool of Q GRPO groups (Q x G response records) and S decode slots. Each call
(`advance`) decodes until P groups have all G responses finished, returns those P (the oldest
finished first) and keeps the rest where they are: responses still in a slot keep their tokens,
KV cache and slot, and continue at the next call under that call's parameters; responses not yet
started wait. A step therefore never waits for the longest response of its own batch. `admit`
puts the next P prompts' groups into the pool's free places.

Every sampled token records the policy version that drew it (`version_RxL`), its log-prob under
that policy (the behaviour log-prob the off-policy correction reweights, rljax.policy_loss) and,
for a MoE, the experts it was routed to (`experts_RxLxYxK`, what router replay trains with).
Staleness rule: at the start of a call under version v, a response holding a token older than
v - max_staleness is dropped and resampled from its prompt (same key) under the new policy; its
group waits for it, so groups stay whole and no response is lost or trained twice.
"""
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rljax.model import router
from rljax.model import transformer as model_lib
from rljax.rollout import sampler as sampler_lib

EMPTY, PENDING, DECODING, DONE = 0, 1, 2, 3
NEVER = jnp.iinfo(jnp.int32).max   # sorts after every real priority


class Flight(NamedTuple):
  """The pool between calls: R = Q x G records (group q's in rows q*G .. q*G+G-1), S slots."""
  prompt_RxT: jax.Array
  valid_RxT: jax.Array
  key_Rx2: jax.Array        # per-response key: token t draws with fold_in(key, t)
  cap_R: jax.Array          # response budget
  serial_Q: jax.Array       # admission order of the group (-1: free place)
  status_R: jax.Array       # EMPTY, PENDING, DECODING or DONE
  tokens_RxL: jax.Array
  logp_RxL: jax.Array       # behaviour log-probs
  mask_RxL: jax.Array
  version_RxL: jax.Array    # the policy version that sampled each token
  experts_RxLxYxK: jax.Array   # MoE: each token's experts per layer (sampler.Rollout); else None
  slots: sampler_lib.Slots  # response_S: record index, or R when idle
  cache: model_lib.KVCache  # one row per slot, laid out as generate_continuous's
  kv_valid_SxC: jax.Array
  admitted: jax.Array       # groups admitted so far


def empty(model_cfg, groups, group, slots, prompt_len, max_len, pad_id=0):
  """A pool of `groups` free groups of `group` responses and `slots` idle decode slots. What a
  caller keeps per group (an answer) stays with the caller, keyed by the group's serial."""
  num = groups * group
  zeros = lambda *shape, dtype=jnp.int32: jnp.zeros(shape, dtype)
  return Flight(
      prompt_RxT=jnp.full((num, prompt_len), pad_id, jnp.int32),
      valid_RxT=zeros(num, prompt_len, dtype=bool),
      key_Rx2=zeros(num, 2, dtype=jnp.uint32), cap_R=zeros(num),
      serial_Q=jnp.full((groups,), -1, jnp.int32), status_R=zeros(num),
      tokens_RxL=jnp.full((num, max_len), pad_id, jnp.int32),
      logp_RxL=zeros(num, max_len, dtype=jnp.float32), mask_RxL=zeros(num, max_len, dtype=bool),
      version_RxL=zeros(num, max_len), experts_RxLxYxK=router.unrecorded(model_cfg, num, max_len),
      slots=sampler_lib.Slots(jnp.full((slots,), num, jnp.int32), zeros(slots),
                              jnp.full((slots,), pad_id, jnp.int32), zeros(slots, dtype=bool)),
      cache=sampler_lib.shard_cache(model_lib.KVCache.zeros(model_cfg, slots,
                                                            prompt_len + max_len)),
      kv_valid_SxC=jnp.ones((slots, prompt_len + max_len), bool), admitted=jnp.int32(0))


def _reset(flight, records_K, status, pad_id):
  """`flight` with the records `records_K` (R: none) cleared to `status`, no token sampled."""
  at = lambda x, value: x.at[records_K].set(value, mode='drop')
  return flight._replace(status_R=at(flight.status_R, status),
                         tokens_RxL=at(flight.tokens_RxL, pad_id),
                         logp_RxL=at(flight.logp_RxL, 0.0), mask_RxL=at(flight.mask_RxL, False),
                         version_RxL=at(flight.version_RxL, 0),
                         experts_RxLxYxK=jax.tree.map(lambda x: at(x, -1),
                                                      flight.experts_RxLxYxK))


def admit(flight, prompt_PxT, valid_PxT, rng, caps_N, pad_id=0):
  """The P groups of these prompts (N = P x G responses, group-major, response n's key
  fold_in(rng, n)) in the first P free places, serials `admitted` on; the pool must have them
  (after `advance` it has exactly the P places it returned)."""
  groups, P = flight.serial_Q.shape[0], prompt_PxT.shape[0]
  group = flight.status_R.shape[0] // groups
  place_P = jnp.argsort(flight.serial_Q >= 0, stable=True)[:P]   # free places first
  rows_N = (place_P[:, None] * group + jnp.arange(group)).reshape(-1)
  repeat = lambda x: jnp.repeat(x, group, axis=0)
  flight = flight._replace(
      prompt_RxT=flight.prompt_RxT.at[rows_N].set(repeat(prompt_PxT)),
      valid_RxT=flight.valid_RxT.at[rows_N].set(repeat(valid_PxT)),
      key_Rx2=flight.key_Rx2.at[rows_N].set(sampler_lib.response_keys(rng, P * group)),
      cap_R=flight.cap_R.at[rows_N].set(caps_N),
      serial_Q=flight.serial_Q.at[place_P].set(flight.admitted + jnp.arange(P)),
      admitted=flight.admitted + P)
  return _reset(flight, rows_N, PENDING, pad_id)


def restart_stale(flight, version, max_staleness, pad_id=0):
  """Drops every started response holding a token older than version - max_staleness: it is
  resampled from its prompt (its slot, if it had one, is freed). Returns (flight, count)."""
  num = flight.status_R.shape[0]
  oldest_R = jnp.min(jnp.where(flight.mask_RxL, flight.version_RxL, NEVER), axis=1)
  stale_R = (flight.status_R >= DECODING) & (oldest_R < version - max_staleness)
  slots = flight.slots
  held_S = stale_R[jnp.minimum(slots.response_S, num - 1)] & slots.active_S
  flight = flight._replace(slots=slots._replace(active_S=slots.active_S & ~held_S))
  return _reset(flight, jnp.where(stale_R, jnp.arange(num), num), PENDING, pad_id), jnp.sum(stale_R)


def complete_groups(status_R, groups):
  """Groups whose every response is finished."""
  return jnp.all(status_R.reshape(groups, -1) == DONE, axis=1)


def queue(flight):
  """The pending responses, oldest group first and then by index in the group, and their count:
  the order refills take them in. Nothing turns pending during a call, so it holds for the call."""
  num, groups = flight.status_R.shape[0], flight.serial_Q.shape[0]
  group = num // groups
  pending_R = flight.status_R == PENDING
  priority_R = jnp.where(pending_R, jnp.repeat(flight.serial_Q, group) * group
                         + jnp.arange(num) % group, NEVER)
  return jnp.argsort(priority_R), jnp.sum(pending_R)


class Prompts(NamedTuple):
  """Prompt caches of the pool's groups under this call's parameters, by place (Q rows, T - 1
  columns): the first `ready` groups of the call's group order have theirs."""
  kv: model_lib.KVCache
  ready: jax.Array


def group_order(flight):
  """The pool's places in the order the queue reaches their groups: those with pending responses,
  oldest first, then the rest."""
  groups = flight.serial_Q.shape[0]
  pending_Q = jnp.any(flight.status_R.reshape(groups, -1) == PENDING, axis=1)
  return jnp.argsort(jnp.where(pending_Q, flight.serial_Q, NEVER))


def prefill_next(decoder, variables, flight, order_Q, prompts, count, needed=True):
  """`prompts` with the next `count` groups of `order_Q` prefilled, if `needed` (a traced bool
  skips the prefill when false). Only the new rows pass through the branch: with the whole cache
  in it, XLA copies the cache at every refill."""
  num, groups = flight.status_R.shape[0], flight.serial_Q.shape[0]
  rank_C = prompts.ready + jnp.arange(count)
  place_C = jnp.where((rank_C < groups) & needed, order_Q[jnp.minimum(rank_C, groups - 1)],
                      groups)
  first_C = jnp.minimum(place_C, groups - 1) * (num // groups)
  run = lambda: sampler_lib.prompt_cache(decoder, variables, flight.prompt_RxT[first_C],
                                         flight.valid_RxT[first_C])
  kv_C = run() if needed is True else jax.lax.cond(
      needed, run, lambda: jax.tree.map(jnp.zeros_like, jax.eval_shape(run)))
  put = lambda big, small: big.at[place_C].set(small.reshape(count, *small.shape[-3:]),
                                              mode='drop')
  return Prompts(jax.tree.map(put, prompts.kv, kv_C), prompts.ready + count * needed)


def refill(prompt_kv, flight, queue_R, head, tail, rows):
  """The next `rows` responses of the queue (`queue_R[head:tail]`) into the first free slots
  (fewer when fewer are free or queued), each with its group's prompt cache rows from
  `prompt_kv` (Prompts.kv). Returns (flight, the queue's new head)."""
  num, prompt_len = flight.prompt_RxT.shape
  group = num // flight.serial_Q.shape[0]
  pick_K = queue_R[jnp.minimum(head + jnp.arange(rows), num - 1)]
  prompt_kv_K = (jax.tree.map(lambda every: every[pick_K // group], prompt_kv)
                 if prompt_len > 1 else None)
  cache, kv_valid_SxC, slots, taken_K = sampler_lib.fill_slots(
      flight.cache, flight.kv_valid_SxC, flight.slots, pick_K, prompt_kv_K,
      flight.valid_RxT[pick_K], flight.prompt_RxT[pick_K, -1], tail - head)
  status_R = flight.status_R.at[jnp.where(taken_K, pick_K, num)].set(DECODING, mode='drop')
  return flight._replace(cache=cache, kv_valid_SxC=kv_valid_SxC, slots=slots,
                         status_R=status_R), head + jnp.sum(taken_K)


class Finished(NamedTuple):
  """The P groups a call returns (B = P x G rows, group-major)."""
  rollout: sampler_lib.Rollout
  version_BxL: jax.Array
  prompt_BxT: jax.Array
  valid_BxT: jax.Array
  serial_P: jax.Array     # each group's serial (admission order)
  restarted: jax.Array    # responses dropped for staleness at the start of the call


def advance(model, params, flight, version, max_staleness, cfg: sampler_lib.SamplingConfig,
            num_groups):
  """Decodes under `params` (policy `version`) until `num_groups` groups are finished; returns
  (flight without them, Finished). Jit with model, cfg and num_groups static."""
  flight, restarted = restart_stale(flight, version, max_staleness, cfg.pad_id)
  num, prompt_len = flight.prompt_RxT.shape
  groups = flight.serial_Q.shape[0]
  group, num_slots = num // groups, flight.slots.active_S.shape[0]
  decoder = model_lib.Transformer(model.cfg, unrolled=True)
  variables = {'params': model_lib.decoding_params(params, model.cfg)}
  position0_R = model_lib.positions_from_valid(flight.valid_RxT)[:, -1]
  rows = sampler_lib.refill_rows(num_slots)
  queue_R, tail = queue(flight)
  # Prompts are prefilled under this call's parameters (a carried response keeps the cache it
  # has), in the queue's group order: `num_groups` up front, then `rows` more whenever a refill
  # reaches past them, as a call starts about num_groups groups of the pool's 2 x num_groups.
  order_Q = group_order(flight)
  rank_Q = jnp.zeros_like(order_Q).at[order_Q].set(jnp.arange(groups))
  prefill = functools.partial(prefill_next, decoder, variables, flight, order_Q)
  prompts = Prompts(None, jnp.int32(0))
  if prompt_len > 1:
    prompts = prefill(prompts._replace(kv=sampler_lib.shard_cache(
        model_lib.KVCache.zeros(model.cfg, groups, prompt_len - 1))), min(groups, num_groups))

  def can_fill(carry):   # a whole chunk of free slots (or of the queued responses)
    head, free = carry[0], jnp.sum(~carry[2]['slots'].active_S)
    return (head < tail) & (free >= jnp.minimum(rows, tail - head))

  fixed = flight   # the fields no decoding step changes ride outside the loops
  whole = lambda fields: fixed._replace(**fields)

  def body(state):
    steps, decoded, head, prompts, fields = state

    def fill(carry):   # a refill takes min(rows, tail - head) responses: at most `rows` groups
      head, prompts, refilled = carry
      if prompt_len > 1:
        last = rank_Q[queue_R[jnp.minimum(head + rows, tail) - 1] // group]
        prompts = prefill(prompts, rows, last >= prompts.ready)
      flight, head = refill(prompts.kv, whole(dict(fields, **refilled)), queue_R, head, tail,
                            rows)
      return head, prompts, changing(flight, REFILLED)
    head, prompts, refilled = jax.lax.while_loop(
        can_fill, fill, (head, prompts, changing(whole(fields), REFILLED)))
    flight = whole(dict(fields, **refilled))
    decoded += jnp.sum(flight.slots.active_S)
    flight = decode_step(decoder, variables, flight, position0_R, version, cfg)
    return steps + 1, decoded, head, prompts, changing(flight, DECODED)

  def cond(state):
    head, flight = state[2], whole(state[4])
    busy = jnp.any(flight.slots.active_S) | (head < tail)
    return (jnp.sum(complete_groups(flight.status_R, groups)) < num_groups) & busy

  steps, decoded, _, _, fields = jax.lax.while_loop(
      cond, body, (jnp.int32(0), jnp.int32(0), jnp.int32(0), prompts, changing(flight, DECODED)))
  return take_finished(whole(fields), steps, decoded, num_groups, restarted)


def decode_step(decoder, variables, flight, position0_R, version, cfg):
  """One token for every busy slot, written to its response with the policy version; a response
  that samples the stop token or reaches its cap is done and frees its slot."""
  cache, slots, step = sampler_lib.decode_slots(
      decoder, variables, flight.cache, flight.kv_valid_SxC, flight.slots, flight.key_Rx2,
      position0_R, flight.cap_R, flight.prompt_RxT.shape[1], cfg)
  num = flight.status_R.shape[0]
  at = lambda x, value: x.at[step.row_S, step.t_S].set(value, mode='drop')
  return flight._replace(
      cache=cache, slots=slots, tokens_RxL=at(flight.tokens_RxL, step.token_S),
      logp_RxL=at(flight.logp_RxL, step.logp_S), mask_RxL=at(flight.mask_RxL, True),
      version_RxL=at(flight.version_RxL, version),
      experts_RxLxYxK=jax.tree.map(at, flight.experts_RxLxYxK, step.experts_SxYxK),
      status_R=flight.status_R.at[jnp.where(step.stop_S, step.row_S, num)].set(DONE, mode='drop'))


# What a refill changes, and what a decoding step changes: only these ride in the loops' carries.
REFILLED = ('cache', 'kv_valid_SxC', 'slots', 'status_R')
DECODED = REFILLED + ('tokens_RxL', 'logp_RxL', 'mask_RxL', 'version_RxL', 'experts_RxLxYxK')


def changing(flight, names):
  return {name: getattr(flight, name) for name in names}


def take_finished(flight, steps, decoded, num_groups, restarted):
  """The `num_groups` oldest finished groups out of the pool, their places freed."""
  num, groups = flight.status_R.shape[0], flight.serial_Q.shape[0]
  group, num_slots = num // groups, flight.slots.active_S.shape[0]
  order = jnp.where(complete_groups(flight.status_R, groups), flight.serial_Q, NEVER)
  place_P = jnp.argsort(order, stable=True)[:num_groups]
  rows_B = (place_P[:, None] * group + jnp.arange(group)).reshape(-1)
  mask_BxL = flight.mask_RxL[rows_B]
  rollout = sampler_lib.Rollout(
      flight.tokens_RxL[rows_B], flight.logp_RxL[rows_B], mask_BxL, jnp.sum(mask_BxL, axis=1),
      steps, decoded.astype(jnp.float32) / jnp.maximum(steps * num_slots, 1).astype(jnp.float32),
      jax.tree.map(lambda x: x[rows_B], flight.experts_RxLxYxK))
  finished = Finished(rollout, flight.version_RxL[rows_B], flight.prompt_RxT[rows_B],
                      flight.valid_RxT[rows_B], flight.serial_Q[place_P], restarted)
  flight = flight._replace(status_R=flight.status_R.at[rows_B].set(EMPTY),
                           serial_Q=flight.serial_Q.at[place_P].set(-1))
  return flight, finished


def staleness_stats(version_BxL, mask_BxL, version, max_staleness):
  """Per-token staleness (versions between the sampling policy and the trained one) of a batch:
  mean, max and the fraction at each value 0 .. max_staleness."""
  stale_BxL = version - version_BxL
  stats = dict(staleness_mean=jnp.sum(stale_BxL * mask_BxL) / jnp.maximum(jnp.sum(mask_BxL), 1),
               staleness_max=jnp.max(jnp.where(mask_BxL, stale_BxL, 0)))
  for k in range(max_staleness + 1):
    stats[f'staleness_frac_{k}'] = (jnp.sum((stale_BxL == k) & mask_BxL)
                                    / jnp.maximum(jnp.sum(mask_BxL), 1))
  return stats
