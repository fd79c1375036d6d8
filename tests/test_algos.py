"""rljax.algos: resolution by name, each algorithm's batch construction against numpy, and the
batch arithmetic the protocol relies on (with_batch)."""
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo as grpo_config
from configs import ppo as ppo_config
from configs import rloo as rloo_config
from rljax import algos
from rljax.algos import grpo
from rljax.algos import rloo
from rljax.rollout import sampler


def test_algorithms_resolve_by_name_and_unknown_names_fail_clearly():
  assert algos.names() == ['grpo', 'ppo', 'rloo']
  assert algos.get('grpo') is grpo and algos.get('rloo').BATCH_ARG == 'P'
  assert algos.get('ppo').BATCH_ARG == 'B'
  for name in ('sac', '../train', ''):
    with pytest.raises(ValueError, match=r"algo must be one of \['grpo', 'ppo', 'rloo'\]"):
      algos.get(name)


@pytest.mark.parametrize('config_file, value, batch', [
    (grpo_config.get_config('runlocal'), 64, 512), (ppo_config.get_config('runlocal'), 64, 64),
    (rloo_config.get_config('runlocal,G=4'), 8, 32)])
def test_with_batch_sets_the_batch_argument_and_caps_micro_batches(config_file, value, batch):
  config = algos.with_batch(config_file, value)
  assert algos.batch_size(config) == batch
  assert config.train.micro_batch == min(config_file.train.micro_batch, batch)
  assert config_file.rollout.P != value   # a copy: the original is untouched


def _rollout(tokens_BxL, mask_BxL):
  tokens_BxL = jnp.asarray(tokens_BxL, jnp.int32)
  return sampler.Rollout(tokens_BxL=tokens_BxL, logp_BxL=jnp.full(tokens_BxL.shape, -0.5),
                         mask_BxL=jnp.asarray(mask_BxL, bool),
                         lengths_B=jnp.asarray(mask_BxL).sum(1))


def _group_case(P=3, G=4, L=5, seed=0):
  rng = np.random.default_rng(seed)
  rewards_PxG = rng.choice([0.0, 1.0], (P, G)).astype(np.float32)
  rewards_PxG[1] = 1.0   # a zero-variance group
  lengths_B = rng.integers(1, L + 1, P * G)
  mask_BxL = np.arange(L)[None, :] < lengths_B[:, None]
  rollout = _rollout(rng.integers(0, 16, (P * G, L)), mask_BxL)
  prompt_BxT = jnp.zeros((P * G, 3), jnp.int32)
  return rewards_PxG, mask_BxL, rollout, prompt_BxT


@pytest.mark.parametrize('filter_zero_variance', [False, True])
def test_group_batch_is_group_z_scores_on_every_valid_token(filter_zero_variance):
  rewards_PxG, mask_BxL, rollout, prompt_BxT = _group_case()
  cfg = grpo_config.get_config('runlocal').grpo
  cfg.filter_zero_variance = filter_zero_variance
  batch, stats = grpo.group_batch(rollout, jnp.asarray(rewards_PxG.reshape(-1)), prompt_BxT,
                                  prompt_BxT > 0, 4, cfg)
  std_Px1 = rewards_PxG.std(axis=1, ddof=1, keepdims=True)
  z_PxG = np.where(std_Px1 > 0, (rewards_PxG - rewards_PxG.mean(1, keepdims=True)) /
                   (std_Px1 + 1e-6), 0.0)
  keep_B = np.repeat(std_Px1[:, 0] > 0, 4) if filter_zero_variance else np.ones(12, bool)
  expected_mask_BxL = mask_BxL & keep_B[:, None]
  np.testing.assert_array_equal(batch.mask_BxL, expected_mask_BxL)
  np.testing.assert_allclose(batch.advantages_BxL, z_PxG.reshape(-1, 1) * expected_mask_BxL,
                             rtol=1e-6, atol=1e-7)
  assert int(stats['retained']) == keep_B.sum()
  assert float(stats['zero_variance_frac']) == pytest.approx(1 / 3)


def test_rloo_advantages_are_reward_minus_the_mean_of_the_others():
  rewards_PxG, mask_BxL, rollout, prompt_BxT = _group_case(P=2, G=5)
  expected_PxG = np.array([[r - (row.sum() - r) / 4 for r in row] for row in rewards_PxG])
  np.testing.assert_allclose(rloo.leave_one_out_advantages(rewards_PxG), expected_PxG, rtol=1e-6)
  batch, stats = rloo.rloo_batch(rollout, jnp.asarray(rewards_PxG.reshape(-1)), prompt_BxT,
                                 prompt_BxT > 0, 5, None)
  np.testing.assert_allclose(batch.advantages_BxL, expected_PxG.reshape(-1, 1) * mask_BxL,
                             rtol=1e-6, atol=1e-7)
  assert int(stats['retained']) == 10


def test_grpo_minibatches_and_micro_batches_must_hold_whole_groups():
  config = grpo_config.get_config('runlocal,P=4,G=6')
  config.train.micro_batch = 8   # divides the 24 rows, splits groups of 6
  with pytest.raises(ValueError, match=r'micro_batch \(8\) must be a multiple of rollout.G'):
    grpo.check(config)
  config.train.micro_batch, config.train.num_minibatches = 6, 8   # 24 rows in 8: groups split
  with pytest.raises(ValueError, match=r'num_minibatches \(8\) must divide rollout.P \(4\)'):
    grpo.check(config)
