"""A task's tool as an environment (rljax.envs.tools), its steps run by the host's runner
(rljax.envs.runner) in the worker pool: the call's text, the result's tokens between the
markers, and every failure (raising, not text, too long, not encodable, hanging, crashing, no
call-open marker, disabled, markers or special tokens in the result) turned into the error
result and counted by its kind; a chunk's hanging calls wait one timeout together, not one
each."""
import time

import numpy as np
import pytest

from rljax.data import tokenizer as tokenizer_lib
from rljax.envs import calculator
from rljax.envs import pool as pool_lib
from rljax.envs import runner
from rljax.envs import screen
from rljax.envs import tools

import sample_tools

TOKENIZER = tokenizer_lib.ToolTokenizer()
TOOL = tools.Tool(calculator.calculate, TOKENIZER, ('[', ']', '{', '}'), error='?',
                  max_chars=calculator.RESULT_CHARS)
LIMITS = runner.Limits(timeout_s=0.3)
ids = TOKENIZER.encode


def run_calls(tool, histories, limits=LIMITS):
  """The runner's Outcome of each call: one fresh episode per history (its first turn)."""
  episodes = runner.Episodes(tool, limits, [{}] * len(histories), budget=1000)
  return episodes.step(list(range(len(histories))), histories)


def test_calls_get_the_tools_result_between_the_markers():
  histories = [ids('[12+30]'), ids('7[1+1]{2}2[(2+3)*4]'), ids('[999999999999*999999]')]
  outcomes = run_calls(TOOL, histories)
  assert [o.ids for o in outcomes] == [ids('{42}'), ids('{20}'),
                                       ids('{%d}' % (999999999999 * 999999))]
  assert [o.error for o in outcomes] == ['', '', ''] and all(o.resume for o in outcomes)
  assert tools.call_text(TOOL, ids('5[1+2]{3}[4*4]')) == '4*4'


@pytest.mark.parametrize('fn,history,kind', [
    (calculator.calculate, '[1+]', 'raised'),            # the calculator refuses it
    (calculator.calculate, '12+3]', 'malformed'),        # no call-open marker: not run
    (sample_tools.return_int, '[1]', 'malformed'),       # not text
    (sample_tools.return_long, '[1]', 'oversize'),       # longer than max_chars
    (sample_tools.return_word, '[1]', 'malformed'),      # the tokenizer cannot encode it
    (sample_tools.raise_error, '[1]', 'raised'),
    (sample_tools.hang, '[1]', 'timeout'),
    (sample_tools.spin_in_c, '[1]', 'timeout'),          # C code holding the GIL
    (sample_tools.allocate, '[1]', 'memory'),
    (sample_tools.exit_hard, '[1]', 'crash'),
    (sample_tools.segfault, '[1]', 'crash'),
    (sample_tools.return_markers, '[1]', 'bad_result'),  # '}' would close the result early
    (None, '[1+1]', 'disabled'),
])
def test_a_bad_call_gets_the_error_result(fn, history, kind):
  outcome, = run_calls(TOOL._replace(fn=fn), [ids(history)], LIMITS._replace(memory_mb=64))
  assert outcome.ids == ids('{?}') and outcome.error == kind and outcome.resume


def test_a_call_of_ids_the_tokenizer_cannot_decode_is_malformed():
  """(A model with more ids than its tokenizer: refused at the config check, and harmless here.)"""
  outcome, = run_calls(TOOL, [ids('[') + [TOKENIZER.vocab_size] + ids(']')])
  assert outcome.ids == ids('{?}') and outcome.error == 'malformed'


def test_hanging_calls_of_one_chunk_share_one_timeout():
  tool = TOOL._replace(fn=sample_tools.hang)
  pool_lib.pool_for(tool, LIMITS.workers, runner.MAX_ANSWER, LIMITS.memory_mb).wait_ready()
  start = time.perf_counter()
  outcomes = run_calls(tool, [ids('[1]')] * 8)
  elapsed = time.perf_counter() - start
  assert [o.error for o in outcomes] == ['timeout'] * 8
  assert 0.3 <= elapsed < 0.3 * 2   # together, not 8 x 0.3 s


@pytest.mark.parametrize('fn,kind', [(sample_tools.return_end_token, 'bad_result'),
                                     (sample_tools.return_wide, 'oversize'),
                                     (sample_tools.plain, '')])
def test_special_tokens_and_results_longer_in_tokens_are_refused(fn, kind):
  tool = TOOL._replace(fn=fn, tokenizer=sample_tools.ChatTokenizer())
  outcome, = run_calls(tool, [ids('[4+38]')])
  assert outcome.error == kind
  assert outcome.ids == (ids('{42}') if fn is sample_tools.plain else ids('{?}'))
  assert screen.forbidden_ids(tool) == {*ids('[]{}'), TOKENIZER.eos_id, TOKENIZER.pad_id, 23}


@pytest.mark.parametrize('edit,message', [
    (dict(markers=('[', ']', '{', ']')), 'four distinct tokens'),
    (dict(error='}'), r"error text '}' is not a valid result \(bad_result\)"),
    (dict(error='?' * 20), r'is not a valid result \(oversize\)'),
])
def test_a_tool_whose_error_result_is_not_clean_is_refused(edit, message):
  runner.check(TOOL)
  with pytest.raises(ValueError, match=message):
    runner.check(TOOL._replace(**edit))


def test_markers_must_be_single_tokens():
  with pytest.raises(ValueError, match='one token each'):
    TOOL._replace(markers=('[[', ']', '{', '}')).marker_ids()


def test_output_mask_marks_exactly_the_results():
  row = ids('9[1+2]{3}3[4*4]{16}16=') + [TOKENIZER.eos_id, TOKENIZER.pad_id]
  text = TOKENIZER.decode(row)
  inside, expected = False, []   # a plain loop over the characters
  for char in text:
    inside = inside or char == '{'
    expected.append(inside)
    inside = inside and char != '}'
  expected += [False, False]
  # a numpy row, as the warm start has it
  np.testing.assert_array_equal(TOOL.observation_mask(np.array(row)), expected)
