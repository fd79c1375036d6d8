"""The built-in calculator tool (rljax.envs.calculator): random expressions against their trees'
values computed in Python ints (the reference never parses text), and hostile calls (code, huge
numbers, deep nesting, empty, unicode, non-text) refused with CalculatorError, each within
milliseconds."""
import re
import time

import numpy as np
import pytest

from rljax.envs import calculator


def random_tree(rng, depth):
  """(text, value) of a random expression of the grammar, at most `depth` levels of nesting."""
  kind = rng.integers(0, 4) if depth else 0
  if kind == 0:
    value = int(rng.integers(0, 10**int(rng.integers(1, 7))))
    return str(value), value
  if kind == 1:
    text, value = random_tree(rng, depth - 1)
    return f'({text})', value
  if kind == 2:
    text, value = random_tree(rng, depth - 1)
    return f'-({text})', -value
  (a, x), (b, y) = random_tree(rng, depth - 1), random_tree(rng, depth - 1)
  op = '+-*'[rng.integers(0, 3)]
  return f'({a}{op}{b})', {'+': x + y, '-': x - y, '*': x * y}[op]


def test_random_expressions_equal_their_tree_values():
  rng = np.random.default_rng(0)
  checked = 0
  for _ in range(2000):
    text, value = random_tree(rng, 3)
    if len(text) > calculator.MAX_CHARS or abs(value) >= 10**calculator.MAX_RESULT_DIGITS:
      continue
    assert calculator.calculate(text) == str(value), text
    checked += 1
  assert checked > 1000


@pytest.mark.parametrize('text,value', [
    ('12+30', '42'), ('2+3*4', '14'), ('(2+3)*4', '20'), ('10-2-3', '5'), ('-5+2', '-3'),
    ('--5', '5'), ('2*-3', '-6'), ('0', '0'), ('007', '7'), ('999999999999*999999',
                                                            str(999999999999 * 999999))])
def test_precedence_and_associativity(text, value):
  assert calculator.calculate(text) == value


HOSTILE = [
    ('', 'empty'),
    ("__import__('os').system('echo pwned')", 'expected a number'),
    ('1;2', "unexpected ';'"),
    ('1+1 ', "unexpected ' '"),
    ('2**10', 'expected a number'),
    ('1/2', "unexpected '/'"),
    ('1' * 13, 'operand of 13 digits'),
    ('999999999999*999999999999', 'more than 18 digits'),
    ('999999*999999*999999*999999', 'more than 18 digits'),
    ('(' * 9 + '1' + ')' * 9, 'nested'),
    ('-' * 9 + '1', 'nested'),
    ('(' * 40, 'nested'),
    ('((1)', 'unclosed'),
    ('1)', "unexpected ')'"),
    ('1+', 'the end'),
    ('²+1', 'expected a number'),      # str.isdigit() is True for these
    ('٣+1', 'expected a number'),
    ('１+1', 'expected a number'),
    ('9' * 10**6, 'characters'),
    ('1\x00+1', 'unexpected'),
]


@pytest.mark.parametrize('text,message', HOSTILE)
def test_hostile_calls_are_refused_fast(text, message):
  start = time.perf_counter()
  with pytest.raises(calculator.CalculatorError, match=re.escape(message)):
    calculator.calculate(text)
  assert time.perf_counter() - start < 0.05


@pytest.mark.parametrize('call', [None, b'1+1', 12, ['1']])
def test_non_text_is_refused(call):
  with pytest.raises(calculator.CalculatorError, match='a call is text'):
    calculator.calculate(call)
