"""RLOO on the built-in arithmetic task: GRPO's setting with a leave-one-out baseline.

  python -m rljax.main --config=configs/rloo.py:runlocal --workdir=/tmp/rljax_rloo

Args after ':' (comma-separated): P (prompts per batch), G (responses per prompt), runlocal, seed,
model (a preset of configs/models.py), loss (clip | gspo | cispo, as in configs/grpo.py).
"""
from configs import common


def get_config(arg=None):
  arg = common.parse_arg(arg, P=16, G=8, runlocal=False, seed=0, model='', loss='clip')
  auto = arg.P == 'auto'   # P=auto: chosen during the run (docs/guide/auto_batch.md)
  config = common.base_config(16 if auto else arg.P, arg.G, arg.runlocal, arg.seed, arg.model)
  config.algo = 'rloo'
  config.rloo = dict(policy_loss='clip', clip_low=0.2, clip_high=0.2, clip_ratio_c=0.0,
                     kl_coef=0.0, kl_estimator='k3', loss_agg='token-mean', moe_aux_coef=1e-3,
                     off_policy='none', is_low=0.5, is_high=2.0)   # docs/reference/losses.md
  common.policy_loss(config.rloo, arg.loss)
  return common.enable_auto_batch(config) if auto else config
