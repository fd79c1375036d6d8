"""Tools for the tool runner's tests (test_tool_pool.py, test_tool_calls.py, test_turns.py,
test_tool_sums.py), plain and misbehaving: module-level functions, so they pickle by reference
to the worker processes, in a module importing nothing but the standard library and the
character tokenizers, so a worker loads them in milliseconds. `TextEnv` runs one as an
environment over character codes, which the pool's tests use to send it any text;
`ChatTokenizer` has what a Hugging Face tokenizer has that the character one lacks.

`hostile` does what its call text says, as a hostile model could make a tool do: '1+1' is a
plain calculation, the others hang, spin in C holding the GIL, allocate without bound, crash or
return what a result must not be.
"""
import ctypes
import os
import re
import threading
import time

from rljax.data import tokenizer as tokenizer_lib


def checksum(call):
  """A tool whose result is easy to recompute: the digits of a sum over the call's characters."""
  return str(sum(ord(char) for char in call))


def hang(_):
  threading.Event().wait(60)


def spin_in_c(_):
  """Catastrophic backtracking: seconds in the re module's C loop, never releasing the GIL."""
  return str(bool(re.match(r'(a+)+$', 'a' * 40 + 'b')))


def allocate(_):
  chunks = []
  while True:
    chunks.append(bytearray(1 << 26))   # 64 MiB: refused at once past the bound


def exit_hard(_):
  os._exit(3)


def segfault(_):
  ctypes.string_at(0)


def raise_error(_):
  return 1 / 0


def return_int(_):
  return 12


def return_long(_):
  return '9' * 100


def return_word(_):
  return 'seven'


def return_markers(_):
  return '1}2{3'


def sleep_then_write(path):
  """The side effect a timed-out call must never have: a file written after its timeout."""
  time.sleep(0.5)
  with open(path, 'w') as f:
    f.write('late')
  return '1'


def plain(call):
  return str(sum(int(x) for x in call.split('+')))


BEHAVIOURS = {'hang': hang, 'spin': spin_in_c, 'alloc': allocate, 'exit': exit_hard,
              'segv': segfault, 'raise': raise_error}


def hostile(call):
  """The behaviour the call names, or the sum of a call such as '1+1'."""
  return BEHAVIOURS.get(call, plain)(call)


def return_end_token(_):
  """A Hugging Face chat model's end of turn: one special token, were it appended."""
  return '42<|im_end|>'


def return_wide(_):
  """Ten characters of two tokens each (ChatTokenizer), as UTF-8 bytes can be."""
  return '\u00e9' * 10


class TextEnv:
  """An environment (rljax.envs) over code points: a turn's ids are a text's characters, the
  observation those of `fn(text)` (or what it returned, when not text), as a plain 5-list Step."""

  def __init__(self, fn):
    self.fn = fn

  def reset(self, record):
    del record

  def step(self, state, turns):
    result = self.fn(''.join(map(chr, turns[-1])))
    return [list(map(ord, result)) if isinstance(result, str) else result, state, None, False, '']


class ChatTokenizer(tokenizer_lib.ToolTokenizer):
  """The tool tokenizer with what a Hugging Face one has: a special end-of-turn token written
  as text ('<|im_end|>', id 23, a stop id) and characters of several tokens ('é': 2 ids)."""
  special = '<|im_end|>'
  vocab_size = 24
  stop_ids = {tokenizer_lib.ToolTokenizer.eos_id, 23}
  special_ids = {23}

  def encode(self, text):
    out = []
    for part in text.split(self.special):
      out += [23] + sum(([2, 3] if c == 'é' else tokenizer_lib.ToolTokenizer.encode(self, c)
                    for c in part), [])
    return out[1:]
