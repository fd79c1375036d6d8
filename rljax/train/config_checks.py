"""Validation of a whole config before anything is built or compiled: one clear message per
problem (raised as ValueError; the main turns it into a non-zero exit)."""
import math
import os

import jax

from rljax import algos
from rljax.data import rewards
from rljax.model import moe
from rljax import optim
from rljax import sharding
from rljax import tasks
from rljax.train import auto_batch
from rljax.train import schedules


def _positive(name, value):
  if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
    raise ValueError(f'{name} must be a positive number, got {value!r}')


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


def check(config, device_count=None, process_count=None):
  """Raises ValueError naming the first bad field of `config`."""
  rollout, train, opt = config.rollout, config.train, config.optimizer
  algo = algos.get(config.algo)
  if rollout.P < 1:
    raise ValueError(f'rollout.P (PPO: B) must be >= 1, got {rollout.P}')
  batch = algos.batch_size(config)
  algo.check(config)
  _positive('optimizer.lr', opt.lr)
  _positive('optimizer.base_batch', opt.base_batch)
  optim.scaled_lr(opt.lr, batch, opt.base_batch, opt.lr_rule)  # raises on a bad rule
  if opt.max_bad_steps < 1:
    raise ValueError(f'optimizer.max_bad_steps must be >= 1, got {opt.max_bad_steps}')
  algos.check_decay('optimizer', opt, config, batch)
  _positive('rollout.temperature', rollout.temperature)
  if not 0 < rollout.top_p <= 1:
    raise ValueError(f'rollout.top_p must be in (0, 1], got {rollout.top_p}')
  if rollout.slots < 0:
    raise ValueError(f'rollout.slots must be >= 0 (0: static batching), got {rollout.slots}')
  schedules.check(config, jax.device_count() if device_count is None else device_count,
                  jax.process_count() if process_count is None else process_count)
  if rollout.top_k < 0 or rollout.max_new_tokens < 0:
    raise ValueError(f'rollout.top_k and max_new_tokens must be >= 0 (0: off / from the task), got '
                     f'{rollout.top_k} and {rollout.max_new_tokens}')
  if train.num_minibatches < 1 or batch % train.num_minibatches:
    raise ValueError(f'train.num_minibatches ({train.num_minibatches}) must divide the batch '
                     f'P*G = {batch}')
  minibatch = batch // train.num_minibatches
  if train.micro_batch and (train.micro_batch < 1 or minibatch % train.micro_batch):
    raise ValueError(f'train.micro_batch ({train.micro_batch}) must divide the minibatch of '
                     f'{minibatch} responses')
  if train.max_samples <= 0 and train.max_steps <= 0:
    raise ValueError('set train.max_samples or train.max_steps to a positive budget')
  for key in ('num_epochs', 'eval_every', 'log_every', 'keep_checkpoints'):
    if train[key] < 1:
      raise ValueError(f'train.{key} must be >= 1, got {train[key]}')
  if train.checkpoint_every < 0:
    raise ValueError(f'train.checkpoint_every must be >= 0 (0: only at the end), got '
                     f'{train.checkpoint_every}')
  _check_data(config)
  _check_tools(config, jax.process_count() if process_count is None else process_count)
  if config.model.moe_impl not in moe.EXPERT_IMPLS:
    raise ValueError(f'model.moe_impl must be one of {sorted(moe.EXPERT_IMPLS)}, got '
                     f'{config.model.moe_impl!r}')
  model = config.model
  if model.num_experts and not 0 < model.experts_per_token <= model.num_experts:
    raise ValueError(f'model.experts_per_token ({config.model.experts_per_token}) must be in '
                     f'[1, num_experts={config.model.num_experts}]')
  if config.model.num_heads % config.model.num_kv_heads:
    raise ValueError(f'model.num_heads ({config.model.num_heads}) must be a multiple of '
                     f'num_kv_heads ({config.model.num_kv_heads})')
  if 'mesh' in config:
    _check_mesh(config, batch, minibatch,
                (jax.device_count() if device_count is None else device_count)
                - rollout.devices,
                jax.process_count() if process_count is None else process_count)
  if 'debug' in config:
    step_set(config.debug.nan_steps)
  if config.auto_batch.enabled:
    _check_auto_batch(config, device_count, process_count)


def _check_auto_batch(config, device_count, process_count):
  """The bounds, the settings, and every batch the run may reach checked as a config of its own."""
  auto, arg = config.auto_batch, algos.get(config.algo).BATCH_ARG
  unit = f'auto_batch bounds are in rollout.P ({arg} of {config.algo})'
  if not (auto_batch.is_power_of_two(auto.min) and auto_batch.is_power_of_two(auto.max)):
    raise ValueError(f'auto_batch.min ({auto.min}) and max ({auto.max}) must be powers of two; '
                     f'{unit}')
  if auto.min > auto.max:
    raise ValueError(f'auto_batch.min ({auto.min}) is larger than auto_batch.max ({auto.max})')
  if config.rollout.P not in auto_batch.allowed_batches(auto.min, auto.max):
    raise ValueError(f'rollout.P ({config.rollout.P}) must be a power of two in [auto_batch.min, '
                     f'auto_batch.max] = [{auto.min}, {auto.max}]: the batch auto_batch starts at')
  if auto.every_samples < 1 or auto.probe_steps < 2 or auto.window < 2 or not auto.margin >= 0:
    raise ValueError(f'auto_batch needs every_samples >= 1, probe_steps >= 2, window >= 2 and '
                     f'margin >= 0; got {auto.every_samples}, {auto.probe_steps}, {auto.window}, '
                     f'{auto.margin}')
  if auto.throughput_file and not os.path.isfile(auto.throughput_file):
    raise ValueError(f'auto_batch.throughput_file {auto.throughput_file} is not a file')
  for section in ('optimizer', 'critic_optimizer'):
    if section in config and config[section].decay != 'constant':
      raise ValueError(f"auto_batch needs {section}.decay='constant' (a decay's horizon is in "
                       f'updates, which a changing batch moves), got {config[section].decay!r}')
  for P in auto_batch.allowed_batches(auto.min, auto.max):
    _check_batch(algos.with_batch(config, P), P, device_count, process_count)


