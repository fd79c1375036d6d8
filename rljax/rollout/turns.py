"""Multi-turn rollouts: continuous batching whose responses are episodes of an environment
(rljax.envs; a tool is one kind): a response that ends a turn gets the environment's
observation appended to its KV cache, and decodes on from there.

Token in, token out: a response is one row of tokens, the sampled ones and the observations in
the order they came, and that row is what the trainer reads; nothing is decoded to text and
encoded again between turns. `mask` marks the sampled tokens (the policy loss, the KL and
`logprob_mismatch` are over them), `tool` the observations, which the model attends to but
which are not its actions. A MoE records, for every token of the row, sampled or observed, the
experts each layer routed the forward pass that fed the token before it (the pass whose output
is that position's), as the plain sampler does for router replay (rljax.model.router).

Decoding runs in chunks, one jitted call each (`chunk`): the continuous-batching loop of
rljax.rollout.sampler (`refill`, `decode_slots`), in which a response that samples the
environment's turn-end token (a tool's call-close) waits in its slot, cache and all, while the
other slots decode and refill; the chunk returns once no slot decodes. The host then runs the
waiting responses' steps (rljax.envs.runner), and the next chunk starts by appending their
observations to the cache in one forward pass over the slots (`append`: K columns per slot, each
at its own position). A response ends at the end token, at its token budget (observation tokens
count), at a step that says done, or at a turn it has no steps or room left for. A slot's cache row
holds its prompt in columns [0, T) and its response from T on, as generate_continuous lays it out,
with K more columns of room for an append.
"""
import functools
import time
from typing import NamedTuple

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

from rljax import collective
from rljax.model import router
from rljax.model import transformer as model_lib
from rljax.envs import runner
from rljax.rollout import sampler as sampler_lib
from rljax import sharding


class Turns(NamedTuple):
  """The turn loop between chunks: S slots over N responses of up to L tokens."""
  cache: model_lib.KVCache   # S rows, T + L + K columns
  kv_valid_SxC: jax.Array
  slots: sampler_lib.Slots   # active_S: decoding
  waiting_S: jax.Array       # stopped at a turn's end, holding its slot and cache
  pending: jax.Array         # responses started so far
  tokens_NxL: jax.Array      # sampled tokens and observations, PAD after the end
  logp_NxL: jax.Array        # sampler log-probs of the sampled tokens (0 elsewhere)
  mask_NxL: jax.Array        # True on sampled tokens
  tool_NxL: jax.Array        # True on tools' result tokens
  experts_NxLxYxK: jax.Array  # MoE: each token's experts per layer, -1 after the end (None: dense)
  steps: jax.Array           # decoding steps
  decoded: jax.Array         # slot-steps that decoded a response token


def num_slots(cfg, num):
  """Decode slots of N responses: rollout.slots (0: one per response), at least 2 (a one-row
  KV cache has no batch axis)."""
  return max(2, min(cfg.slots or num, num))


def empty(model_cfg, cfg, room, num, prompt_len):
  """The turn loop before the first chunk: idle slots, no token sampled."""
  slots, max_len = num_slots(cfg, num), cfg.max_new_tokens
  columns = prompt_len + max_len + room
  zeros = lambda *shape, dtype=jnp.int32: jnp.zeros(shape, dtype)
  return Turns(
      cache=sampler_lib.shard_cache(model_lib.KVCache.zeros(model_cfg, slots, columns)),
      kv_valid_SxC=jnp.ones((slots, columns), bool),
      slots=sampler_lib.Slots(jnp.full((slots,), num, jnp.int32), zeros(slots),
                              jnp.full((slots,), cfg.pad_id, jnp.int32), zeros(slots, dtype=bool)),
      waiting_S=zeros(slots, dtype=bool), pending=jnp.int32(0),
      tokens_NxL=jnp.full((num, max_len), cfg.pad_id, jnp.int32),
      logp_NxL=zeros(num, max_len, dtype=jnp.float32), mask_NxL=zeros(num, max_len, dtype=bool),
      tool_NxL=zeros(num, max_len, dtype=bool),
      experts_NxLxYxK=router.unrecorded(model_cfg, num, max_len), steps=jnp.int32(0),
      decoded=jnp.int32(0))


