"""reasoning-gym as rljax reads it (rljax.data.rg_library): datasets by name with clear errors, and
the library's own scorer, reached through a record's reference, checked against answers computed
here without the library."""
import json
import math
import sys

import pytest

from rljax.data import rewards
from rljax.data import rg_library
from rljax.data import rg_prompts

SIZE = 1000


def references(name, args, count, seed=0):
  """(compact prompt, reference) of a dataset's first `count` entries."""
  args = rg_library.parse_args(json.dumps(args))
  data = rg_library.dataset(name, args, seed, SIZE)
  return [(rg_prompts.render(name, 'compact', data[i]),
           rg_library.reference(name, args, seed, SIZE, i, data[i]['answer']))
          for i in range(count)]


def solve_linear(equation):
  """The value of the one letter in 'a+x=b', 'x-a=b', 'a-x=b' (simple_equations' two terms)."""
  letter = next(c for c in equation if c.isalpha())
  left, right = equation.split('=')
  value = lambda x: eval(left.replace(letter, f'({x})')) - int(right)   # linear in x
  slope = value(1) - value(0)
  return -value(0) // slope


# (dataset, its config fields, the answer of a compact prompt computed without the library)
INDEPENDENT = [
    ('chain_sum', dict(max_terms=4, max_digits=3), lambda p: eval(p[:-1])),
    ('basic_arithmetic', dict(allow_parentheses=False, allow_negation=False, operators=['+', '-']),
     lambda p: eval(p[:-1])),
    ('gcd', dict(max_numbers=3, max_value=500), lambda p: math.gcd(*eval(p[4:-2] + ','))),
    ('simple_equations', dict(max_terms=2, operators=['+', '-'], operators_weights=[0.5, 0.5]),
     solve_linear),
]


@pytest.mark.parametrize('name, args, answer_of', INDEPENDENT, ids=[c[0] for c in INDEPENDENT])
def test_the_library_scorer_agrees_with_an_independent_answer(name, args, answer_of):
  score = rewards.get_reward_fn('reasoning_gym')
  for prompt, reference in references(name, args, 100):
    right = answer_of(prompt)
    assert rg_library.demonstration(reference) == str(right), prompt
    assert score(str(right), reference) == 1.0 and score(str(right + 1), reference) == 0.0
    assert score('', reference) == 0.0


def test_a_score_is_the_datasets_own_score_answer_of_the_entry():
  data = rg_library.dataset('chain_sum', '{}', 5, SIZE)
  _, reference = references('chain_sum', {}, 8, seed=5)[7]
  entry = data[7]
  for response in (entry['answer'], entry['answer'] + '0', '+0' + entry['answer'], 'x'):
    assert rg_library.score(response, reference) == data.score_answer(response, entry)


def test_a_reference_the_library_now_answers_otherwise_is_not_scored():
  _, reference = references('chain_sum', {}, 1)[0]
  stale = json.dumps(dict(json.loads(reference), answer='123456789'))
  with pytest.raises(ValueError, match='now answers .* not .123456789.: built by another'):
    rg_library.score('123456789', stale)
  assert rewards.score_batch(rg_library.score, ['1'], [stale]) == (pytest.approx([0.0]), 1)


def test_dataset_args_are_a_json_object_without_seed_or_size():
  assert rg_library.parse_args('{"max_terms": 3, "max_digits": 1}') == (
      '{"max_digits": 1, "max_terms": 3}')
  assert rg_library.parse_args('') == '{}'
  for text, message in (('{max_terms: 3}', r"must be a JSON object, got '\{max_terms: 3\}' \("),
                        ('[3]', 'must be a JSON object'), ('{"seed": 3}', 'the seed is data.seed')):
    with pytest.raises(ValueError, match=message):
      rg_library.parse_args(text)


@pytest.mark.parametrize('name, args, message', [
    ('chain_summ', '{}', r"data.dataset must name a reasoning-gym dataset, got 'chain_summ'; the "
                         r'datasets: ab, acre, .*basic_arithmetic, .*chain_sum, .*zebra_puzzles'),
    ('chain_sum', '{"max_term": 3}', r'data.dataset_args: chain_sum has no field max_term; its '
                                     r'fields: min_terms, max_terms, min_digits, max_digits, '
                                     r'allow_negation'),
    ('chain_sum', '{"max_terms": 3, "min_terms": 4}',
     r'data.dataset_args \{"max_terms": 3, "min_terms": 4\} is not a valid chain_sum config: '
     r'max_terms must be >= min_terms'),
], ids=['unknown-dataset', 'unknown-field', 'refused-by-the-library'])
def test_bad_datasets_fail_in_one_line(name, args, message):
  with pytest.raises(ValueError, match=message) as raised:
    rg_library.dataset(name, args, 0, SIZE)
  assert '\n' not in str(raised.value)


def test_without_the_library_one_line_says_how_to_install_it(monkeypatch):
  monkeypatch.setitem(sys.modules, 'reasoning_gym', None)   # what `import` finds uninstalled
  with pytest.raises(ValueError, match=r"^data.name=reasoning_gym needs the reasoning-gym package: "
                                       r"pip install 'reasoning-gym>=0.1.25,<0.2'"):
    rg_library.names()
