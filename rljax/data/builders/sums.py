"""Multi-operand addition with the work written out, as a TFDS dataset: responses of uneven length.

A prompt adds k operands ('3+5+8+9='); the reference response writes every running sum, each
step the next operand and the sum so far ('5=8+8=16+9=25'), so a correct response has k - 1
steps: 4 tokens with the end token at k = 2, then up to 5 more per step (1-digit operands). k is
drawn with P(k) proportional to 1/k over [2, max_operands], so most responses are short and a few
are long, the shape of reasoning rollouts. Problems are generated locally from a seed (no
download, identical on every host); test prompts never occur in the train split.
"""

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from rljax.data.builders import local

_MAX_DIGITS = 6


@dataclasses.dataclass(eq=False)
class SumsConfig(tfds.core.BuilderConfig):
  """The knobs of one sums dataset; build it with `make_config`."""

  max_operands: int = 8   # k in [2, max_operands]
  digits: int = 1         # operands drawn uniformly from [0, 10**digits), no zero padding
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


def problem_count(max_operands, digits):
  """How many distinct problems there are: (10**digits)**k operand lists for each k."""
  return sum(10**(digits * k) for k in range(2, max_operands + 1))


def _new_config(max_operands=8, digits=1, num_train=100_000, num_test=1_000,
                seed=0) -> SumsConfig:
  if not 2 <= max_operands <= 64:
    raise ValueError(f'data.max_operands must be in [2, 64], got {max_operands}')
  if not 1 <= digits <= _MAX_DIGITS:
    raise ValueError(f'data.digits must be in [1, {_MAX_DIGITS}] for the sums task, got {digits}')
  local.check_split_knobs(num_train, num_test, seed)
  if num_test * 10 > problem_count(max_operands, digits):
    raise ValueError(f'num_test={num_test} is more than a tenth of the '
                     f'{problem_count(max_operands, digits)} distinct problems with 2 to '
                     f'{max_operands} operands of {digits} digit(s)')
  knobs = dict(max_operands=max_operands, digits=digits, num_train=num_train,
               num_test=num_test, seed=seed)
  return SumsConfig(name=f'k{max_operands}_d{digits}_n{num_train}_t{num_test}_s{seed}',
                    description=f'Running-sum problems with knobs {knobs}.', **knobs)


def _draw_k(rng, count, config):
  """`count` operand counts k with P(k) ~ 1/k over [2, max_operands]."""
  ks = np.arange(2, config.max_operands + 1)
  return rng.choice(ks, size=count, p=(1 / ks) / np.sum(1 / ks))


def _operands(rng, k, config):
  return tuple(rng.integers(0, 10**config.digits, size=k).tolist())


def _problems(config: SumsConfig):
  """(test, train) operand lists. The test split takes at most half of the problems with any one
  k (1-digit k = 2 has only 100), so every k stays in train; a train problem that hits a test
  prompt is redrawn with the same k."""
  rng = np.random.default_rng(config.seed)
  test, taken_K = {}, np.zeros(config.max_operands + 1, int)
  for k in _draw_k(rng, 2 * config.num_test, config):
    operands = _operands(rng, k, config)
    if operands not in test and 2 * (taken_K[k] + 1) <= 10**(config.digits * k):
      test[operands], taken_K[k] = None, taken_K[k] + 1
    if len(test) == config.num_test:
      break
  if len(test) < config.num_test:
    raise ValueError(f'could not draw {config.num_test} distinct test problems')
  train = []
  for k in _draw_k(rng, config.num_train, config):
    operands = _operands(rng, k, config)
    while operands in test:
      operands = _operands(rng, k, config)
    train.append(operands)
  return list(test), train


class Sums(local.LocalBuilder):
  """Multi-operand addition prompts and their worked solutions."""

  VERSION = tfds.core.Version('1.1.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.',
                   '1.1.0': 'At most half of any k held out; train redraws keep k.'}

  BUILDER_CONFIGS = [_new_config()]

  def _splits(self):
    return _problems(self.builder_config)

  def _records(self, problems):
    for operands in problems:
      yield {'prompt': '+'.join(map(str, operands)) + '=', 'answer': solution(operands)}


def make_config(max_operands=8, digits=1, num_train=100_000, num_test=1_000,
                seed=0) -> SumsConfig:
  """Returns the config for these knobs (the predefined one if they match)."""
  return local.predefined_or(Sums, _new_config(max_operands, digits, num_train, num_test, seed))
