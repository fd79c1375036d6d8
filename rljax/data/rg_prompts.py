"""How a reasoning-gym entry reads as a prompt (data.render): the library's own `question`, or a
compact form built from the entry's metadata for the arithmetic-style datasets, short enough for
a character model's context: chain_sum's 'State the final answer to the following arithmetic
problem: 4 - 1 - 7 =' reads '4-1-7='. The problem, its answer and its scorer are the library's
either way; only the wording is left out.
"""


def _expression(entry):
  """'4 - 1 - 7' -> '4-1-7=' (basic_arithmetic's '/' is floor division, as the library computes)."""
  return entry['metadata']['expression'].replace(' ', '') + '='


def _call(function, key):
  """'gcd(780,461)=' from the numbers in metadata[key]."""
  return lambda entry: f'{function}({",".join(map(str, entry["metadata"][key]))})='


COMPACT = {
    'basic_arithmetic': _expression,
    'chain_sum': _expression,
    'count_bits': lambda entry: f'bits({entry["metadata"]["number"]})=',
    'decimal_chain_sum': _expression,
    'gcd': _call('gcd', 'numbers'),
    'lcm': _call('lcm', 'numbers'),
    'products': _expression,
    # '56-98*e=-1218': the answer is the value of its one letter
    'simple_equations': lambda entry: entry['metadata']['equation'].replace(' ', ''),
}
STYLES = ('question', 'compact')


def check(name, style):
  """ValueError unless `style` is a render style that dataset `name` has."""
  if style not in STYLES:
    raise ValueError(f'data.render must be one of {STYLES}, got {style!r}')
  if style == 'compact' and name not in COMPACT:
    raise ValueError(f'data.render=compact: {name} has no compact prompt; those that have one: '
                     f'{", ".join(sorted(COMPACT))} (or data.render=question)')


def render(name, style, entry) -> str:
  """The prompt of a library entry of dataset `name`."""
  return entry['question'] if style == 'question' else COMPACT[name](entry)
