"""rljax.tasks: tasks found by name, and a new task is one new file (written here into a temporary
folder of the package): the registry, the lengths the planner and the checks read, and the task
the loop trains on all come from that file alone."""
import jax
import pytest

from configs import grpo
from rljax.data import sources
from rljax import sharding
from rljax import tasks
from rljax.train import run as run_lib

TOY = '''"""Doubling: 'a=' -> 2a, with the character tokenizer and the exact-numeric verifier."""
from rljax.data import tokenizer as tokenizer_lib

REWARD = 'exact_numeric'


def check(config):
  del config   # nothing to need: no tokenizer file, no data file


def lengths(config):
  return 3, 4, tokenizer_lib.ArithmeticTokenizer.vocab_size


def make(config, data_dir):
  split = [dict(prompt=f'{a}=', answer=str(2 * a)) for a in range(10, 100)]
  return tokenizer_lib.ArithmeticTokenizer(), split[:80], split[80:]
'''


def test_tasks_resolve_by_name_and_unknown_names_fail_clearly():
  assert tasks.names() == ['arithmetic', 'gsm8k', 'math', 'reasoning_gym', 'sums', 'tool_sums']
  for name in ('gsm9k', '_characters', '../data', ''):
    with pytest.raises(ValueError, match=r"data.name must be one of \['arithmetic', 'gsm8k', "
                                         r"'math', 'reasoning_gym', 'sums', 'tool_sums'\]"):
      tasks.get(name)


def test_a_new_task_is_one_file(tmp_path, monkeypatch):
  (tmp_path / 'doubling.py').write_text(TOY)
  monkeypatch.setattr(tasks, '__path__', [*tasks.__path__, str(tmp_path)])
  assert 'doubling' in tasks.names()
  config = grpo.get_config('runlocal,P=4,G=2')
  config.data.name = 'doubling'
  task = tasks.make_task(config)
  assert (task.prompt_len, task.max_new_tokens, len(task.test_source)) == (3, 4, 10)
  assert (task.reward_fn('20', '20'), task.reward_fn('21', '20')) == (1.0, 0.0)
  batch = next(sources.PromptIterator(task.train_source, 4, seed=0, tokenizer=task.tokenizer))
  assert all(int(p[:-1]) * 2 == int(a) for p, a in zip(batch['prompt'], batch['answer']))
  shape = run_lib.abstract_setup(config, sharding.make_mesh(config.mesh, jax.devices()[:1]))
  assert (shape.prompt_len, shape.new_tokens, shape.batch) == (3, 4, 8)
