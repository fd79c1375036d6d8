"""rljax.train.workdir: one run per workdir, with real orbax checkpoints written by
rljax.train.checkpoint (a workdir written by an earlier rljax: tests/test_upgrades.py)."""
import json
import os

import jax.numpy as jnp
import pytest

from configs import grpo
from rljax import files
from rljax.train import checkpoint
from rljax.train import metrics
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
  assert not files.read_jsonl(f'{workdir}/metrics.jsonl')


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
  recorded = files.read_json(os.path.join(run, 'config.json'))
  del recorded['grpo']['policy_loss']
  files.write_json_atomic(os.path.join(run, 'config.json'), recorded)
  workdir_lib.record_or_check(run, config)
  config.grpo.policy_loss = 'cispo'
  with pytest.raises(ValueError, match=r"was started with grpo.policy_loss='<missing>', the "
                     r"config now says 'cispo'"):
    workdir_lib.record_or_check(run, config)
