"""rljax.protocol.mlperf: MLPerf Training v6.1's GRPO rules as functions of the batch (against the
compliance checker's formulas in numpy and its RCPs' hyperparameters), the `mlperf` and
`mlperf,runlocal` presets of configs/protocol.py building valid arms under them, and the closed
division refusing a broken rule in one line."""
import math

import numpy as np
import pytest

from configs import protocol as protocol_config
from rljax import main
from rljax.protocol import driver
from rljax.protocol import mlperf
from rljax.protocol import runs

MLPERF = mlperf.RULES['qwen35_397b_grpo']


@pytest.mark.parametrize('batch', [16, 64, 128, 256, 384, 512, 1000, 1024, 2048, 4096])
def test_the_rules_are_the_compliance_checkers_formulas(batch):
  """closed_qwen35_397b_grpo.yaml: lr 1.0e-6 * (B / 256) ** 0.5, clip 0.125 * (256 / B) ** 0.5,
  validation_start_samples = B * math.ceil(2.5 + 3840 / B)."""
  assert mlperf.lr_at(MLPERF, batch) == pytest.approx(1.0e-6 * (batch / 256)**0.5, rel=1e-12)
  assert mlperf.clip_at(MLPERF, batch) == pytest.approx(0.125 * (256 / batch)**0.5, rel=1e-12)
  assert mlperf.start_at(MLPERF, batch) == batch * int(np.ceil(2.5 + 3840 / batch))


def test_the_rcps_hyperparameters_and_convergence_points():
  """rcps_qwen35_397b_grpo.json: its lr and clip at 256/512/1024, and every reference run's samples
  to converge, which are the validation starts: each converged at its first validation."""
  np.testing.assert_allclose([mlperf.lr_at(MLPERF, b) for b in (256, 512, 1024)],
                             [1e-06, 1.4142135624e-06, 2e-06], rtol=1e-10)
  np.testing.assert_allclose([mlperf.clip_at(MLPERF, b) for b in (256, 512, 1024)],
                             [0.125, 0.08838834765, 0.0625], rtol=1e-10)
  assert [mlperf.start_at(MLPERF, b) for b in (256, 512, 1024)] == [4608, 5120, 7168]


@pytest.mark.parametrize('arg,batches', [('mlperf', (256, 512, 1024)),
                                         ('mlperf,runlocal', (32, 64, 128, 256))])
def test_the_presets_build_valid_arms_under_the_rules(arg, batches):
  config = protocol_config.get_config(arg)
  rules = mlperf.rules_of(config.protocol)
  arms = driver.arms(config, 'D')   # every arm passes the trainer's checks and the closed rules
  assert [a.batch for a in arms] == list(batches) and config.protocol.num_seeds == 6
  for arm in arms:
    spec, cfg = runs.arm_spec(arm), arm.config
    assert spec['lr'] == pytest.approx(rules.lr * math.sqrt(arm.batch / rules.batch), rel=1e-12)
    assert spec['clip'] == pytest.approx(0.125 * math.sqrt(256 / arm.batch), rel=1e-12)
    assert (cfg.rollout.G, cfg.train.eval_size, cfg.optimizer.decay, cfg.optimizer.warmup_steps,
            cfg.optimizer.b1, cfg.optimizer.b2) == (16, 256, 'constant', 0, 0.9, 0.999)
    assert cfg.train.eval_from_samples == arm.batch * math.ceil(
        2.5 + rules.start_samples / arm.batch)
    assert cfg.train.eval_every * arm.batch == config.protocol.eval_every_samples
    assert cfg.train.target == pytest.approx(rules.target + config.protocol.stop_margin)
  assert config.protocol.lr0 == rules.lr and config.protocol.targets == (rules.target,)


def test_a_protocol_without_the_rules_is_unchanged():
  config = protocol_config.get_config('runlocal')
  assert config.protocol.mlperf == '' and mlperf.validation_start(config.protocol, 256) == 0
  assert {a.config.train.eval_from_samples for a in driver.arms(config, 'D')} == {0}


