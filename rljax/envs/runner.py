"""The host's side of a batch of episodes (rljax.envs): each one's record, state, turns so far and
reward, its steps run in the worker pool (rljax.envs.pool) and every answer screened, so that the
turn loop (rljax.rollout.turns) only appends what comes back.

An answer is untrusted like the step that made it: it must be a Step (rljax.envs) whose
observation is a list of token ids of the environment's tokenizer, at most `max_observation` of
them and none that ends a response or means something else (the end, padding, stop and special
tokens: rljax.envs.screen.control_ids), whose reward is None or a finite number and whose `done`
is a bool. Anything else is an error of one kind (rljax.envs.ERRORS) and the model reads the
environment's error observation, as after a step that raised or hung.
"""
import math
from typing import NamedTuple

import numpy as np

from rljax import envs
from rljax.envs import pool as pool_lib
from rljax.envs import screen

MAX_ANSWER = 1 << 20   # bytes of a step's JSON (its state and observation): far past any real one


class Limits(NamedTuple):
  """What a step may cost (the config's `tools` section): seconds, worker processes at once and
  MiB a worker may allocate above its loaded environment."""
  timeout_s: float = 1.0
  workers: int = 8
  memory_mb: int = 512


def limits(tools):
  return Limits(tools.timeout_s, tools.workers, tools.memory_mb)


# tools.<field>: (type, lowest, highest), each bound included. timeout_s: from 10 ms, below which
# a call's round trip to its worker is most of it, to an hour; workers: processes at once;
# memory_mb: MiB a worker may allocate above its loaded tool; max_calls: a response's tool calls.
BOUNDS = {'timeout_s': (float, 0.01, 3600.0), 'max_calls': (int, 1, 1024),
          'workers': (int, 1, 64), 'memory_mb': (int, 16, 1 << 20)}


def check_limits(tools):
  """Each bounded field of the config's `tools` section a finite number of its type in its range
  (inf, nan and 1e-9 too)."""
  for field, (kind, low, high) in BOUNDS.items():
    value = tools[field]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and (kind is float or isinstance(value, int)) and low <= value <= high):
      noun, bounds = ('a number', f'{low:g}, {high:g}') if kind is float else (
          'an integer', f'{low}, {high}')
      raise ValueError(f'tools.{field} must be {noun} in [{bounds}], got {value!r}')


