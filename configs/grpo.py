"""GRPO on the built-in arithmetic task.

  python -m rljax.main --config=configs/grpo.py:runlocal --workdir=/tmp/rljax
  python -m rljax.main --config=configs/grpo.py:P=1024,G=8 --workdir=gs://...

Args after ':' (comma-separated): P (prompts per batch; P=auto: chosen during the run among
config.auto_batch's bounds, docs/guide/auto_batch.md), G (responses per prompt), runlocal (tiny
model and budget for a 2-core CPU), seed, model (a preset of configs/models.py, e.g.
qwen3-30b-a3b), task (arithmetic | sums | tools | rg:<a reasoning-gym dataset>, e.g.
rg:chain_sum), loss (clip | gspo | cispo: the policy loss with
its published clip bounds, common.policy_loss), lora (a LoRA rank: adapters on a frozen base,
0 = full fine-tuning, common.lora). Any field can be overridden with --config.a.b=value.
"""
from configs import common


def get_config(arg=None):
  arg = common.parse_arg(arg, P=16, G=8, runlocal=False, seed=0, model='', task='arithmetic',
                         loss='clip', lora=0)
  auto = arg.P == 'auto'
  config = common.base_config(16 if auto else arg.P, arg.G, arg.runlocal, arg.seed, arg.model)
  config.algo = 'grpo'
  # The policy loss (docs/reference/losses.md). normalize_std=False is Dr. GRPO; adv_eps is added
  # to the group std. clip_ratio_c > 1 turns on dual-clip for A < 0 (0: off). kl_estimator, as a
  # kl_coef loss term: 'k3' follows the gradient of KL(ref || pi), 'k2' that of KL(pi || ref);
  # 'k1' has zero expected gradient and is refused. loss_agg: one of losses.AGGREGATION_MODES.
  # off_policy: 'tis' weights each token by min(pi_old / mu, is_high) against the sampler's mu,
  # 'mis' drops tokens whose ratio leaves [is_low, is_high]; 'none' (default): no correction.
  config.grpo = dict(normalize_std=True, adv_eps=1e-6, filter_zero_variance=False,
                     policy_loss='clip', clip_low=0.2, clip_high=0.2, clip_ratio_c=0.0, kl_coef=0.0,
                     kl_estimator='k3', loss_agg='token-mean', moe_aux_coef=1e-3,
                     off_policy='none', is_low=0.5, is_high=2.0)
  common.policy_loss(config.grpo, arg.loss)
  # 5e-5 at P*G = 128 learns fastest per sample on the arithmetic task (docs/method.md); the
  # runlocal demo anneals a higher lr to 0 over its one fixed budget (docs/guide/grpo.md).
  if arg.runlocal:
    config.optimizer.update(lr=1e-4, decay='linear')
  common.task(config, arg.task, arg.runlocal)
  common.lora(config, arg.lora)
  return common.enable_auto_batch(config) if auto else config
