"""PPO with a critic: per-token values, GAE over the response tokens, a clipped value loss.

One prompt per response (P = B, G = 1); the batch unit of the lr rules is B responses. The
verifier's reward lands on the last response token; a token-level KL penalty to the frozen initial
policy can be subtracted from every token's reward (kl_reward_coef, InstructGPT style) and/or a KL
term added to the policy loss (kl_coef, as GRPO does); both, either or neither. GAE(gamma, lambda)
gives advantages (whitened by default) for the actor and returns for the critic.

The critic is a separate model with its own Adam and its own lr rule of B (rljax.model.critic),
updated after the actor on the same minibatch; with `share_trunk` the value head sits on the
policy's trunk and ONE update follows policy loss + vf_coef * value loss, each part with its own
Adam. Actor and critic gradient norms are logged separately: the paper finds the critic's barely
falls with batch.
"""
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from rljax import algos
from rljax import losses
from rljax.model import critic as critic_lib
from rljax.model import lora
from rljax import optim
from rljax import policy_loss
from rljax import sharding
from rljax import update

BATCH_ARG = 'B'   # responses per batch, one per prompt


def check(config):
  rollout, cfg = config.rollout, config.ppo
  if rollout.G != 1:
    raise ValueError(f'rollout.G must be 1 for PPO (B prompts, one response each), got {rollout.G}')
  if lora.config_of(config.model):
    raise ValueError('model.lora trains adapters with grpo or rloo; ppo trains the policy and its '
                     'critic as full weights: set model.lora.rank=0 for ppo')
  algos.check_policy_loss('ppo', cfg)
  if cfg.kl_reward_estimator not in losses.KL_KINDS:
    raise ValueError(f'ppo.kl_reward_estimator {cfg.kl_reward_estimator!r} is not one of '
                     f'{losses.KL_KINDS}')
  if not cfg.kl_reward_coef >= 0:   # NaN too
    raise ValueError(f'ppo.kl_reward_coef must be >= 0, got {cfg.kl_reward_coef}')
  if not math.isfinite(cfg.value_clip):
    raise ValueError(f'ppo.value_clip must be a number (<= 0: no clipping), got {cfg.value_clip}')
  for key in ('gamma', 'lam'):
    if not 0 <= cfg[key] <= 1:
      raise ValueError(f'ppo.{key} must be in [0, 1], got {cfg[key]}')
  if cfg.share_trunk and not cfg.vf_coef > 0:
    raise ValueError(f'ppo.vf_coef must be > 0 with a shared trunk, got {cfg.vf_coef}')
  algos.check_optimizer('critic_optimizer', config.critic_optimizer, config, rollout.P)


class PPOBatch(NamedTuple):
  policy: policy_loss.PolicyBatch
  critic: critic_lib.CriticBatch


# Critic metrics averaged into each training row (rljax.train.loop), beyond the actor's.
LOGGED = ('value_loss', 'value_clipfrac', 'critic_grad_norm', 'critic_moe_aux_loss',
          'critic_grad_sq_small', 'critic_grad_sq_big', 'critic_skipped_frac')


def terminal_rewards(rewards_B, mask_BxL):
  """The sequence reward on each row's last action (its last sampled token: observations of an
  environment may sit between and after them), 0 elsewhere (and on empty rows)."""
  mask_BxL = jnp.asarray(mask_BxL, jnp.float32)
  length = mask_BxL.shape[1]
  last_B = length - 1 - jnp.argmax(mask_BxL[:, ::-1] > 0, axis=1)
  at_last_BxL = jnp.arange(length)[None, :] == last_B[:, None]
  return jnp.where(at_last_BxL, jnp.asarray(rewards_B, jnp.float32)[:, None], 0.0) * mask_BxL


def critic_params_of(state, share_trunk):
  """The critic's parameter tree: its own, or the policy's trunk plus the value head."""
  if share_trunk:
    return dict(trunk=critic_lib.trunk_of(state['params']),
                value_head=state['critic_params']['value_head'])
  return state['critic_params']


