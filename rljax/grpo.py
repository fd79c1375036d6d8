"""GRPO: advantages are rewards z-scored within each group of G responses to the same prompt.

No critic: the group is the baseline. The batch unit is P x G responses; rows are group-major
(the G responses of a prompt are consecutive), which minibatch shuffling keeps intact.
"""
import functools

import jax
import jax.numpy as jnp

from rljax import algorithm
from rljax import losses
from rljax import optim
from rljax import policy_loss
from rljax import sharding


def group_batch(rollout, rewards_B, prompt_BxT, valid_BxT, G, grpo_cfg):
  """GRPO advantages over groups of G consecutive rows; zero-variance groups optionally dropped."""
  rewards_PxG = rewards_B.reshape(-1, G)
  advantages_B = losses.group_advantages(rewards_PxG, grpo_cfg.normalize_std,
                                         grpo_cfg.adv_eps).reshape(-1)
  zero_var_P = losses.zero_variance_groups(rewards_PxG)
  keep_B = jnp.repeat(~zero_var_P, G) if grpo_cfg.filter_zero_variance else jnp.ones_like(advantages_B,
                                                                                            bool)
  mask_BxL = (rollout.mask_BxL & keep_B[:, None]).astype(jnp.float32)
  batch = policy_loss.PolicyBatch(
      prompt_BxT=prompt_BxT, prompt_valid_BxT=valid_BxT, response_BxL=rollout.tokens_BxL,
      mask_BxL=mask_BxL, old_logp_BxL=rollout.logp_BxL,
      advantages_BxL=advantages_B[:, None] * mask_BxL, weights_BxL=jnp.zeros_like(mask_BxL))
  stats = dict(zero_variance_frac=jnp.mean(zero_var_P), retained=jnp.sum(keep_B))
  return batch, stats


def make(config, model, params, num_micro, mesh):
  """The GRPO Algorithm for `config`, starting from policy `params`."""
  G = config.rollout.G
  batch_size = config.rollout.P * G
  optimizer, schedule = optim.make_optimizer(config.optimizer, batch_size,
                                             optim.planned_updates(config.train, batch_size))
  make_batch = sharding.on_mesh(jax.jit(lambda state, rollout, rewards_B, prompt_BxT, valid_BxT, ref_params:
                       group_batch(rollout, rewards_B, prompt_BxT, valid_BxT, G, config.grpo)),
                                mesh)
  loss_fn = policy_loss.make_policy_loss(model, config.grpo, config.rollout.temperature, num_micro,
                                         config.train.logits_chunk)
  step = functools.partial(policy_loss.policy_update, loss_fn, optimizer, config.grpo.loss_agg,
                           num_micro)

  def update(state, batch, ref_params):
    params, opt_state, metrics = step(state['params'], state['opt_state'], batch, ref_params)
    return dict(params=params, opt_state=opt_state), metrics

  return algorithm.Algorithm(
      state=dict(params=params, opt_state=sharding.init_optimizer(optimizer, params, mesh)),
      make_batch=make_batch, update=sharding.on_mesh(jax.jit(update, donate_argnums=0), mesh),
      schedules=dict(lr=schedule),
      needs_reference=bool(config.grpo.kl_coef))
