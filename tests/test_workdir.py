"""rljax.train.workdir: one run per workdir, with real orbax checkpoints written by
rljax.train.checkpoint; a workdir written by an earlier rljax resumed by the CLI."""
import json
import os
import shutil

import jax.numpy as jnp
import ml_collections
import pytest

import rljax_cli as cli
from configs import grpo
from configs import ppo
from configs import rloo
from rljax.train import checkpoint
from rljax.train import metrics
from rljax.train import warmstart
from rljax.train import workdir as workdir_lib


def _config(**train):
  config = grpo.get_config('runlocal,P=4,G=4')
  config.train.update(train)
  return config


def _save_step(workdir, config, step):
  ckpt = checkpoint.Checkpointer(workdir, every=1, keep=2)
  state = {'params': {'w': jnp.arange(3.0) + step}, 'rng': jnp.asarray([0, step], jnp.uint32)}
  ckpt.save(step, state, dict(step=step, config=workdir_lib.config_json(config)))
  ckpt.close()
  return state


def test_differences_ignore_what_may_change_on_resume():
  saved = workdir_lib.config_json(_config())
  longer = _config(max_steps=50, log_every=1, checkpoint_every=7, overwrite=True)
  longer.data.dir, longer.mesh.data = '/elsewhere', 4
  assert workdir_lib.differences(saved, workdir_lib.config_json(longer)) == []
  other = _config(eval_every=3)
  other.rollout.G, other.seed = 8, 3
  assert workdir_lib.differences(saved, workdir_lib.config_json(other)) == [
      'rollout.G: 4 -> 8', 'seed: 0 -> 3', 'train.eval_every: 25 -> 3']


def _older(config):
  """A config as an rljax before INTRODUCED's fields wrote it: without those at the value that
  computes as before, and without the auto_batch section while it is off."""
  config = json.loads(json.dumps(config))
  for key, value in workdir_lib.INTRODUCED.items():
    *sections, name = key.split('.')
    parent = config
    for section in sections:
      parent = parent.get(section, {})
    if parent.get(name, '<absent>') == value:
      del parent[name]
  if not config['auto_batch'].get('enabled', False):   # (already dropped: its value was False)
    del config['auto_batch']
  if 'rank' not in config['model']['lora']:   # LoRA off (its rank dropped: its value was 0)
    del config['model']['lora']
  return config


def test_fields_added_since_a_workdir_was_written_are_unchanged_at_their_old_value():
  saved = _older(workdir_lib.config_json(_config()))
  assert 'devices' not in saved['rollout'] and 'auto_batch' not in saved
  assert workdir_lib.differences(saved, workdir_lib.config_json(_config())) == []
  assert workdir_lib.differences(workdir_lib.config_json(_config()), saved) == []   # and back
  split, on = _config(), _config()
  split.rollout.devices, on.auto_batch.enabled = 2, True
  assert workdir_lib.differences(saved, workdir_lib.config_json(split)) == [
      "rollout.devices: '<missing>' -> 2"]
  assert "auto_batch.enabled: '<missing>' -> True" in workdir_lib.differences(
      saved, workdir_lib.config_json(on))
  assert 'lora' not in saved['model']
  adapted = _config()
  adapted.model.lora.rank = 8
  assert "model.lora.rank: '<missing>' -> 8" in workdir_lib.differences(
      saved, workdir_lib.config_json(adapted))


def test_data_fields_added_since_warm_starts_were_cached_leave_their_fingerprint_at_default():
  """A warm start cached before the reasoning_gym fields existed is found by today's config."""
  config = _config()
  older = workdir_lib.config_json(config)
  for field in warmstart.LATER_DATA_FIELDS:
    del older['data'][field]
  older = ml_collections.ConfigDict(older)
  assert warmstart.fingerprint(older) == warmstart.fingerprint(config)
  config.data.render = 'compact'
  assert warmstart.fingerprint(older) != warmstart.fingerprint(config)


@pytest.mark.parametrize('module', [grpo, ppo, rloo])
def test_every_introduced_field_is_a_field_of_the_configs(module):
  fields = workdir_lib.flat(workdir_lib.config_json(module.get_config('runlocal')))
  algo = module.get_config('runlocal').algo
  others = {'grpo', 'ppo', 'rloo'} - {algo} | (set() if algo == 'ppo' else {'critic_optimizer'})
  assert {key for key in workdir_lib.INTRODUCED if key.split('.')[0] not in others} <= set(fields)