def append(decoder, variables, turns, tool_SxK, length_S, resume_S, position0_N, prompt_len):
  """`turns` with each resumed slot's tool result (its first length_S of tool_SxK) written to its
  response and its cache: one forward pass feeds the call-close token and all but the last result
  token (K tokens per slot from column T - 1 + t), the last is the next one decoding feeds.
  A MoE's experts of feed column k are recorded at result token k, the position its output is
  for. Slots not resumed end their response; the pass writes their K columns from T - 1, which
  the slot's next response writes again before it reads them."""
  slots, num = turns.slots, turns.tokens_NxL.shape[0]
  room = tool_SxK.shape[1]
  t_S = jnp.where(resume_S, slots.t_S, 0)
  feed_SxK = jnp.concatenate([slots.token_S[:, None], tool_SxK[:, :-1]], axis=1)
  positions_SxK = (position0_N[jnp.minimum(slots.response_S, num - 1)] + t_S)[:, None] + (
      jnp.arange(room))
  (_, cache, _), experts_SxKxYxK = model_lib.apply_recording(
      decoder, variables, feed_SxK, turns.kv_valid_SxC, turns.cache, prompt_len - 1 + t_S,
      positions_SxK, method='hidden')
  real_SxK = resume_S[:, None] & (jnp.arange(room) < length_S[:, None])
  row_SxK = jnp.where(real_SxK, slots.response_S[:, None], num)
  column_SxK = t_S[:, None] + jnp.arange(room)
  at = lambda x, value: x.at[row_SxK, column_SxK].set(value, mode='drop')
  last_S = jnp.take_along_axis(tool_SxK, jnp.maximum(length_S - 1, 0)[:, None], axis=1)[:, 0]
  slots = sampler_lib.Slots(slots.response_S, jnp.where(resume_S, slots.t_S + length_S, slots.t_S),
                            jnp.where(resume_S, last_S, slots.token_S), resume_S)
  return turns._replace(cache=cache, slots=slots, waiting_S=jnp.zeros_like(resume_S),
                        tokens_NxL=at(turns.tokens_NxL, tool_SxK),
                        tool_NxL=at(turns.tool_NxL, True),
                        experts_NxLxYxK=jax.tree.map(at, turns.experts_NxLxYxK, experts_SxKxYxK))


def chunk(model, params, turns, tool_SxK, length_S, resume_S, prompt_PxT, valid_PxT, rng,
          cfg: sampler_lib.SamplingConfig, call_id):
  """Appends the resumed slots' observations (`append`), then decodes until no slot decodes:
  every response finished or waiting on a call. Jit with model, cfg and call_id static; response
  n (of N = P x cfg.group) is of prompt n // group and draws token t with fold_in(key_n, t)."""
  num, prompt_len = turns.tokens_NxL.shape[0], prompt_PxT.shape[1]
  decoder = model_lib.Transformer(model.cfg, unrolled=True)
  variables = {'params': model_lib.decoding_params(params, model.cfg)}
  keys_Nx2 = sampler_lib.response_keys(rng, num)
  position0_N = sampler_lib.repeat_rows(
      model_lib.positions_from_valid(valid_PxT)[:, -1], cfg.group)
  caps_N = jnp.full((num,), cfg.max_new_tokens)
  rows = sampler_lib.refill_rows(turns.waiting_S.shape[0])
  prompt_kv = (sampler_lib.prompt_rows(decoder, variables, prompt_PxT, valid_PxT, 1)
               if prompt_len > 1 else None)
  # Always run: with nothing to resume it only writes columns no response reads. (Under lax.cond,
  # the forward pass's collectives deadlocked a mesh of XLA:CPU devices.)
  turns = append(decoder, variables, turns, tool_SxK, length_S, resume_S, position0_N, prompt_len)

  def can_fill(busy, pending):   # a whole chunk of free slots (or of the responses left)
    free, left = jnp.sum(~busy), num - pending
    return (left > 0) & (free >= jnp.minimum(rows, left))

  def fill(carry):
    cache, kv_valid_SxC, slots, pending = carry
    return sampler_lib.refill(prompt_kv, prompt_PxT, valid_PxT, cfg.group, cache, kv_valid_SxC,
                              slots, pending, rows)

  def body(t):
    busy = t.slots._replace(active_S=t.slots.active_S | t.waiting_S)
    cache, kv_valid_SxC, busy, pending = jax.lax.while_loop(
        lambda c: can_fill(c[2].active_S, c[3]), fill, (t.cache, t.kv_valid_SxC, busy, t.pending))
    slots = busy._replace(active_S=busy.active_S & ~t.waiting_S)
    cache, decoded, step = sampler_lib.decode_slots(decoder, variables, cache, kv_valid_SxC, slots,
                                                    keys_Nx2, position0_N, caps_N, prompt_len, cfg)
    call_S = slots.active_S & ~step.stop_S & (step.token_S == call_id)
    keep = lambda new, old: jnp.where(t.waiting_S, old, new)   # a waiting slot stays where it is
    at = lambda x, value: x.at[step.row_S, step.t_S].set(value, mode='drop')
    return t._replace(
        cache=cache, kv_valid_SxC=kv_valid_SxC, pending=pending,
        slots=sampler_lib.Slots(decoded.response_S, keep(decoded.t_S, slots.t_S),
                                keep(decoded.token_S, slots.token_S), decoded.active_S & ~call_S),
        waiting_S=t.waiting_S | call_S, tokens_NxL=at(t.tokens_NxL, step.token_S),
        logp_NxL=at(t.logp_NxL, step.logp_S), mask_NxL=at(t.mask_NxL, True),
        experts_NxLxYxK=jax.tree.map(at, t.experts_NxLxYxK, step.experts_SxYxK),
        steps=t.steps + 1, decoded=t.decoded + jnp.sum(slots.active_S))

  def cond(t):
    return jnp.any(t.slots.active_S) | can_fill(t.slots.active_S | t.waiting_S, t.pending)

  return jax.lax.while_loop(cond, body, turns)


