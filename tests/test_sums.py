"""The sums task (rljax.data.builders.sums): worked solutions checked against numpy running sums,
the length bounds against the longest possible problem, train and test disjoint, the running_sums
verifier, the task registration and the config preset."""
import itertools

import numpy as np
import pytest

from configs import grpo
from rljax.data.builders import sums
from rljax.data import rewards
from rljax.data import sources as data
from rljax.data import tokenizer as tokenizer_lib
from rljax import tasks

TOKENIZER = tokenizer_lib.ArithmeticTokenizer()


def parse_prompt(prompt):
  assert prompt.endswith('=')
  return [int(x) for x in prompt[:-1].split('+')]


def numpy_solution(operands):
  """Independent reference: '+'-joined 'operand=running sum' from np.cumsum."""
  sums_K = np.cumsum(operands)
  return '+'.join(f'{a}={s}' for a, s in zip(operands[1:], sums_K[1:]))


@pytest.fixture(scope='module')
def splits(tmp_path_factory):
  config = sums.make_config(max_operands=9, digits=2, num_train=400, num_test=40, seed=3)
  data_dir = str(tmp_path_factory.mktemp('sums'))
  return [data.load_tfds_split(sums.Sums, config, data_dir, split) for split in ('train', 'test')]


def records(source):
  return [(data.text(r['prompt']), data.text(r['answer']))
          for r in data.read_records(source, range(len(source)))]


def test_answers_are_numpy_running_sums_and_splits_are_disjoint(splits):
  train, test = map(records, splits)
  assert len(train) == 400 and len(test) == 40
  for prompt, answer in train + test:
    operands = parse_prompt(prompt)
    assert 2 <= len(operands) <= 9 and all(0 <= a < 100 for a in operands)
    assert answer == numpy_solution(operands)
    assert rewards.running_sums(answer, answer) == 1.0
  assert not {p for p, _ in test} & {p for p, _ in train}
  ks = np.array([len(parse_prompt(p)) for p, _ in train])
  assert np.mean(ks == 2) > np.mean(ks == 9) > 0   # P(k) ~ 1/k: short ones common, long ones rare


@pytest.mark.parametrize('max_operands,digits', [(2, 1), (12, 2), (30, 3)])
def test_length_bounds_are_those_of_the_longest_problem(max_operands, digits):
  largest = [10**digits - 1] * max_operands
  prompt_len, response_len = sums.lengths(max_operands, digits)
  assert len(TOKENIZER.encode('+'.join(map(str, largest)) + '=')) == prompt_len
  assert len(TOKENIZER.encode(sums.solution(largest))) == response_len


@pytest.mark.parametrize('response,reward', [
    ('5=42+82=124+19=143', 1.0),
    ('5=42+82=124+19=0143', 1.0),        # the same numbers
    ('5=42+82=124+19=142', 0.0),         # wrong final sum
    ('5=42+82=123+19=143', 0.0),         # the right total through a wrong sum
    ('5=42+81=124+19=143', 0.0),         # a wrong operand
    ('5=42+101=143', 0.0),               # a step missing
    ('5=42+82=124+19=143+0=143', 0.0),   # a step too many
    ('143', 0.0), ('5=42+82=124+19=143+', 0.0), ('5=42+82=124=19=143', 0.0), ('', 0.0),
])
def test_running_sums_verifier(response, reward):
  assert rewards.running_sums(response, '5=42+82=124+19=143') == reward


def test_preset_and_task(tmp_path):
  config = grpo.get_config('runlocal,task=sums')
  assert (config.data.digits, config.data.max_operands, config.rollout.slots) == (1, 8, 32)
  assert config.data.name == 'sums' and config.rollout.P * config.rollout.G > config.rollout.slots
  # RL needs room above the warm start; checks every 10 steps keep it from overshooting far.
  assert config.warmstart.threshold <= 0.5 and config.warmstart.eval_every <= 10
  config.data.update(dir=str(tmp_path), num_train=300, num_test=30)
  task = tasks.make_task(config)
  prompt_len, max_new_tokens, vocab = tasks.lengths(config)
  # '9+9+9+9+9+9+9+9=' and '9=18+9=27+9=36+9=45+9=54+9=63+9=72' plus the end token
  assert (task.prompt_len, task.max_new_tokens) == (prompt_len, max_new_tokens) == (16, 35)
  assert vocab == TOKENIZER.vocab_size and task.reward_fn is rewards.running_sums
  for prompt, answer in records(task.test_source):
    assert len(TOKENIZER.encode(prompt)) <= prompt_len
    assert len(TOKENIZER.encode(answer)) + 1 <= max_new_tokens
  assert prompt_len + max_new_tokens <= config.model.max_seq_len


def test_bad_knobs_raise_one_clear_error():
  with pytest.raises(ValueError, match='max_operands'):
    sums.make_config(max_operands=1)
  # 2 one-digit operands: 100 problems, so at most 10 held out.
  sums.make_config(max_operands=2, digits=1, num_test=10)
  with pytest.raises(ValueError, match='num_test=11 is more than a tenth of the 100 distinct'):
    sums.make_config(max_operands=2, digits=1, num_test=11)
  sums.make_config(max_operands=12, digits=1, num_test=1000)   # k up to 12: plenty


@pytest.mark.parametrize('max_operands,digits', [(2, 1), (3, 1), (2, 2)])
def test_problem_count_is_that_of_every_operand_list(max_operands, digits):
  every = {operands for k in range(2, max_operands + 1)
           for operands in itertools.product(range(10**digits), repeat=k)}
  assert sums.problem_count(max_operands, digits) == len(every)


def test_test_split_holds_at_most_half_of_any_k():
  """1-digit, k = 2 has 100 problems and P(k = 2) = 0.6 here: without the cap the test split
  would take nearly all of them and train would see k = 2 only through those left over."""
  config = sums.make_config(max_operands=3, digits=1, num_train=2000, num_test=100, seed=1)
  test, train = sums._problems(config)  # pylint: disable=protected-access
  assert len(set(test)) == len(test) == 100 and not set(test) & set(train)
  for k in (2, 3):
    held_out = sum(len(operands) == k for operands in test)
    assert 0 < held_out <= 10**k // 2
    assert sum(len(operands) == k for operands in train) > 0.3 * len(train)
  with pytest.raises(ValueError, match="task='nope'"):
    grpo.get_config('task=nope')
