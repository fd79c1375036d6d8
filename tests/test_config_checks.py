"""Unit checks of rljax.train.config_checks helpers; the CLI-level table of bad inputs is in
tests/test_bad_input.py."""
import pytest

from configs import grpo
from configs import ppo
from rljax import sharding
from rljax.train import config_checks


@pytest.mark.parametrize('mesh, devices, sizes', [
    (dict(data=-1, fsdp=1, expert=1, tensor=1), 8, dict(data=8, fsdp=1, expert=1, tensor=1)),
    (dict(data=2, fsdp=-1, expert=2, tensor=1), 8, dict(data=2, fsdp=2, expert=2, tensor=1)),
    (dict(data=1, fsdp=2, expert=2, tensor=2), 8, dict(data=1, fsdp=2, expert=2, tensor=2)),
])
def test_mesh_sizes(mesh, devices, sizes):
  assert sharding.mesh_shape(mesh, devices) == sizes


@pytest.mark.parametrize('mesh, devices, message', [
    (dict(data=3, fsdp=1, expert=1, tensor=1), 8, 'needs 3 devices, but 8 are available'),
    (dict(data=-1, fsdp=3, expert=1, tensor=1), 8, '8 devices are not divisible by 3'),
    (dict(data=-1, fsdp=-1, expert=1, tensor=1), 8, 'only one mesh axis may be -1'),
    (dict(data=0, fsdp=1, expert=1, tensor=1), 8, 'mesh.data must be a positive size or -1'),
    (dict(data=-2, fsdp=1, expert=1, tensor=1), 8, 'mesh.data must be a positive size or -1'),
])
def test_bad_mesh(mesh, devices, message):
  with pytest.raises(ValueError, match=message):
    sharding.mesh_shape(mesh, devices)


def test_data_parallel_divisibility_on_eight_devices():
  config = grpo.get_config('runlocal,P=4,G=4')
  config.train.micro_batch = 8
  config_checks.check(config, device_count=8, process_count=1)   # 16 and 8 split 8 ways
  config.mesh.fsdp, config.mesh.data = 2, -1
  config_checks.check(config, device_count=8, process_count=1)
  config.train.micro_batch = 4
  with pytest.raises(ValueError, match=r'train.micro_batch \(4\) is not divisible by the '
                     r'data-parallel size data \* fsdp \* expert = 8'):
    config_checks.check(config, device_count=8, process_count=1)
  config.train.micro_batch, config.mesh.tensor, config.mesh.data = 4, 2, -1   # dp = 4
  config_checks.check(config, device_count=8, process_count=1)
  with pytest.raises(ValueError, match=r'rollout.P \(4\) is not divisible by the 8 processes'):
    config_checks.check(config, device_count=8, process_count=8)
  config.mesh.update(dict(data=1, fsdp=1, expert=8, tensor=1))
  config.train.micro_batch = 8
  with pytest.raises(ValueError, match=r'model.num_experts \(4\) is not divisible by mesh.expert'):
    config_checks.check(config, device_count=8, process_count=1)


def test_the_expert_axis_splits_the_batch_too():
  """The batch is split over data x fsdp x expert (sharding.BATCH_AXES): a micro-batch that the
  expert axis does not divide is refused before anything is built."""
  config = grpo.get_config('runlocal,P=4,G=4')
  config.mesh.update(dict(data=2, fsdp=1, expert=4, tensor=1))
  config.train.micro_batch = 8
  config_checks.check(config, device_count=8, process_count=1)
  config.train.micro_batch = 4
  with pytest.raises(ValueError, match=r'train.micro_batch \(4\) is not divisible by the '
                     r'data-parallel size data \* fsdp \* expert = 8'):
    config_checks.check(config, device_count=8, process_count=1)


@pytest.mark.parametrize('spec, steps', [('', set()), ('3', {3}), ('3-5', {3, 4, 5}),
                                         ('1, 4-5,9', {1, 4, 5, 9})])
def test_step_set(spec, steps):
  assert config_checks.step_set(spec) == steps


@pytest.mark.parametrize('spec', ['x', '5-3', '3-', '-3', '1,,x'])
def test_bad_step_set(spec):
  with pytest.raises(ValueError, match='bad step range'):
    config_checks.step_set(spec)


def test_default_configs_pass():
  for arg in ('runlocal', 'P=1024,G=8'):
    config_checks.check(grpo.get_config(arg), device_count=8, process_count=1)


def _tiny():
  config = grpo.get_config('runlocal,P=4,G=4')
  config.train.micro_batch = 8
  return config


