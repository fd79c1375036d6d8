"""rljax.train's own numbers, the rollout statistics logged every step, against numpy (the loop
itself runs end to end in test_reliability.py, test_ppo_e2e.py and test_train_math.py)."""
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import train


def test_rollout_stats_match_numpy():
  rng = np.random.default_rng(0)
  rewards_B = rng.choice([0.0, 1.0], 24).astype(np.float32)
  lengths_B = rng.integers(1, 6, 24).astype(np.int32)
  stats = train.rollout_stats(jnp.asarray(rewards_B), jnp.asarray(lengths_B))
  assert float(stats['reward_mean']) == pytest.approx(rewards_B.mean(), rel=1e-6)
  assert float(stats['reward_std']) == pytest.approx(rewards_B.std(), rel=1e-6)   # population std
  assert int(stats['tokens']) == lengths_B.sum()
  assert float(stats['response_len_mean']) == pytest.approx(lengths_B.mean(), rel=1e-6)
