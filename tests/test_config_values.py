"""docs/reference/config.md's `values` column held to the code: every field's default in configs/
lies in its declared range; a value just outside the range is refused with a line that names the
field, and the edges of a range with no condition on other fields are not refused for it; the
`(before: X)` values are rljax/train/upgrades.py's INTRODUCED."""
import ast
import math
import pathlib
import re
from typing import NamedTuple, Optional

import pytest

from configs import grpo
from configs import ppo
from configs import protocol
from configs import rloo
from rljax.protocol import runs
from rljax import tasks
from rljax.train import config_checks
from rljax.train import upgrades
from test_docs import CODE, config_items, documented_rows

REFERENCE = pathlib.Path(__file__).parent.parent / 'docs' / 'reference' / 'config.md'
BOUND = r'(-?[0-9.e+-]+)'
# The contexts in which each config file's fields are read: P=auto reads auto_batch.*, the tool
# task tools.* and data.demo_frac, a LoRA rank model.lora.*.
CONTEXTS = {'grpo': (grpo, ('runlocal', 'runlocal,P=auto', 'runlocal,task=tools',
                            'runlocal,lora=8')),
            'ppo': (ppo, ('runlocal',)), 'protocol': (protocol, ('runlocal',))}
# Fields read only with another field set so.
WHEN = {'rollout.max_staleness': {'rollout.schedule': 'partial', 'rollout.slots': 16},
        'model.dense_hidden': {'model.num_experts': 0},
        'ppo.vf_coef': {'ppo.share_trunk': True},
        **{f'{algo}.{bound}': {f'{algo}.off_policy': 'mis'}
           for algo in ('grpo', 'ppo') for bound in ('is_low', 'is_high')}}
# Fields read only by tasks whose data (local JSONL files, the reasoning-gym library) a config
# check here does not build; their own tests hold their checks (tests/test_math_data.py,
# tests/test_reasoning_gym.py).
UNREAD = ('data.max_prompt_len', 'data.max_response_len', 'data.render')


class Spec(NamedTuple):
  kind: str                   # int, number, power, choice, bool, text, list
  low: Optional[float] = None
  high: Optional[float] = None
  low_open: bool = False
  high_open: bool = False
  extra: Optional[float] = None   # `... or V`: one more value allowed
  choices: tuple = ()
  conditioned: bool = False   # a condition on other fields follows `;`


def parse(text):
  """The Spec a `values` cell declares."""
  rule, conditioned = text.split(';')[0].strip(), ';' in text
  if rule.startswith('one of '):
    choices = tuple('' if choice == "''" else choice for choice in CODE.findall(rule))
    return Spec('choice', choices=choices, conditioned=conditioned)
  if rule in ('bool', 'text', 'list', 'power of two'):
    return Spec(rule.split()[0], conditioned=conditioned)
  rule, _, extra = rule.partition(' or ')
  extra = float(extra) if extra else None
  kind, _, bound = rule.partition(' ')
  if not bound:
    return Spec(kind, extra=extra, conditioned=conditioned)
  one = re.fullmatch(r'(>=|>) ' + BOUND, bound)
  if one:
    return Spec(kind, float(one[2]), None, one[1] == '>', False, extra, (), conditioned)
  two = re.fullmatch(r'in ([[(])' + BOUND + ', ' + BOUND + r'([\])])', bound)
  assert two, f'a values cell this test cannot read: {text!r}'
  return Spec(kind, float(two[2]), float(two[3]), two[1] == '(', two[4] == ')', extra, (),
              conditioned)


def cells():
  """{dotted field: its `values` cell} from the reference's tables (`as in grpo` rows: grpo's)."""
  found = {field: row[0] for field, row in documented_rows(REFERENCE.read_text()).items()}
  return {field: found['grpo.' + field.split('.', 1)[1]] if cell == 'as in `grpo`' else cell
          for field, cell in found.items()}


BEFORE = re.compile(r' \(before: `(.*)`\)$')   # the value that reproduces rljax before the field
CELLS = cells()
SPECS = {field: parse(BEFORE.sub('', cell)) for field, cell in CELLS.items()}


def allowed(spec, value):
  """Whether `value` is of the declared type and in the declared range."""
  if spec.kind in ('text', 'list', 'bool'):
    return isinstance(value, {'text': str, 'list': (tuple, list), 'bool': bool}[spec.kind])
  if spec.kind == 'choice':
    return value in spec.choices
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return False
  if spec.kind == 'power':
    return isinstance(value, int) and value >= 1 and not value & (value - 1)
  if (spec.kind == 'int' and not isinstance(value, int)) or not math.isfinite(value):
    return False
  if value == spec.extra:
    return True
  above = spec.low is None or (value > spec.low if spec.low_open else value >= spec.low)
  below = spec.high is None or (value < spec.high if spec.high_open else value <= spec.high)
  return above and below


