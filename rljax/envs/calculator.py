"""The built-in tool: a calculator of integer expressions, over untrusted model output.

A call's text is parsed by a small grammar and never run as code (no eval, exec or shell):

  expression := term (('+' | '-') term)*
  term       := factor ('*' factor)*
  factor     := '-' factor | number | '(' expression ')'
  number     := 1 to MAX_DIGITS ASCII digits

The limits bound its time and its output: at most MAX_CHARS characters, MAX_DEPTH nested
parentheses and signs, operands of MAX_DIGITS digits, every value (intermediate ones included)
below 10**MAX_RESULT_DIGITS in magnitude. Anything else raises CalculatorError saying what is
wrong; the runner turns it into an error result (rljax.envs.runner: `raised`).
"""

MAX_CHARS = 64
MAX_DEPTH = 8
MAX_DIGITS = 12
MAX_RESULT_DIGITS = 18
RESULT_CHARS = MAX_RESULT_DIGITS + 1   # the longest result: a sign and the digits
_DIGITS = frozenset('0123456789')      # ASCII only: str.isdigit() also accepts '²' and '٣'


class CalculatorError(ValueError):
  """The call is not an expression of the grammar, or breaks a limit."""


def calculate(text) -> str:
  """The value of the expression `text`, in decimal."""
  if not isinstance(text, str):
    raise CalculatorError(f'a call is text, got {type(text).__name__}')
  if not text:
    raise CalculatorError('empty call')
  if len(text) > MAX_CHARS:
    raise CalculatorError(f'call of {len(text)} characters, more than {MAX_CHARS}')
  parser = _Parser(text)
  value = parser.expression(0)
  if parser.at < len(text):
    raise CalculatorError(f'unexpected {text[parser.at]!r} at {parser.at}')
  return str(value)


def _bounded(value):
  if abs(value) >= 10**MAX_RESULT_DIGITS:
    raise CalculatorError(f'a value of more than {MAX_RESULT_DIGITS} digits')
  return value


class _Parser:
  """Recursive descent over `text`; `at` is the next character. Recursion is at most MAX_DEPTH
  deep (each '(' and each sign is one level)."""

  def __init__(self, text):
    self.text, self.at = text, 0

  def peek(self):
    return self.text[self.at] if self.at < len(self.text) else ''

  def expression(self, depth):
    value = self.term(depth)
    while self.peek() in ('+', '-'):
      op = self.peek()
      self.at += 1
      right = self.term(depth)
      value = _bounded(value + right if op == '+' else value - right)
    return value

  def term(self, depth):
    value = self.factor(depth)
    while self.peek() == '*':
      self.at += 1
      value = _bounded(value * self.factor(depth))
    return value

  def factor(self, depth):
    char = self.peek()
    if char in ('-', '('):
      if depth >= MAX_DEPTH:
        raise CalculatorError(f'more than {MAX_DEPTH} nested parentheses or signs')
      self.at += 1
      if char == '-':
        return -self.factor(depth + 1)
      value = self.expression(depth + 1)
      if self.peek() != ')':
        raise CalculatorError(f'unclosed parenthesis at {self.at}')
      self.at += 1
      return value
    start = self.at
    while self.peek() in _DIGITS:
      self.at += 1
    if self.at == start:
      raise CalculatorError(f'expected a number at {start}, got {char or "the end"!r}')
    if self.at - start > MAX_DIGITS:
      raise CalculatorError(f'an operand of {self.at - start} digits, more than {MAX_DIGITS}')
    return _bounded(int(self.text[start:self.at]))
