"""Validation of a whole config before anything is built or compiled: one clear message per
problem (raised as ValueError; the main turns it into a non-zero exit)."""
from rljax import losses
from rljax import optim


def _check_policy_loss(name, cfg):
  if cfg.loss_agg not in losses.AGGREGATION_MODES:
    raise ValueError(f'{name}.loss_agg {cfg.loss_agg!r} is not one of {losses.AGGREGATION_MODES}')
  if cfg.kl_estimator not in losses.KL_KINDS:
    raise ValueError(f'{name}.kl_estimator {cfg.kl_estimator!r} is not one of {losses.KL_KINDS}')
  if cfg.clip_low < 0 or cfg.clip_high < 0 or cfg.kl_coef < 0:
    raise ValueError(f'{name}.clip_low, clip_high and kl_coef must be >= 0, got {cfg.clip_low}, '
                     f'{cfg.clip_high}, {cfg.kl_coef}')


def _check_ppo(config):
  rollout, cfg = config.rollout, config.ppo
  if rollout.G != 1:
    raise ValueError(f'rollout.G must be 1 for PPO (B prompts, one response each), got {rollout.G}')
  _check_policy_loss('ppo', cfg)
  if cfg.kl_reward_estimator not in losses.KL_KINDS:
    raise ValueError(f'ppo.kl_reward_estimator {cfg.kl_reward_estimator!r} is not one of '
                     f'{losses.KL_KINDS}')
  if cfg.kl_reward_coef < 0:
    raise ValueError(f'ppo.kl_reward_coef must be >= 0, got {cfg.kl_reward_coef}')
  for key in ('gamma', 'lam'):
    if not 0 <= cfg[key] <= 1:
      raise ValueError(f'ppo.{key} must be in [0, 1], got {cfg[key]}')
  if cfg.share_trunk and cfg.vf_coef <= 0:
    raise ValueError(f'ppo.vf_coef must be > 0 with a shared trunk, got {cfg.vf_coef}')
  copt = config.critic_optimizer
  try:
    optim.scaled_lr(copt.lr, rollout.P, copt.base_batch, copt.lr_rule)
  except ValueError as error:
    raise ValueError(f'critic_optimizer: {error}') from None


def check(config):
  """Raises ValueError naming the first bad field of `config`."""
  rollout, train, opt = config.rollout, config.train, config.optimizer
  if config.algo not in ('grpo', 'ppo'):
    raise ValueError(f"algo must be 'grpo' or 'ppo', got {config.algo!r}")
  if rollout.P < 1:
    raise ValueError(f'rollout.P (PPO: B) must be >= 1, got {rollout.P}')
  batch = rollout.P * rollout.G
  if config.algo == 'grpo':
    if rollout.G < 2:
      raise ValueError(f'rollout.G must be >= 2 for GRPO (group z-scores need 2 responses), '
                       f'got {rollout.G}')
    _check_policy_loss('grpo', config.grpo)
  else:
    _check_ppo(config)
  optim.scaled_lr(opt.lr, batch, opt.base_batch, opt.lr_rule)  # raises on bad lr / rule
  if rollout.temperature <= 0:
    raise ValueError(f'rollout.temperature must be > 0, got {rollout.temperature}')
  if not 0 < rollout.top_p <= 1:
    raise ValueError(f'rollout.top_p must be in (0, 1], got {rollout.top_p}')
  if train.num_minibatches < 1 or batch % train.num_minibatches:
    raise ValueError(f'train.num_minibatches ({train.num_minibatches}) must divide the batch '
                     f'P*G = {batch}')
  minibatch = batch // train.num_minibatches
  if train.micro_batch and (train.micro_batch < 1 or minibatch % train.micro_batch):
    raise ValueError(f'train.micro_batch ({train.micro_batch}) must divide the minibatch of '
                     f'{minibatch} responses')
  if train.max_samples <= 0 and train.max_steps <= 0:
    raise ValueError('set train.max_samples or train.max_steps to a positive budget')
  if config.model.moe_impl not in ('ragged', 'dense'):
    raise ValueError(f"model.moe_impl must be 'ragged' or 'dense', got {config.model.moe_impl!r}")
  if config.model.num_experts and not 0 < config.model.experts_per_token <= config.model.num_experts:
    raise ValueError(f'model.experts_per_token ({config.model.experts_per_token}) must be in '
                     f'[1, num_experts={config.model.num_experts}]')
  if config.model.num_heads % config.model.num_kv_heads:
    raise ValueError(f'model.num_heads ({config.model.num_heads}) must be a multiple of '
                     f'num_kv_heads ({config.model.num_kv_heads})')
