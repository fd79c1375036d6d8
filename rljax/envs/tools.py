"""A tool as an environment: the model's turn is a call, the observation the tool's result.

A call is the text between the response's last call-open marker and the call-close marker that
ends the turn (the environment's `turn_end`); the tool's function maps it to the result's text,
whose tokens, between the result markers, are the observation. Calls are untrusted model output
and a tool is any Python: its step runs in a worker process like every environment's
(rljax.envs.pool), and its result is screened (rljax.envs.screen). A call that fails gets the
error result (`error` between the markers) instead, counted by its kind (rljax.envs.ERRORS),
and the episode goes on. A tool gives no reward: the task's verifier scores the answer.

The module imports nothing heavy: every worker process imports it to unpickle the tool.
"""
from typing import Any, Callable, NamedTuple

from rljax import envs
from rljax.envs import screen


class Tool(NamedTuple):
  """An rljax.envs.Environment whose steps run `fn` on the model's call."""
  fn: Callable[[str], str] | None   # call text -> result text, a module-level function (it is
                                    # pickled to the workers); None: disabled, every call errs
  tokenizer: Any
  markers: tuple   # (call open, call close: the turn's end, result open, result close),
                   # 1 token each
  error: str = '?'         # the result text of a failed call
  max_chars: int = 32      # the longest result, in characters and in tokens
  max_calls: int = 2       # per response: a response stopping at one more call ends there

  def marker_ids(self):
    """The four markers' token ids; ValueError unless they are four distinct single tokens, none
    of them the end or padding token."""
    ids = [self.tokenizer.encode(marker) for marker in self.markers]
    if any(len(i) != 1 for i in ids):
      raise ValueError(f'tool markers {self.markers} must be one token each, got {ids}')
    ids = tuple(i[0] for i in ids)
    if len(set(ids)) != 4 or {self.tokenizer.eos_id, self.tokenizer.pad_id} & set(ids):
      raise ValueError(f'tool markers {self.markers} must be four distinct tokens, none of them '
                       f'the end or padding token')
    return ids

  @property
  def turn_end(self):
    return self.marker_ids()[1]

  @property
  def max_observation(self):
    """Tokens of the longest result, markers included (screen refuses longer ones)."""
    return self.max_chars + 2

  @property
  def max_turns(self):
    return self.max_calls

  @property
  def error_observation(self):
    """The error result; ValueError unless the error text is a clean result that fits."""
    ids, error = screen.result_ids(self, self.error, screen.forbidden_ids(self))
    if error:
      raise ValueError(f'the tool\'s error text {self.error!r} is not a valid result ({error})')
    _, _, result_open, result_close = self.marker_ids()
    return [result_open, *ids, result_close]

  def reset(self, record):
    """A tool keeps no state: a call's result depends on the call alone."""
    del record

  def step(self, state, turns):
    """The result of the call the response so far (`turns`, joined) ends with."""
    ids = [token for turn in turns for token in turn]
    if self.fn is None:
      return self._refused(state, 'disabled')
    text = call_text(self, ids)
    if text is None:
      return self._refused(state, 'malformed')
    value = self.fn(text)   # raising: the runner counts it ('raised')
    if not isinstance(value, str):
      return self._refused(state, 'malformed')
    if len(value) > self.max_chars:
      return self._refused(state, 'oversize')
    result, error = screen.result_ids(self, value, screen.forbidden_ids(self))
    if error:
      return self._refused(state, error)
    _, _, result_open, result_close = self.marker_ids()
    return envs.Step([result_open, *result, result_close], state)

  def _refused(self, state, kind):
    return envs.Step(self.error_observation, state, error=kind)

  def observation_mask(self, ids):
    """True on the results of a token row (result open to result close, both included): the
    tokens of a demonstration no loss trains on (rljax.train.warmstart)."""
    _, _, result_open, result_close = self.marker_ids()
    mask, depth = [], 0
    for token in ids:
      depth += int(token == result_open) - int(token == result_close)
      mask.append(depth > 0 or token == result_close)
    return mask


def call_text(tool, ids):
  """The text of the call `ids` (a response's tokens so far, the call-close last) ends with, or
  None when it has no call-open marker or the tokenizer cannot decode it."""
  call_open = tool.marker_ids()[0]
  opens = [i for i, token in enumerate(ids[:-1]) if token == call_open]
  if not opens:
    return None
  try:
    return tool.tokenizer.decode(ids[opens[-1] + 1:-1])
  except ValueError:
    return None
