"""Rollout schedules: where a step's batch comes from. `setup` picks one from the config (`make`)
and `rljax.train.loop.rl_step` calls its `draw` without asking which it is:

  EachStep    'each_step': every step samples G responses to each of its P prompts under the
              current policy;
  Partial     'partial': a pool of 2P groups decoded over continuous-batching slots, whose
              unfinished responses go on decoding at the next step (rljax.rollout.partial);
  DrawnAhead  'drawn_ahead': the sampler, on rollout.devices devices of its own, draws the next
              step's batch while the training devices update on the batch drawn one step before.

`rollout.schedule` names the one a run uses (`kind`).

Each has `init()` (its state in the carry's `rollout` slot, checkpointed; None for EachStep),
`batches(step)` (how many batches of prompts the step takes from the run's stream: a schedule
that holds a batch ahead takes two at the first step) and `draw(params, state, batches, rng, step)
-> (state, Sampled)`. Answers stay on the host: a
schedule that carries a batch between steps keeps them in `answers` (saved in the checkpoint's
meta), keyed by the serial of their group, so no answer length depends on the schedule; the
prompts' stream indices ride beside them in `prompt_ids`, so each step logs which prompts it
trained (WORKDIR/prompts.jsonl).
"""
import math
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from rljax import algos
from rljax import collective
from rljax.data import sources as data
from rljax.rollout import partial as partial_lib
from rljax.rollout import sampler as sampler_lib
from rljax.rollout import turns
from rljax import sharding

step_key = jax.jit(jax.random.fold_in)


class Sampled(NamedTuple):
  """A step's batch on the training mesh: B = P x G responses, group-major."""
  rollout: sampler_lib.Rollout
  prompt_BxT: jax.Array
  valid_BxT: jax.Array
  answers: list   # B answers, on the host: the verifier's input
  stats: dict     # the schedule's own numbers for the training row
  prompt_ids: list   # the P prompts' stream indices (rljax.data.sources.PromptIterator)
  env_rewards: Any = None   # B episode rewards from an environment's steps, NaN where none
  #                           (rljax.envs.reward); None: single-turn responses


class Sampler(NamedTuple):
  """What every schedule samples with."""
  sample: Callable   # (params, prompt_PxT, valid_PxT, rng) -> Rollout of P x group responses
  #                    (with an environment: rljax.rollout.turns.TurnRollout)
  sampling: sampler_lib.SamplingConfig   # its settings; `group`: responses per prompt row
  G: int             # responses per prompt
  tokenizer: Any
  prompt_len: int
  mesh: jax.sharding.Mesh   # the sampler's


def per_response(answers, G):
  """Each of P answers once per response of its group: B = P x G, group-major as the rows are."""
  return [answer for answer in answers for _ in range(G)]


