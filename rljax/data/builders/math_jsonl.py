"""Local GSM8K- and MATH-format JSONL files as TFDS datasets (array_record; no download).

  gsm8k: {"question": ..., "answer": "...worked steps...\\n#### 72"}
  math:  {"problem": ..., "solution": "... $\\boxed{\\frac{1}{2}}$ ..."}

Every record becomes {prompt, answer, solution}: the question, the final answer (after '####', or
the last \\boxed{} / \\fbox{}), and the full worked solution. The test split is a second file, or
else `num_test` records held out of the train file by a seeded draw. The config name carries a
hash of the files' bytes, so an edited file is rebuilt, never read stale from the cache.
"""

import dataclasses
import hashlib
import json
import os

import numpy as np
import tensorflow_datasets as tfds

from rljax.data.builders import local

FORMATS = {'gsm8k': ('question', 'answer'), 'math': ('problem', 'solution')}


@dataclasses.dataclass(eq=False)
class MathJsonlConfig(tfds.core.BuilderConfig):
  format: str = 'gsm8k'
  path: str = ''        # train file (and the test split's source when test_path is empty)
  test_path: str = ''
  num_test: int = 0     # records held out of `path` when there is no test file
  seed: int = 0


def last_boxed(text: str):
  """Contents of the last \\boxed{...} or \\fbox{...} (braces balanced), or None."""
  start = max(text.rfind('\\boxed{'), text.rfind('\\fbox{'))
  if start < 0:
    return None
  depth, begin = 0, text.index('{', start)
  for i in range(begin, len(text)):
    depth += {'{': 1, '}': -1}.get(text[i], 0)
    if depth == 0:
      return text[begin + 1:i]
  return None


def final_answer(fmt: str, solution: str):
  """The reference answer of a worked solution, or None when it has none."""
  if fmt == 'gsm8k':
    if '####' not in solution:
      return None
    return solution.rsplit('####', 1)[1].strip() or None
  answer = last_boxed(solution)
  return answer.strip() if answer and answer.strip() else None


def read_jsonl(path: str, fmt: str) -> list[dict]:
  """Parses a file into {prompt, answer, solution} records; a bad line raises, naming file:line."""
  question_key, solution_key = FORMATS[fmt]
  records = []
  with open(path, 'rb') as f:
    for number, raw in enumerate(f, 1):
      where = f'{path}:{number}'
      try:
        line = raw.decode('utf-8')
      except UnicodeDecodeError as error:
        raise ValueError(f'{where}: not UTF-8 (byte {error.start + 1} of the line is '
                         f'{raw[error.start]:#04x})') from None
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as error:
        raise ValueError(f'{where}: not JSON ({error.msg})') from None
      if not isinstance(row, dict) or not isinstance(row.get(question_key), str) or not isinstance(
          row.get(solution_key), str):
        raise ValueError(f'{where}: a {fmt} record needs string fields {question_key!r} and '
                         f'{solution_key!r}')
      answer = final_answer(fmt, row[solution_key])
      if answer is None:
        expected = "'#### <answer>'" if fmt == 'gsm8k' else 'a \\boxed{...} answer'
        raise ValueError(f'{where}: the {solution_key!r} field has no final answer ({expected})')
      records.append(dict(prompt=row[question_key].strip(), answer=answer,
                          solution=row[solution_key]))
  if not records:
    raise ValueError(f'{path} holds no records')
  return records


def _digest(*paths) -> str:
  sha = hashlib.sha256()
  for path in paths:
    if path:
      with open(path, 'rb') as f:
        sha.update(f.read())
    sha.update(b'\0')
  return sha.hexdigest()[:16]


def make_config(fmt='gsm8k', path='', test_path='', num_test=0, seed=0) -> MathJsonlConfig:
  """Validates the knobs; the name encodes the format, the files' content and the split knobs."""
  if fmt not in FORMATS:
    raise ValueError(f'data format {fmt!r} is not one of {sorted(FORMATS)}')
  for name, value in (('data.path', path), ('data.test_path', test_path)):
    if value and not os.path.isfile(value):
      raise ValueError(f'{name} {value!r} is not a file')
  if not path:
    raise ValueError(f'the {fmt} task reads a local JSONL file: set --config.data.path=FILE')
  if not test_path and num_test < 1:
    raise ValueError('set data.test_path, or data.num_test > 0 records to hold out of data.path')
  held_out = 0 if test_path else num_test
  name = f'{fmt}_{_digest(path, test_path)}_t{held_out}_s{seed}'
  return MathJsonlConfig(name=name, description=f'{fmt} records from {path} ({test_path})',
                         format=fmt, path=os.path.abspath(path),
                         test_path=os.path.abspath(test_path) if test_path else '',
                         num_test=held_out, seed=seed)


class MathJsonl(local.LocalBuilder):
  """Math word problems with reference final answers, from local JSONL files."""

  FEATURES = ('prompt', 'answer', 'solution')

  def _splits(self):
    config = self.builder_config
    train = read_jsonl(config.path, config.format)
    if config.test_path:
      return read_jsonl(config.test_path, config.format), train
    if config.num_test >= len(train):
      raise ValueError(f'num_test={config.num_test} leaves no training records of {len(train)}')
    order = np.random.default_rng(config.seed).permutation(len(train))
    held_out = set(order[:config.num_test].tolist())
    return ([r for i, r in enumerate(train) if i in held_out],
            [r for i, r in enumerate(train) if i not in held_out])