@pytest.mark.parametrize('field, value, message', [
    ('optimizer.lr', -1e-4, r'optimizer.lr must be a positive number, got -0.0001'),
    ('optimizer.lr', float('inf'), r'optimizer.lr must be a positive number, got inf'),
    ('optimizer.lr_rule', 'cubic', r"optimizer.lr_rule 'cubic' is unknown"),
    ('optimizer.max_bad_steps', 0, r'optimizer.max_bad_steps must be >= 1'),
    ('rollout.top_p', 1.5, r'rollout.top_p must be in \(0, 1\], got 1.5'),
    ('rollout.temperature', float('nan'), r'rollout.temperature must be a positive number'),
    ('rollout.top_k', -1, r'rollout.top_k and max_new_tokens must be >= 0'),
    ('data.on_bad_record', 'ignore', r"data.on_bad_record must be 'skip' or 'raise'"),
    ('train.max_steps', 0, r'set train.max_samples or train.max_steps to a positive budget'),
    ('train.log_every', 0, r'train.log_every must be >= 1'),
    ('train.eval_from_samples', -1, r'train.eval_from_samples must be >= 0 \(0: never\)'),
    ('train.eval_first_samples', -1, r'train.eval_first_samples must be >= 0 \(0: none\)'),
    ('optimizer.clip_rule', 'sqrt', r"optimizer.clip_rule 'sqrt' is unknown"),
    ('optimizer.max_grad_norm', -1.0, r'optimizer.max_grad_norm must be a number >= 0'),
    ('train.checkpoint_every', -1, r'train.checkpoint_every must be >= 0'),
    ('train.num_minibatches', 3, r'train.num_minibatches \(3\) must divide the batch P\*G = 16'),
    ('grpo.loss_agg', 'median', r"grpo.loss_agg 'median' is not one of"),
    ('grpo.off_policy', 'is', r"grpo.off_policy 'is' is not one of \('none', 'tis', 'mis'\)"),
    ('model.experts_per_token', 5,
     r'model.experts_per_token \(5\) must be in \[1, num_experts=4\]'),
    ('model.num_kv_heads', 3, r'model.num_heads \(4\) must be a multiple of num_kv_heads \(3\)'),
    ('debug.nan_steps', '9-3', r"bad step range '9-3'"),
    ('model.d_model', 0, r'model.d_model must be an integer >= 1, got 0'),
    ('model.num_layers', 0, r'model.num_layers must be an integer >= 1, got 0'),
    ('model.head_dim', -1, r'model.head_dim must be an integer >= 1, got -1'),
    ('model.num_kv_heads', 0, r'model.num_kv_heads must be an integer >= 1, got 0'),
    ('model.vocab_size', 0, r'model.vocab_size must be an integer >= 1, got 0'),
    ('model.expert_hidden', 0, r'model.expert_hidden must be an integer >= 1, got 0'),
    ('model.num_experts', -1, r'model.num_experts must be an integer >= 0, got -1'),
    ('model.rope_theta', 0.0, r'model.rope_theta must be a positive number, got 0.0'),
    ('model.norm_eps', -1e-6, r'model.norm_eps must be a positive number, got -1e-06'),
    ('model.init_std', float('nan'), r'model.init_std must be a positive number, got nan'),
    ('model.dtype', 'float8',
     r"model.dtype must be one of \['bfloat16', 'float32'\], got 'float8'"),
    ('model.param_dtype', 'int8', r"model.param_dtype must be one of \['bfloat16', 'float32'\]"),
    ('model.remat', 'some', r"model.remat must be one of \['dots', 'full', 'none'\], got 'some'"),
    ('warmstart.lr', 0.0, r'warmstart.lr must be a positive number, got 0.0'),
    ('warmstart.threshold', 2.0, r'warmstart.threshold \(an accuracy\) must be in \[0, 1\]'),
    ('warmstart.batch', 0, r'warmstart needs batch >= 1, eval_every >= 1 and 0 <= min_steps'),
    ('warmstart.min_steps', 10**6, r'warmstart needs .*; got 128, 25, 1000000, \d+'),
    ('warmstart.seed', -2, r"warmstart.seed must be >= 0, or -1 for the run's, got -2"),
    ('train.max_samples', -1, r'train.max_samples must be >= 0 \(0: none\), got -1'),
    ('train.target', 1.5, r'train.target \(an accuracy\) must be in \[0, 1\] \(0: none\), got 1.5'),
    ('train.target', -1.0, r'train.target \(an accuracy\) must be in \[0, 1\]'),
    ('train.logits_chunk', -1, r'train.logits_chunk must be >= 0 \(0: whole\), got -1'),
    ('optimizer.b1', 1.0, r"optimizer.b1 and b2 \(Adam's moment decays\) must be in \[0, 1\)"),
    ('optimizer.eps', -1e-8, r'optimizer.eps must be a number >= 0, got -1e-08'),
    ('optimizer.weight_decay', float('nan'), r'optimizer.weight_decay must be a number >= 0'),
    ('optimizer.warmup_steps', -1, r'optimizer.warmup_steps must be a number >= 0, got -1'),
    ('grpo.moe_aux_coef', -1.0, r'grpo.clip_low, clip_high, kl_coef and moe_aux_coef must be '),
    ('grpo.clip_low', float('nan'), r'grpo.clip_low, .* must be numbers >= 0, got nan, 0.2'),
])
def test_bad_field(field, value, message):
  config = _tiny()
  config.train.max_samples = 0   # the budget comes from max_steps alone
  config.train.max_steps = 8
  section, key = field.split('.')
  config[section][key] = value
  with pytest.raises(ValueError, match=message):
    config_checks.check(config, device_count=1, process_count=1)


