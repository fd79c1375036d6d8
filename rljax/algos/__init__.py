"""RL algorithms, resolved by name: `config.algo = 'grpo'` is the module rljax.algos.grpo.

The loop (rljax.train.loop) owns what every algorithm shares: rollouts, rewards, evaluation,
metrics, checkpoints. An algorithm module owns what differs, and declares:

  BATCH_ARG                     the config-file argument that sets its batch
                                ('P' for GRPO, 'B' for PPO), a string literal: launchers read it
                                from the source, without jax
  check(config)                 ValueError naming the first bad field of its own config section
  make(config, model, params, mesh, rng) -> Algorithm

So a new algorithm is one new file here plus a config file; nothing else changes. Every
algorithm's batch argument is rollout.P (GRPO's prompts, PPO's B with G = 1), so the batch has one
owner: `batch_size` and `with_batch` below.
"""
import math
import sys
from typing import Callable, NamedTuple

import ml_collections

from rljax import losses
from rljax import optim
from rljax import registry

# Update metrics that a training row averages over the optimizer updates of one rollout batch;
# every other update metric is the first update's (on-policy).
AVERAGED = ('grad_norm', 'kl', 'grad_sq_small', 'grad_sq_big', 'b_small', 'b_big')


def params_policy(state, reference):
  """The policy of an algorithm that trains every weight: its state's 'params'."""
  del reference
  return state['params']


class Algorithm(NamedTuple):
  state: dict            # pytrees, checkpointed whole: the trained weights and optimizer state
  make_batch: Callable   # (state, rollout, rewards_B, prompt_BxT, valid_BxT, ref_params) ->
                         # (batch, stats)
  update: Callable       # (state, batch, ref_params, rng) -> (state, metrics): all epochs and
                         # minibatches
  updates_per_batch: int  # optimizer updates in one call of `update`
  batch: int             # responses per rollout batch (`batch_size`): what one `update` call takes
  schedules: dict        # training-row key -> schedule(update count), e.g. {'lr': ...}
  needs_reference: bool  # whether a frozen copy of the initial policy is used (KL)
  logged: tuple = ()     # update metrics averaged into each training row beyond AVERAGED
  # (state, reference) -> the params the sampler, the evaluator and make_batch run: state['params'],
  # or with LoRA the base (in the reference slot) merged with state['adapters'] (rljax.algos._lora)
  policy: Callable = params_policy
  adapts: bool = False   # LoRA: the reference slot holds the frozen base, rebuilt, not checkpointed


def names():
  """The algorithms this package holds."""
  return registry.names(sys.modules[__name__])


def get(name):
  """The algorithm module called `name`; ValueError naming the known ones if there is none."""
  return registry.get(sys.modules[__name__], name, 'algo')


def batch_size(config):
  """Responses per rollout batch (P x G; PPO: B x 1): the unit of the learning-rate rule."""
  return config.rollout.P * config.rollout.G


def with_batch(config, value, keep_micro_batches=False):
  """A copy of `config` whose batch argument is `value`; micro-batches (memory only) capped at
  the new batch, or as many of them a minibatch as before (auto_batch keeps its starting count,
  so the noise scale's two micro-batch sizes scale with the batch)."""
  count = micro_batches(config) if keep_micro_batches else None
  config = ml_collections.ConfigDict(config.to_dict())
  config.rollout.P = value
  config.train.micro_batch = min(config.train.micro_batch, batch_size(config))
  if keep_micro_batches:
    config.train.micro_batch = batch_size(config) // config.train.num_minibatches // count
  return config


def micro_batches(config):
  """Micro-batches per minibatch: gradients are accumulated over them, so memory is one's."""
  minibatch = batch_size(config) // config.train.num_minibatches
  return minibatch // (config.train.micro_batch or minibatch)


def check(config):
  """ValueError naming the first bad field of the algorithm and its batch: rollout.P, the
  algorithm's own section, the optimizer at that batch, minibatches and micro-batches."""
  module, train = get(config.algo), config.train
  if config.rollout.P < 1:
    raise ValueError(f'rollout.P (PPO: B) must be >= 1, got {config.rollout.P}')
  batch = batch_size(config)
  module.check(config)
  check_optimizer('optimizer', config.optimizer, config, batch)
  if train.num_minibatches < 1 or batch % train.num_minibatches:
    raise ValueError(f'train.num_minibatches ({train.num_minibatches}) must divide the batch '
                     f'P*G = {batch}')
  minibatch = batch // train.num_minibatches
  if train.micro_batch and (train.micro_batch < 1 or minibatch % train.micro_batch):
    raise ValueError(f'train.micro_batch ({train.micro_batch}) must divide the minibatch of '
                     f'{minibatch} responses')
  if train.num_epochs < 1:
    raise ValueError(f'train.num_epochs must be >= 1, got {train.num_epochs}')


