"""Tests for the verifiers."""

import numpy as np
import pytest

from rljax.data import rewards


@pytest.mark.parametrize('response, answer, expected', [
    ('85', '85', 1.0),
    ('085', '85', 1.0),
    (' 85\n', '85', 1.0),
    ('-12', '-12', 1.0),
    ('12', '-12', 0.0),
    ('1.50', '1.5', 1.0),
    ('86', '85', 0.0),
    ('', '85', 0.0),
    ('8 5', '85', 0.0),
    ('85=', '85', 0.0),
    ('8_5', '85', 0.0),
    ('nan', 'nan', 0.0),
    ('85', '', 0.0),
])
def test_exact_numeric(response, answer, expected):
  assert rewards.exact_numeric(response, answer) == expected


def test_registry():
  assert rewards.get_reward_fn('exact_numeric') is rewards.exact_numeric
  with pytest.raises(ValueError, match='exact_numeric'):
    rewards.get_reward_fn('bleu')


def test_score_batch():
  rewards_B, num_failed = rewards.score_batch(
      rewards.exact_numeric, ['85', '7', '085'], ['85', '8', '85'])
  assert rewards_B.dtype == np.float32
  np.testing.assert_array_equal(rewards_B, [1.0, 0.0, 1.0])
  assert num_failed == 0


def test_score_batch_survives_a_failing_verifier():
  def flaky(response, answer):
    if response == 'boom':
      raise RuntimeError('verifier crashed')
    if response == 'nan':
      return float('nan')
    return rewards.exact_numeric(response, answer)

  rewards_B, num_failed = rewards.score_batch(
      flaky, ['boom', '3', 'nan', '4'], ['1', '3', '1', '5'])
  np.testing.assert_array_equal(rewards_B, [0.0, 1.0, 0.0, 0.0])
  assert num_failed == 2


def test_score_batch_checks_lengths():
  with pytest.raises(ValueError):
    rewards.score_batch(rewards.exact_numeric, ['1'], [])
