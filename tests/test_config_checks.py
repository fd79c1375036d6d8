"""Unit checks of rljax.config_checks helpers; the CLI-level table of bad inputs is in
tests/test_bad_input.py."""
import pytest

from configs import grpo
from rljax import config_checks


@pytest.mark.parametrize('mesh, devices, sizes', [
    (dict(data=-1, fsdp=1, expert=1, tensor=1), 8, dict(data=8, fsdp=1, expert=1, tensor=1)),
    (dict(data=2, fsdp=-1, expert=2, tensor=1), 8, dict(data=2, fsdp=2, expert=2, tensor=1)),
    (dict(data=1, fsdp=2, expert=2, tensor=2), 8, dict(data=1, fsdp=2, expert=2, tensor=2)),
])
def test_mesh_sizes(mesh, devices, sizes):
  assert config_checks.mesh_sizes(mesh, devices) == sizes


@pytest.mark.parametrize('mesh, devices, message', [
    (dict(data=3, fsdp=1, expert=1, tensor=1), 8, 'do not multiply to the 8 devices'),
    (dict(data=-1, fsdp=3, expert=1, tensor=1), 8, 'do not multiply to the 8 devices'),
    (dict(data=-1, fsdp=-1, expert=1, tensor=1), 8, 'only one mesh axis may be -1'),
    (dict(data=0, fsdp=1, expert=1, tensor=1), 8, 'mesh.data must be a positive size or -1'),
    (dict(data=-2, fsdp=1, expert=1, tensor=1), 8, 'mesh.data must be a positive size or -1'),
])
def test_bad_mesh(mesh, devices, message):
  with pytest.raises(ValueError, match=message):
    config_checks.mesh_sizes(mesh, devices)


def test_data_parallel_divisibility_on_eight_devices():
  config = grpo.get_config('runlocal,P=4,G=4')
  config.train.micro_batch = 8
  config_checks.check(config, device_count=8, process_count=1)   # 16 and 8 split 8 ways
  config.mesh.fsdp, config.mesh.data = 2, -1
  config_checks.check(config, device_count=8, process_count=1)
  config.train.micro_batch = 4
  with pytest.raises(ValueError, match=r'train.micro_batch \(4\) is not divisible by the '
                     r'data-parallel size data \* fsdp = 8'):
    config_checks.check(config, device_count=8, process_count=1)
  config.train.micro_batch, config.mesh.tensor, config.mesh.data = 4, 2, -1   # dp = 4
  config_checks.check(config, device_count=8, process_count=1)
  with pytest.raises(ValueError, match=r'rollout.P \(4\) is not divisible by the 8 processes'):
    config_checks.check(config, device_count=8, process_count=8)
  config.mesh.update(dict(data=1, fsdp=1, expert=8, tensor=1))
  with pytest.raises(ValueError, match=r'model.num_experts \(4\) is not divisible by mesh.expert'):
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
