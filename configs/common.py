"""Parses the `:key=value,...` argument of a config file (big_vision style).

`get_config("P=1024,runlocal")` in a config file calls `parse_arg(arg, P=16, runlocal=False)`:
types come from the defaults, a bare key means True, unknown keys and bad values raise one clear
ValueError (the main turns it into a non-zero exit).
"""
import ml_collections

from configs import models

AUTO_ARGS = ('P', 'B')   # batch arguments that also take 'auto' (config.auto_batch)


def _convert(key, text, default):
  if text.strip() == 'auto' and key in AUTO_ARGS:
    return 'auto'
  if isinstance(default, bool):
    lowered = text.strip().lower()
    if lowered in ('', 'true', '1', 'yes'):
      return True
    if lowered in ('false', '0', 'no'):
      return False
    raise ValueError(f'config arg {key}={text!r}: expected a boolean (true/false)')
  if isinstance(default, int):
    try:
      return int(text)
    except ValueError:
      raise ValueError(f'config arg {key}={text!r}: expected an integer') from None
  if isinstance(default, float):
    try:
      return float(text)
    except ValueError:
      raise ValueError(f'config arg {key}={text!r}: expected a number') from None
  return text


def parse_arg(arg, **defaults):
  """Returns a ConfigDict of `defaults` overridden by the comma-separated
  `key=value` pairs in `arg`.

  A batch argument (AUTO_ARGS) may also be 'auto': the batch is then chosen during the run
  (enable_auto_batch)."""
  values = dict(defaults)
  for item in (arg or '').split(','):
    item = item.strip()
    if not item:
      continue
    key, has_value, text = item.partition('=')
    key = key.strip()
    if key not in defaults:
      raise ValueError(f'unknown config arg {key!r}; known args: {", ".join(sorted(defaults))}')
    if not has_value and not isinstance(defaults[key], bool):
      raise ValueError(f'config arg {key!r} needs a value ({key}=...)')
    values[key] = _convert(key, text, defaults[key])
  return ml_collections.ConfigDict(values)


LORA_TARGETS = ('q', 'k', 'v', 'o', 'gate', 'up', 'down')   # rljax.model.lora.TARGETS: all


def lora(config, rank):
  """`config` training LoRA adapters of `rank` on every projection (rank 0: unchanged), at ten
  times the full fine-tuning lr: LoRA's best lr is about 10x full fine-tuning's at alpha 32
  (Schulman et al., "LoRA Without Regret", 2025; not swept here: docs/guide/lora.md)."""
  if rank < 0:
    raise ValueError(f'config arg lora={rank}: expected a rank >= 0 (0: full fine-tuning)')
  if rank:
    config.model.lora.rank = rank
    config.optimizer.lr *= 10
  return config


def model_preset(runlocal, name=''):
  """configs/models.py's preset `name`; by default a ~0.5M-param MoE for CPU demos and tests
  (runlocal), or a ~1.3B-param Qwen3-MoE-shaped model otherwise."""
  return models.preset(name or ('tiny' if runlocal else 'moe1b'))