def check(env):
  """ValueError, one line, for an environment that breaks the contract where it can be seen
  before any step: its attributes and its error observation."""
  for name in ('reset', 'step'):
    if not callable(getattr(env, name, None)):
      raise ValueError(f'environment {type(env).__name__} has no {name}() method')
  tokenizer = env.tokenizer
  for name in ('max_observation', 'max_turns'):
    value = getattr(env, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < (name == 'max_observation'):
      raise ValueError(f'environment {type(env).__name__}: {name} must be an integer >= '
                       f'{int(name == "max_observation")}, got {value!r}')
  turn_end = env.turn_end
  if not _is_id(turn_end, tokenizer) or turn_end in (tokenizer.eos_id, tokenizer.pad_id):
    raise ValueError(f'environment {type(env).__name__}: turn_end must be a token id of its '
                     f'tokenizer other than the end and padding tokens, got {turn_end!r}')
  error = env.error_observation
  kind = error is not None and observation_error(env, error, screen.control_ids(tokenizer))
  if kind:
    raise ValueError(f'environment {type(env).__name__}: error_observation {error!r} is not a '
                     f'valid observation ({kind})')


def _is_id(token, tokenizer):
  return (isinstance(token, int) and not isinstance(token, bool) and
          0 <= token < tokenizer.vocab_size)


def observation_error(env, ids, forbidden):
  """'' for a valid observation, else its error kind."""
  if not isinstance(ids, list) or not ids:
    return 'malformed'
  if not all(_is_id(token, env.tokenizer) for token in ids) or forbidden.intersection(ids):
    return 'bad_result'
  return 'oversize' if len(ids) > env.max_observation else ''


def answer_error(env, value, forbidden):
  """'' for a worker's 'ok' value that is a valid Step, else its error kind."""
  if not (isinstance(value, list) and len(value) == len(envs.Step._fields)):
    return 'malformed'
  step = envs.Step(*value)
  reward_ok = step.reward is None or (isinstance(step.reward, (int, float)) and
                                      not isinstance(step.reward, bool) and
                                      math.isfinite(step.reward))
  if not (reward_ok and isinstance(step.done, bool) and step.error in ('',) + envs.ERRORS):
    return 'malformed'
  return '' if step.done else observation_error(env, step.observation, forbidden)


class Outcome(NamedTuple):
  ids: list     # the observation the response gets (the error observation after a failure)
  error: str    # '' or one of rljax.envs.ERRORS
  resume: bool  # whether the response goes on after it


class Episodes:
  """N episodes of `env` under `limits`, episode n reset from records[n] at its first step;
  responses of at most `budget` tokens."""

  def __init__(self, env, limits, records, budget):
    self.env, self.limits, self.records, self.budget = env, limits, records, budget
    self.forbidden = screen.control_ids(env.tokenizer)
    num = len(records)
    self.states, self.started = [None] * num, np.zeros(num, bool)
    self.turns = [[] for _ in range(num)]   # each episode's turns and observations so far
    self.steps_N, self.appended_N = np.zeros(num, np.int32), np.zeros(num, np.int32)
    self.reward_N = np.full(num, np.nan, np.float32)   # NaN: no step gave a reward
    self.counts = dict.fromkeys(('tool_errors',) + tuple(f'tool_{e}' for e in envs.ERRORS), 0)

  def step(self, episodes, responses):
    """The Outcome of each of `episodes` (indices) whose response so far is `responses`' row,
    the turn_end last; an episode at its max_turns, or done, or without room for the
    observation and one more token, does not resume."""
    todo = [i for i, n in enumerate(episodes) if self.steps_N[n] < self.env.max_turns]
    for i in todo:
      n = episodes[i]
      self.turns[n].append([int(t) for t in responses[i][sum(map(len, self.turns[n])):]])
    answers = self._run([episodes[i] for i in todo])
    outcomes = [Outcome([], '', False)] * len(episodes)
    for i, answer in zip(todo, answers):
      outcomes[i] = self._take(episodes[i], *answer, len(responses[i]))
    return outcomes

  def _run(self, episodes):
    """[(kind, value)] of the steps of `episodes`, run in the pool at once."""
    if not episodes:
      return []
    messages = [dict(turns=self.turns[n], state=self.states[n]) if self.started[n] else
                dict(turns=self.turns[n], record=self.records[n]) for n in episodes]
    pool = pool_lib.pool_for(self.env, self.limits.workers, MAX_ANSWER, self.limits.memory_mb)
    return [answer[:2] for answer in pool.run(messages, self.limits.timeout_s)]

  def _take(self, n, kind, value, length):
    """Episode n after its step's answer (kind, value): its state, reward, turns and counts."""
    self.steps_N[n] += 1
    error = {'ok': '', 'not_data': 'malformed'}.get(kind, kind)
    error = error or answer_error(self.env, value, self.forbidden)
    if error:
      step = envs.Step(self.env.error_observation, self.states[n], error=error)
    else:
      step = envs.Step(*value)
      self.states[n], self.started[n] = step.state, True
      if step.reward is not None:
        self.reward_N[n] = np.nan_to_num(self.reward_N[n]) + step.reward
    if step.error:
      self.counts['tool_errors'] += 1
      self.counts[f'tool_{step.error}'] += 1
    ids = step.observation or []
    resume = (not step.done and step.observation is not None and
              length + len(ids) < self.budget)
    if resume:
      self.turns[n].append(ids)
      self.appended_N[n] += 1
    return Outcome(ids, step.error, resume)

  def stats(self, seconds):
    """The rollout's environment numbers for the training row (`seconds`: host time in steps)."""
    return dict(self.counts, tool_calls=int(np.sum(self.steps_N)), tool_time_s=seconds,
                turns_mean=float(np.mean(1 + self.appended_N)))
