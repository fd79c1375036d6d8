"""Synthetic arithmetic problems ('037+048=' -> '85') as a TFDS dataset.

The problems are generated locally from a seed, so the dataset needs no
download and is identical on every host. Each knob combination gets its own
config name, so differently configured datasets never share a cache directory.
The test split holds distinct problems that never occur in the train split;
train problems are drawn uniformly with replacement from everything else.
`extra_test` more held-out problems are drawn after the train split and appended
to the test split: a larger eval set that leaves the train split (and every run
trained on it) as it is.
"""

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from rljax.data.builders import local

_OPS = '+-*'
_OP_NAMES = {'+': 'plus', '-': 'minus', '*': 'times'}
_MAX_DIGITS = 9  # Keeps every product and problem id inside int64.


@dataclasses.dataclass(eq=False)
class ArithmeticConfig(tfds.core.BuilderConfig):
  """The knobs of one arithmetic dataset; build it with `make_config`."""

  digits: int = 3  # Operands are drawn uniformly from [0, 10**digits).
  ops: str = '+'  # Subset of '+-*', canonical order.
  zero_pad: bool = True  # '037+048=' rather than '37+48='.
  num_train: int = 100_000
  num_test: int = 1_000
  seed: int = 0
  extra_test: int = 0  # Held-out problems drawn after the train split.


def config_name(digits, ops, zero_pad, num_train, num_test, seed, extra_test=0) -> str:
  """Encodes every knob, e.g. 'd3_ops-plus_pad1_n100000_t1000_s0' ('_x3000' with extra_test)."""
  op_names = '-'.join(_OP_NAMES[op] for op in ops)
  return (f'd{digits}_ops-{op_names}_pad{int(zero_pad)}_n{num_train}'
          f'_t{num_test}_s{seed}' + (f'_x{extra_test}' if extra_test else ''))


def _num_problems(digits: int, ops: str) -> int:
  """Counts the distinct (a, op, b) triples."""
  return len(ops) * 100**digits


def _new_config(digits=3, ops='+', zero_pad=True, num_train=100_000,
                num_test=1_000, seed=0, extra_test=0) -> ArithmeticConfig:
  """Validates the knobs and names the config after them."""
  unknown = set(ops) - set(_OPS)
  if not ops or unknown:
    raise ValueError(f'ops must be a non-empty subset of {_OPS!r}, got {ops!r}')
  ops = ''.join(op for op in _OPS if op in ops)
  if not 1 <= digits <= _MAX_DIGITS:
    raise ValueError(f'digits must be in [1, {_MAX_DIGITS}], got {digits}')
  local.check_split_knobs(num_train, num_test, seed)
  if num_test >= _num_problems(digits, ops):
    raise ValueError(
        f'num_test={num_test} leaves no training problems: there are only'
        f' {_num_problems(digits, ops)} distinct problems with {digits} digits'
        f' and ops {ops!r}')
  spare = max(0, _num_problems(digits, ops) - num_test - num_train) // 2
  if extra_test and not 0 < extra_test <= spare:
    raise ValueError(f'extra_test={extra_test} must be in [0, {spare}]: at most half the problems'
                     ' that neither split can hold')
  knobs = dict(digits=digits, ops=ops, zero_pad=bool(zero_pad),
               num_train=num_train, num_test=num_test, seed=seed, extra_test=extra_test)
  return ArithmeticConfig(
      name=config_name(**knobs),
      description=f'Arithmetic problems with knobs {knobs}.',
      **knobs)


def _problem_ids(config: ArithmeticConfig):
  """Draws (test_ids, train_ids); an id encodes (op, a, b) as one integer."""
  num_problems = _num_problems(config.digits, config.ops)
  rng = np.random.default_rng(config.seed)
  test_ids = rng.choice(num_problems, size=config.num_test, replace=False)
  train_ids = rng.integers(num_problems, size=config.num_train)
  clashes = np.isin(train_ids, test_ids)
  while clashes.any():  # Redraw the few train problems that hit the test set.
    train_ids[clashes] = rng.integers(num_problems, size=clashes.sum())
    clashes = np.isin(train_ids, test_ids)
  if config.extra_test:   # drawn last: the draws above are the same with and without them
    unused = np.setdiff1d(np.arange(num_problems), np.concatenate([test_ids, train_ids]))
    test_ids = np.concatenate([test_ids, rng.choice(unused, config.extra_test, replace=False)])
  return test_ids, train_ids


class Arithmetic(local.LocalBuilder):
  """Arithmetic prompts and their integer answers."""

  BUILDER_CONFIGS = [_new_config()]

  def _splits(self):
    return _problem_ids(self.builder_config)

  def _records(self, ids_N: np.ndarray):
    config = self.builder_config
    base = 10**config.digits
    ops_N = np.array(list(config.ops))[ids_N // base**2]
    a_N, b_N = (ids_N // base) % base, ids_N % base
    results_N = np.select([ops_N == '+', ops_N == '-'],
                          [a_N + b_N, a_N - b_N], a_N * b_N)
    width = config.digits if config.zero_pad else 0
    for a, op, b, result in zip(a_N.tolist(), ops_N.tolist(), b_N.tolist(), results_N.tolist()):
      yield {'prompt': f'{a:0{width}d}{op}{b:0{width}d}=', 'answer': str(result)}


def make_config(digits=3, ops='+', zero_pad=True, num_train=100_000,
                num_test=1_000, seed=0, extra_test=0) -> ArithmeticConfig:
  """Returns the config for these knobs (the predefined one if they match)."""
  return local.predefined_or(Arithmetic, _new_config(digits, ops, zero_pad, num_train, num_test,
                                                     seed, extra_test))
