"""The one place a whole config is checked, before anything is built or compiled: one clear
message per problem (raised as ValueError; the main turns it into a non-zero exit).

Each part checks its own fields beside its code (the rollout: rljax.train.schedules; the
algorithm and its batch: rljax.algos, with the optimizer's rljax.optim; checkpoints:
rljax.train.checkpoint; the data and the task's own, a tool's limits included: rljax.tasks; the
mesh: rljax.sharding); `check` calls them in turn (P=auto's settings: rljax.auto_batch.state),
with what only the loop and the model read checked here, and every batch P=auto may reach checked
as a config of its own.
"""
import math

import jax

from rljax import algos
from rljax.auto_batch import state as auto_state
from rljax.model import transformer as model_lib
from rljax import sharding
from rljax import tasks
from rljax.train import checkpoint
from rljax.train import schedules
from rljax.train import warmstart


def check(config, device_count=None, process_count=None):
  """Raises ValueError naming the first bad field of `config`."""
  device_count = jax.device_count() if device_count is None else device_count
  process_count = jax.process_count() if process_count is None else process_count
  schedules.check(config, device_count, process_count)
  model_lib.check(config.model)
  algos.check(config)
  _check_loop(config)
  checkpoint.check(config.train)
  tasks.check(config, process_count, schedules.kind(config).RUNS_TURNS)
  if config.warmstart.enabled and not config.init.hf_path:   # a Hugging Face start has none
    warmstart.check(config.warmstart, process_count)
  batch, micro = algos.batch_size(config), config.train.micro_batch
  batches = [('the batch P*G', batch), ('the minibatch', batch // config.train.num_minibatches)]
  sharding.check_mesh(config.mesh, device_count - config.rollout.devices,
                      batches + ([('train.micro_batch', micro)] if micro else []),
                      config.model.num_experts)
  step_set(config.debug.nan_steps)
  if config.auto_batch.enabled:
    _check_auto_batch(config, device_count, process_count)


def _check_loop(config):
  """What the loop itself reads: the mode and seed, the budget and the target, how often it
  evaluates and logs, the logits' chunks, and after how many non-finite updates in a row it
  stops."""
  train = config.train
  if config.mode != 'train':
    raise ValueError(f"mode must be 'train' (one run) or 'protocol', got {config.mode!r}")
  if config.seed < 0:
    raise ValueError(f'seed must be >= 0, got {config.seed}')
  if train.max_samples <= 0 and train.max_steps <= 0:
    raise ValueError('set train.max_samples or train.max_steps to a positive budget')
  if not (math.isfinite(train.target) and 0 <= train.target <= 1):
    raise ValueError(f'train.target (an accuracy) must be in [0, 1] (0: none), got {train.target}')
  for key in ('eval_every', 'log_every'):
    if train[key] < 1:
      raise ValueError(f'train.{key} must be >= 1, got {train[key]}')
  for key, meaning in (('max_samples', 'none'), ('max_steps', 'none'), ('logits_chunk', 'whole'),
                       ('eval_first_samples', 'none'), ('eval_from_samples', 'never')):
    if train[key] < 0:
      raise ValueError(f'train.{key} must be >= 0 (0: {meaning}), got {train[key]}')
  if config.optimizer.max_bad_steps < 1:
    raise ValueError(f'optimizer.max_bad_steps must be >= 1, got {config.optimizer.max_bad_steps}')


def step_set(spec):
  """'3,5-7' -> {3, 5, 6, 7}: the format of debug.nan_steps."""
  steps = set()
  for part in filter(None, (p.strip() for p in spec.split(','))):
    first, dash, last = part.partition('-')
    last = last if dash else first
    if not (first.isdigit() and last.isdigit()) or int(first) > int(last):
      raise ValueError(f"bad step range {part!r} in {spec!r}; expected e.g. '3' or '3-9'")
    steps.update(range(int(first), int(last) + 1))
  return steps


def _check_auto_batch(config, device_count, process_count):
  """auto_batch's settings (rljax.auto_batch.state.check), then every batch the run may reach
  checked as a config of its own."""
  for P, at_P in auto_state.check(config).items():
    at_P.auto_batch.enabled = False
    try:
      check(at_P, device_count, process_count)
    except ValueError as error:
      raise ValueError(f'auto_batch at rollout.P={P}: {error}') from None


def check_lengths(prompt_len, max_new_tokens, model_cfg, vocab_size):
  """Raises ValueError when the task does not fit the model: context length and vocabulary (0:
  only the task's tokenizer file knows it; `check_vocabulary` once the tokenizer is built)."""
  if prompt_len + max_new_tokens > model_cfg.max_seq_len:
    raise ValueError(f'prompt ({prompt_len}) + response ({max_new_tokens}) = '
                     f'{prompt_len + max_new_tokens} tokens exceed the model context '
                     f'model.max_seq_len = {model_cfg.max_seq_len}')
  check_vocabulary(model_cfg, vocab_size)


def check_vocabulary(model_cfg, vocab_size):
  if model_cfg.vocab_size < vocab_size:
    raise ValueError(f'model.vocab_size ({model_cfg.vocab_size}) is smaller than the tokenizer\'s '
                     f'{vocab_size} ids')
