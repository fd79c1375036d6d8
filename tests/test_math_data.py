"""The GSM8K / MATH JSONL datasets (rljax.data.builders.math_jsonl) and the task layer on top
(rljax.tasks): final-answer extraction, splits, bad files, chat-rendered prompts."""
import json
import os

import pytest

from configs import grpo
from rljax.data.builders import math_jsonl
from rljax.data import rewards
from rljax.data import sources as data
from rljax.hf import tokenizer as hf_tokenizer
from rljax import tasks

TESTDATA = os.path.join(os.path.dirname(__file__), 'testdata')
GSM8K = os.path.join(TESTDATA, 'gsm8k_sample.jsonl')
MATH = os.path.join(TESTDATA, 'math_sample.jsonl')
TINY = os.path.join(TESTDATA, 'tiny_qwen3')


def records(source):
  return [{k: data.text(v) for k, v in r.items()}
          for r in data.read_records(source, range(len(source)))]


def load(tmp_path, fmt, path, split, **kwargs):
  config = math_jsonl.make_config(fmt, path, **kwargs)
  return data.load_tfds_split(math_jsonl.MathJsonl, config, str(tmp_path), split)


def jsonl_rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.mark.parametrize('fmt, solution, answer', [
    ('gsm8k', 'He has 3 + 4 = <<3+4=7>>7.\n#### 7', '7'),
    ('gsm8k', 'Total 1469.\n#### 1,469', '1,469'),
    ('gsm8k', 'a #### b\n####  -12 ', '-12'),
    ('gsm8k', 'no marker 7', None),
    ('gsm8k', 'empty\n#### ', None),
    ('math', 'So $x = \\boxed{\\frac{1}{2}}$.', '\\frac{1}{2}'),
    ('math', 'First \\boxed{1}, finally \\boxed{\\sqrt{\\frac{a}{b}}}', '\\sqrt{\\frac{a}{b}}'),
    ('math', 'An \\fbox{x^{2} + 1} answer', 'x^{2} + 1'),
    ('math', 'unbalanced \\boxed{\\frac{1}{2}', None),
    ('math', 'no box', None),
])
def test_final_answer(fmt, solution, answer):
  assert math_jsonl.final_answer(fmt, solution) == answer


def test_gsm8k_holds_out_a_seeded_test_split(tmp_path):
  train = records(load(tmp_path, 'gsm8k', GSM8K, 'train', num_test=8))
  test = records(load(tmp_path, 'gsm8k', GSM8K, 'test', num_test=8))
  rows = jsonl_rows(GSM8K)
  assert len(train) == 56 and len(test) == 8
  assert {r['prompt'] for r in train}.isdisjoint(r['prompt'] for r in test)
  by_question = {r['question']: r for r in rows}
  for record in train + test:
    row = by_question[record['prompt']]
    assert record['solution'] == row['answer']
    assert record['answer'] == row['answer'].split('####')[-1].strip()
  other_seed = records(load(tmp_path, 'gsm8k', GSM8K, 'test', num_test=8, seed=1))
  assert [r['prompt'] for r in other_seed] != [r['prompt'] for r in test]


def test_math_with_a_test_file(tmp_path):
  test_file = tmp_path / 'test.jsonl'
  test_file.write_text(''.join(json.dumps(r) + '\n' for r in jsonl_rows(MATH)[:5]))
  train = records(load(tmp_path, 'math', MATH, 'train', test_path=str(test_file)))
  test = records(load(tmp_path, 'math', MATH, 'test', test_path=str(test_file)))
  assert len(train) == 32 and len(test) == 5
  assert [r['prompt'] for r in test] == [r['problem'] for r in jsonl_rows(MATH)[:5]]
  assert all(r['answer'] and r['answer'] in r['solution'] for r in train)


def test_edited_file_is_rebuilt_not_read_stale(tmp_path):
  path = tmp_path / 'data.jsonl'
  rows = jsonl_rows(GSM8K)[:10]

  def answers():
    return {r['answer'] for split in ('train', 'test')
            for r in records(load(tmp_path, 'gsm8k', str(path), split, num_test=2))}

  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  assert '999' not in answers()
  rows[0]['answer'] = 'changed\n#### 999'
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  assert '999' in answers()


@pytest.mark.parametrize('line, message', [
    (b'not json', ':2: not JSON'),
    (b'{"question": "q"}', ":2: a gsm8k record needs string fields 'question' and 'answer'"),
    (b'{"question": "q", "answer": "no marker"}', ':2: the .answer. field has no final answer'),
    (b'{"question": "caf\xe9"}', r'bad.jsonl:2: not UTF-8 \(byte 18 of the line is 0xe9\)'),
])
def test_bad_line_is_named_with_file_and_line(tmp_path, line, message):
  path = tmp_path / 'bad.jsonl'
  path.write_bytes((json.dumps(jsonl_rows(GSM8K)[0]) + '\n').encode() + line + b'\n')
  with pytest.raises(ValueError, match=message):
    load(tmp_path, 'gsm8k', str(path), 'train', test_path=GSM8K)


