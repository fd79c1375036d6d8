"""PPO with a critic on the built-in arithmetic task.

  python -m rljax.main --config=configs/ppo.py:runlocal --workdir=/tmp/rljax_ppo
  python -m rljax.main --config=configs/ppo.py:B=1024 --workdir=gs://...

Args after ':' (comma-separated): B (global batch in responses, one per prompt), runlocal (tiny
model and budget for a 2-core CPU), seed, model (a preset of configs/models.py), task (as in
configs/grpo.py: arithmetic | sums | tools | rg:<a reasoning-gym dataset>). Any field can be
overridden with --config.a.b=value.
"""
from configs import common


def get_config(arg=None):
  arg = common.parse_arg(arg, B=256, runlocal=False, seed=0, model='', task='arithmetic')
  # B prompts, one response each; model: a preset of configs/models.py (default: the runlocal or
  # the ~1.3B MoE)
  auto = arg.B == 'auto'   # B=auto: chosen during the run (docs/guide/auto_batch.md)
  config = common.base_config(256 if auto else arg.B, 1, arg.runlocal, arg.seed, arg.model)
  config.algo = 'ppo'

  # KL: kl_reward_coef subtracts a per-token KL to the initial policy from the rewards
  # (InstructGPT); kl_coef adds one to the policy loss (as GRPO). value_clip <= 0: no value
  # clipping. share_trunk: the value head reads the policy's trunk and one update follows
  # pg loss + vf_coef * value loss. kl_estimator (loss term): 'k3' follows the gradient of
  # KL(ref || pi), 'k2' that of KL(pi || ref), 'k1' has zero expected gradient and is refused.
  # kl_reward_estimator (in the reward, never differentiated): 'k1' is the unbiased standard.
  # clip_ratio_c > 1: dual-clip for A < 0 (0: off). docs/reference/losses.md has them all.
  config.ppo = dict(policy_loss='clip', clip_low=0.2, clip_high=0.2, clip_ratio_c=0.0,
                    kl_coef=0.0, kl_estimator='k3', kl_reward_coef=0.0, kl_reward_estimator='k1',
                    loss_agg='token-mean', moe_aux_coef=1e-3, gamma=1.0, lam=0.95,
                    whiten_advantages=True, whiten_rewards=False, value_clip=0.2,
                    share_trunk=False, vf_coef=0.5, off_policy='none', is_low=0.5, is_high=2.0)

  # B responses is the batch unit of both lr rules, lr = lr * sqrt(B / base_batch) for the actor
  # and the critic each. Calibrated at B=256 on runlocal (docs/guide/ppo.md).
  config.optimizer.update(lr=2e-4, base_batch=256, decay='constant')
  config.critic_optimizer = dict(lr=1e-3, base_batch=256, lr_rule='sqrt', warmup_steps=0,
                                 decay='constant', max_grad_norm=1.0, clip_rule='constant',
                                 b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0)
  config.train.max_samples = 80_000 if arg.runlocal else 2_000_000
  config.auto_batch.update(min=64, max=1024)
  common.task(config, arg.task, arg.runlocal)
  return common.enable_auto_batch(config) if auto else config
