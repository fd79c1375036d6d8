"""RLOO (Ahmadian et al., 2024): each response's baseline is the mean reward of the OTHER G - 1
responses to its prompt, an unbiased baseline with no critic and no division by a std.

Everything but the advantages is GRPO's (rljax.algos.grpo): the batch unit P x G, the clipped
policy loss of config.rloo, whole groups per minibatch and micro-batch. This file is all it takes
to add a group-baseline algorithm; configs/rloo.py is its config.
"""
import functools

import jax.numpy as jnp

from rljax.algos import grpo

BATCH_ARG = 'P'   # as GRPO's: prompts per batch; each gets G responses
check = grpo.check


def leave_one_out_advantages(rewards_PxG):
  """r_i - mean_{j != i} r_j within each group (G >= 2)."""
  rewards_PxG = jnp.asarray(rewards_PxG, jnp.float32)
  G = rewards_PxG.shape[1]
  others_mean_PxG = (jnp.sum(rewards_PxG, axis=1, keepdims=True) - rewards_PxG) / (G - 1)
  return rewards_PxG - others_mean_PxG


def rloo_batch(rollout, rewards_B, prompt_BxT, valid_BxT, G, section):
  del section
  advantages_B = leave_one_out_advantages(rewards_B.reshape(-1, G)).reshape(-1)
  keep_B = jnp.ones_like(advantages_B, bool)
  return grpo.policy_batch(rollout, advantages_B, keep_B, prompt_BxT, valid_BxT), dict(
      retained=jnp.sum(keep_B))


make = functools.partial(grpo.make, batch_fn=rloo_batch)
