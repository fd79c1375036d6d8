"""PPO with a critic on the built-in arithmetic task.

  python -m rljax.main --config=configs/ppo.py:runlocal --workdir=/tmp/rljax_ppo
  python -m rljax.main --config=configs/ppo.py:B=1024 --workdir=gs://...

Args after ':' (comma-separated): B (global batch in responses, one per prompt), runlocal (tiny
model and budget for a 2-core CPU), seed. Any field can be overridden with --config.a.b=value.
"""
import ml_collections

from configs import common
from configs import grpo


def get_config(arg=None):
  arg = common.parse_arg(arg, B=256, runlocal=False, seed=0)
  config = ml_collections.ConfigDict()
  config.algo = 'ppo'
  config.seed = arg.seed
  config.model = grpo.model_preset(arg.runlocal)

  # The task: zero-padded 3-digit addition (`037+048=` -> `85`), built locally with TFDS.
  config.data = dict(dir='', digits=3, ops='+', zero_pad=True, num_train=100_000, num_test=1000,
                     seed=0, on_bad_record='skip')
  config.reward = 'exact_numeric'

  # B prompts, one response each: B responses is the batch unit of both lr rules.
  config.rollout = dict(P=arg.B, G=1, max_new_tokens=0, temperature=1.0, top_k=0, top_p=1.0)

  # KL: kl_reward_coef subtracts a per-token KL to the initial policy from the rewards (InstructGPT);
  # kl_coef adds one to the policy loss (as GRPO). value_clip <= 0: no value clipping. share_trunk:
  # the value head reads the policy's trunk and one update follows pg loss + vf_coef * value loss.
  config.ppo = dict(clip_low=0.2, clip_high=0.2, kl_coef=0.0, kl_estimator='k3', kl_reward_coef=0.0,
                    kl_reward_estimator='k1', loss_agg='token-mean', moe_aux_coef=1e-3, gamma=1.0,
                    lam=0.95, whiten_advantages=True, whiten_rewards=False, value_clip=0.2,
                    share_trunk=False, vf_coef=0.5)

  # Actor and critic each: lr = lr * sqrt(B / base_batch). Calibrated at B=256 on runlocal (docs/ppo.md):
  # actor 5e-5 / 1e-4 / 2e-4 reach +30 points in 64k / 46k / 36k samples, 4e-4 collapses; a critic
  # at 1e-3 explains ~3x more return variance than at 3e-4.
  config.optimizer = dict(lr=2e-4, base_batch=256, lr_rule='sqrt', warmup_steps=0, max_grad_norm=1.0,
                          b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, max_bad_steps=5)
  config.critic_optimizer = dict(lr=1e-3, base_batch=256, lr_rule='sqrt', warmup_steps=0,
                                 max_grad_norm=1.0, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0)

  # Budget in training responses (compare runs by samples, never by steps).
  config.train = dict(max_samples=80_000 if arg.runlocal else 2_000_000, max_steps=0,
                      micro_batch=64 if arg.runlocal else 256, num_minibatches=1, num_epochs=1,
                      eval_every=25, eval_size=500, log_every=10, checkpoint_every=100,
                      keep_checkpoints=2, target=0.0)

  # Supervised warm start, shared with GRPO (same fingerprint: same cache for both).
  config.warmstart = dict(enabled=True, dir='', lr=1e-3, batch=128, threshold=0.3, eval_every=25,
                          min_steps=200, max_steps=4000)
  return config
