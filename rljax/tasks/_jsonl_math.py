"""What the math word-problem tasks (gsm8k, math) share: local JSONL files read into TFDS
(--config.data.path=FILE), the tokenizer of the Hugging Face model in --config.init.hf_path, and
prompts rendered through its chat template."""
from collections.abc import Sequence

from absl import logging

from rljax.data.builders import math_jsonl
from rljax.data import sources
from rljax.hf import tokenizer as hf_tokenizer

REWARD = 'math'


def lengths(config):
  """The configured lengths (planning needs no tokenizer); its file alone knows the vocabulary."""
  return config.data.max_prompt_len, config.data.max_response_len, 0


def check(config):
  tokenizer_path(config)


def tokenizer_path(config):
  path = config.init.hf_path
  if not path:
    raise ValueError(f'the {config.data.name} task needs a tokenizer: set '
                     '--config.init.hf_path=DIR (a Hugging Face model directory with '
                     'tokenizer.json)')
  return path


class PromptSource(Sequence):
  """A data source whose prompts read as the model will see them (instruction + chat template).

  Records whose rendered prompt is longer than `max_len` tokens are left out (counted, logged):
  every batch then has fixed shapes and no prompt is silently truncated.
  """

  def __init__(self, source, tokenizer, max_len, instruction='', chat_template=True):
    self._source, self._tokenizer = source, tokenizer
    self._instruction, self._chat = instruction, chat_template
    records = sources.read_records(source, range(len(source)))
    lengths_N = map(len, tokenizer.encode_batch(self.render(r['prompt']) for r in records))
    self._keep = [i for i, n in enumerate(lengths_N) if n <= max_len]
    self.dropped = len(source) - len(self._keep)
    if self.dropped:
      logging.warning('%d of %d prompts are longer than %d tokens and left out', self.dropped,
                      len(source), max_len)
    if not self._keep:
      raise ValueError(f'every prompt is longer than data.max_prompt_len={max_len} tokens')

  def render(self, question) -> str:
    question = sources.text(question)
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
    records = sources.read_records(self._source, [self._keep[i] for i in indices])
    return [self._record(r) for r in records]


def make(config, data_dir):
  dcfg = config.data
  path = tokenizer_path(config)
  if dcfg.max_prompt_len < 1 or dcfg.max_response_len < 2:
    raise ValueError(f'data.max_prompt_len ({dcfg.max_prompt_len}) must be >= 1 and '
                     f'data.max_response_len ({dcfg.max_response_len}) >= 2')
  tokenizer = hf_tokenizer.HFTokenizer(path)
  builder_config = math_jsonl.make_config(dcfg.name, dcfg.path, dcfg.test_path, dcfg.num_test,
                                          dcfg.seed)
  train, test = (PromptSource(sources.load_tfds_split(math_jsonl.MathJsonl, builder_config,
                                                      data_dir, split),
                              tokenizer, dcfg.max_prompt_len, dcfg.instruction,
                              dcfg.chat_template) for split in ('train', 'test'))
  return tokenizer, train, test