class TurnRollout(NamedTuple):
  rollout: sampler_lib.Rollout   # mask_BxL: the sampled tokens only
  tool_BxL: jax.Array            # True on the observations' tokens
  stats: dict                    # the step's environment numbers (host floats)
  reward_B: np.ndarray           # each episode's reward from its steps, NaN where they gave none

  @property
  def tokens_BxL(self):   # what an evaluator reads of any sampler's output
    return self.rollout.tokens_BxL


class TurnSampler(NamedTuple):
  """The turn loop: called as a sampler, `(params, prompt_PxT, valid_PxT, rng, records) ->
  TurnRollout` (`sample`); its jitted pieces are `chunk(params, turns, tool_SxK, length_S, resume_S,
  prompt_PxT, valid_PxT, rng) -> Turns`, which is what `lower` compiles (rljax.plan),
  `empty(num, prompt_len) -> Turns` and `finish(turns) -> (Rollout, tool_NxL)`."""
  chunk: object
  empty: object
  finish: object
  env: object             # rljax.envs.Environment
  limits: runner.Limits   # what a step may cost
  cfg: sampler_lib.SamplingConfig

  def __call__(self, params, prompt_PxT, valid_PxT, rng, records=None):
    return sample(self, params, prompt_PxT, valid_PxT, rng, records)

  def lower(self, *args):
    return self.chunk.lower(*args)


def make_sampler(model, cfg, env, limits=runner.Limits(), wrap=lambda fn: fn):
  """The TurnSampler of `model` under `cfg` with `env` (rljax.envs) run under `limits`; `wrap`
  puts a jitted function on a mesh (rljax.sharding.on_mesh). ValueError for an environment that
  breaks the contract (rljax.envs.runner.check)."""
  runner.check(env)
  chunk_fn = jax.jit(functools.partial(chunk, model, cfg=cfg, call_id=env.turn_end),
                     donate_argnums=1)
  empty_fn = jax.jit(functools.partial(empty, model.cfg, cfg, env.max_observation),
                     static_argnums=(0, 1))
  return TurnSampler(wrap(chunk_fn), wrap(empty_fn), wrap(jax.jit(finish)), env, limits, cfg)


def draw(sampler, params, prompt_PxT, valid_PxT, rng, records):
  """What any sampler draws for these prompt rows, a turn loop's episodes reset from `records`
  (one per row: {'prompt', 'answer'})."""
  if isinstance(sampler, TurnSampler):
    return sampler(params, prompt_PxT, valid_PxT, rng, records)
  return sampler(params, prompt_PxT, valid_PxT, rng)


def finish(turns):
  """The Rollout of the finished turn loop (a MoE's recorded experts with it), and its
  observation mask."""
  return sampler_lib.finish(turns.tokens_NxL, turns.logp_NxL, turns.mask_NxL, turns.steps,
                            turns.waiting_S.shape[0], turns.experts_NxLxYxK), turns.tool_NxL


