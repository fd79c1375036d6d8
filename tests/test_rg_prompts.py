"""How reasoning-gym entries read as prompts (rljax.data.rg_prompts): the library's question, or the
compact form every COMPACT dataset makes from its metadata, with the numbers of its question."""
import re

import pytest

from rljax.data import rg_library
from rljax.data import rg_prompts


@pytest.mark.parametrize('name', sorted(rg_prompts.COMPACT))
def test_a_compact_prompt_holds_the_numbers_of_the_question(name):
  data = rg_library.dataset(name, '{}', 0, 100)
  for index in range(20):
    entry = data[index]
    compact = rg_prompts.render(name, 'compact', entry)
    assert rg_prompts.render(name, 'question', entry) == entry['question']
    assert ' ' not in compact and len(compact) < len(entry['question'])
    number = r'\d+(?:\.\d+)?'
    assert re.findall(number, compact) == re.findall(number, entry['question'])[-len(
        re.findall(number, compact)):], (compact, entry['question'])


def test_render_styles_are_checked():
  rg_prompts.check('leg_counting', 'question')
  with pytest.raises(ValueError, match=r"data.render must be one of \('question', 'compact'\)"):
    rg_prompts.check('chain_sum', 'short')
  with pytest.raises(ValueError, match=r'data.render=compact: leg_counting has no compact prompt; '
                                       r'those that have one: basic_arithmetic, chain_sum'):
    rg_prompts.check('leg_counting', 'compact')
