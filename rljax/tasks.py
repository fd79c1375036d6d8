"""What the RL loop trains on, chosen by `config.data.name`: its tokenizer, data splits, lengths and
verifier, so the loop itself is the same for every task.

  arithmetic   the built-in synthetic task, character tokenizer (the default)
  sums         multi-operand addition with every running sum written out: responses of uneven
               length, 4 to 35 tokens by default (rljax.datasets.sums), character tokenizer
  gsm8k, math  local JSONL files (--config.data.path=FILE), the tokenizer of the Hugging Face model
               in --config.init.hf_path, prompts rendered through its chat template
"""
from collections.abc import Sequence
import os
from typing import Any, NamedTuple

from absl import logging

from rljax import data
from rljax import hf_tokenizer
from rljax import rewards
from rljax import tokenizer as tokenizer_lib
from rljax.datasets import math_jsonl
from rljax.datasets import sums

NAMES = ('arithmetic', 'sums', 'gsm8k', 'math')
DEFAULT_REWARDS = {'arithmetic': 'exact_numeric', 'sums': 'running_sums', 'gsm8k': 'math',
                   'math': 'math'}


class Task(NamedTuple):
  tokenizer: Any
  train_source: Sequence
  test_source: Sequence
  prompt_len: int        # prompts are left-padded to this many tokens
  max_new_tokens: int    # response budget, end token included
  reward_fn: Any


def arithmetic_lengths(data_cfg):
  """(prompt tokens, max response tokens incl. the end token) of the arithmetic task."""
  prompt_len = 2 * data_cfg.digits + 2
  answer_len = 2 * data_cfg.digits if '*' in data_cfg.ops else data_cfg.digits + 1
  answer_len += '-' in data_cfg.ops
  return prompt_len, answer_len + 1


def sums_lengths(data_cfg):
  """(prompt tokens, max response tokens incl. the end token) of the sums task."""
  sums.make_config(data_cfg.max_operands, data_cfg.digits)   # ValueError on bad knobs, first
  prompt_len, response_len = sums.lengths(data_cfg.max_operands, data_cfg.digits)
  return prompt_len, response_len + 1


def lengths(config):
  """(prompt tokens, max response tokens, vocabulary size or 0 if only the tokenizer file knows)
  from the config alone, so they are checked before anything is built."""
  dcfg = config.data
  if dcfg.get('name', 'arithmetic') == 'arithmetic':
    return (*arithmetic_lengths(dcfg), tokenizer_lib.ArithmeticTokenizer.vocab_size)
  if dcfg.name == 'sums':
    return (*sums_lengths(dcfg), tokenizer_lib.ArithmeticTokenizer.vocab_size)
  _tokenizer_path(config)   # the first thing to fix, before any length or model check
  return dcfg.max_prompt_len, dcfg.max_response_len, 0


def _tokenizer_path(config):
  hf_path = config.init.hf_path if 'init' in config else ''
  if not hf_path:
    raise ValueError(f'the {config.data.name} task needs a tokenizer: set '
                     '--config.init.hf_path=DIR (a Hugging Face model directory with '
                     'tokenizer.json)')
  return hf_path


class PromptSource(Sequence):
  """A data source whose prompts read as the model will see them (instruction + chat template).

  Records whose rendered prompt is longer than `max_len` tokens are left out (counted, logged):
  every batch then has fixed shapes and no prompt is silently truncated.
  """

  def __init__(self, source, tokenizer, max_len, instruction='', chat_template=True):
    self._source, self._tokenizer = source, tokenizer
    self._instruction, self._chat = instruction, chat_template
    records = data._read(source, range(len(source)))  # pylint: disable=protected-access
    lengths = map(len, tokenizer.encode_batch(self.render(r['prompt']) for r in records))
    self._keep = [i for i, n in enumerate(lengths) if n <= max_len]
    self.dropped = len(source) - len(self._keep)
    if self.dropped:
      logging.warning('%d of %d prompts are longer than %d tokens and left out', self.dropped,
                      len(source), max_len)
    if not self._keep:
      raise ValueError(f'every prompt is longer than data.max_prompt_len={max_len} tokens')

  def render(self, question) -> str:
    question = data._text(question)  # pylint: disable=protected-access
    if self._instruction:
      question = f'{question}\n{self._instruction}'
    return self._tokenizer.chat_prompt(question) if self._chat else question

  def _record(self, record):
    return dict(record, prompt=self.render(record['prompt']))

  def __len__(self):
    return len(self._keep)

  def __getitem__(self, index):
    return self._record(self._source[self._keep[index]])

  def __getitems__(self, indices):
    records = data._read(self._source, [self._keep[i] for i in indices])  # pylint: disable=protected-access
    return [self._record(r) for r in records]


def _math_task(config, data_dir):
  dcfg = config.data
  hf_path = _tokenizer_path(config)
  if dcfg.max_prompt_len < 1 or dcfg.max_response_len < 2:
    raise ValueError(f'data.max_prompt_len ({dcfg.max_prompt_len}) must be >= 1 and '
                     f'data.max_response_len ({dcfg.max_response_len}) >= 2')
  tokenizer = hf_tokenizer.HFTokenizer(hf_path)
  builder_config = math_jsonl.make_config(dcfg.name, dcfg.path, dcfg.test_path, dcfg.num_test,
                                          dcfg.seed)
  sources = [PromptSource(data.load_tfds_split(math_jsonl.MathJsonl, builder_config, data_dir,
                                               split), tokenizer, dcfg.max_prompt_len,
                          dcfg.instruction, dcfg.chat_template) for split in ('train', 'test')]
  return tokenizer, sources, dcfg.max_prompt_len, dcfg.max_response_len


def make_task(config) -> Task:
  """The task named by config.data.name (one clear ValueError for a bad choice)."""
  dcfg = config.data
  name = dcfg.get('name', 'arithmetic')
  if name not in NAMES:
    raise ValueError(f'data.name {name!r} is not one of {NAMES}')
  data_dir = dcfg.dir or os.path.expanduser('~/.cache/rljax/datasets')
  if name in ('arithmetic', 'sums') and 'init' in config and config.init.hf_path:
    raise ValueError(f'init.hf_path brings its own tokenizer, which the {name} task does not '
                     'use: pick data.name=gsm8k or math')
  if name == 'sums':
    tokenizer = tokenizer_lib.ArithmeticTokenizer()
    builder_config = sums.make_config(dcfg.max_operands, dcfg.digits, dcfg.num_train,
                                      dcfg.num_test, dcfg.seed)
    sources = [data.load_tfds_split(sums.Sums, builder_config, data_dir, split)
               for split in ('train', 'test')]
    prompt_len, max_new_tokens = sums_lengths(dcfg)
  elif name == 'arithmetic':
    tokenizer = tokenizer_lib.ArithmeticTokenizer()
    knobs = dict(digits=dcfg.digits, ops=dcfg.ops, zero_pad=dcfg.zero_pad,
                 num_train=dcfg.num_train, num_test=dcfg.num_test, seed=dcfg.seed)
    sources = [data.load_split(data_dir, split=split, **knobs) for split in ('train', 'test')]
    prompt_len, max_new_tokens = arithmetic_lengths(dcfg)
  else:
    tokenizer, sources, prompt_len, max_new_tokens = _math_task(config, data_dir)
  reward = config.reward if config.reward != 'auto' else DEFAULT_REWARDS[name]
  return Task(tokenizer, sources[0], sources[1], prompt_len, max_new_tokens,
              rewards.get_reward_fn(reward))
