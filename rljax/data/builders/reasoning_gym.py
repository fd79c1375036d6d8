"""A reasoning-gym dataset's entries as a TFDS dataset (the reasoning_gym task's data): the
library's own problems, drawn by index from one seeded dataset (rljax.data.rg_library), so the
same knobs give the same records on every host.

Entry i of a reasoning-gym dataset of seed s is made from Random(s + i). The test split holds the
first `num_test` distinct prompts (from entry 0 on); the train split the next `num_train` entries
whose prompt is not a test prompt (a prompt may repeat in train, as in the other builders).
Entries whose prompt or answer is longer than the character limits, or uses a character outside
`charset` (each empty: no limit), are passed over: the character tokenizer's context and
alphabet. A record is {prompt, answer}: the prompt rendered (rljax.data.rg_prompts), the answer
a reference to the entry (rg_library.reference), which the verifier hands to the library's scorer.
"""

import dataclasses
import hashlib
import json

import tensorflow_datasets as tfds

from rljax.data.builders import local
from rljax.data import rg_library
from rljax.data import rg_prompts

SCAN = 20   # entries looked at, at most, per record a split wants


@dataclasses.dataclass(eq=False)
class ReasoningGymConfig(tfds.core.BuilderConfig):
  """The knobs of one dataset; build it with `make_config`."""

  dataset: str = 'chain_sum'
  args: str = '{}'          # the library dataset's config fields, canonical JSON
  render: str = 'question'  # rg_prompts.STYLES
  num_train: int = 100_000
  num_test: int = 1_000
  seed: int = 0
  max_prompt_chars: int = 0
  max_answer_chars: int = 0
  charset: str = ''

  @property
  def size(self):
    """The library dataset's size: every index the draws may read."""
    return SCAN * (self.num_test + self.num_train)


def make_config(dataset, args='{}', render='question', num_train=100_000, num_test=1_000, seed=0,
                max_prompt_chars=0, max_answer_chars=0, charset='') -> ReasoningGymConfig:
  """Validates the knobs (the library's own checks included); the name carries the dataset, the
  split knobs and a hash of the rest and of the library's version."""
  args = rg_library.parse_args(args)
  local.check_split_knobs(num_train, num_test, seed)
  rg_library.dataset(dataset, args, seed, SCAN * (num_test + num_train))
  rg_prompts.check(dataset, render)
  knobs = dict(dataset=dataset, args=args, render=render, num_train=num_train, num_test=num_test,
               seed=seed, max_prompt_chars=max_prompt_chars, max_answer_chars=max_answer_chars,
               charset=charset)
  rest = json.dumps([args, render, max_prompt_chars, max_answer_chars, charset,
                     rg_library.version()])
  digest = hashlib.sha256(rest.encode()).hexdigest()[:12]
  return ReasoningGymConfig(name=f'{dataset}_{digest}_n{num_train}_t{num_test}_s{seed}',
                            description=f'reasoning-gym entries with knobs {knobs}.', **knobs)


def _fits(config, prompt, answer):
  for text, limit in ((prompt, config.max_prompt_chars), (answer, config.max_answer_chars)):
    if limit and len(text) > limit or config.charset and not set(text) <= set(config.charset):
      return False
  return True


def _draw(config, start, stop, count, wanted):
  """Records of entries start, start + 1, ... before `stop` that fit and that `wanted(prompt)`
  admits, until `count`; and the index after the last one read."""
  data = rg_library.dataset(config.dataset, config.args, config.seed, config.size)
  records, index = [], start
  while len(records) < count and index < stop:
    entry = data[index]
    prompt = rg_prompts.render(config.dataset, config.render, entry)
    if _fits(config, prompt, entry['answer']) and wanted(prompt):
      records.append(dict(prompt=prompt, answer=rg_library.reference(
          config.dataset, config.args, config.seed, config.size, index, entry['answer'])))
    index += 1
  if len(records) < count:
    raise ValueError(f'{config.dataset}: only {len(records)} of the {count} records wanted fit '
                     f'in entries {start} to {stop - 1} (distinct test prompts, within the length '
                     'limits): lower data.num_test / num_train, or change data.dataset_args')
  return records, index


def _splits(config):
  """(test, train) records."""
  test_prompts = set()

  def new_test_prompt(prompt):
    fresh = prompt not in test_prompts
    test_prompts.add(prompt)
    return fresh

  test, index = _draw(config, 0, SCAN * config.num_test, config.num_test, new_test_prompt)
  train, _ = _draw(config, index, config.size, config.num_train,
                   lambda prompt: prompt not in test_prompts)
  return test, train


class ReasoningGym(local.LocalBuilder):
  """Prompts and entry references of a reasoning-gym dataset."""

  def _splits(self):
    return _splits(self.builder_config)