def sample_rollout(sampler, params, examples, rng):
  """G responses to each of the P prompts of `examples`, decoded now, on the sampler's mesh."""
  G = sampler.G
  answers = per_response(examples['answer'], G)
  prompt_PxT, valid_PxT = data.encode_prompts(examples['prompt'], sampler.tokenizer,
                                              sampler.prompt_len)
  repeat = lambda n: sharding.put_batch((np.repeat(prompt_PxT, n, 0), np.repeat(valid_PxT, n, 0)),
                                        sampler.mesh)
  sampled = repeat(G // sampler.sampling.group)   # each sampled row makes `group` responses
  records = [dict(prompt=str(prompt), answer=str(answer)) for prompt, answer in
             zip(examples['prompt'], examples['answer'])
             for _ in range(G // sampler.sampling.group)]
  rollout = turns.draw(sampler.sample, params, *sampled,
                       sharding.move(rng, sharding.replicated(sampler.mesh)), records)
  stats, env_rewards = {}, None
  if isinstance(rollout, turns.TurnRollout):   # an environment's turns: their numbers join the row
    rollout, stats, env_rewards = rollout.rollout, rollout.stats, rollout.reward_B
  prompt_BxT, valid_BxT = sampled if sampler.sampling.group == 1 else repeat(G)
  return Sampled(rollout, prompt_BxT, valid_BxT, answers, stats, list(examples['id']),
                 env_rewards)


class Schedule:
  """What every schedule has: the host state a checkpoint's meta keeps (`state`, `restore`) and
  what the rest of the run asks of its kind: the programs it runs ('sampler': the rollout
  sampler, or its turn loop; 'pool': rljax.rollout.partial's admit and advance, its pool
  replicated) and whether it runs an environment's turns."""
  PROGRAMS = 'sampler'
  RUNS_TURNS = False
  NAME = ''   # its rollout.schedule
  FIRST_BATCHES = 1   # batches of prompts it takes at the first step (then one a step)
  answers = prompt_ids = None   # the prompts it holds between steps

  @staticmethod
  def check(config, device_count, process_count):
    """ValueError naming the first field of `config` this schedule cannot run with."""
    del config, device_count, process_count

  def batches(self, step):
    """How many batches of prompts `draw` takes at `step`."""
    return self.FIRST_BATCHES if step == 1 else 1

  def state(self):
    """The answers and stream indices of the prompts it holds (a checkpoint's meta keeps them)."""
    return dict(answers=self.answers, prompt_ids=self.prompt_ids)

  def restore(self, answers, prompt_ids):
    self.answers, self.prompt_ids = answers, prompt_ids


class EachStep(Schedule):
  """Every step samples its own batch under the current policy (the default)."""
  NAME, RUNS_TURNS = 'each_step', True

  def __init__(self, sampler):
    self.sampler = sampler

  def init(self):
    return None

  def draw(self, params, state, batches, rng, step):
    del step
    examples, = batches
    return state, sample_rollout(self.sampler, params, examples, rng)


class Partial(Schedule):
  """'partial': this step's P prompts join the pool (the first step also admits the next batch, so
  the pool holds two batches of groups: it takes two); decoding under the current policy runs until
  P groups are finished, and those are this step's batch."""
  NAME, PROGRAMS, FIRST_BATCHES = 'partial', 'pool', 2

  @staticmethod
  def check(config, device_count, process_count):
    """Partial rollouts decode whole groups over continuous-batching slots, at one batch."""
    del device_count, process_count
    rollout = config.rollout
    if algos.get(config.algo).BATCH_ARG != 'P':
      raise ValueError(f'the partial schedule trains whole groups of G responses (grpo, rloo), not '
                       f'{config.algo}')
    if rollout.slots < 2:
      raise ValueError(f'the partial schedule needs rollout.slots >= 2 (continuous batching), got '
                       f'{rollout.slots}')
    if not (isinstance(rollout.max_staleness, int) and rollout.max_staleness >= 0):
      raise ValueError(f'rollout.max_staleness must be an integer >= 0, got '
                       f'{rollout.max_staleness!r}')
    if config.auto_batch.enabled:
      raise ValueError('the partial schedule needs a fixed batch: its pool holds two batches of '
                       'groups; turn auto_batch off (P=auto) or choose another rollout.schedule')

  @staticmethod
  def empty_pool(s):
    """The pool of the run of Shape `s` with nothing in it: two batches of free groups."""
    rollout = s.config.rollout
    return partial_lib.empty(s.model.cfg, 2 * rollout.P, rollout.G, s.sampling.slots,
                             s.prompt_len, s.new_tokens, pad_id=s.sampling.pad_id)

  def __init__(self, sampler, programs, rollout_cfg):
    self.sampler = sampler
    self.admit, self.advance, self.pool = programs   # jitted admit and advance; the empty pool
    self.P, self.max_staleness = rollout_cfg.P, rollout_cfg.max_staleness
    self.answers = {}   # str(serial of a group in the pool) -> its answer
    self.prompt_ids = {}   # str(serial) -> its prompt's stream index

  def init(self):
    return self.pool

  def draw(self, params, flight, batches, rng, step):
    admitted = int(sharding.to_numpy(flight.admitted))
    for i, batch in enumerate(map(every_process_batch, batches)):
      prompt_PxT, valid_PxT = data.encode_prompts(batch['prompt'], self.sampler.tokenizer,
                                                  self.sampler.prompt_len)
      caps_N = np.full(len(prompt_PxT) * self.sampler.G, flight.tokens_RxL.shape[1], np.int32)
      flight = self.admit(flight, *sharding.place((prompt_PxT, valid_PxT), self.sampler.mesh),
                          step_key(rng, 100 + i), sharding.place(caps_N, self.sampler.mesh))
      serials = [str(admitted + i * self.P + p) for p in range(len(prompt_PxT))]
      self.answers.update(zip(serials, map(str, batch['answer'])))
      self.prompt_ids.update(zip(serials, batch['id']))
    version = step - 1
    flight, finished = self.advance(params, flight, version, self.max_staleness)
    rollout, version_BxL, prompt_BxT, valid_BxT = sharding.split_rows(
        finished[:4], self.sampler.mesh)
    serials = [str(serial) for serial in sharding.to_numpy(finished.serial_P)]
    answers = per_response([self.answers.pop(serial) for serial in serials], self.sampler.G)
    prompt_ids = [self.prompt_ids.pop(serial) for serial in serials]
    stats = dict(partial_lib.staleness_stats(version_BxL, rollout.mask_BxL, version,
                                             self.max_staleness),
                 restarted=finished.restarted)
    answers, prompt_ids = own_rows(rollout, answers, prompt_ids, self.sampler.G)
    return flight, Sampled(rollout, prompt_BxT, valid_BxT, answers, stats, prompt_ids)


def own_rows(rollout, answers, prompt_ids, G):
  """(answers, prompt_ids) of the rows of `rollout` this process holds, of a batch whose `answers`
  (one per response) and `prompt_ids` (one per group) are every process's."""
  rows_B = sharding.local_rows(rollout.tokens_BxL)
  return [answers[b] for b in rows_B], [prompt_ids[g] for g in np.unique(rows_B // G)]


def every_process_batch(examples):
  """The prompts, answers and stream indices of every process's `examples`, in process order: the
  batch one process would read (rljax.data.sources.PromptIterator)."""
  local = {key: [value.item() if hasattr(value, 'item') else value for value in examples[key]]
           for key in ('prompt', 'answer', 'id')}
  parts = collective.from_every_process(local)
  return {key: [value for part in parts for value in part[key]] for key in local}


class DrawnAhead(Schedule):
  """'drawn_ahead': the sampler's devices (rollout.devices) draw the next batch from the policy
  before this step's update, while the training devices update on the batch drawn one step
  earlier: every batch is one policy version old (the first two from the initial one, so the
  first step takes two batches)."""
  NAME, FIRST_BATCHES = 'drawn_ahead', 2

  @staticmethod
  def check(config, device_count, process_count):
    """The sampler on devices of its own, one step behind."""
    rollout = config.rollout
    if not (isinstance(rollout.devices, int) and 0 < rollout.devices < device_count):
      raise ValueError(f'the drawn_ahead schedule needs rollout.devices, the sampler\'s devices, '
                       f'an integer in [1, {device_count}), got {rollout.devices!r}')
    if config.auto_batch.enabled:
      raise ValueError('the drawn_ahead schedule needs a fixed batch: the batch drawn ahead has '
                       'its size; turn auto_batch off (P=auto) or choose another rollout.schedule')
    if process_count > 1 and jax.default_backend() == 'tpu':
      raise ValueError('the drawn_ahead schedule runs on one TPU host: a share of every host of a '
                       'slice is no box of its torus, which XLA:TPU does not compile for, and '
                       'whole hosts would need a transfer between device sets that '
                       'multi-controller JAX lacks')
    if rollout.devices % process_count:
      raise ValueError(f'rollout.devices ({rollout.devices}) must split evenly over the '
                       f'{process_count} processes (each gives the sampler as many of its devices)')
    sizes = sharding.mesh_shape(config.mesh, rollout.devices)
    data_parallel = math.prod(sizes[axis] for axis in sharding.BATCH_AXES)
    if rollout.P * rollout.G % data_parallel:
      raise ValueError(f'the batch P*G ({rollout.P * rollout.G}) is not divisible by the '
                       f'sampler mesh\'s data-parallel size {data_parallel} (rollout.devices '
                       f'{rollout.devices}, mesh {sizes})')

  def __init__(self, sampler, to_sampler, mesh, empty):
    self.sampler, self.to_sampler, self.mesh, self.empty = sampler, to_sampler, mesh, empty
    self.answers = []   # the P answers of the batch drawn ahead, every process's
    self.prompt_ids = []   # its P prompts' stream indices

  def init(self):
    return self.empty

  def _draw(self, params, examples, rng):
    sampled = sample_rollout(self.sampler, params, examples, rng)
    ahead = dict(rollout=sampled.rollout, prompt_BxT=sampled.prompt_BxT,
                 valid_BxT=sampled.valid_BxT)
    batch = every_process_batch(examples)
    return ahead, list(map(str, batch['answer'])), batch['id']

  def draw(self, params, ahead, batches, rng, step):
    del step
    params, answers, prompt_ids = self.to_sampler(params), self.answers, self.prompt_ids
    *first, examples = batches
    if first:   # nothing drawn ahead yet: the first batch is drawn now, from the same policy
      ahead, answers, prompt_ids = self._draw(params, first[0], step_key(rng, 100))
    # runs on while this step updates
    drawn, self.answers, self.prompt_ids = self._draw(params, examples, rng)
    ahead = sharding.split_rows(ahead, self.mesh)
    answers, prompt_ids = own_rows(ahead['rollout'], per_response(answers, self.sampler.G),
                                   prompt_ids, self.sampler.G)
    return drawn, Sampled(ahead['rollout'], ahead['prompt_BxT'], ahead['valid_BxT'], answers, {},
                          prompt_ids)


def empty_ahead(sampler, params, P):
  """'drawn_ahead': the batch drawn ahead as zeros laid out where the sampler leaves it: what a
  checkpoint restores it into."""
  rows = P * sampler.G
  prompt = jax.ShapeDtypeStruct((rows // sampler.sampling.group, sampler.prompt_len), np.int32)
  valid = jax.ShapeDtypeStruct(prompt.shape, np.bool_)
  with jax.set_mesh(sampler.mesh):
    rollout = jax.eval_shape(sampler.sample, params, prompt, valid, jax.random.PRNGKey(0))
  ahead = dict(rollout=rollout,
               prompt_BxT=jax.ShapeDtypeStruct((rows, sampler.prompt_len), np.int32),
               valid_BxT=jax.ShapeDtypeStruct((rows, sampler.prompt_len), np.bool_))
  zeros = lambda x: jax.device_put(np.zeros(x.shape, x.dtype),
                                   sharding.batch_sharding(sampler.mesh, x.ndim))
  return jax.tree.map(zeros, ahead)


def sampler_group(config, mesh):
  """Responses per prompt the sampler makes from one prefill of it: rollout.G when the P prompt
  rows split evenly over the data-parallel devices of its `mesh`, else 1 (the prompts repeated G
  times)."""
  if config.rollout.P % sharding.data_parallel_size(mesh):
    return 1
  return config.rollout.G


def sampling_config(config, new_tokens, group, eos_id=1, pad_id=0):
  """The rollout sampler's settings for `config`, the one place they are made (the evaluator's
  are these, greedy: rljax.train.programs.greedy). The stop and padding ids: the task
  tokenizer's; by default the character tokenizer's, which a plan, building no tokenizer, uses."""
  rollout = config.rollout
  return sampler_lib.SamplingConfig(
      max_new_tokens=new_tokens, eos_id=eos_id, pad_id=pad_id, temperature=rollout.temperature,
      top_k=rollout.top_k, top_p=rollout.top_p, slots=rollout.slots, group=group)


def check(config, device_count, process_count):
  """ValueError naming the first bad field of the rollout section: the sampler's settings, then
  the schedule's."""
  rollout, t = config.rollout, config.rollout.temperature
  if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
    raise ValueError(f'rollout.temperature must be a positive number, got {t!r}')
  if not 0 < rollout.top_p <= 1:
    raise ValueError(f'rollout.top_p must be in (0, 1], got {rollout.top_p}')
  if rollout.slots < 0:
    raise ValueError(f'rollout.slots must be >= 0 (0: static batching), got {rollout.slots}')
  if rollout.top_k < 0 or rollout.max_new_tokens < 0:
    raise ValueError(f'rollout.top_k and max_new_tokens must be >= 0 (0: off / from the task), got '
                     f'{rollout.top_k} and {rollout.max_new_tokens}')
  if rollout.schedule not in SCHEDULES:
    raise ValueError(f'rollout.schedule must be one of {sorted(SCHEDULES)}, got '
                     f'{rollout.schedule!r}')
  if rollout.devices and rollout.schedule != DrawnAhead.NAME:
    raise ValueError(f'rollout.devices ({rollout.devices}) gives the drawn_ahead schedule\'s '
                     f'sampler its devices; set rollout.schedule=drawn_ahead or rollout.devices=0')
  schedule = kind(config)
  schedule.check(config, device_count, process_count)


SCHEDULES = {schedule.NAME: schedule for schedule in (EachStep, Partial, DrawnAhead)}


def kind(config):
  """The schedule class `config` asks for: the one place that reads which."""
  return SCHEDULES[config.rollout.schedule]


def make(config, s, sampler, programs, to_sampler):
  """The schedule of `config` for the run of Shape `s`, sampling with `sampler` and, for
  'partial', `programs` (rljax.train.programs)."""
  schedule = kind(config)
  if schedule is Partial:
    return Partial(sampler, (programs['admit'].fn, programs['advance'].fn,
                             sharding.place(Partial.empty_pool(s), s.mesh)), config.rollout)
  if schedule is DrawnAhead:
    return DrawnAhead(sampler, to_sampler, s.mesh,
                      empty_ahead(sampler, s.sampler_params, config.rollout.P))
  return EachStep(sampler)
