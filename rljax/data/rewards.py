"""Verifiers: score a decoded response against the reference answer.

A reward function is `fn(response: str, answer: str) -> float`. Configs name
one from `REWARDS`; `score_batch` turns a crashing verifier into a zero reward
and a count, so one odd sample never stops a training run.
"""

import decimal
import functools
import re
import threading

import numpy as np

from rljax.data import rg_library

_NUMBER = re.compile(r'[+-]?(\d+\.?\d*|\.\d+)')


def _number(text: str):
  """Parses a plain decimal number, or returns None."""
  text = text.strip()
  if not _NUMBER.fullmatch(text):
    return None
  return decimal.Decimal(text)


def exact_numeric(response: str, answer: str) -> float:
  """1.0 when both parse as the same number ('085' == '85'), else 0.0."""
  response_value, answer_value = _number(response), _number(answer)
  if response_value is None or answer_value is None:
    return 0.0
  return float(response_value == answer_value)


@functools.lru_cache(maxsize=65536)
def _parse_gold(answer: str):
  """A reference answer is bare LaTeX ('\\frac{1}{2}', '1,469'): boxing it tells math-verify so."""
  import math_verify  # pylint: disable=import-outside-toplevel  (slow import; math tasks only)
  return math_verify.parse(f'\\boxed{{{answer}}}', parsing_timeout=_timeout())


def _timeout():
  """math-verify times out with SIGALRM, which only the main thread may use."""
  return 5 if threading.current_thread() is threading.main_thread() else None


def math_equivalent(response: str, answer: str) -> float:
  """1.0 when the response's final answer equals the reference mathematically (math-verify: sympy
  equivalence, so '0.5' == '\\frac{1}{2}', '(x+1)^2' == 'x^2+2x+1', '1,469' == '1469').

  The final answer is the line after the last '####' (GSM8K style) if there is one, else what
  math-verify extracts from the whole response (the last \\boxed{}, else the last expression).
  """
  import math_verify  # pylint: disable=import-outside-toplevel
  gold = _parse_gold(answer.strip())
  if not gold:
    raise ValueError(f'reference answer {answer!r} does not parse')
  if '####' in response:   # GSM8K style: the answer is the line after the last marker
    response = (response.rsplit('####', 1)[1].strip().splitlines() or [''])[0]
  predicted = math_verify.parse(response, parsing_timeout=_timeout())
  return float(bool(predicted) and math_verify.verify(gold, predicted, timeout_seconds=_timeout()))


def running_sums(response: str, answer: str) -> float:
  """1.0 when the response writes out the reference's steps ('operand=running sum', joined by
  '+'), each operand and each sum equal to the reference's as numbers, else 0.0
  (rljax.data.builders.sums). Every step counts: a right total reached through a wrong sum is wrong
  work, and rewarding it would teach the policy wrong additions."""
  steps, reference = ([step.split('=') for step in text.split('+')] for text in (response, answer))
  if len(steps) != len(reference) or any(len(step) != 2 for step in steps):
    return 0.0
  values = [_number(value) for step in steps for value in step]
  return float(None not in values and
               values == [_number(value) for step in reference for value in step])


def final_answer(response: str, answer: str) -> float:
  """exact_numeric on what follows the last tool result ('}') of each, or the whole text where
  there is none: '[1+2]{3}3' and '3' both answer '3' (rljax.data.builders.tool_sums). The
  response's final answer is its own tokens: a tool's result alone answers nothing."""
  return exact_numeric(response.rsplit('}', 1)[-1], answer.rsplit('}', 1)[-1])


REWARDS = {'exact_numeric': exact_numeric, 'math': math_equivalent, 'running_sums': running_sums,
           'final_answer': final_answer,
           'reasoning_gym': rg_library.score}   # the library's own scorer of the entry named


def get_reward_fn(name: str):
  """Returns the reward function registered under `name`."""
  if name not in REWARDS:
    raise ValueError(
        f'unknown reward {name!r}; choose one of {sorted(REWARDS)}')
  return REWARDS[name]


def score_batch(fn, responses: list[str], answers: list[str]):
  """Returns (rewards_B float32, num_failed); a failed score counts as 0.

  A score fails when `fn` raises or returns something that is not a finite
  number (a NaN reward would poison every advantage of its group).
  """
  if len(responses) != len(answers):
    raise ValueError(f'{len(responses)} responses but {len(answers)} answers')
  rewards_B = np.zeros(len(responses), np.float32)
  num_failed = 0
  for row, (response, answer) in enumerate(zip(responses, answers)):
    try:
      reward = float(fn(response, answer))
    except Exception:  # pylint: disable=broad-except
      reward = float('nan')
    if np.isfinite(reward):
      rewards_B[row] = reward
    else:
      num_failed += 1
  return rewards_B, num_failed