@pytest.mark.e2e   # the tiny CLI run of tests/rljax_cli.py
def test_a_workdir_of_an_earlier_rljax_resumes_identically(tiny, tmp_path):
  """The reference run cut back to step 6 as an rljax before manifests and today's newer config
  fields wrote it: no manifest, the config without those fields. Today's CLI resumes it with one
  warning line and ends exactly as the uninterrupted run; the steps it saves have manifests."""
  from test_reliability import differences_from_reference  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'run'
  shutil.copytree(tiny / 'reference', workdir)
  for step in ('7', '8'):
    shutil.rmtree(workdir / 'checkpoints' / step)
  shutil.rmtree(workdir / 'checkpoints' / '6' / 'manifest')
  meta = json.loads((workdir / 'checkpoints' / '6' / 'meta' / 'metadata').read_text())
  meta['config'] = _older(meta['config'])
  (workdir / 'checkpoints' / '6' / 'meta' / 'metadata').write_text(json.dumps(meta))
  (workdir / 'config.json').write_text(json.dumps(meta['config']))
  code, text = cli.run(tiny, workdir)
  assert code == 0 and 'Traceback' not in text, text[-3000:]
  assert [line for line in text.splitlines() if 'rljax: warning' in line] == [
      'rljax: warning: checkpoint step 6 has no manifest (saved by an rljax before manifests); '
      'restored unchecked; the checkpoints saved from now on have one'], text[-3000:]
  assert not differences_from_reference(tiny, workdir)
  assert os.path.isdir(workdir / 'checkpoints' / '8' / 'manifest')


def test_fresh_then_resume_then_refuse_then_overwrite(tmp_path):
  workdir = str(tmp_path / 'run')
  config = _config()
  assert workdir_lib.prepare(workdir, config) is None
  workdir_lib.claim(workdir, config)
  state = _save_step(workdir, config, 3)
  metrics.MetricsWriter(workdir).train(dict(step=3, samples=1, reward_mean=0.5, lr=1.0,
                                            grad_norm=1.0, samples_per_s=1.0), console=False)

  meta = workdir_lib.prepare(workdir, _config(max_steps=99))   # a longer budget resumes
  assert meta['step'] == 3
  restored, _ = checkpoint.Checkpointer(workdir, 1, 2).restore(state)
  assert (restored['params']['w'] == state['params']['w']).all()

  with pytest.raises(ValueError, match=r'holds another run, with a different config \(rollout.G: '
                     r'4 -> 8\).*--config.train.overwrite=True'):
    other = _config()
    other.rollout.G = 8
    workdir_lib.prepare(workdir, other)
  assert checkpoint.read_latest_meta(workdir)['step'] == 3   # refused: nothing touched

  other.train.overwrite = True
  assert workdir_lib.prepare(workdir, other) is None
  assert checkpoint.read_latest_meta(workdir) is None
  assert not metrics.read_jsonl(f'{workdir}/metrics.jsonl')


def test_run_killed_before_its_first_checkpoint_is_recognised(tmp_path):
  workdir = str(tmp_path / 'run')
  (tmp_path / 'run').mkdir()
  workdir_lib.claim(workdir, _config())
  assert workdir_lib.prepare(workdir, _config()) is None
  with pytest.raises(ValueError, match=r'train.eval_every: 25 -> 5'):
    workdir_lib.prepare(workdir, _config(eval_every=5))
  with open(f'{workdir}/config.json') as f:
    assert json.load(f)['train']['eval_every'] == 25


def test_a_file_is_not_a_workdir(tmp_path):
  (tmp_path / 'file').write_text('')
  with pytest.raises(ValueError, match='exists and is not a directory'):
    workdir_lib.prepare(str(tmp_path / 'file'), _config())


def test_record_or_check_refuses_any_changed_field(tmp_path):
  config = grpo.get_config('runlocal')
  workdir_lib.record_or_check(str(tmp_path / 'run'), config)
  workdir_lib.record_or_check(str(tmp_path / 'run'), config)   # the same config: fine
  config.train.max_samples = 1000   # a budget too: a driver's run is one experiment
  with pytest.raises(ValueError, match=r'was started with train.max_samples=250000, the config '
                     r'now says 1000 \(1 field\(s\) differ\)'):
    workdir_lib.record_or_check(str(tmp_path / 'run'), config)


def test_record_or_check_accepts_a_run_recorded_before_a_field_existed(tmp_path):
  """A protocol workdir written before grpo.policy_loss existed resumes while the config keeps
  the value that computes what rljax computed then, and is refused with any other."""
  run = str(tmp_path / 'run')
  config = grpo.get_config('runlocal')
  workdir_lib.record_or_check(run, config)
  recorded = workdir_lib.read_json(os.path.join(run, 'config.json'))
  del recorded['grpo']['policy_loss']
  workdir_lib.write_json_atomic(os.path.join(run, 'config.json'), recorded)
  workdir_lib.record_or_check(run, config)
  config.grpo.policy_loss = 'cispo'
  with pytest.raises(ValueError, match=r"was started with grpo.policy_loss='<missing>', the "
                     r"config now says 'cispo'"):
    workdir_lib.record_or_check(run, config)
