"""optax Adam(W) whose learning rate is a function of the GLOBAL batch (the paper's "align" step).

lr(B) = lr0 * f(B / B0), f = sqrt (Malladi et al.; the default), linear (Goyal et al.) or constant,
with B counted in training responses (GRPO: P x G; PPO: B). Linear warmup, then the peak held
(`decay='constant'`) or annealed to 0 at the run's last update ('linear', as TRL's default, or
'cosine'): on a fixed budget the anneal turns late, noisy updates into gains (docs/guide/grpo.md).
Global-norm clipping at max_grad_norm x c(B / B0), c = constant (the default) or inverse_sqrt
(MLPerf Training v6.1's GRPO rule, 0.125 x sqrt(256 / B): docs/guide/mlperf.md), and non-finite
updates skipped (counted by optax.apply_if_finite) so one bad batch cannot poison the weights.
"""
import math

import jax
import optax

LR_RULES = {
    'sqrt': lambda ratio: ratio ** 0.5,
    'linear': lambda ratio: ratio,
    'constant': lambda ratio: 1.0,
}
# The clip follows the batch inversely: under noise-dominated gradients the global grad norm falls
# as B^-1/2, so inverse_sqrt keeps the clip at one fraction of it at every batch.
CLIP_RULES = {
    'constant': lambda ratio: 1.0,
    'inverse_sqrt': lambda ratio: ratio ** -0.5,
}


def check(name, opt_cfg, batch, train_cfg=None):
  """ValueError naming the first bad field of the optimizer section `name` at `batch` responses,
  its schedule over the updates `train_cfg`'s budget plans (`planned_updates`; None: unbounded)
  included."""
  for key in ('lr', 'base_batch'):
    value = opt_cfg[key]
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
      raise ValueError(f'{name}.{key} must be a positive number, got {value!r}')
  if not (0 <= opt_cfg.b1 < 1 and 0 <= opt_cfg.b2 < 1):
    raise ValueError(f"{name}.b1 and b2 (Adam's moment decays) must be in [0, 1), got "
                     f'{opt_cfg.b1} and {opt_cfg.b2}')
  for key in ('eps', 'weight_decay', 'warmup_steps'):
    if not (math.isfinite(opt_cfg[key]) and opt_cfg[key] >= 0):
      raise ValueError(f'{name}.{key} must be a number >= 0, got {opt_cfg[key]!r}')
  try:
    total_updates = 1 << 30 if train_cfg is None else planned_updates(train_cfg, batch)
    schedule_for(opt_cfg, at_batch(opt_cfg, batch)[0], total_updates)
  except ValueError as error:
    raise ValueError(f'{name}.{error}') from None


def scaled_lr(lr0, batch, base_batch, rule):
  """The peak learning rate for a global batch of `batch` responses."""
  if rule not in LR_RULES:
    raise ValueError(f'lr_rule {rule!r} is unknown; choose one of {sorted(LR_RULES)}')
  if lr0 <= 0 or batch <= 0 or base_batch <= 0:
    raise ValueError(f'lr ({lr0}), batch ({batch}) and base_batch ({base_batch}) must be positive')
  return lr0 * LR_RULES[rule](batch / base_batch)


def scaled_clip(max_grad_norm, batch, base_batch, rule):
  """The global-norm clip for a global batch of `batch` responses (0: no clipping, at any batch)."""
  if rule not in CLIP_RULES:
    raise ValueError(f'clip_rule {rule!r} is unknown; choose one of {sorted(CLIP_RULES)}')
  if not (isinstance(max_grad_norm, (int, float)) and math.isfinite(max_grad_norm) and
          max_grad_norm >= 0):
    raise ValueError(f'max_grad_norm must be a number >= 0 (0: no clipping), got {max_grad_norm!r}')
  return max_grad_norm * CLIP_RULES[rule](batch / base_batch)


def at_batch(opt_cfg, batch):
  """(peak lr, global-norm clip) that the optimizer section `opt_cfg` gives a batch of `batch`
  responses: its lr and clip rules from its base batch."""
  return (scaled_lr(opt_cfg.lr, batch, opt_cfg.base_batch, opt_cfg.lr_rule),
          scaled_clip(opt_cfg.max_grad_norm, batch, opt_cfg.base_batch, opt_cfg.clip_rule))


DECAYS = {
    'constant': lambda peak, updates: optax.constant_schedule(peak),
    'linear': lambda peak, updates: optax.linear_schedule(peak, 0.0, updates),
    'cosine': lambda peak, updates: optax.cosine_decay_schedule(peak, updates),
}


def planned_updates(train_cfg, batch):
  """The optimizer updates a run's budget allows (steps x minibatches x epochs): the decay horizon.

  GRPO's filter_zero_variance retains fewer than `batch` responses per step, so a samples budget
  then takes more steps than this: config_checks asks for train.max_steps there.
  """
  budgets = [b for b in (train_cfg.max_steps, math.ceil(train_cfg.max_samples / batch)) if b > 0]
  return min(budgets, default=0) * train_cfg.num_minibatches * train_cfg.num_epochs


def schedule_for(opt_cfg, peak, total_updates):
  """Linear warmup to `peak`, then opt_cfg.decay until update `total_updates`."""
  decay = opt_cfg.decay
  if decay not in DECAYS:
    raise ValueError(f'decay must be one of {sorted(DECAYS)}, got {decay!r}')
  warmup = max(int(opt_cfg.warmup_steps), 0)
  if decay != 'constant' and total_updates <= warmup:
    raise ValueError(f'decay={decay!r}: the run has {total_updates} updates, not more than '
                     f'warmup_steps ({warmup})')
  after = DECAYS[decay](peak, total_updates - warmup)
  if not warmup:
    return after
  return optax.join_schedules([optax.linear_schedule(peak / (warmup + 1), peak, warmup), after],
                              [warmup])


def _adam(opt_cfg, batch, total_updates):
  """(clipped Adam(W) with the lr rule, its schedule); no non-finite guard."""
  peak, clip = at_batch(opt_cfg, batch)
  schedule = schedule_for(opt_cfg, peak, total_updates)
  chain = [optax.clip_by_global_norm(clip)] if clip else []
  chain.append(optax.adamw(schedule, b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps,
                           weight_decay=opt_cfg.weight_decay))
  return optax.chain(*chain), schedule


def make_optimizer(opt_cfg, batch, total_updates=0):
  """Returns (optax transformation, schedule: update count -> lr) for a global batch.

  total_updates: the run's length in updates, which a decaying schedule ends at (planned_updates).
  """
  tx, schedule = _adam(opt_cfg, batch, total_updates)
  return optax.apply_if_finite(tx, max_consecutive_errors=opt_cfg.max_bad_steps), schedule


def make_joint_optimizer(opt_cfgs, batch, total_updates=0):
  """One transformation over a dict of parameter trees, each top-level key with its own Adam, lr
  rule and clipping (e.g. a policy and a value head that share a trunk); one non-finite guard.

  Returns (transformation, {key: schedule}).
  """
  parts = {name: _adam(cfg, batch, total_updates) for name, cfg in opt_cfgs.items()}
  labels = lambda params: {name: jax.tree.map(lambda _, n=name: n, tree)
                           for name, tree in params.items()}
  tx = optax.multi_transform({name: part[0] for name, part in parts.items()}, labels)
  max_bad = min(cfg.max_bad_steps for cfg in opt_cfgs.values())
  return (optax.apply_if_finite(tx, max_consecutive_errors=max_bad),
          {name: part[1] for name, part in parts.items()})