def check_policy_loss(name, cfg):
  """The fields every policy-gradient algorithm's section shares (its name: `name`)."""
  if cfg.loss_agg not in losses.AGGREGATION_MODES:
    raise ValueError(f'{name}.loss_agg {cfg.loss_agg!r} is not one of {losses.AGGREGATION_MODES}')
  if cfg.kl_estimator not in losses.KL_KINDS:
    raise ValueError(f'{name}.kl_estimator {cfg.kl_estimator!r} is not one of {losses.KL_KINDS}')
  weights = [cfg.clip_low, cfg.clip_high, cfg.kl_coef, cfg.moe_aux_coef]
  if not all(math.isfinite(w) and w >= 0 for w in weights):
    raise ValueError(f'{name}.clip_low, clip_high, kl_coef and moe_aux_coef must be numbers >= 0, '
                     f'got {", ".join(map(str, weights))}')
  if cfg.kl_coef > 0 and cfg.kl_estimator == 'k1':
    raise ValueError(f"{name}.kl_estimator 'k1' with kl_coef > 0: k1's expected gradient is 0, so "
                     "it does not regularise; use 'k3' (gradient of KL(ref||pi)) or 'k2' (of "
                     "KL(pi||ref))")
  if cfg.clip_ratio_c and not cfg.clip_ratio_c > 1:
    raise ValueError(f'{name}.clip_ratio_c (dual-clip) must be > 1, or 0 for off, got '
                     f'{cfg.clip_ratio_c}')
  kind = cfg.get('policy_loss', 'clip')
  if kind not in losses.POLICY_LOSSES:
    raise ValueError(f'{name}.policy_loss {kind!r} is not one of {losses.POLICY_LOSSES}')
  if kind == 'gspo' and cfg.loss_agg != 'seq-mean-token-mean':
    raise ValueError(f"{name}.policy_loss 'gspo' averages its sequences' objectives: set "
                     f"{name}.loss_agg='seq-mean-token-mean' (got {cfg.loss_agg!r})")
  if kind == 'cispo' and cfg.clip_ratio_c:
    raise ValueError(f"{name}.clip_ratio_c (dual-clip) bounds the clipped surrogate; "
                     f"policy_loss 'cispo' bounds its weights by clip_low and clip_high: set 0")
  mode = cfg.off_policy
  if mode not in losses.OFF_POLICY_MODES:
    raise ValueError(f'{name}.off_policy {mode!r} is not one of {losses.OFF_POLICY_MODES}')
  if mode == 'tis' and not cfg.is_high >= 1:
    raise ValueError(f"{name}.is_high (the 'tis' cap) must be >= 1, got {cfg.is_high}")
  if mode == 'mis' and not 0 <= cfg.is_low <= 1 <= cfg.is_high:
    raise ValueError(f"{name}.is_low and is_high (the 'mis' band) must satisfy 0 <= is_low <= 1 "
                     f'<= is_high, got {cfg.is_low} and {cfg.is_high}')
  if 'adv_eps' in cfg and not cfg.adv_eps >= 0:
    raise ValueError(f'{name}.adv_eps must be >= 0, got {cfg.adv_eps}')


def check_optimizer(name, opt, config, batch):
  """The optimizer section `name` at `batch` (optim.check), its decay over the run's planned
  updates: a decaying lr ends at the last one, which must be known."""
  decay, train = opt.decay, config.train
  filters_rows = config[config.algo].get('filter_zero_variance', False)
  if decay != 'constant' and filters_rows and not train.max_steps:
    raise ValueError(f'{name}.decay={decay!r} anneals to 0 at the last planned update, which '
                     f'{config.algo}.filter_zero_variance leaves unknown under a samples budget: '
                     'set train.max_steps')
  budget = (train.max_samples > 0 or train.max_steps > 0) and min(train.num_minibatches,
                                                                    train.num_epochs) >= 1
  # without a budget or with bad loop settings: reported by check() itself
  optim.check(name, opt, batch, train if budget else None)
