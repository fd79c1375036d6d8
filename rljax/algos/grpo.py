"""GRPO: advantages are rewards z-scored within each group of G responses to the same prompt.

No critic: the group is the baseline. The batch unit is P x G responses; rows are group-major
(the G responses of a prompt are consecutive), which minibatch shuffling keeps intact.
"""
import functools

import jax
import jax.numpy as jnp

from rljax import algos
from rljax.algos import _lora
from rljax import losses
from rljax import optim
from rljax import policy_loss
from rljax import sharding
from rljax import update as update_lib

BATCH_ARG = 'P'   # prompts per batch; each gets G responses


def check(config):
  rollout, train = config.rollout, config.train
  if rollout.G < 2:
    raise ValueError(f'rollout.G must be >= 2 for {config.algo.upper()} (a group baseline needs 2 '
                     f'responses), got {rollout.G}')
  if train.num_minibatches >= 1 and rollout.P * rollout.G % train.num_minibatches == 0 and (
      rollout.P % train.num_minibatches):
    raise ValueError(f'train.num_minibatches ({train.num_minibatches}) must divide rollout.P '
                     f'({rollout.P}): minibatches hold whole groups')
  minibatch = rollout.P * rollout.G // max(train.num_minibatches, 1)
  if train.micro_batch and minibatch % train.micro_batch == 0 and train.micro_batch % rollout.G:
    raise ValueError(f'train.micro_batch ({train.micro_batch}) must be a multiple of rollout.G '
                     f'({rollout.G}): the gradient noise scale needs whole groups per micro-batch')
  algos.check_policy_loss(config.algo, config[config.algo])


def policy_batch(rollout, advantages_B, keep_B, prompt_BxT, valid_BxT):
  """The policy-gradient batch of a rollout: one advantage per response, spread over its tokens;
  rows not kept (keep_B False) are masked out."""
  mask_BxL = (rollout.mask_BxL & keep_B[:, None]).astype(jnp.float32)
  return policy_loss.PolicyBatch(
      prompt_BxT=prompt_BxT, prompt_valid_BxT=valid_BxT, response_BxL=rollout.tokens_BxL,
      mask_BxL=mask_BxL, old_logp_BxL=rollout.logp_BxL,
      advantages_BxL=advantages_B[:, None] * mask_BxL, weights_BxL=jnp.zeros_like(mask_BxL),
      experts_BxLxYxK=rollout.experts_BxLxYxK)


def group_batch(rollout, rewards_B, prompt_BxT, valid_BxT, G, grpo_cfg):
  """GRPO advantages over groups of G consecutive rows; zero-variance groups optionally dropped."""
  rewards_PxG = rewards_B.reshape(-1, G)
  advantages_B = losses.group_advantages(rewards_PxG, grpo_cfg.normalize_std,
                                         grpo_cfg.adv_eps).reshape(-1)
  zero_var_P = losses.zero_variance_groups(rewards_PxG)
  keep_B = (jnp.repeat(~zero_var_P, G) if grpo_cfg.filter_zero_variance
            else jnp.ones_like(advantages_B, bool))
  batch = policy_batch(rollout, advantages_B, keep_B, prompt_BxT, valid_BxT)
  return batch, dict(zero_variance_frac=jnp.mean(zero_var_P), retained=jnp.sum(keep_B))


def make(config, model, params, mesh, rng, batch_fn=group_batch):
  """The GRPO Algorithm for `config`, starting from policy `params` (`rng`: LoRA adapters' init).

  `batch_fn(rollout, rewards_B, prompt_BxT, valid_BxT, G, section) -> (batch, stats)` makes the
  advantages: group z-scores here; other group-baseline algorithms (rljax.algos.rloo) pass theirs.
  With model.lora the update trains adapters on the frozen base (rljax.algos._lora).
  """
  G, train, section = config.rollout.G, config.train, config[config.algo]
  num_micro = algos.micro_batches(config)
  batch = algos.batch_size(config)
  optimizer, schedule = optim.make_optimizer(config.optimizer, batch,
                                             optim.planned_updates(train, batch))
  trained = _lora.trained(config, model, params, mesh, rng)

  def make_batch(state, rollout, rewards_B, prompt_BxT, valid_BxT, ref_params):
    batch, stats = batch_fn(rollout, rewards_B, prompt_BxT, valid_BxT, G, section)
    batch, is_stats = policy_loss.off_policy_correction(
        model, trained.policy(state, ref_params), batch, section, config.rollout.temperature,
        num_micro * train.num_minibatches, train.logits_chunk)
    return batch, dict(stats, **is_stats)

  loss_fn = trained.loss(policy_loss.make_policy_loss(
      model, section, config.rollout.temperature, num_micro, train.logits_chunk))
  step = functools.partial(policy_loss.policy_update, loss_fn, optimizer, section.loss_agg,
                           num_micro)

  def update(state, batch, ref_params, rng):
    def one_update(state, minibatch):
      tree, opt_state, metrics = step(state[trained.key], state['opt_state'], minibatch,
                                      ref_params)
      return {trained.key: tree, 'opt_state': opt_state}, metrics
    return update_lib.minibatch_epochs(
        one_update, state, batch, rng, num_epochs=train.num_epochs,
        num_minibatches=train.num_minibatches, group_size=G, averaged=algos.AVERAGED)

  return algos.Algorithm(
      state={trained.key: trained.tree,
             'opt_state': sharding.init_optimizer(optimizer, trained.tree, mesh)},
      make_batch=sharding.on_mesh(jax.jit(make_batch), mesh),
      update=sharding.on_mesh(jax.jit(update, donate_argnums=0), mesh),
      updates_per_batch=train.num_epochs * train.num_minibatches, batch=batch,
      schedules=dict(lr=schedule), needs_reference=bool(section.kl_coef) or trained.adapts,
      policy=_lora.policy_program(trained, params, mesh), adapts=trained.adapts)