def base_config(P, G, runlocal, seed, model=''):
  """What every training config shares: model, mesh, task, logs, rollouts, optimizer, loop, warm
  start. Each algorithm's config file adds its own section (config.<algo>) and settings.

  Each field's type, range and meaning are declared once, in docs/reference/config.md (held to
  the checks by tests/test_config_values.py); the comments here say only why a default is what
  it is."""
  config = ml_collections.ConfigDict()
  config.mode = 'train'
  config.seed = seed
  config.model = dict(model_preset(runlocal, model), router_replay=False,
                      lora=dict(rank=0, alpha=32.0, targets=LORA_TARGETS))   # alpha: PEFT's
  config.mesh = dict(data=-1, fsdp=1, expert=1, tensor=1)
  # Zero-padded 3-digit addition (`037+048=` -> `85`), built locally: no download.
  config.data = dict(name='arithmetic', dir='', digits=3, ops='+', zero_pad=True,
                     num_train=100_000, num_test=1000, seed=0, on_bad_record='skip',
                     extra_test=0, path='', test_path='', max_prompt_len=256,
                     max_response_len=512, instruction='', chat_template=True, max_operands=8,
                     demo_frac=0.25, dataset='', dataset_args='{}', render='question')
  config.reward = 'auto'
  config.init = dict(hf_path='')
  config.metrics = dict(tensorboard=True, progress=True, wandb=False, wandb_project='rljax')
  config.rollout = dict(P=P, G=G, max_new_tokens=0, temperature=1.0, top_k=0, top_p=1.0, slots=0,
                        schedule='each_step', max_staleness=1, devices=0)
  config.tools = dict(enabled=True, timeout_s=1.0, max_calls=2, workers=8, memory_mb=512)
  config.optimizer = dict(lr=5e-5, base_batch=128, lr_rule='sqrt', warmup_steps=0, decay='constant',
                          max_grad_norm=1.0, clip_rule='constant', b1=0.9, b2=0.999, eps=1e-8,
                          weight_decay=0.0, max_bad_steps=5)
  # Budgets in retained training responses: runs compare by samples, never by steps.
  config.train = dict(max_samples=250_000 if runlocal else 2_000_000, max_steps=0,
                      micro_batch=64 if runlocal else min(256, P * G), num_minibatches=1,
                      num_epochs=1, logits_chunk=0 if runlocal else 128, eval_every=25,
                      eval_first_samples=0, eval_from_samples=0, eval_size=500, log_every=10,
                      checkpoint_every=100, keep_checkpoints=2, target=0.0, overwrite=False)
  # The config arg P=auto (B=auto) turns it on: enable_auto_batch.
  config.auto_batch = dict(enabled=False, min=2 if runlocal else 16, max=32 if runlocal else 256,
                           every_samples=2048 if runlocal else 65_536, probe_steps=8, margin=0.1,
                           window=50, throughput_file='', compile_s=-1.0,
                           verify_samples=8192 if runlocal else 262_144)
  config.debug = dict(nan_steps='')
  # RL from a random init earns no reward: a supervised start to a partly competent policy.
  config.warmstart = dict(enabled=True, dir='', lr=1e-3, batch=128, threshold=0.3, eval_every=25,
                          min_steps=200, max_steps=4000, seed=-1)
  return config


