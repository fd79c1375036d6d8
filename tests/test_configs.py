"""configs/common.parse_arg, configs/grpo.get_config and rljax.train.config_checks.check."""

import pytest

from configs import common
from configs import grpo
from configs import rloo
from rljax import losses
from rljax.model import lora
from rljax.train import config_checks

DEFAULTS = dict(P=16, lr=1e-3, runlocal=False, name='base')


def test_parse_types_come_from_defaults():
  arg = common.parse_arg('P=1024,lr=3e-4,runlocal=true,name=big', **DEFAULTS)
  assert arg.P == 1024 and type(arg.P) is int
  assert arg.lr == 3e-4 and type(arg.lr) is float
  assert arg.runlocal is True
  assert arg.name == 'big' and type(arg.name) is str


def test_parse_int_into_float_field_and_bool_spellings():
  assert type(common.parse_arg('lr=2', **DEFAULTS).lr) is float
  for text, value in [('true', True), ('True', True), ('1', True), ('yes', True),
                      ('false', False), ('0', False), ('no', False)]:
    assert common.parse_arg(f'runlocal={text}', **DEFAULTS).runlocal is value, text


def test_parse_bare_key_is_true_and_defaults_stay():
  arg = common.parse_arg('runlocal', **DEFAULTS)
  assert arg.runlocal is True
  assert (arg.P, arg.lr, arg.name) == (16, 1e-3, 'base')
  for empty in (None, '', ' , '):
    assert common.parse_arg(empty, **DEFAULTS).to_dict() == DEFAULTS


def test_parse_whitespace_is_ignored():
  arg = common.parse_arg(' P = 8 , runlocal ', **DEFAULTS)
  assert arg.P == 8 and arg.runlocal is True


@pytest.mark.parametrize('text,key', [
    ('Q=3', 'Q'),                 # unknown key
    ('P=16,batchsize=4', 'batchsize'),
    ('P=abc', 'P'),               # bad int
    ('P=2.5', 'P'),               # a float is not an int
    ('lr=fast', 'lr'),            # bad float
    ('runlocal=maybe', 'runlocal'),
    ('P', 'P'),                   # a bare key is only for booleans
    ('name', 'name'),
])
def test_parse_errors_name_the_key(text, key):
  with pytest.raises(ValueError, match=key):
    common.parse_arg(text, **DEFAULTS)


def test_grpo_get_config_args():
  config = grpo.get_config('P=1024,runlocal')
  assert config.rollout.P == 1024 and config.rollout.G == 8
  assert config.algo == 'grpo'
  assert config.model.d_model < grpo.get_config().model.d_model   # runlocal: the tiny preset
  assert grpo.get_config('G=4,seed=3').rollout.G == 4 and grpo.get_config('seed=3').seed == 3
  with pytest.raises(ValueError, match='PP'):
    grpo.get_config('PP=3')


def test_check_accepts_good_configs():
  config_checks.check(grpo.get_config('runlocal'))
  config_checks.check(grpo.get_config('P=1024,G=8'))   # the docstring's full-size example
  config_checks.check(grpo.get_config('runlocal,task=sums'))   # docs/guide/rollouts.md's run
  for dataset in common.RG_RUNLOCAL:   # docs/guide/environments.md's runs
    config_checks.check(grpo.get_config(f'runlocal,task=rg:{dataset}'))
  with pytest.raises(ValueError, match=r"config arg task='rg': expected 'arithmetic', 'sums', "
                                       r"'tools' or 'rg:<a reasoning-gym dataset>'"):
    grpo.get_config('task=rg')


@pytest.mark.parametrize('loss', ['gspo', 'cispo'])
def test_a_policy_loss_arg_sets_its_published_settings(loss):
  config = grpo.get_config(f'runlocal,loss={loss}')
  config_checks.check(config)
  assert config.grpo.policy_loss == loss
  assert config.grpo.clip_high == (4e-4 if loss == 'gspo' else 5.0)
  assert config.grpo.off_policy == ('tis' if loss == 'gspo' else 'none')   # GSPO: pi_old recomputed
  config_checks.check(rloo.get_config(f'runlocal,loss={loss}'))
  with pytest.raises(ValueError, match=r"config arg loss='dapo': expected one of \('clip', 'gspo'"):
    grpo.get_config('loss=dapo')
  assert tuple(common.POLICY_LOSS_SETTINGS) == losses.POLICY_LOSSES   # one list of kinds


def test_the_default_lora_targets_are_every_target_the_model_adapts():
  assert common.LORA_TARGETS == tuple(lora.TARGETS)
  config = grpo.get_config('runlocal,lora=4')
  full = grpo.get_config('runlocal')
  assert (config.model.lora.rank, config.optimizer.lr) == (4, 10 * full.optimizer.lr)
  config_checks.check(config)


def test_check_accepts_full_size_defaults():
  config_checks.check(grpo.get_config())


def _broken(edit):
  config = grpo.get_config('runlocal')   # P=16, G=8: batch 128, micro_batch 64
  edit(config)
  return config


@pytest.mark.parametrize('edit,match', [
    (lambda c: setattr(c.rollout, 'G', 1), 'G'),
    (lambda c: setattr(c.rollout, 'G', 0), 'G'),
    (lambda c: setattr(c.optimizer, 'lr', 0.0), 'lr'),
    (lambda c: setattr(c.optimizer, 'lr', -1e-4), 'lr'),
    (lambda c: setattr(c.optimizer, 'lr_rule', 'cube'), 'lr_rule'),
    (lambda c: setattr(c.train, 'micro_batch', 48), 'micro_batch'),     # 128 % 48 != 0
    (lambda c: setattr(c.train, 'micro_batch', 256), 'micro_batch'),    # bigger than the batch
    (lambda c: setattr(c.train, 'num_minibatches', 3), 'num_minibatches'),
    (lambda c: setattr(c.grpo, 'loss_agg', 'token-sum'), 'loss_agg'),
    (lambda c: setattr(c.grpo, 'kl_estimator', 'k4'), 'kl_estimator'),
    (lambda c: setattr(c.rollout, 'temperature', 0.0), 'temperature'),
    (lambda c: setattr(c.rollout, 'top_p', 1.5), 'top_p'),
    (lambda c: setattr(c.optimizer, 'decay', 'step'), 'optimizer.decay must be one of'),
    (lambda c: (c.optimizer.update(decay='linear'), c.grpo.update(filter_zero_variance=True)),
     'set train.max_steps'),
    # runlocal plans 1954 updates:
    (lambda c: c.optimizer.update(decay='cosine', warmup_steps=2000), 'warmup_steps'),
])
def test_check_rejects(edit, match):
  with pytest.raises(ValueError, match=match):
    config_checks.check(_broken(edit))


def test_check_micro_batch_must_divide_the_minibatch():
  config = _broken(lambda c: (setattr(c.train, 'num_minibatches', 2),
                              setattr(c.train, 'micro_batch', 64)))
  config_checks.check(config)                       # minibatch 64, micro-batch 64: fine
  config.train.micro_batch = 128
  with pytest.raises(ValueError, match='micro_batch'):
    config_checks.check(config)
