"""The reasoning_gym task (rljax.tasks.reasoning_gym) and its TFDS dataset
(rljax.data.builders.reasoning_gym): the same seed gives the same records, the test split is
distinct and held out, the length and character limits hold, the task trains on the library's
answers and scores with its scorer, with the character tokenizer or a Hugging Face one, and bad
settings stop the CLI with one line."""
import json
import os
import re
import sys

import pytest

from configs import grpo
from rljax.data.builders import reasoning_gym as builder
from rljax.data import rg_library
from rljax.data import sources as data
from rljax.hf import tokenizer as hf_tokenizer
from rljax import main
from rljax import tasks
from rljax.train import warmstart

CHAIN_SUM = '{"max_digits": 2, "max_terms": 3}'
TINY_HF = os.path.join(os.path.dirname(__file__), 'testdata', 'tiny_qwen3')


def records(data_dir, **knobs):
  """(test, train) records as text, the dataset built in `data_dir`."""
  config = builder.make_config(**dict(dict(dataset='chain_sum', args=CHAIN_SUM, render='compact',
                                           num_train=300, num_test=60), **knobs))
  return [[{k: data.text(v) for k, v in r.items()} for r in data.read_records(s, range(len(s)))]
          for s in (data.load_tfds_split(builder.ReasoningGym, config, str(data_dir), split)
                    for split in ('test', 'train'))]


def test_the_same_seed_makes_the_same_records_and_another_seed_others(tmp_path):
  test, train = records(tmp_path / 'a', seed=4)
  assert [test, train] == records(tmp_path / 'b', seed=4)   # built again, elsewhere
  other_test, _ = records(tmp_path / 'c', seed=5000)
  assert {r['prompt'] for r in test} != {r['prompt'] for r in other_test}
  references = [json.loads(r['answer']) for r in test + train]
  assert [r['index'] for r in references] == sorted(r['index'] for r in references)
  assert {(r['dataset'], r['seed'], json.dumps(r['args'], sort_keys=True)) for r in references} == {
      ('chain_sum', 4, CHAIN_SUM)}


def test_the_test_prompts_are_distinct_held_out_and_within_the_limits(tmp_path):
  test, train = records(tmp_path, max_prompt_chars=6, max_answer_chars=2, charset='0123456789+=')
  test_prompts = [r['prompt'] for r in test]
  assert len(set(test_prompts)) == len(test) == 60 and len(train) == 300
  assert not set(test_prompts) & {r['prompt'] for r in train}
  for record in test + train:
    prompt, answer = record['prompt'], rg_library.demonstration(record['answer'])
    assert re.fullmatch(r'\d+(\+\d+)+=', prompt) and len(prompt) <= 6 and len(answer) <= 2


def test_too_few_distinct_problems_fail_in_one_line(tmp_path):
  with pytest.raises(ValueError, match=r'chain_sum: only 200 of the 300 records wanted fit in '
                                       r'entries 0 to 5999 \(distinct test prompts'):
    records(tmp_path, args='{"max_digits": 1, "max_terms": 2}', num_test=300)   # 2 x 10 x 10 exist


def task_config(tmp_path, arg='runlocal,P=4,G=2,task=rg:chain_sum'):
  config = grpo.get_config(arg)
  config.data.update(dir=str(tmp_path), num_train=64, num_test=16)
  config.train.update(micro_batch=8, eval_size=16)
  return config


def test_the_task_trains_on_the_librarys_answers_and_scores_with_its_scorer(tmp_path):
  task = tasks.make_task(task_config(tmp_path))
  assert (task.prompt_len, task.max_new_tokens, task.tokenizer.vocab_size) == (6, 5, 98)
  batch = next(data.PromptIterator(task.train_source, 4, seed=0, tokenizer=task.tokenizer))
  for prompt, answer in zip(batch['prompt'], batch['answer']):
    target = task.demonstration(answer)
    assert target == str(eval(prompt[:-1])) and len(task.tokenizer.encode(target)) < 5
    assert (task.reward_fn(target, answer), task.reward_fn(target + '7', answer) < 1) == (1.0, True)
  rows = warmstart.supervised_batch(batch['prompt'], list(map(task.demonstration, batch['answer'])),
                                    task.tokenizer, task.prompt_len, 11)
  assert task.tokenizer.decode(rows.tokens_BxS[0, 6:]) == task.demonstration(batch['answer'][0])


def test_with_a_hugging_face_model_the_librarys_questions_go_through_its_chat_template(tmp_path):
  config = task_config(tmp_path, 'P=4,G=2,task=rg:leg_counting')
  config.init.hf_path = TINY_HF
  task = tasks.make_task(config)
  prompt = data.eval_set(task.test_source, 1)[0][0]
  question = next(r for r in records(tmp_path, dataset='leg_counting', args='{}', render='question',
                                     num_train=64, num_test=16)[0])['prompt']
  assert prompt == hf_tokenizer.HFTokenizer(TINY_HF).chat_prompt(question)
  assert 'how many legs' in question and tasks.lengths(config) == (256, 512, 0)


def cli_error(capsys, config, tmp_path):
  """main.run's one `rljax: error:` line (exit 2), nothing built."""
  with pytest.raises(SystemExit) as stopped:
    main.run(config, str(tmp_path / 'run'))
  errors = [line for line in capsys.readouterr().err.splitlines()
            if line.startswith('rljax: error: ')]
  assert stopped.value.code == 2 and len(errors) == 1 and not os.listdir(tmp_path), errors
  return errors[0].removeprefix('rljax: error: ')


@pytest.mark.parametrize('field, value, message', [
    ('data.dataset', 'chain_summ', r"data.dataset must name a reasoning-gym dataset, got "
                                   r"'chain_summ'; the datasets: ab, .*"),
    ('data.dataset_args', '{"max_digits": 0}', r'data.dataset_args .* is not a valid chain_sum '
                                               r'config: max_digits must be >= min_digits'),
    ('data.render', 'short', r"data.render must be one of \('question', 'compact'\), got 'short'"),
    ('model.vocab_size', 16, r"model.vocab_size \(16\) must equal the reasoning_gym character "
                             r"tokenizer's 98 ids"),
    ('data.max_prompt_len', 0, r'data.max_prompt_len \(0\) must be >= 1 .*'),
])
def test_bad_settings_stop_the_cli_with_one_line(capsys, tmp_path, field, value, message):
  config = task_config(tmp_path)
  section, name = field.split('.')
  config[section][name] = value
  assert re.fullmatch(message, cli_error(capsys, config, tmp_path))


def test_without_the_library_the_cli_says_how_to_install_it(capsys, tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'reasoning_gym', None)
  assert cli_error(capsys, task_config(tmp_path), tmp_path).startswith(
      'data.name=reasoning_gym needs the reasoning-gym package: pip install')
