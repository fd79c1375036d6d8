"""Tests for the arithmetic tokenizer."""

import numpy as np
import pytest

from rljax.data.tokenizer import ArithmeticTokenizer
from rljax.data.tokenizer import ToolTokenizer


def test_vocabulary_layout():
  tokenizer = ArithmeticTokenizer()
  assert tokenizer.vocab_size == 16
  assert (tokenizer.pad_id, tokenizer.eos_id) == (0, 1)
  assert tokenizer.encode('0123456789+-*=') == list(range(2, 16))


def test_round_trip():
  tokenizer = ArithmeticTokenizer()
  assert tokenizer.encode('037+048=') == [2, 5, 9, 12, 2, 6, 10, 15]
  assert tokenizer.decode(tokenizer.encode('12*-3=')) == '12*-3='


def test_decode_stops_at_eos_and_skips_pad():
  tokenizer = ArithmeticTokenizer()
  ids = np.array([0, 0, 10, 7, 1, 3, 0], np.int32)  # PAD PAD 8 5 EOS 1 PAD
  assert tokenizer.decode(ids) == '85'
  assert tokenizer.decode([]) == ''


def test_encode_names_the_bad_character():
  with pytest.raises(ValueError, match="'x'"):
    ArithmeticTokenizer().encode('1x2')


def test_decode_rejects_out_of_range_ids():
  with pytest.raises(ValueError, match='16'):
    ArithmeticTokenizer().decode([2, 16])


def test_tool_tokenizer_extends_the_arithmetic_ids():
  tool, arithmetic = ToolTokenizer(), ArithmeticTokenizer()
  assert tool.vocab_size == 23
  assert tool.encode('0123456789+-*=') == arithmetic.encode('0123456789+-*=')
  assert tool.encode('()[]{}?') == list(range(16, 23))
  assert tool.decode(tool.encode('[12+3]{15}15')) == '[12+3]{15}15'
  with pytest.raises(ValueError, match="'x'"):
    tool.encode('[x]')