def ppo_batch(state, rollout, rewards_B, prompt_BxT, valid_BxT, ref_params, *, model, critic, cfg,
              temperature, num_micro):
  """Rollout + rewards -> (PPOBatch, stats): values of the current critic, token rewards, GAE."""
  mask_BxL = rollout.mask_BxL.astype(jnp.float32)
  critic_params = critic_params_of(state, cfg.share_trunk)
  values_BxL = policy_loss.micro_map(
      lambda p, v, r: critic_lib.response_values(critic, critic_params, p, v, r)[0], num_micro,
      prompt_BxT, valid_BxT, rollout.tokens_BxL) * mask_BxL
  rewards_BxL = terminal_rewards(rewards_B, mask_BxL)
  stats = {}
  if cfg.kl_reward_coef:
    ref_logp_BxL = policy_loss.micro_map(
        lambda p, v, r: policy_loss.response_logprobs(model, ref_params, p, v, r, temperature)[0],
        num_micro, prompt_BxT, valid_BxT, rollout.tokens_BxL)
    kl_BxL = losses.kl_penalty(rollout.logp_BxL, ref_logp_BxL, cfg.kl_reward_estimator) * mask_BxL
    rewards_BxL = rewards_BxL - cfg.kl_reward_coef * kl_BxL
    stats['kl_reward'] = jnp.sum(kl_BxL) / jnp.maximum(jnp.sum(jnp.any(mask_BxL > 0, axis=1)), 1)
  if cfg.whiten_rewards:   # unit scale, sign kept: the returns the critic learns are whitened too
    rewards_BxL = losses.whiten(rewards_BxL, mask_BxL, shift_mean=False)
  advantages_BxL, returns_BxL = losses.gae(rewards_BxL, values_BxL, mask_BxL, cfg.gamma, cfg.lam)
  stats.update(value_mean=losses.masked_mean(values_BxL, mask_BxL),
               return_mean=losses.masked_mean(returns_BxL, mask_BxL),
               explained_variance=losses.explained_variance(values_BxL, returns_BxL, mask_BxL),
               retained=jnp.asarray(mask_BxL.shape[0]))
  if cfg.whiten_advantages:
    advantages_BxL = losses.whiten(advantages_BxL, mask_BxL)
  weights_BxL = jnp.zeros_like(mask_BxL)   # set per minibatch by the update
  batch = PPOBatch(
      policy=policy_loss.PolicyBatch(
          prompt_BxT=prompt_BxT, prompt_valid_BxT=valid_BxT, response_BxL=rollout.tokens_BxL,
          mask_BxL=mask_BxL, old_logp_BxL=rollout.logp_BxL, advantages_BxL=advantages_BxL,
          weights_BxL=weights_BxL, experts_BxLxYxK=rollout.experts_BxLxYxK),
      critic=critic_lib.CriticBatch(
          prompt_BxT=prompt_BxT, prompt_valid_BxT=valid_BxT, response_BxL=rollout.tokens_BxL,
          mask_BxL=mask_BxL, old_values_BxL=values_BxL, returns_BxL=returns_BxL,
          weights_BxL=weights_BxL))
  return batch, stats


def critic_metrics(metrics):
  """The critic's update metrics under the names of the training row."""
  renamed = dict(value_loss=metrics['value_loss'], value_clipfrac=metrics['value_clipfrac'],
                 critic_moe_aux_loss=metrics['critic_moe_aux_loss'],
                 critic_grad_norm=metrics['grad_norm'], critic_skipped_frac=metrics['skipped'])
  if 'grad_sq_small' in metrics:
    renamed.update(critic_grad_sq_small=metrics['grad_sq_small'],
                   critic_grad_sq_big=metrics['grad_sq_big'])
  return renamed


def separate_update(state, batch, ref_params, *, actor_loss, actor_tx, critic_loss, critic_tx,
                    loss_agg, num_micro):
  """One actor step, then one critic step, on the same (mini)batch."""
  params, opt_state, metrics = policy_loss.policy_update(
      actor_loss, actor_tx, loss_agg, num_micro, state['params'], state['opt_state'], batch.policy,
      ref_params)
  critic_batch = batch.critic._replace(weights_BxL=losses.token_weights(batch.critic.mask_BxL,
                                                                        loss_agg))
  critic_params, critic_opt_state, cm = update.apply_update(
      critic_loss, critic_tx, state['critic_params'], state['critic_opt_state'], critic_batch,
      num_micro)
  state = dict(params=params, opt_state=opt_state, critic_params=critic_params,
               critic_opt_state=critic_opt_state)
  return state, dict(metrics, **critic_metrics(cm))


def shared_update(state, batch, ref_params, *, actor_loss, critic_loss, tx, loss_agg, vf_coef,
                  num_micro):
  """One step on policy loss + vf_coef * value loss; the trunk gets both gradients.

  grad_norm is the norm over the policy's parameters (trunk and lm_head: both losses' gradients),
  critic_grad_norm over the value head alone.
  """
  batch = PPOBatch(
      batch.policy._replace(weights_BxL=losses.token_weights(batch.policy.mask_BxL, loss_agg)),
      batch.critic._replace(weights_BxL=losses.token_weights(batch.critic.mask_BxL, loss_agg)))

  def joint_loss(joint, micro):
    pg, metrics = actor_loss(joint['policy'], micro.policy, ref_params)
    vf, critic_sums = critic_loss(dict(trunk=critic_lib.trunk_of(joint['policy']),
                                       value_head=joint['value_head']), micro.critic)
    return pg + vf_coef * vf, dict(metrics, **critic_sums)

  joint = dict(policy=state['params'], value_head=state['critic_params']['value_head'])
  grads, loss, metrics, _ = update.accumulate_gradients(joint_loss, joint, batch, num_micro)
  updates, opt_state = tx.update(grads, state['opt_state'], joint)
  joint, opt_state = update.keep_finite(optax.apply_updates(joint, updates), opt_state, joint,
                                        state['opt_state'])
  skipped = 1 - opt_state.last_finite.astype(jnp.int32)
  metrics = dict(metrics, loss=loss, grad_norm=optax.global_norm(grads['policy']), skipped=skipped)
  metrics.update(critic_metrics(dict(metrics, grad_norm=optax.global_norm(grads['value_head']))))
  metrics = policy_loss.mean_mismatch(metrics)
  state = dict(params=joint['policy'], opt_state=opt_state,
               critic_params=dict(value_head=joint['value_head']))
  return state, metrics