@pytest.mark.parametrize('path,value,message', [
    ('arm.optimizer.b2', 0.99, r'arm P2 has optimizer.b2=0.99, the closed rule is 0.999'),
    ('arm.optimizer.warmup_steps', 10, r'has optimizer.warmup_steps=10, the closed rule is 0'),
    ('arm.optimizer.decay', 'linear', r"optimizer.decay='linear', the closed rule is 'constant'"),
    ('arm.rollout.G', 8, r'has rollout.G=8, the closed rule is 16'),
    ('arm.rollout.temperature', 0.7, r'has rollout.temperature=0.7'),
    ('arm.train.eval_size', 1000, r'has train.eval_size=1000, the closed rule is 256'),
    ('arm.train.num_minibatches', 2, r'has train.num_minibatches=2, the closed rule is 1'),
    ('arm.optimizer.max_grad_norm', 1.0, r'P2 clips at 1 at batch 32, the closed rule is 0\.35'),
    ('arm.optimizer.clip_rule', 'constant', r'arm P4 clips at 0\.353553 at batch 64'),
    ('protocol.lr0', 2e-5, r'P2 trains at lr 2e-05 at batch 32, the closed rule is 1\.25158e-05'),
    ('protocol.lr0', 0.0, r'protocol.lr0=0 \(an lr calibrated per run\)'),
    ('protocol.control', (4,), r'fixed-lr controls \(4,\)'),
    ('protocol.target', 0.5, r'protocol.target=0.5, the closed rule is 0.6'),
])
def test_the_closed_division_refuses_a_broken_rule_in_one_line(path, value, message):
  config = protocol_config.get_config('mlperf,runlocal')
  *parents, name = path.split('.')
  node = config
  for parent in parents:
    node = node[parent]
  node[name] = value
  with pytest.raises(ValueError, match=message) as error:
    driver.arms(config, 'D')
  assert '\n' not in str(error.value) and 'division=open' in str(error.value)
  config.protocol.division = 'open'   # the same run, marked open-division
  assert driver.arms(config, 'D')


def test_moving_the_base_says_which_lr0_the_rule_gives_it():
  config = protocol_config.get_config('mlperf')
  config.protocol.update(sweep=(32, 64), base=32)
  with pytest.raises(ValueError, match=r'protocol.lr0, the lr at the base batch 512, is '
                                       r'1\.41421e-06 by it'):
    driver.arms(config, 'D')
  config.protocol.lr0 = mlperf.lr_at(MLPERF, 512)
  assert [a.batch for a in driver.arms(config, 'D')] == [512, 1024]


@pytest.mark.parametrize('arg,message', [
    ('algo=ppo,mlperf', "config arg mlperf: MLPerf's RL benchmark is GRPO"),
    ('mlperf,quick', 'config arg mlperf'),
    ('mlperf,runlocal,shallow', 'config arg mlperf')])
def test_mlperf_takes_no_other_preset(arg, message):
  with pytest.raises(ValueError, match=message):
    protocol_config.get_config(arg)


@pytest.mark.parametrize('field,value,message', [
    ('mlperf', 'v5', r"protocol.mlperf 'v5' is not a rule set"),
    ('division', 'closd', r"protocol.division must be one of \('closed', 'open'\)")])
def test_bad_rule_settings_fail_clearly(field, value, message):
  config = protocol_config.get_config('mlperf,runlocal')
  config.protocol[field] = value
  with pytest.raises(ValueError, match=message):
    driver.arms(config, 'D')


def test_the_command_says_it_in_one_line_exit_2_and_writes_nothing(capsys, tmp_path):
  config = protocol_config.get_config('mlperf,runlocal')
  config.arm.optimizer.weight_decay = 0.01
  with pytest.raises(SystemExit) as stopped:
    main.run(config, str(tmp_path / 'D'))
  stderr = capsys.readouterr().err
  assert stopped.value.code == 2 and stderr.count('\n') == 1 and 'Traceback' not in stderr
  assert stderr.startswith("rljax: error: protocol.division='closed' (MLPerf qwen35_397b_grpo, "
                           "rules 'runlocal'): arm P2 has optimizer.weight_decay=0.01, the closed "
                           'rule is 0.0; pass --config.protocol.division=open')
  assert not (tmp_path / 'D').exists()
