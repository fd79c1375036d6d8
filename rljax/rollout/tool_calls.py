"""A task's tool, run on the host for the responses that stopped at a call: the one piece of
Python between two decoding chunks of the turn loop (rljax.rollout.turns).

A call is the text between the response's last call-open marker and the call-close marker it
stopped at; the tool maps it to the result's text, whose tokens, between the result markers, the
turn loop appends to the response. Calls are untrusted model output and a tool is any Python, so
every call runs in a bounded pool of worker processes (rljax.rollout.tool_pool: killed and
replaced past `timeout_s`, capped in memory and in the result's length) and every result is
screened (rljax.rollout.tool_screen); a call that fails either way gets the error result
(`error` between the markers) instead, counted by its kind (ERRORS), and the run goes on.
"""
from typing import Any, Callable, NamedTuple

import numpy as np

from rljax.rollout import tool_pool
from rljax.rollout import tool_screen

# Outcome.error, besides '' (no error): no call-open marker, a result that is not text or not
# encodable; the tool raised; past timeout_s; tools.enabled False; the worker died; past the
# memory bound; a result longer than max_chars; a result holding markers or special tokens.
ERRORS = ('malformed', 'raised', 'timeout', 'disabled', 'crash', 'memory', 'oversize',
          'bad_result')


class Tool(NamedTuple):
  fn: Callable[[str], str] | None   # call text -> result text, a module-level function (it is
                                    # pickled to the workers); None: disabled, every call errs
  tokenizer: Any
  markers: tuple   # (call open, call close: the stop, result open, result close), one token each
  error: str = '?'         # the result text of a failed call
  max_chars: int = 32      # the longest result, in characters and in tokens
  timeout_s: float = 1.0   # per call
  max_calls: int = 2       # per response: a response stopping at one more call ends there
  workers: int = 8         # worker processes: the calls that run at once
  memory_mb: int = 512     # what a worker may allocate above its loaded self

  def marker_ids(self):
    """The four markers' token ids; ValueError unless each is one token."""
    ids = [self.tokenizer.encode(marker) for marker in self.markers]
    if any(len(i) != 1 for i in ids):
      raise ValueError(f'tool markers {self.markers} must be one token each, got {ids}')
    return tuple(i[0] for i in ids)

  @property
  def max_tokens(self):
    """Tokens of the longest result, markers included (tool_screen refuses longer ones)."""
    return self.max_chars + 2


class Outcome(NamedTuple):
  ids: list      # the result's tokens, markers included
  error: str     # '' or one of ERRORS
  seconds: float


def call_text(tool, ids):
  """The text of the call `ids` (a response's tokens so far, the call-close last) ends with, or
  None when it has no call-open marker or the tokenizer cannot decode it."""
  call_open = tool.marker_ids()[0]
  opens = np.flatnonzero(np.asarray(ids[:-1]) == call_open)
  if not len(opens):
    return None
  try:
    return tool.tokenizer.decode(ids[opens[-1] + 1:-1])
  except ValueError:
    return None


def run_calls(tool, histories):
  """The Outcome of the call each of `histories` (token ids, the call-close last) ends with."""
  texts = [call_text(tool, ids) for ids in histories]
  runnable = [i for i, text in enumerate(texts) if text is not None] if tool.fn else []
  answers = {}
  if runnable:
    pool = tool_pool.pool_for(tool.fn, tool.workers, tool.max_chars, tool.memory_mb)
    answers = dict(zip(runnable, pool.run([texts[i] for i in runnable], tool.timeout_s)))
  forbidden = tool_screen.forbidden_ids(tool)
  return [_outcome(tool, texts[i], answers.get(i), forbidden) for i in range(len(texts))]


def _outcome(tool, text, answer, forbidden):
  """The Outcome of one call from its worker's `answer` (kind, text, seconds; None: not run)."""
  _, _, result_open, result_close = tool.marker_ids()
  error, seconds = ('disabled' if tool.fn is None else 'malformed'), 0.0
  if answer is not None:
    kind, value, seconds = answer
    error = 'malformed' if kind == 'not_text' else kind
    if kind == 'ok':
      ids, error = tool_screen.result_ids(tool, value, forbidden)
      if not error:
        return Outcome([result_open, *ids, result_close], '', seconds)
  return Outcome([result_open, *tool.tokenizer.encode(tool.error), result_close], error, seconds)


def output_mask(tool, ids):
  """True on the tools' result tokens of a token row (result open to result close, both
  included): the tokens no loss trains on (rljax.train.warmstart's demonstrations)."""
  _, _, result_open, result_close = tool.marker_ids()
  ids = np.asarray(ids)
  depth = np.cumsum(ids == result_open) - np.cumsum(ids == result_close)
  return (depth > 0) | (ids == result_close)