@pytest.mark.parametrize('kwargs, message', [
    (dict(fmt='gsm8k', path=''), 'set --config.data.path'),
    (dict(fmt='gsm8k', path='/nonexistent.jsonl', num_test=1), 'is not a file'),
    (dict(fmt='gsm8k', path=GSM8K), 'data.num_test > 0'),
    (dict(fmt='csv', path=GSM8K, num_test=1), "'csv' is not one of"),
])
def test_bad_config(kwargs, message):
  with pytest.raises(ValueError, match=message):
    math_jsonl.make_config(**kwargs)


# ------------------------------------------------------------------ the verifier


@pytest.mark.parametrize('response, answer, expected', [
    ('He has 3 + 4 = 7 apples.\n#### 7', '7', 1.0),
    ('#### 1469', '1,469', 1.0),
    ('so the total is 1,469', '1469', 1.0),
    ('the answer is 72.0', '72', 1.0),
    ('#### 73', '72', 0.0),
    ('72 is wrong, #### 73', '72', 0.0),
    ('#### 7\nThen 8 more', '7', 1.0),
    ('#### ', '7', 0.0),
    ('$\\boxed{0.5}$', '\\frac{1}{2}', 1.0),
    ('\\boxed{\\frac{2}{4}}', '\\frac{1}{2}', 1.0),
    ('\\boxed{(x+9)^2}', 'x^{2} + 18 x + 81', 1.0),
    ('\\boxed{\\sqrt{12}}', '2 \\sqrt{3}', 1.0),
    ('\\boxed{3.46}', '2 \\sqrt{3}', 0.0),
    ('x = 4', '4', 1.0),
    ('44', '4', 0.0),
    ('', '4', 0.0),
    ('no number at all', '4', 0.0),
])
def test_math_verifier_accepts_equivalent_forms(response, answer, expected):
  assert rewards.math_equivalent(response, answer) == expected


def test_math_verifier_is_registered_and_rejects_a_bad_reference():
  assert rewards.get_reward_fn('math') is rewards.math_equivalent
  scores, failed = rewards.score_batch(rewards.math_equivalent, ['#### 7', '#### 7'], ['7', ''])
  assert list(scores) == [1.0, 0.0] and failed == 1


def test_sample_files_verify_against_their_own_solutions(tmp_path):
  """Every worked solution in the sample files earns reward 1 against its own final answer."""
  for fmt, path in (('gsm8k', GSM8K), ('math', MATH)):
    for record in math_jsonl.read_jsonl(path, fmt):
      assert rewards.math_equivalent(record['solution'], record['answer']) == 1.0, record


# ------------------------------------------------------------------ the task layer


def math_config(tmp_path, **data_overrides):
  config = grpo.get_config('runlocal')
  config.data.update(name='gsm8k', path=GSM8K, num_test=8, dir=str(tmp_path), max_prompt_len=64,
                     max_response_len=8)
  config.data.update(data_overrides)
  config.init.hf_path = TINY
  return config


def test_gsm8k_task_renders_prompts_through_the_chat_template(tmp_path):
  task = tasks.make_task(math_config(tmp_path, instruction='Answer after ####.'))
  tokenizer = hf_tokenizer.HFTokenizer(TINY)
  assert task.reward_fn is rewards.math_equivalent
  assert (task.prompt_len, task.max_new_tokens) == (64, 8)
  first = data.read_records(task.test_source, [0])[0]
  raw = records(load(tmp_path, 'gsm8k', GSM8K, 'test', num_test=8))[0]
  assert first['prompt'] == tokenizer.chat_prompt(raw['prompt'] + '\nAnswer after ####.')
  assert data.text(first['answer']) == raw['answer']
  prompts, answers = data.eval_set(task.test_source, 8)
  tokens, _ = data.encode_prompts(prompts, tokenizer, task.prompt_len)
  assert tokens.shape == (8, 64)


def test_over_long_prompts_are_left_out(tmp_path):
  full = tasks.make_task(math_config(tmp_path))
  lengths = sorted(len(full.tokenizer.encode(r['prompt'])) for r in data.read_records(
      full.train_source, range(len(full.train_source))))
  cut = lengths[len(lengths) // 2]
  short = tasks.make_task(math_config(tmp_path, max_prompt_len=cut))
  assert len(short.train_source) == sum(n <= cut for n in lengths) < len(full.train_source)
  assert short.train_source.dropped == len(full.train_source) - len(short.train_source)
  with pytest.raises(ValueError, match='every prompt is longer'):
    tasks.make_task(math_config(tmp_path, max_prompt_len=3))


def test_task_errors(tmp_path):
  config = math_config(tmp_path)
  config.init.hf_path = ''
  with pytest.raises(ValueError, match='init.hf_path'):
    tasks.make_task(config)
  with pytest.raises(ValueError, match="data.name must be one of .*, got 'gsm9k'"):
    tasks.make_task(math_config(tmp_path, name='gsm9k'))


def test_arithmetic_stays_the_default(tmp_path):
  config = grpo.get_config('runlocal')
  config.data.update(dir=str(tmp_path), num_train=300, num_test=50)
  task = tasks.make_task(config)
  assert (task.reward_fn is rewards.exact_numeric
          and (task.prompt_len, task.max_new_tokens) == (8, 5))
  assert data.text(task.test_source[0]['prompt']).endswith('=')
