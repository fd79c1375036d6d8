"""A task's tool, run on the host for the responses that stopped at a call: the one piece of
Python between two decoding chunks of the turn loop (rljax.rollout.turns).

A call is the text between the response's last call-open marker and the call-close marker it
stopped at; the tool maps it to the result's text, whose tokens, between the result markers, the
turn loop appends to the response. Calls are untrusted model output and a tool is any Python, so
a call that raises, returns anything but text, returns more than `max_chars` characters or text
the tokenizer cannot encode, or runs past `timeout_s` gets the error result (`error` between the
markers) instead, and the run goes on. Each call runs in a daemon thread of its own, a chunk's
calls all at once; a call past its timeout is abandoned (its thread may finish or hang; it holds
nothing the run needs and does not keep the process from exiting).
"""
import threading
import time
from typing import Any, Callable, NamedTuple

import numpy as np

ERRORS = ('malformed', 'raised', 'timeout', 'disabled')   # Outcome.error, besides '' (no error)


class Tool(NamedTuple):
  fn: Callable[[str], str] | None   # call text -> result text; None: disabled, every call errs
  tokenizer: Any
  markers: tuple   # (call open, call close: the stop, result open, result close), one token each
  error: str = '?'         # the result text of a failed call
  max_chars: int = 32      # the longest result text
  timeout_s: float = 1.0   # per call
  max_calls: int = 2       # per response: a response stopping at one more call ends there

  def marker_ids(self):
    """The four markers' token ids; ValueError unless each is one token."""
    ids = [self.tokenizer.encode(marker) for marker in self.markers]
    if any(len(i) != 1 for i in ids):
      raise ValueError(f'tool markers {self.markers} must be one token each, got {ids}')
    return tuple(i[0] for i in ids)

  @property
  def max_tokens(self):
    """Tokens of the longest result, markers included: at most one token per character."""
    return self.max_chars + 2


class Outcome(NamedTuple):
  ids: list      # the result's tokens, markers included
  error: str     # '' or one of ERRORS
  seconds: float


def call_text(tool, ids):
  """The text of the call `ids` (a response's tokens so far, the call-close last) ends with, or
  None when it has no call-open marker."""
  call_open = tool.marker_ids()[0]
  opens = np.flatnonzero(np.asarray(ids[:-1]) == call_open)
  return None if not len(opens) else tool.tokenizer.decode(ids[opens[-1] + 1:-1])


def run_calls(tool, histories):
  """The Outcome of the call each of `histories` (token ids, the call-close last) ends with."""
  texts = [call_text(tool, ids) for ids in histories]
  values, seconds = [None] * len(texts), [0.0] * len(texts)

  def run(i):
    start = time.perf_counter()
    try:
      values[i] = tool.fn(texts[i])
    except BaseException as error:  # pylint: disable=broad-except  (untrusted input, any tool)
      values[i] = error
    seconds[i] = time.perf_counter() - start

  threads = {}
  if tool.fn is not None:
    for i, text in enumerate(texts):
      if text is not None:
        threads[i] = threading.Thread(target=run, args=(i,), daemon=True)
        threads[i].start()
  started = time.perf_counter()
  for i, thread in threads.items():
    thread.join(max(0.0, started + tool.timeout_s - time.perf_counter()))
  return [_outcome(tool, texts[i], threads.get(i), values[i], seconds[i], started)
          for i in range(len(texts))]


def _outcome(tool, text, thread, value, seconds, started):
  """The Outcome of one call (`thread`: the one that ran it, None if it did not run)."""
  _, _, result_open, result_close = tool.marker_ids()
  if tool.fn is None or text is None:
    error = 'disabled' if tool.fn is None else 'malformed'
  elif thread.is_alive():
    error, seconds = 'timeout', time.perf_counter() - started
  elif isinstance(value, BaseException):
    error = 'raised'
  elif not isinstance(value, str) or len(value) > tool.max_chars:
    error = 'malformed'
  else:
    try:
      return Outcome([result_open, *tool.tokenizer.encode(value), result_close], '', seconds)
    except Exception:  # pylint: disable=broad-except  (text the tokenizer cannot encode)
      error = 'malformed'
  return Outcome([result_open, *tool.tokenizer.encode(tool.error), result_close], error, seconds)


def output_mask(tool, ids):
  """True on the tools' result tokens of a token row (result open to result close, both
  included): the tokens no loss trains on (rljax.train.warmstart's demonstrations)."""
  _, _, result_open, result_close = tool.marker_ids()
  ids = np.asarray(ids)
  depth = np.cumsum(ids == result_open) - np.cumsum(ids == result_close)
  return (depth > 0) | (ids == result_close)