def test_router_replay_needs_experts():
  config = _tiny()
  config.model.update(num_experts=0, router_replay=True)
  with pytest.raises(ValueError, match=r'model.router_replay needs a mixture of experts'):
    config_checks.check(config, device_count=1, process_count=1)
  config.model.num_experts = 4
  config_checks.check(config, device_count=1, process_count=1)


@pytest.mark.parametrize('mode, low, high, message', [
    ('tis', 0.5, 0.8, r"grpo.is_high \(the 'tis' cap\) must be >= 1, got 0.8"),
    ('mis', 1.2, 2.0, r"grpo.is_low and is_high \(the 'mis' band\) must satisfy 0 <= is_low <= 1"),
    ('mis', 0.5, float('nan'), r"the 'mis' band.*got 0.5 and nan"),
])
def test_bad_off_policy_bounds(mode, low, high, message):
  config = _tiny()
  config.grpo.update(off_policy=mode, is_low=low, is_high=high)
  with pytest.raises(ValueError, match=message):
    config_checks.check(config, device_count=1, process_count=1)
  config.grpo.update(is_low=0.5, is_high=2.0)
  config_checks.check(config, device_count=1, process_count=1)


@pytest.mark.parametrize('edit, message', [
    (dict(slots=0),
     r'the partial schedule needs rollout.slots >= 2 \(continuous batching\), got 0'),
    (dict(slots=8, max_staleness=-1), r'rollout.max_staleness must be an integer >= 0, got -1'),
])
def test_bad_partial_rollouts(edit, message):
  config = _tiny()
  config.rollout.update(schedule='partial', **edit)
  with pytest.raises(ValueError, match=message):
    config_checks.check(config, device_count=1, process_count=1)
  config.rollout.update(slots=8, max_staleness=2)
  config_checks.check(config, device_count=1, process_count=1)
  config.auto_batch.enabled = True
  with pytest.raises(ValueError, match=r'the partial schedule needs a fixed batch'):
    config_checks.check(config, device_count=1, process_count=1)


def test_partial_rollouts_refuse_ppo():
  config = ppo.get_config('runlocal,B=8')
  config.rollout.update(schedule='partial', slots=8)
  with pytest.raises(ValueError, match=r'the partial schedule trains whole groups of G responses'):
    config_checks.check(config, device_count=1, process_count=1)


@pytest.mark.parametrize('edit, processes, message', [
    (dict(devices=8), 1, r"the drawn_ahead schedule needs rollout.devices, the sampler's devices, "
                         r'an integer in \[1, 8\), got 8'),
    (dict(devices=0), 1, r'the drawn_ahead schedule needs rollout.devices, .* got 0'),
    (dict(devices=-2), 1, r'an integer in \[1, 8\), got -2'),
    (dict(devices=4, schedule='partial', slots=8), 1,
     r"rollout.devices \(4\) gives the drawn_ahead schedule's sampler its devices; set "
     r'rollout.schedule=drawn_ahead or rollout.devices=0'),
    (dict(devices=4, schedule='each_step'), 1, r"rollout.devices \(4\) gives the drawn_ahead"),
    (dict(schedule='drawn'), 1, r"rollout.schedule must be one of \['drawn_ahead', 'each_step', "
                                r"'partial'\], got 'drawn'"),
    (dict(devices=3), 2, r'rollout.devices \(3\) must split evenly over the 2 processes'),
    (dict(devices=6), 1, r"P\*G \(16\) is not divisible by the sampler mesh's data-parallel "
                         r'size 6'),
])
def test_bad_sampler_devices(edit, processes, message):
  config = _tiny()   # P x G = 16, micro-batches of 8, on 8 devices: 4 train and 4 sample
  config.rollout.update({'schedule': 'drawn_ahead', **edit})
  with pytest.raises(ValueError, match=message):
    config_checks.check(config, device_count=8, process_count=processes)
  config.rollout.update(schedule='drawn_ahead', devices=4)
  config_checks.check(config, device_count=8, process_count=1)
  config.auto_batch.enabled = True
  with pytest.raises(ValueError, match=r'the drawn_ahead schedule needs a fixed batch'):
    config_checks.check(config, device_count=8, process_count=1)