def outside(spec):
  """Values just outside the declared range (of the field's own type)."""
  if spec.kind == 'choice':
    return ['no-such-value']
  if spec.kind == 'power':
    return [3, 0]
  if spec.kind not in ('int', 'number'):
    return []
  step = lambda bound: 1 if spec.kind == 'int' else max(abs(bound), 1) * 1e-3
  values = [] if spec.kind == 'int' else [math.nan]
  if spec.low is not None:
    values.append(spec.low if spec.low_open else spec.low - step(spec.low))
  if spec.high is not None:
    values.append(spec.high if spec.high_open else spec.high + step(spec.high))
  cast = int if spec.kind == 'int' else float
  return [cast(v) for v in values if v != spec.extra]


def edges(spec):
  """The range's included edges (and its extra value), for a range with no condition."""
  if spec.conditioned or spec.kind not in ('int', 'number'):
    return []
  cast = int if spec.kind == 'int' else float
  values = [spec.low if not spec.low_open else None, spec.high if not spec.high_open else None,
            spec.extra]
  return [cast(v) for v in values if v is not None]


def put(config, field, value):
  *path, key = field.split('.')
  for part in path:
    config = config[part]
  config[key] = value


def refusal(name, arg, field, value, tmp_path):
  """The config check's message for configs/<name>.py:arg with `field` = value (None: passed)."""
  module, _ = CONTEXTS[name]
  config = module.get_config(arg)
  for other, setting in WHEN.get(field, {}).items():
    put(config, other, setting)
  try:
    put(config, field, value)
    if name == 'protocol':
      runs.arms(config, str(tmp_path))
    else:
      config_checks.check(config, device_count=1, process_count=1)
      tasks.check_needs(config)
  except (TypeError, ValueError) as error:   # a TypeError: the ConfigDict refuses the type
    return str(error)
  return None


def names(message, field):
  return re.search(r'\b' + re.escape(field.split('.')[-1]) + r'\b', message) is not None


def fields_of(name):
  module, _ = CONTEXTS[name]
  skip = ('arm.',) if name == 'protocol' else ()
  return [field for field, _ in config_items(module.get_config('runlocal').to_dict())
          if field in SPECS and not field.startswith(skip) and field not in UNREAD]


CASES = [(name, field) for name in CONTEXTS for field in fields_of(name)
         if name == 'grpo' or field.split('.')[0] in ('ppo', 'critic_optimizer', 'protocol')]


CONFIG_FIELDS = {field for module in (grpo, ppo, rloo, protocol)
                 for field, _ in config_items(module.get_config('runlocal').to_dict())
                 if not field.startswith('arm.')}


def test_every_config_field_has_a_values_cell():
  assert not sorted(CONFIG_FIELDS - set(SPECS))


@pytest.mark.parametrize('name', CONTEXTS)
def test_the_defaults_lie_in_their_declared_ranges(name):
  module, args = CONTEXTS[name]
  for arg in ('',) + args:
    bad = [(field, value) for field, value in config_items(module.get_config(arg).to_dict())
           if field in SPECS and not allowed(SPECS[field], value)]   # an arm's: its file's
    assert not bad, f'configs/{name}.py:{arg}: {bad}'


def test_the_reference_declares_the_values_an_older_record_gives_the_fields_added_since():
  """Its `(before: ...)` values are upgrades.INTRODUCED, and lie in their declared ranges."""
  before = {field: ast.literal_eval(BEFORE.search(cell)[1]) for field, cell in CELLS.items()
            if BEFORE.search(cell) and field in CONFIG_FIELDS}
  assert before == upgrades.INTRODUCED
  assert not {field: value for field, value in before.items() if not allowed(SPECS[field], value)}


@pytest.mark.parametrize('name,field', CASES)
def test_a_value_outside_the_declared_range_is_refused_naming_the_field(name, field, tmp_path):
  spec, (_, args) = SPECS[field], CONTEXTS[name]
  for value in outside(spec):
    messages = [refusal(name, arg, field, value, tmp_path) for arg in args]
    assert any(m and names(m, field) for m in messages), (value, messages)
  for value in edges(spec):
    messages = [refusal(name, arg, field, value, tmp_path) for arg in args]
    assert not all(m and names(m, field) for m in messages), (value, messages)
  if spec.kind == 'choice':   # a refusal that quotes the choices quotes the declared ones
    message = refusal(name, args[0], field, 'no-such-value', tmp_path)
    quoted = set(re.findall(r"'([^']*)'", message)) - {'no-such-value'}
    assert not quoted or quoted == set(spec.choices), message
