"""Tests for the arithmetic TFDS dataset and the data layer built on it."""

import re
import signal

import numpy as np
import pytest

from rljax.data.builders import arithmetic
from rljax.data import sources as data
from rljax.data.tokenizer import ArithmeticTokenizer

SMALL = dict(digits=3, ops='+', zero_pad=True, num_train=2000, num_test=200,
             seed=0)
MIXED = dict(digits=2, ops='*-+', zero_pad=False, num_train=2000, num_test=100,
             seed=1)
_PROBLEM = re.compile(r'(\d+)([+\-*])(\d+)=')


def _records(source):
  return [(data.text(r['prompt']), data.text(r['answer']))
          for r in data.read_records(source, range(len(source)))]


def _check_arithmetic(prompt, answer):
  a, op, b = _PROBLEM.fullmatch(prompt).groups()
  a, b = int(a), int(b)
  assert int(answer) == {'+': a + b, '-': a - b, '*': a * b}[op], prompt
  return a, op, b


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp('tfds')


@pytest.fixture(scope='module')
def small(data_dir):
  return {split: _records(data.load_split(data_dir, **SMALL, split=split))
          for split in ('train', 'test')}


def _text_source(n):
  return [{'prompt': f'{i}+0=', 'answer': str(i)} for i in range(n)]


# Dataset.


def test_config_names_encode_every_knob():
  assert arithmetic.make_config().name == 'd3_ops-plus_pad1_n100000_t1000_s0'
  assert arithmetic.make_config() is arithmetic.Arithmetic.BUILDER_CONFIGS[0]
  assert arithmetic.make_config(**MIXED).name == (
      'd2_ops-plus-minus-times_pad0_n2000_t100_s1')
  with pytest.raises(ValueError, match='ops'):
    arithmetic.make_config(ops='+/')
  with pytest.raises(ValueError, match='num_test'):
    arithmetic.make_config(digits=1, num_test=100)


def test_splits_are_disjoint_and_correct(small):
  train, test = small['train'], small['test']
  assert (len(train), len(test)) == (2000, 200)
  test_prompts = {prompt for prompt, _ in test}
  assert len(test_prompts) == 200
  assert not test_prompts & {prompt for prompt, _ in train}
  for prompt, answer in train + test:
    assert re.fullmatch(r'\d{3}\+\d{3}=', prompt), prompt
    _check_arithmetic(prompt, answer)


def test_knobs_change_the_problems(data_dir, small):
  mixed = _records(data.load_split(data_dir, **MIXED, split='train'))
  problems = [_check_arithmetic(p, a) for p, a in mixed]
  assert {op for _, op, _ in problems} == set('+-*')
  assert max(max(a, b) for a, _, b in problems) < 100
  assert any(answer.startswith('-') for _, answer in mixed)
  assert all(not re.search(r'(^|\D)0\d', p) for p, _ in mixed)  # No padding.
  assert len({len(p) for p, _ in mixed}) > 1  # Variable-length prompts.
  # The first dataset in the same directory is untouched by the second.
  assert _records(data.load_split(data_dir, **SMALL, split='test')) == (
      small['test'])


def test_test_split_avoids_train_even_when_problems_repeat(tmp_path):
  # 100 one-digit sums: 40 held out, so many train draws hit the test set.
  tiny = dict(digits=1, ops='+', num_train=500, num_test=40)
  test = _records(data.load_split(tmp_path, **tiny, split='test'))
  train = _records(data.load_split(tmp_path, **tiny, split='train'))
  test_prompts = {prompt for prompt, _ in test}
  assert len(test_prompts) == 40
  assert not test_prompts & {prompt for prompt, _ in train}
  assert len({prompt for prompt, _ in train}) == 60  # All the rest, repeated.


def test_extra_test_problems_leave_the_train_split_as_it_is(data_dir, small):
  """extra_test appends held-out problems drawn after the train split: the train split and the
  first num_test test problems are the ones without it, and no extra problem is trained on."""
  extra = dict(SMALL, extra_test=300)
  assert arithmetic.make_config(**extra).name == 'd3_ops-plus_pad1_n2000_t200_s0_x300'
  train = _records(data.load_split(data_dir, **extra, split='train'))
  test = _records(data.load_split(data_dir, **extra, split='test'))
  assert train == small['train'] and test[:200] == small['test'] and len(test) == 500
  prompts = [prompt for prompt, _ in test]
  assert len(set(prompts)) == 500 and not set(prompts) & {prompt for prompt, _ in train}
  for prompt, answer in test:
    _check_arithmetic(prompt, answer)
  with pytest.raises(ValueError, match='extra_test'):
    arithmetic.make_config(digits=1, num_train=50, num_test=10, extra_test=30)