def test_lengths_and_vocabulary():
  model = grpo.get_config('runlocal').model
  config_checks.check_lengths(8, 5, model, 16)
  model.max_seq_len = 12
  with pytest.raises(ValueError, match=r'prompt \(8\) \+ response \(5\) = 13 tokens exceed'):
    config_checks.check_lengths(8, 5, model, 16)
  with pytest.raises(ValueError,
                     match=r"model.vocab_size \(16\) is smaller than the tokenizer's 17"):
    config_checks.check_lengths(4, 5, model, 17)


@pytest.mark.parametrize('arg, message', [
    ('P', r"config arg 'P' needs a value \(P=\.\.\.\)"),
    ('runlocal=perhaps', r"config arg runlocal='perhaps': expected a boolean"),
    ('seed=1.5', r"config arg seed='1.5': expected an integer"),
])
def test_bad_config_arg(arg, message):
  with pytest.raises(ValueError, match=message):
    grpo.get_config(arg)


@pytest.mark.parametrize('edit, message', [
    (dict(tools=dict(timeout_s=0.0)),
     r'tools.timeout_s must be a number in \[0.01, 3600\], got 0.0'),
    (dict(tools=dict(timeout_s=float('inf'))), r'tools.timeout_s must be a number in .*, got inf'),
    (dict(tools=dict(timeout_s=float('nan'))), r'tools.timeout_s must be a number in .*, got nan'),
    (dict(tools=dict(timeout_s=9.3e9)),
     r'tools.timeout_s must be a number in .*, got 9300000000.0'),
    (dict(tools=dict(timeout_s=1e-9)), r'tools.timeout_s must be a number in .*, got 1e-09'),
    (dict(tools=dict(max_calls=0)), r'tools.max_calls must be an integer in \[1, 1024\], got 0'),
    (dict(tools=dict(workers=0)), r'tools.workers must be an integer in \[1, 64\], got 0'),
    (dict(tools=dict(workers=65)), r'tools.workers must be an integer in \[1, 64\], got 65'),
    (dict(tools=dict(memory_mb=8)),
     r'tools.memory_mb must be an integer in \[16, 1048576\], got 8'),
    (dict(model=dict(vocab_size=32)), r"model.vocab_size \(32\) must equal the tool_sums "
                                      r"tokenizer's 23 ids"),
    (dict(rollout=dict(schedule='partial', slots=8)),
     r'rollout.schedule=partial does not run tool turns; use rollout.schedule=each_step for the '
     r'tool_sums task'),
    (dict(rollout=dict(schedule='drawn_ahead', devices=4)),
     r'rollout.schedule=drawn_ahead does not run tool turns'),
])
def test_bad_tool_settings(edit, message):
  config = grpo.get_config('runlocal,P=4,G=4,task=tools')
  config.train.micro_batch = 8
  config_checks.check(config, device_count=8, process_count=1)
  for section, fields in edit.items():
    config[section].update(fields)
  with pytest.raises(ValueError, match=message):
    config_checks.check(config, device_count=8, process_count=1)


def test_tool_tasks_take_ppo_and_several_processes():
  config_checks.check(ppo.get_config('runlocal,B=64,task=tools'), device_count=1, process_count=1)
  config = grpo.get_config('runlocal,P=4,G=4,task=tools')
  config.train.micro_batch = 8
  config_checks.check(config, device_count=2, process_count=2)   # tests/test_multihost.py runs it


@pytest.mark.parametrize('field, value, message', [
    ('mode', 'bogus', r"mode must be 'train' \(one run\) or 'protocol', got 'bogus'"),
    ('seed', -1, r'seed must be >= 0, got -1'),
])
def test_bad_top_level_field(field, value, message):
  config = _tiny()
  config[field] = value
  with pytest.raises(ValueError, match=message):
    config_checks.check(config, device_count=1, process_count=1)
