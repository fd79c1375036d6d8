"""Running a task's tool on the host (rljax.rollout.tool_calls): the call's text, the result's
tokens between the markers, and every failure (raising, not text, too long, not encodable,
hanging, no call-open marker, disabled) turned into the error result and counted by its kind; a
chunk's hanging calls wait one timeout together, not one each."""
import threading
import time

import numpy as np
import pytest

from rljax.data import calculator
from rljax.data import tokenizer as tokenizer_lib
from rljax.rollout import tool_calls

TOKENIZER = tokenizer_lib.ToolTokenizer()
TOOL = tool_calls.Tool(calculator.calculate, TOKENIZER, ('[', ']', '{', '}'), error='?',
                       max_chars=calculator.RESULT_CHARS, timeout_s=0.3)
ids = TOKENIZER.encode


def test_calls_get_the_tools_result_between_the_markers():
  histories = [ids('[12+30]'), ids('7[1+1]{2}2[(2+3)*4]'), ids('[999999999999*999999]')]
  outcomes = tool_calls.run_calls(TOOL, histories)
  assert [o.ids for o in outcomes] == [ids('{42}'), ids('{20}'),
                                       ids('{%d}' % (999999999999 * 999999))]
  assert [o.error for o in outcomes] == ['', '', '']
  assert tool_calls.call_text(TOOL, ids('5[1+2]{3}[4*4]')) == '4*4'


def hang(_):
  threading.Event().wait(30)


@pytest.mark.parametrize('fn,history,kind', [
    (calculator.calculate, '[1+]', 'raised'),            # the calculator refuses it
    (calculator.calculate, '12+3]', 'malformed'),        # no call-open marker: not run
    (lambda call: 12, '[1]', 'malformed'),               # not text
    (lambda call: '9' * 20, '[1]', 'malformed'),         # longer than max_chars
    (lambda call: 'seven', '[1]', 'malformed'),          # the tokenizer cannot encode it
    (lambda call: 1 / 0, '[1]', 'raised'),
    (hang, '[1]', 'timeout'),
    (None, '[1+1]', 'disabled'),
])
def test_a_bad_call_gets_the_error_result(fn, history, kind):
  outcome, = tool_calls.run_calls(TOOL._replace(fn=fn), [ids(history)])
  assert outcome.ids == ids('{?}') and outcome.error == kind


def test_hanging_calls_of_one_chunk_share_one_timeout():
  start = time.perf_counter()
  outcomes = tool_calls.run_calls(TOOL._replace(fn=hang), [ids('[1]')] * 8)
  elapsed = time.perf_counter() - start
  assert [o.error for o in outcomes] == ['timeout'] * 8
  assert 0.3 <= elapsed < 0.3 * 2   # together, not 8 x 0.3 s


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
  np.testing.assert_array_equal(tool_calls.output_mask(TOOL, row), expected)
