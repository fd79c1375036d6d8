"""What the RL loop trains on, found by name like the algorithms: `config.data.name = 'sums'` is
the module rljax.tasks.sums. A task module declares:

  REWARD                      its default verifier (rljax.data.rewards), used when reward='auto'
  check(config)               ValueError for what training it needs and the config lacks (a
                              tokenizer), before any length or model check; planning skips it
  lengths(config)             (prompt tokens, max response tokens incl. the end token, vocabulary
                              size or 0 if only the tokenizer file knows), from the config alone,
                              so they are checked (and planned) before anything is built
  make(config, data_dir)      (tokenizer, train source, test source)

and, if its responses are episodes of an environment (multi-turn rollouts, rljax.rollout.turns;
a tool is one kind):

  env(config)                 its rljax.envs.Environment, from the config alone (run under the
                              config's `tools` limits: rljax.envs.runner.limits)

and, if a record's answer is more than the text a response should be (a reference the verifier
reads, as reasoning_gym's):

  demonstration(answer)       the text the supervised warm start imitates for that answer

So a new task is one new file here; the loop, the planner and the checks are the same for every
task. Modules whose name starts with '_' hold what several tasks share.
"""
import os
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from rljax.data import rewards
from rljax.envs import runner
from rljax import registry


class Task(NamedTuple):
  tokenizer: Any
  train_source: Sequence
  test_source: Sequence
  prompt_len: int        # prompts are left-padded to this many tokens
  max_new_tokens: int    # response budget, end token included
  reward_fn: Any
  env: Any = None        # rljax.envs.Environment, or None: single-turn responses
  demonstration: Any = None   # answer -> the warm start's target text, or None: the answer


def names():
  """The tasks this package holds."""
  return registry.names(sys.modules[__name__])


def get(name):
  """The task module called `name`; ValueError naming the known ones if there is none."""
  return registry.get(sys.modules[__name__], name, 'data.name')


def name_of(config):
  return config.data.name


def check(config, process_count, runs_turns=True):
  """ValueError naming the first bad field that every task reads (the data section, the reward,
  and the prompts each of `process_count` processes reads); for a task whose responses are
  episodes of an environment, a rollout schedule that `runs_turns`, the `tools` limits and a model
  vocabulary of exactly its ids."""
  data, P = config.data, config.rollout.P
  if data.on_bad_record not in ('skip', 'raise'):
    raise ValueError(f"data.on_bad_record must be 'skip' or 'raise', got {data.on_bad_record!r}")
  if data.seed < 0:
    raise ValueError(f'data.seed must be >= 0, got {data.seed}')
  if data.num_train < P:
    raise ValueError(f'data.num_train ({data.num_train}) is smaller than one batch of '
                     f'P = {P} prompts')
  if data.extra_test and data.name != 'arithmetic':
    raise ValueError(f'data.extra_test ({data.extra_test}): only the arithmetic task draws extra '
                     f'held-out problems, not {data.name}')
  held_out = data.num_test + data.extra_test
  if not 1 <= config.train.eval_size <= held_out:
    raise ValueError(f'train.eval_size ({config.train.eval_size}) must be in [1, data.num_test + '
                     f'data.extra_test = {held_out}]')
  if data.dir and os.path.exists(data.dir) and not os.path.isdir(data.dir):
    raise ValueError(f'data.dir {data.dir} exists and is not a directory')
  if config.reward != 'auto' and config.reward not in rewards.REWARDS:
    raise ValueError(f"reward must be 'auto' (the verifier of the task) or one of "
                     f'{sorted(rewards.REWARDS)}, got {config.reward!r}')
  if P % process_count:
    raise ValueError(f'rollout.P ({P}) is not divisible by the {process_count} processes (each '
                     'reads its own slice of the prompts)')
  task = get(name_of(config))
  if hasattr(task, 'env'):
    _check_environment(config, task, runs_turns)


def _check_environment(config, task, runs_turns):
  """A schedule that runs its turns, its limits, and a vocabulary the sampler cannot leave: an id
  the environment's calls and the verifier cannot decode would be sampled otherwise."""
  if not runs_turns:
    raise ValueError(f'rollout.schedule={config.rollout.schedule} does not run tool turns; use '
                     f'rollout.schedule=each_step for the {config.data.name} task')
  runner.check_limits(config.tools)
  _, _, vocab_size = task.lengths(config)
  if vocab_size and config.model.vocab_size != vocab_size:
    raise ValueError(f'model.vocab_size ({config.model.vocab_size}) must equal the '
                     f'{config.data.name} tokenizer\'s {vocab_size} ids: the sampler would write '
                     'ids the environment\'s calls and the reward cannot decode')


def lengths(config):
  """(prompt tokens, max response tokens, vocabulary size or 0): the named task's own."""
  return get(name_of(config)).lengths(config)


def env(config):
  """The named task's environment, or None: its responses are single turns."""
  task = get(name_of(config))
  return task.env(config) if hasattr(task, 'env') else None


def check_needs(config):
  """The named task's own check: what it needs to be built (a tokenizer, a library, its dataset's
  settings). Apart from `check`: a plan of the config needs none of it."""
  get(name_of(config)).check(config)


def make_task(config) -> Task:
  """The task named by config.data.name, built (its dataset prepared if needed)."""
  task = get(name_of(config))
  task.check(config)
  data_dir = config.data.dir or os.path.expanduser('~/.cache/rljax/datasets')
  tokenizer, train_source, test_source = task.make(config, data_dir)
  prompt_len, max_new_tokens, _ = task.lengths(config)
  return Task(tokenizer, train_source, test_source, prompt_len, max_new_tokens,
              reward_fn(config), env(config), getattr(task, 'demonstration', None))


def reward_fn(config):
  """The verifier config.reward names; 'auto': the named task's own."""
  reward = config.reward if config.reward != 'auto' else get(name_of(config)).REWARD
  return rewards.get_reward_fn(reward)