def make(config, model, params, mesh, rng):
  """The PPO Algorithm for `config`, starting from policy `params` (the critic from its trunk,
  its value head drawn from `rng`)."""
  cfg, train, batch = config.ppo, config.train, algos.batch_size(config)
  num_micro = algos.micro_batches(config)
  total_updates = optim.planned_updates(train, batch)
  critic = critic_lib.Critic(model.cfg)
  critic_opt_cfg = ml_collections.ConfigDict(dict(
      config.critic_optimizer.to_dict(), max_bad_steps=config.optimizer.max_bad_steps))
  actor_loss = policy_loss.make_policy_loss(model, cfg, config.rollout.temperature, num_micro,
                                            train.logits_chunk)
  critic_loss = critic_lib.make_critic_loss(critic, cfg.value_clip, cfg.moe_aux_coef, num_micro)
  critic_params = sharding.place(critic_lib.from_policy(params, rng, model.cfg), mesh)
  if cfg.share_trunk:
    tx, schedules = optim.make_joint_optimizer(
        dict(policy=config.optimizer, value_head=critic_opt_cfg), batch, total_updates)
    critic_params = dict(value_head=critic_params['value_head'])
    state = dict(params=params,
                 opt_state=sharding.init_optimizer(tx, dict(policy=params, **critic_params), mesh),
                 critic_params=critic_params)
    step = functools.partial(shared_update, actor_loss=actor_loss, critic_loss=critic_loss, tx=tx,
                             loss_agg=cfg.loss_agg, vf_coef=cfg.vf_coef, num_micro=num_micro)
    schedules = dict(lr=schedules['policy'], critic_lr=schedules['value_head'])
  else:
    actor_tx, actor_schedule = optim.make_optimizer(config.optimizer, batch, total_updates)
    critic_tx, critic_schedule = optim.make_optimizer(critic_opt_cfg, batch, total_updates)
    state = dict(params=params, opt_state=sharding.init_optimizer(actor_tx, params, mesh),
                 critic_params=critic_params,
                 critic_opt_state=sharding.init_optimizer(critic_tx, critic_params, mesh))
    step = functools.partial(separate_update, actor_loss=actor_loss, actor_tx=actor_tx,
                             critic_loss=critic_loss, critic_tx=critic_tx, loss_agg=cfg.loss_agg,
                             num_micro=num_micro)
    schedules = dict(lr=actor_schedule, critic_lr=critic_schedule)

  # The rollout batch is the full batch; value and reference forwards go micro-batch by micro-batch.
  def make_batch(state, rollout, rewards_B, prompt_BxT, valid_BxT, ref_params):
    batch, stats = ppo_batch(state, rollout, rewards_B, prompt_BxT, valid_BxT, ref_params,
                             model=model, critic=critic, cfg=cfg,
                             temperature=config.rollout.temperature,
                             num_micro=num_micro * train.num_minibatches)
    policy, is_stats = policy_loss.off_policy_correction(
        model, state['params'], batch.policy, cfg, config.rollout.temperature,
        num_micro * train.num_minibatches, train.logits_chunk)
    return batch._replace(policy=policy), dict(stats, **is_stats)

  def update_fn(state, batch, ref_params, rng):
    return update.minibatch_epochs(
        lambda state, minibatch: step(state, minibatch, ref_params), state, batch, rng,
        num_epochs=train.num_epochs, num_minibatches=train.num_minibatches, group_size=1,
        averaged=algos.AVERAGED + LOGGED)

  return algos.Algorithm(
      state=state, make_batch=sharding.on_mesh(jax.jit(make_batch), mesh),
      update=sharding.on_mesh(jax.jit(update_fn, donate_argnums=0), mesh),
      updates_per_batch=train.num_epochs * train.num_minibatches, batch=batch,
      schedules=schedules,
      needs_reference=bool(cfg.kl_coef or cfg.kl_reward_coef), logged=LOGGED)
