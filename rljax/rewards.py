"""Verifiers: score a decoded response against the reference answer.

A reward function is `fn(response: str, answer: str) -> float`. Configs name
one from `REWARDS`; `score_batch` turns a crashing verifier into a zero reward
and a count, so one odd sample never stops a training run.
"""

import decimal
import re

import numpy as np

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


REWARDS = {'exact_numeric': exact_numeric}


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