def enable_auto_batch(config):
  """`config` with the batch chosen during the run, starting at auto_batch.min: a constant lr
  after warmup (a decay's horizon is in updates, which a changing batch moves) and micro-batches
  of at most half the smallest batch (the noise scale needs two per step)."""
  auto, G = config.auto_batch, config.rollout.G
  auto.enabled = True
  config.rollout.P = auto.min
  for section in ('optimizer', 'critic_optimizer'):
    if section in config:
      config[section].decay = 'constant'
  config.train.micro_batch = min(config.train.micro_batch or auto.min * G, auto.min * G // 2)
  return config


# Each policy loss with its published settings (docs/reference/losses.md): GSPO clips a sequence's
# length-normalised ratio, so tightly (Zheng et al. 2025), and averages sequences; bounds that
# tight need pi_old from the trainer's own program (off_policy), or the sampler's bfloat16
# rounding alone clips a third of the sequences (docs/guide/router_replay.md). CISPO bounds its
# weights above only (MiniMax-M1, 2025), 5.0 as SkyRL's default.
POLICY_LOSS_SETTINGS = {
    'clip': {},
    'gspo': dict(clip_low=3e-4, clip_high=4e-4, loss_agg='seq-mean-token-mean', off_policy='tis'),
    'cispo': dict(clip_low=1.0, clip_high=5.0),
}


def policy_loss(section, name):
  """`section` (an algorithm's config dict) set to policy loss `name` with its settings."""
  if name not in POLICY_LOSS_SETTINGS:
    raise ValueError(f'config arg loss={name!r}: expected one of '
                     f'{tuple(POLICY_LOSS_SETTINGS)}')
  section.update(policy_loss=name, **POLICY_LOSS_SETTINGS[name])


# reasoning-gym datasets sized for the tiny model (docs/guide/environments.md): the library's
# config fields (data.dataset_args), and the longest compact prompt and response in characters.
RG_RUNLOCAL = {
    'chain_sum': dict(dataset_args='{"max_digits": 2, "max_terms": 2}', max_prompt_len=6,
                      max_response_len=5),
    # '+' and '-' only: without parentheses the library evaluates left to right ('6+10*0' -> 0)
    # and writes a divisor other than the one it divides by ('4/1' -> 2)
    'basic_arithmetic': dict(dataset_args='{"allow_negation": false, "allow_parentheses": false, '
                                          '"max_digits": 1, "max_terms": 3, '
                                          '"operators": ["+", "-"]}',
                             max_prompt_len=8, max_response_len=4),
    'simple_equations': dict(dataset_args='{"max_terms": 2, "max_value": 20, '
                                          '"operators": ["+", "-"], '
                                          '"operators_weights": [0.5, 0.5]}',
                             max_prompt_len=10, max_response_len=4),
    'gcd': dict(dataset_args='{"max_value": 100}', max_prompt_len=12, max_response_len=4),
}
RG_TEXT_VOCAB = 98   # rljax.data.tokenizer.TextTokenizer's ids


def task(config, name, runlocal):
  """`config` on the task `name`: arithmetic (base_config's), sums, tools or rg:<a reasoning-gym
  dataset>."""
  rg_dataset = name.partition('rg:')[2] if name.startswith('rg:') else ''
  if name not in ('arithmetic', 'sums', 'tools') and not rg_dataset:
    raise ValueError(f"config arg task={name!r}: expected 'arithmetic', 'sums', 'tools' or "
                     "'rg:<a reasoning-gym dataset>'")
  if name == 'sums':   # running sums: responses of uneven length (docs/guide/rollouts.md)
    config.data.update(name='sums', digits=1, max_operands=8)
    config.model.max_seq_len = max(config.model.max_seq_len, 160)   # room for longer chains
    config.rollout.slots = 32
    if runlocal:   # warm start and RL sized for the 15-minute CPU run (docs/guide/rollouts.md)
      # RL learns long chains only from a policy that already solves some of them (below ~0.5
      # most 6-8 operand groups earn no reward); checks every 10 steps limit the overshoot.
      config.warmstart.update(batch=64, lr=2e-3, min_steps=300, eval_every=10, threshold=0.5)
      config.optimizer.lr = 2e-4
      config.train.max_samples = 48_000
  if name == 'tools':   # long additions with a calculator tool (docs/guide/tools.md)
    tool_task(config, runlocal)
  if rg_dataset:   # a dataset of the reasoning-gym library (docs/guide/environments.md)
    reasoning_gym_task(config, rg_dataset, runlocal)
  return config


def reasoning_gym_task(config, dataset, runlocal):
  """`config` on the reasoning-gym library's dataset `dataset` with the character tokenizer
  (docs/guide/environments.md). runlocal and a dataset of RG_RUNLOCAL: its compact prompts at the
  sizes measured there; otherwise the library's questions at its default config."""
  config.data.update(name='reasoning_gym', dataset=dataset)
  config.model.vocab_size = RG_TEXT_VOCAB
  if runlocal and dataset in RG_RUNLOCAL:
    config.data.update(render='compact', **RG_RUNLOCAL[dataset])
  elif runlocal:
    config.data.update(max_prompt_len=256, max_response_len=32)
  data = config.data
  config.model.max_seq_len = max(config.model.max_seq_len,
                                 data.max_prompt_len + data.max_response_len)
  return config


def tool_task(config, runlocal):
  """`config` on the tool task: 5-digit additions with a calculator tool, a quarter of the warm
  start's answers demonstrating the call (docs/guide/tools.md)."""
  config.data.update(name='tool_sums', digits=5, max_operands=2, demo_frac=0.25)
  config.model.vocab_size = max(config.model.vocab_size, 23)   # the tool tokenizer's
  if runlocal:
    config.model.max_seq_len = 48
    # A fixed warm start (threshold 0: it stops at min_steps), so the runs with and without the
    # tool, whose evaluations differ, start from one checkpoint.
    config.warmstart.update(threshold=0.0, min_steps=300, eval_every=50)
    config.train.update(max_samples=16_384, eval_every=16)
  return config