def test_build_is_deterministic(tmp_path, small):
  assert _records(data.load_split(tmp_path, **SMALL, split='test')) == (
      small['test'])
  other_seed = dict(SMALL, seed=1)
  assert _records(data.load_split(tmp_path, **other_seed, split='test')) != (
      small['test'])


def test_missing_split_names_the_path(data_dir, small):
  del small  # Built.
  with pytest.raises(ValueError, match=str(data_dir)):
    data.load_split(data_dir, **SMALL, split='validation')


def test_losing_a_concurrent_build_reads_the_winner(tmp_path, monkeypatch):
  original = arithmetic.Arithmetic._split_generators
  calls = []

  def racing(builder, dl_manager):
    calls.append(builder)
    if len(calls) == 1:  # Another process completes the same build first.
      data.load_split(tmp_path, **SMALL, split='train')
    return original(builder, dl_manager)

  monkeypatch.setattr(arithmetic.Arithmetic, '_split_generators', racing)
  assert len(data.load_split(tmp_path, **SMALL, split='test')) == 200
  assert len(calls) == 2
  config_dir = tmp_path / 'arithmetic' / arithmetic.make_config(**SMALL).name
  assert [p.name for p in config_dir.iterdir()] == ['1.0.0']


def test_eval_set(data_dir, small):
  source = data.load_split(data_dir, **SMALL, split='test')
  prompts, answers = data.eval_set(source, 50)
  assert list(zip(prompts, answers)) == small['test'][:50]
  with pytest.raises(ValueError):
    data.eval_set(source, 201)


# Token arrays.


def test_encode_prompts_pads_on_the_left():
  tokenizer = ArithmeticTokenizer()
  tokens_BxT, mask_BxT = data.encode_prompts(['1+2=', '10+20='], tokenizer)
  assert tokens_BxT.dtype == np.int32 and mask_BxT.dtype == bool
  np.testing.assert_array_equal(tokens_BxT, [[0, 0, 3, 12, 4, 15],
                                             [3, 2, 12, 4, 2, 15]])
  np.testing.assert_array_equal(mask_BxT, [[0, 0, 1, 1, 1, 1], [1] * 6])
  tokens_BxT, _ = data.encode_prompts(['1+2='], tokenizer, length=7)
  assert tokens_BxT.shape == (1, 7) and tokens_BxT[0, -1] == 15
  with pytest.raises(ValueError):
    data.encode_prompts(['10+20='], tokenizer, length=5)


def test_encode_supervised_masks_answer_and_eos_targets():
  tokenizer = ArithmeticTokenizer()
  tokens_BxS, mask_BxS, loss_mask_BxS = data.encode_supervised(
      ['1+2=', '10+20='], ['3', '30'], tokenizer)
  np.testing.assert_array_equal(tokens_BxS, [
      [0, 0, 3, 12, 4, 15, 5, 1, 0],
      [3, 2, 12, 4, 2, 15, 5, 2, 1],
  ])
  np.testing.assert_array_equal(mask_BxS, [[0, 0, 1, 1, 1, 1, 1, 1, 0],
                                           [1] * 9])
  np.testing.assert_array_equal(loss_mask_BxS, [[0, 0, 0, 0, 0, 1, 1, 0, 0],
                                                [0, 0, 0, 0, 0, 1, 1, 1, 0]])
  targets = tokens_BxS[:, 1:][loss_mask_BxS[:, :-1]]
  np.testing.assert_array_equal(targets, [5, 1, 5, 2, 1])


# Prompt iterator.


def _take(iterator, n):
  return [next(iterator) for _ in range(n)]


def test_iterator_is_deterministic(data_dir, small):
  source = data.load_split(data_dir, **SMALL, split='train')
  batches = _take(data.PromptIterator(source, 64, seed=3), 3)
  assert batches == _take(data.PromptIterator(source, 64, seed=3), 3)
  assert batches != _take(data.PromptIterator(source, 64, seed=4), 3)
  assert all(len(b['prompt']) == len(b['answer']) == 64 for b in batches)
  index = {prompt: answer for prompt, answer in small['train']}
  assert all(index[p] == a for b in batches for p, a in zip(b['prompt'],
                                                            b['answer']))


