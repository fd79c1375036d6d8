"""GRPO on the built-in arithmetic task.

  python -m rljax.main --config=configs/grpo.py:runlocal --workdir=/tmp/rljax
  python -m rljax.main --config=configs/grpo.py:P=1024,G=8 --workdir=gs://...

Args after ':' (comma-separated): P (prompts per batch), G (responses per prompt), runlocal (tiny
model and budget for a 2-core CPU), seed, task (arithmetic | sums). Any field can be overridden with --config.a.b=value.
"""
import ml_collections

from configs import common


def model_preset(runlocal):
  """A ~0.5M-param MoE for CPU demos and tests, or a ~1B-class MoE (Qwen3-MoE shaped) otherwise."""
  if runlocal:
    return dict(vocab_size=16, d_model=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                num_experts=4, experts_per_token=2, expert_hidden=128, dense_hidden=512,
                moe_impl='bucketed', tie_embeddings=False, rope_theta=10000.0, norm_eps=1e-6, init_std=0.02,
                dtype='float32', param_dtype='float32', remat='none', max_seq_len=64)
  return dict(vocab_size=16, d_model=1024, num_layers=16, num_heads=16, num_kv_heads=4, head_dim=128,
              num_experts=32, experts_per_token=4, expert_hidden=768, dense_hidden=3072,
              moe_impl='ragged', tie_embeddings=False, rope_theta=1e6, norm_eps=1e-6, init_std=0.02,
              dtype='bfloat16', param_dtype='float32', remat='full', max_seq_len=4096)


def get_config(arg=None):
  arg = common.parse_arg(arg, P=16, G=8, runlocal=False, seed=0, task='arithmetic')
  config = ml_collections.ConfigDict()
  config.mode = 'train'   # configs/protocol.py runs many of these: mode 'protocol'
  config.algo = 'grpo'
  config.seed = arg.seed
  config.model = model_preset(arg.runlocal)
  # Device mesh (rljax/sharding.py): -1 takes the remaining devices.
  config.mesh = dict(data=-1, fsdp=1, expert=1, tensor=1)

  # The task: zero-padded 3-digit addition by default (`037+048=` -> `85`), built locally with TFDS.
  # name=gsm8k|math: local JSONL (path, test_path or num_test held out), prompts through the chat
  # template of init.hf_path's tokenizer, up to max_prompt_len tokens, responses max_response_len.
  config.data = dict(name='arithmetic', dir='', digits=3, ops='+', zero_pad=True,
                     num_train=100_000, num_test=1000, seed=0, on_bad_record='skip',
                     path='', test_path='', max_prompt_len=256, max_response_len=512,
                     instruction='', chat_template=True, max_operands=12)
  config.reward = 'auto'   # the task's verifier: exact_numeric (arithmetic), math (gsm8k, math)

  # A Hugging Face Qwen3 / Qwen3-MoE directory to start from (architecture, weights, tokenizer).
  config.init = dict(hf_path='')

  # Logs besides metrics.jsonl: TensorBoard events (WORKDIR/tensorboard), console progress bar, W&B.
  config.metrics = dict(tensorboard=True, progress=True, wandb=False, wandb_project='rljax')

  # Rollouts: P prompts x G responses = the batch unit of the lr rule. max_new_tokens=0: from the task.
  # slots: continuous-batching decode slots (0: static batching; docs/guide/rollouts.md).
  config.rollout = dict(P=arg.P, G=arg.G, max_new_tokens=0, temperature=1.0, top_k=0, top_p=1.0,
                        slots=0)

  config.grpo = dict(normalize_std=True, filter_zero_variance=False, clip_low=0.2, clip_high=0.2,
                     kl_coef=0.0, kl_estimator='k3', loss_agg='token-mean', moe_aux_coef=1e-3)

  # lr = lr * sqrt(P*G / base_batch): 5e-5 at P=16, G=8 is what RECIPE.md measured to work.
  # decay: the lr after warmup, held ('constant') or annealed to 0 at the budget's end ('linear',
  # 'cosine'); the protocol holds it constant.
  config.optimizer = dict(lr=5e-5, base_batch=128, lr_rule='sqrt', warmup_steps=0, decay='constant',
                          max_grad_norm=1.0, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0,
                          max_bad_steps=5)
  if arg.runlocal:   # the README demo, one fixed budget: a higher lr annealed to 0 (docs/grpo.md)
    config.optimizer.update(lr=1e-4, decay='linear')

  # Budget in retained training responses (compare runs by samples, never by steps).
  config.train = dict(max_samples=250_000 if arg.runlocal else 2_000_000, max_steps=0,
                      micro_batch=64 if arg.runlocal else min(256, arg.P * arg.G), num_minibatches=1, num_epochs=1,
                      logits_chunk=0 if arg.runlocal else 128, eval_every=25, eval_size=500,
                      log_every=10, checkpoint_every=100, keep_checkpoints=2, target=0.0,
                      overwrite=False)   # overwrite: replace a different run in the workdir

  # Fault injection for reliability tests: RL steps whose advantages are made NaN, e.g. '3' or '3-9'.
  config.debug = dict(nan_steps='')

  # Supervised warm start to a partly competent policy (RL from random init earns no reward).
  # seed -1: the run's seed; the protocol pins one so every arm and seed starts from one policy.
  config.warmstart = dict(enabled=True, dir='', lr=1e-3, batch=128, threshold=0.3, eval_every=25,
                          min_steps=200, max_steps=4000, seed=-1)
  if arg.task not in ('arithmetic', 'sums'):
    raise ValueError(f"config arg task={arg.task!r}: expected 'arithmetic' or 'sums'")
  if arg.task == 'sums':   # running sums: responses of uneven length (docs/guide/rollouts.md)
    config.data.update(name='sums', digits=2)
    config.model.max_seq_len = max(config.model.max_seq_len, 160)
  return config
