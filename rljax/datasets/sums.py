"""Multi-operand addition with the work written out, as a TFDS dataset: responses of uneven length.

A prompt adds k operands ('37+5+82+19='); the reference response writes every running sum, each
step the next operand and the sum so far ('5=42+82=124+19=143'), so a correct response has k - 1
steps: from 4 tokens (k = 2) to ~7 per step at the top of the range. k is drawn with
P(k) proportional to 1/k over [2, max_operands], so most responses are short and a few are long,
the shape of reasoning rollouts. Problems are generated locally from a seed (no download,
identical on every host); test prompts never occur in the train split.
"""

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from rljax.datasets import local

_MAX_DIGITS = 6


@dataclasses.dataclass(eq=False)
class SumsConfig(tfds.core.BuilderConfig):
  """The knobs of one sums dataset; build it with `make_config`."""

  max_operands: int = 12  # k in [2, max_operands]
  digits: int = 2         # operands drawn uniformly from [0, 10**digits), no zero padding
  num_train: int = 100_000
  num_test: int = 1_000
  seed: int = 0


def solution(operands) -> str:
  """The reference response: for each operand after the first, 'operand=running sum', joined by
  '+' ('5=42+82=124' for 37, 5, 82)."""
  total, steps = operands[0], []
  for operand in operands[1:]:
    total += operand
    steps.append(f'{operand}={total}')
  return '+'.join(steps)


def lengths(max_operands, digits):
  """(prompt tokens, longest reference response in tokens, EOS excluded): those of the problem
  whose operands are all 10**digits - 1."""
  largest = 10**digits - 1
  steps = [digits + 1 + len(str(i * largest)) for i in range(2, max_operands + 1)]
  return max_operands * (digits + 1), sum(steps) + len(steps) - 1


def _new_config(max_operands=12, digits=2, num_train=100_000, num_test=1_000,
                seed=0) -> SumsConfig:
  if not 2 <= max_operands <= 64:
    raise ValueError(f'data.max_operands must be in [2, 64], got {max_operands}')
  if not 1 <= digits <= _MAX_DIGITS:
    raise ValueError(f'data.digits must be in [1, {_MAX_DIGITS}] for the sums task, got {digits}')
  local.check_split_knobs(num_train, num_test, seed)
  if num_test * 10 > (10**digits)**2:
    raise ValueError(f'num_test={num_test} is too many distinct problems for {digits}-digit '
                     'operands')
  knobs = dict(max_operands=max_operands, digits=digits, num_train=num_train,
               num_test=num_test, seed=seed)
  return SumsConfig(name=f'k{max_operands}_d{digits}_n{num_train}_t{num_test}_s{seed}',
                    description=f'Running-sum problems with knobs {knobs}.', **knobs)


def _draw(rng, count, config):
  """`count` operand lists, k with P(k) ~ 1/k over [2, max_operands]."""
  ks = np.arange(2, config.max_operands + 1)
  k_N = rng.choice(ks, size=count, p=(1 / ks) / np.sum(1 / ks))
  return [tuple(rng.integers(0, 10**config.digits, size=k).tolist()) for k in k_N]


def _problems(config: SumsConfig):
  """(test, train) operand lists; train problems that hit a test prompt are redrawn."""
  rng = np.random.default_rng(config.seed)
  test = list(dict.fromkeys(_draw(rng, 2 * config.num_test, config)))[:config.num_test]
  if len(test) < config.num_test:
    raise ValueError(f'could not draw {config.num_test} distinct test problems')
  held_out = set(test)
  train = _draw(rng, config.num_train, config)
  for index, operands in enumerate(train):
    while operands in held_out:
      operands = _draw(rng, 1, config)[0]
    train[index] = operands
  return test, train


class Sums(local.LocalBuilder):
  """Multi-operand addition prompts and their worked solutions."""

  BUILDER_CONFIGS = [_new_config()]

  def _splits(self):
    return _problems(self.builder_config)

  def _records(self, problems):
    for operands in problems:
      yield {'prompt': '+'.join(map(str, operands)) + '=', 'answer': solution(operands)}


def make_config(max_operands=12, digits=2, num_train=100_000, num_test=1_000,
                seed=0) -> SumsConfig:
  """Returns the config for these knobs (the predefined one if they match)."""
  return local.predefined_or(Sums, _new_config(max_operands, digits, num_train, num_test, seed))