def test_epoch_visits_each_record_once():
  iterator = data.PromptIterator(_text_source(10), 3, seed=0)
  epoch = [a for b in _take(iterator, 3) for a in b['answer']]
  assert len(set(epoch)) == 9  # The last partial batch is dropped.
  assert iterator.state() == {'epoch': 0, 'index': 9, 'skipped': 0, 'offset': 0, 'batches': 3}
  next_epoch = [a for b in _take(iterator, 3) for a in b['answer']]
  assert next_epoch != epoch and len(set(next_epoch)) == 9


def test_iterator_resumes_exactly_from_its_state():
  source = _text_source(10)
  iterator = data.PromptIterator(source, 3, seed=0)
  states, batches = [], []
  for _ in range(8):  # Crosses two epoch boundaries.
    states.append(iterator.state())
    batches.append(next(iterator))
  for k in (1, 3, 4, 7):
    resumed = data.PromptIterator(source, 3, seed=0, state=states[k])
    assert _take(resumed, 8 - k) == batches[k:]
  with pytest.raises(ValueError, match='state'):
    data.PromptIterator(source, 3, seed=0, state={'epoch': 0, 'index': 10})


def test_processes_split_every_global_batch():
  source = _text_source(40)
  single = _take(data.PromptIterator(source, 8, seed=0), 7)
  parts = [_take(data.PromptIterator(source, 8, seed=0, process_index=p,
                                     process_count=4), 7) for p in range(4)]
  for step, batch in enumerate(single):
    pieces = [part[step]['prompt'] for part in parts]
    assert all(len(piece) == 2 for piece in pieces)
    assert sum(pieces, []) == batch['prompt']
  with pytest.raises(ValueError, match='multiple'):
    data.PromptIterator(source, 6, seed=0, process_count=4)


def _source_with_bad_records():
  source = _text_source(20)
  source[2] = {'prompt': '1x2=', 'answer': '3'}
  source[5] = {'prompt': '1+2=', 'answer': ''}
  source[11] = {'prompt': '1+2='}
  return source


def test_bad_records_are_skipped_and_counted():
  iterator = data.PromptIterator(_source_with_bad_records(), 4, seed=0)
  batches = _take(iterator, 10)  # Two epochs.
  assert all(len(b['prompt']) == 4 for b in batches)
  prompts = [p for b in batches for p in b['prompt']]
  assert '1x2=' not in prompts and '1+2=' not in prompts
  assert iterator.skipped >= 3


def test_batches_carry_stream_indices_and_skipped_records_their_reasons():
  source = _source_with_bad_records()
  iterator = data.PromptIterator(source, 4, seed=0)
  batches = _take(iterator, 10)   # over two epochs
  skipped = iterator.take_skipped_records()
  indices = [index for b in batches for index in b['id']] + [index for index, _ in skipped]
  assert len(set(indices)) == len(indices)   # epoch x 20 + position: unique over the stream
  assert all(source[index % 20]['answer'] == answer
             for b in batches for index, answer in zip(b['id'], b['answer']))
  assert len(skipped) == iterator.skipped and {index % 20 for index, _ in skipped} == {2, 5, 11}
  reasons = {index % 20: reason for index, reason in skipped}
  assert "cannot encode character 'x'" in reasons[2] and 'empty' in reasons[5]
  assert reasons[11] == "KeyError('answer')"
  assert iterator.take_skipped_records() == []   # each skipped record is taken once


def test_skip_count_survives_resume():
  source = _source_with_bad_records()
  iterator = data.PromptIterator(source, 4, seed=0)
  _take(iterator, 5)
  resumed = data.PromptIterator(source, 4, seed=0, state=iterator.state())
  assert resumed.skipped == iterator.skipped > 0
  assert _take(resumed, 5) == _take(iterator, 5) and resumed.skipped == iterator.skipped


def test_processes_stay_disjoint_when_skipping():
  source = _source_with_bad_records()
  seen = []
  for p in range(2):
    iterator = data.PromptIterator(source, 4, seed=0, process_index=p,
                                   process_count=2)
    seen.append({a for b in _take(iterator, 3) for a in b['answer']})
  assert not seen[0] & seen[1]


def test_bad_records_can_raise():
  iterator = data.PromptIterator(_source_with_bad_records(), 20, seed=0,
                                 on_bad_record='raise')
  with pytest.raises(ValueError, match='malformed record'):
    next(iterator)


def test_all_bad_records_raise_instead_of_looping():
  def hang(*_):
    raise TimeoutError('the iterator loops forever')

  previous = signal.signal(signal.SIGALRM, hang)
  signal.alarm(10)
  try:
    with pytest.raises(ValueError, match='epoch'):
      next(data.PromptIterator([{'prompt': '?', 'answer': '1'}] * 4, 2, 0))
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