def sample(sampler, params, prompt_PxT, valid_PxT, rng, records=None) -> TurnRollout:
  """Responses of P x group rows with their turns: chunks of decoding, each followed by the
  waiting responses' steps on the host, until every response has ended. Response n is an
  episode reset from records[n // group] (None: from {}, for an environment that reads none).
  Over several processes, `records` are the rows this process holds (rljax.sharding.local_rows):
  it runs their episodes' steps, and the observations reach every process."""
  cfg, env = sampler.cfg, sampler.env
  rows_P = sharding.local_rows(prompt_PxT)
  records = [{}] * len(rows_P) if records is None else list(records)
  if len(records) != len(rows_P):
    raise ValueError(f'{len(records)} records for {len(rows_P)} prompt rows')
  mine_N = (rows_P[:, None] * cfg.group + np.arange(cfg.group)).reshape(-1)
  episodes = runner.Episodes(env, sampler.limits, [records[i // cfg.group]
                                                   for i in range(len(mine_N))], cfg.max_new_tokens)
  turns = sampler.empty(prompt_PxT.shape[0] * cfg.group, prompt_PxT.shape[1])
  served = no_observations(turns.waiting_S.shape[0], env.max_observation, cfg.pad_id)
  seconds, chunks = 0.0, 0
  while True:
    turns = sampler.chunk(params, turns, *_placed(served, prompt_PxT), prompt_PxT, valid_PxT, rng)
    chunks += 1
    waiting_S = sharding.to_numpy(turns.waiting_S)
    if not waiting_S.any():
      break
    start = time.perf_counter()
    served = serve(episodes, turns, waiting_S, mine_N, env.max_observation, cfg.pad_id)
    seconds += time.perf_counter() - start
  rollout, tool_NxL = sampler.finish(turns)
  if isinstance(getattr(prompt_PxT, 'sharding', None), jax.sharding.NamedSharding):
    # as a batch is laid out: each process holds its own rows
    rollout, tool_NxL = sharding.split_rows((rollout, tool_NxL), prompt_PxT.sharding.mesh)
  return TurnRollout(rollout, tool_NxL, dict(_every_process(episodes.stats(seconds)),
                                             turn_chunks=chunks), episodes.reward_N)


class Served(NamedTuple):
  """The observations a chunk appends: per slot, its tokens, their count, and whether it goes
  on."""
  tool_SxK: np.ndarray
  length_S: np.ndarray
  resume_S: np.ndarray


def no_observations(slots, room, pad_id):
  return Served(np.full((slots, room), pad_id, np.int32), np.zeros(slots, np.int32),
                np.zeros(slots, bool))


def serve(episodes, turns, waiting_S, mine_N, room, pad_id):
  """Runs the steps of the waiting slots whose responses are `mine_N` (episodes' responses, in
  order; rljax.envs.runner.Episodes.step): the observations of the responses that go on, the
  others end. Every process's, gathered."""
  response_S, t_S = sharding.to_numpy(turns.slots.response_S), sharding.to_numpy(turns.slots.t_S)
  tokens_NxL = sharding.to_numpy(turns.tokens_NxL)
  episode_of = {int(n): i for i, n in enumerate(mine_N)}
  mine_S = waiting_S & np.isin(response_S, mine_N)
  waiting = np.flatnonzero(mine_S)
  outcomes = episodes.step([episode_of[int(response_S[s])] for s in waiting],
                           [tokens_NxL[response_S[s], :t_S[s]] for s in waiting])
  served = no_observations(len(t_S), room, pad_id)
  for s, outcome in zip(waiting, outcomes):
    if outcome.resume:
      length = len(outcome.ids)
      (served.tool_SxK[s, :length], served.length_S[s],
       served.resume_S[s]) = outcome.ids, length, True
  return _from_owners(served, mine_S)


def _from_owners(served, mine_S):
  """Each slot's observation from the process whose response it holds."""
  if jax.process_count() == 1:
    return served
  mine_pxS, *fields = multihost_utils.process_allgather((mine_S, *served))
  owner_S, slots = np.argmax(np.asarray(mine_pxS), axis=0), np.arange(len(mine_S))
  return Served(*(np.asarray(field)[owner_S, slots] for field in fields))


def _placed(served, prompt_PxT):
  """Over several processes, the observations as arrays replicated over the prompts' mesh (a jitted
  call spanning processes takes no host arrays); every process holds the same."""
  if jax.process_count() == 1:
    return served
  return sharding.place(served, prompt_PxT.sharding.mesh)


def _every_process(stats):
  """The environment numbers of every process's episodes (rljax.envs.runner.Episodes.stats): counts
  summed, the host's seconds the slowest process's, turns_mean averaged (each process runs as
  many episodes)."""
  parts = collective.from_every_process(stats)
  combine = dict(tool_time_s=max, turns_mean=lambda values: sum(values) / len(values))
  return {key: combine.get(key, sum)([part[key] for part in parts]) for key in stats}