def _check_batch(config, P, device_count, process_count):
  """One batch auto_batch may choose: the whole config check at it, and two micro-batches."""
  config.auto_batch.enabled = False
  try:
    check(config, device_count, process_count)
  except ValueError as error:
    raise ValueError(f'auto_batch at rollout.P={P}: {error}') from None
  if algos.micro_batches(config) < 2:
    raise ValueError(f'auto_batch at rollout.P={P}: the noise scale needs 2 micro-batches per '
                     f'minibatch; set train.micro_batch below {algos.batch_size(config)} '
                     f'/ num_minibatches')


def _check_data(config):
  data, train = config.data, config.train
  if data.on_bad_record not in ('skip', 'raise'):
    raise ValueError(f"data.on_bad_record must be 'skip' or 'raise', got {data.on_bad_record!r}")
  if data.num_train < config.rollout.P:
    raise ValueError(f'data.num_train ({data.num_train}) is smaller than one batch of '
                     f'P = {config.rollout.P} prompts')
  if not 1 <= train.eval_size <= data.num_test:
    raise ValueError(f'train.eval_size ({train.eval_size}) must be in [1, data.num_test = '
                     f'{data.num_test}]')
  if data.dir and os.path.exists(data.dir) and not os.path.isdir(data.dir):
    raise ValueError(f'data.dir {data.dir} exists and is not a directory')
  if config.reward != 'auto':   # 'auto': the task's own verifier (rljax.tasks)
    rewards.get_reward_fn(config.reward)  # raises on an unknown verifier


def _check_tools(config, process_count):
  """A task whose responses call a tool: its settings, and an algorithm and a rollout schedule
  that run its turns (rljax.rollout.turns)."""
  if not hasattr(tasks.get(tasks.name_of(config)), 'tool'):
    return
  tools, rollout = config.tools, config.rollout
  _positive('tools.timeout_s', tools.timeout_s)
  if not (isinstance(tools.max_calls, int) and tools.max_calls >= 1):
    raise ValueError(f'tools.max_calls must be an integer >= 1, got {tools.max_calls!r}')
  if algos.get(config.algo).BATCH_ARG != 'P':
    raise ValueError(f'a tool task trains grpo or rloo, not {config.algo}: its value targets would '
                     'take a tool\'s result for the end of the response')
  for field, value in (('partial', rollout.partial), ('devices', rollout.devices)):
    if value:
      raise ValueError(f'rollout.{field} does not run tool turns; turn it off for the '
                       f'{tasks.name_of(config)} task')
  if process_count > 1:
    raise ValueError('tool turns run in one process (the host serves every call)')


def _check_mesh(config, batch, minibatch, device_count, process_count):
  sizes = sharding.mesh_shape(config.mesh, device_count)
  data_parallel = math.prod(sizes[axis] for axis in sharding.BATCH_AXES)
  units = [('the batch P*G', batch), ('the minibatch', minibatch)]
  if config.train.micro_batch:
    units.append(('train.micro_batch', config.train.micro_batch))
  for name, size in units:
    if size % data_parallel:
      raise ValueError(f'{name} ({size}) is not divisible by the data-parallel size '
                       f'{" * ".join(sharding.BATCH_AXES)} = {data_parallel} (mesh {sizes})')
  if config.rollout.P % process_count:
    raise ValueError(f'rollout.P ({config.rollout.P}) is not divisible by the {process_count} '
                     'processes (each reads its own slice of the prompts)')
  if config.model.num_experts and config.model.num_experts % sizes['expert']:
    raise ValueError(f'model.num_experts ({config.model.num_experts}) is not divisible by '
                     f'mesh.expert = {sizes["expert"]}')


def check_lengths(prompt_len, max_new_tokens, model_cfg, vocab_size):
  """Raises ValueError when the task does not fit the model: context length and vocabulary."""
  if prompt_len + max_new_tokens > model_cfg.max_seq_len:
    raise ValueError(f'prompt ({prompt_len}) + response ({max_new_tokens}) = '
                     f'{prompt_len + max_new_tokens} tokens exceed the model context '
                     f'model.max_seq_len = {model_cfg.max_seq_len}')
  if model_cfg.vocab_size < vocab_size:
    raise ValueError(f'model.vocab_size ({model_cfg.vocab_size}) is smaller than the tokenizer\'s '
                     f'{vocab_size} ids')
