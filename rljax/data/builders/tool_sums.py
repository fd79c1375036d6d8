"""Long additions that a calculator tool solves, as a TFDS dataset: the tool task's data
(rljax.tasks.tool_sums).

A prompt adds k operands of up to `digits` digits ('52817+90412='); the reference answer is the
sum ('143229'). A `demo_frac` share of the train records answer instead with a demonstration of
the call ('[52817+90412]{143229}143229': the call between '[' and ']', the calculator's result
between '{' and '}', then the answer), which the supervised warm start imitates with the result
masked out (it is the tool's, not the policy's); test answers are always the bare sum. k is
uniform over [2, max_operands]. Problems are generated locally from a seed; test prompts never
occur in the train split.
"""

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from rljax.data.builders import local

CALL = '[{call}]{{{result}}}{result}'   # a demonstration: the call, the tool's result, the answer
MAX_DIGITS = 12   # rljax.envs.calculator's longest operand


@dataclasses.dataclass(eq=False)
class ToolSumsConfig(tfds.core.BuilderConfig):
  """The knobs of one dataset; build it with `make_config`."""

  max_operands: int = 2   # k in [2, max_operands]
  digits: int = 5         # operands drawn uniformly from [0, 10**digits)
  demo_frac: float = 0.25  # train records answered by a demonstration of the call
  num_train: int = 100_000
  num_test: int = 1_000
  seed: int = 0


def demonstration(operands) -> str:
  """The call, the calculator's result and the answer: '[a+b]{s}s'."""
  return CALL.format(call='+'.join(map(str, operands)), result=sum(operands))


def lengths(max_operands, digits):
  """(prompt tokens, longest demonstration in tokens, EOS excluded): those of the problem whose
  operands are all 10**digits - 1."""
  largest = [10**digits - 1] * max_operands
  return max_operands * (digits + 1), len(demonstration(largest))


def _new_config(max_operands=2, digits=5, demo_frac=0.25, num_train=100_000, num_test=1_000,
                seed=0) -> ToolSumsConfig:
  if not 2 <= max_operands <= 8:
    raise ValueError(f'data.max_operands must be in [2, 8] for the tool_sums task, got '
                     f'{max_operands}')
  if not 1 <= digits <= MAX_DIGITS:
    raise ValueError(f'data.digits must be in [1, {MAX_DIGITS}] for the tool_sums '
                     f'task (the calculator\'s operands), got {digits}')
  if not 0 <= demo_frac <= 1:
    raise ValueError(f'data.demo_frac must be in [0, 1], got {demo_frac}')
  local.check_split_knobs(num_train, num_test, seed)
  if num_test * 10 > 100**digits:
    raise ValueError(f'num_test={num_test} is more than a tenth of the {100**digits} two-operand '
                     f'problems of {digits} digit(s)')
  knobs = dict(max_operands=max_operands, digits=digits, demo_frac=demo_frac,
               num_train=num_train, num_test=num_test, seed=seed)
  return ToolSumsConfig(
      name=f'k{max_operands}_d{digits}_demo{demo_frac:g}_n{num_train}_t{num_test}_s{seed}',
      description=f'Long additions with a calculator, knobs {knobs}.', **knobs)


def _operands(rng, config):
  k = int(rng.integers(2, config.max_operands + 1))
  return tuple(int(x) for x in rng.integers(0, 10**config.digits, size=k))


def _problems(config: ToolSumsConfig):
  """(test, train): distinct test operand lists; train ones (redrawn when they hit a test one),
  each with whether its answer demonstrates the call."""
  rng = np.random.default_rng(config.seed)
  test = {}
  while len(test) < config.num_test:
    test[_operands(rng, config)] = None
  train = []
  for _ in range(config.num_train):
    operands = _operands(rng, config)
    while operands in test:
      operands = _operands(rng, config)
    train.append((operands, bool(rng.random() < config.demo_frac)))
  return [(operands, False) for operands in test], train


class ToolSums(local.LocalBuilder):
  """Long-addition prompts, their sums, and demonstrations of the calculator call."""

  BUILDER_CONFIGS = [_new_config()]

  def _splits(self):
    return _problems(self.builder_config)

  def _records(self, problems):
    for operands, demo in problems:
      yield {'prompt': '+'.join(map(str, operands)) + '=',
             'answer': demonstration(operands) if demo else str(sum(operands))}


def make_config(max_operands=2, digits=5, demo_frac=0.25, num_train=100_000, num_test=1_000,
                seed=0) -> ToolSumsConfig:
  """Returns the config for these knobs (the predefined one if they match)."""
  return local.predefined_or(ToolSums, _new_config(max_operands, digits, demo_frac, num_train,
                                                   num_test, seed))
