"""optax Adam(W) whose learning rate is a function of the GLOBAL batch (the paper's "align" step).

lr(B) = lr0 * f(B / B0), f = sqrt (Malladi et al.; the default), linear (Goyal et al.) or constant,
with B counted in training responses (GRPO: P x G; PPO: B). Linear warmup, global-norm clipping,
and non-finite updates skipped (counted by optax.apply_if_finite) so one bad batch cannot poison
the weights.
"""
import optax

LR_RULES = {
    'sqrt': lambda ratio: ratio ** 0.5,
    'linear': lambda ratio: ratio,
    'constant': lambda ratio: 1.0,
}


def scaled_lr(lr0, batch, base_batch, rule):
  """The peak learning rate for a global batch of `batch` responses."""
  if rule not in LR_RULES:
    raise ValueError(f'unknown lr_rule {rule!r}; choose one of {sorted(LR_RULES)}')
  if lr0 <= 0 or batch <= 0 or base_batch <= 0:
    raise ValueError(f'lr ({lr0}), batch ({batch}) and base_batch ({base_batch}) must be positive')
  return lr0 * LR_RULES[rule](batch / base_batch)


def make_optimizer(opt_cfg, batch):
  """Returns (optax transformation, schedule: update count -> lr) for a global batch."""
  peak = scaled_lr(opt_cfg.lr, batch, opt_cfg.base_batch, opt_cfg.lr_rule)
  warmup = max(int(opt_cfg.warmup_steps), 0)
  schedule = optax.linear_schedule(peak / (warmup + 1), peak, warmup) if warmup else (
      optax.constant_schedule(peak))
  chain = []
  if opt_cfg.max_grad_norm:
    chain.append(optax.clip_by_global_norm(opt_cfg.max_grad_norm))
  chain.append(optax.adamw(schedule, b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps,
                           weight_decay=opt_cfg.weight_decay))
  tx = optax.apply_if_finite(optax.chain(*chain), max_consecutive_errors=opt_cfg.max_bad_steps)
  return tx, schedule
