"""rljax.train.upgrades: every format an earlier rljax wrote still resumes, and goes on as the
code that wrote it went on.

- Config records without the fields added since: unchanged at the fields' old values.
- A checkpoint without a manifest (and its config without the new fields): today's CLI resumes
  it to the uninterrupted run's rows, meta and state. A warm-start cache without one is reused.
- Checkpoints in the flat layout (one flat dict, answers as byte rows in the pool or the batch
  drawn ahead): tests/testdata/carry_before_slots/<schedule> holds, for each schedule, a tiny GRPO
  run written by rljax at ad19aea: its checkpoint after step 2 (every step with a KL reference
  policy; partial rollouts with responses in flight; a sampler on devices of its own with a batch
  drawn ahead) and, in expected.jsonl, the rows that code logged when it went on to step 3. Step 3
  is computed again here, by the CPU running the test: its floats are compared at
  tolerance.ACROSS_PROGRAMS (another CPU's kernels round differently), everything else exactly.
"""
import glob
import json
import os
import shutil

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
import rljax_cli
import tolerance
from test_schedules import tiny as tiny_config

from configs import grpo
from configs import ppo
from configs import rloo
from rljax import files
from rljax.train import loop as train
from rljax.train import run as run_lib
from rljax.train import schedules
from rljax.train import upgrades
from rljax.train import warmstart
from rljax.train import workdir as workdir_lib

OLD = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'testdata', 'carry_before_slots')


def _config(**train):
  config = grpo.get_config('runlocal,P=4,G=4')
  config.train.update(train)
  return config


def _older(config):
  """A config as an rljax before INTRODUCED's fields wrote it: without those at the value that
  computes as before, and without the auto_batch section while it is off."""
  config = json.loads(json.dumps(config))
  for key, value in upgrades.INTRODUCED.items():
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


@pytest.mark.parametrize('old, schedule', [(dict(partial=True), 'partial'),
                                           (dict(partial=False, devices=4), 'drawn_ahead'),
                                           (dict(devices=4), 'drawn_ahead'),
                                           (dict(partial=False), 'each_step')])
def test_a_record_that_chose_its_schedule_by_two_fields_reads_as_rollout_schedule(old, schedule):
  """Before rollout.schedule, rollout.partial and rollout.devices chose the schedule."""
  config = _config()
  config.rollout.update(schedule=schedule, devices=old.get('devices', 0))
  saved = workdir_lib.config_json(config)
  del saved['rollout']['schedule']
  saved['rollout'].update(old)
  assert workdir_lib.differences(saved, workdir_lib.config_json(config)) == []
  config.rollout.schedule = 'each_step' if schedule != 'each_step' else 'partial'
  assert workdir_lib.differences(saved, workdir_lib.config_json(config))[0].startswith(
      f"rollout.schedule: '{schedule}' -> ")


def test_data_fields_added_since_warm_starts_were_cached_leave_their_fingerprint_at_default():
  """A warm start cached before the reasoning_gym fields existed is found by today's config."""
  config = _config()
  older = workdir_lib.config_json(config)
  for field in upgrades.LATER_DATA_FIELDS:
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
  assert {key for key in upgrades.INTRODUCED if key.split('.')[0] not in others} <= set(fields)


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
  code, text = rljax_cli.run(tiny, workdir)
  assert code == 0 and 'Traceback' not in text, text[-3000:]
  assert [line for line in text.splitlines() if 'rljax: warning' in line] == [
      'rljax: warning: checkpoint step 6 has no manifest (saved by an rljax before manifests); '
      'restored unchecked; the checkpoints saved from now on have one'], text[-3000:]
  assert not differences_from_reference(tiny, workdir)
  assert os.path.isdir(workdir / 'checkpoints' / '8' / 'manifest')


@pytest.mark.e2e
def test_a_warm_start_cache_from_before_manifests_is_reused_and_saved_again(tiny, tmp_path):
  """The cache in the layout an earlier rljax wrote (params/ by orbax, then info.json): reused
  with one warning line, not trained again, the run identical to the reference, and the cache
  saved again in today's layout."""
  cache = tmp_path / 'warmstart'
  shutil.copytree(tiny / 'warmstart', cache)
  [path] = glob.glob(str(cache / 'warmstart-*'))
  (step, (params, info)), = rljax_cli.checkpoints(path)[0].items()
  shutil.rmtree(os.path.join(path, 'checkpoints'))
  ocp.StandardCheckpointer().save(os.path.join(path, 'params'), params)
  ocp.StandardCheckpointer().wait_until_finished()
  with open(os.path.join(path, 'info.json'), 'w') as f:
    json.dump(info, f)
  workdir = tmp_path / 'run'
  code, text = rljax_cli.run(tiny, workdir, f'--config.warmstart.dir={cache}')
  assert code == 0 and 'Traceback' not in text, text[-3000:]
  warnings = [line for line in text.splitlines() if 'rljax: warning' in line]
  assert len(warnings) == 1 and 'before checkpoint manifests' in warnings[0], warnings
  assert 'warm start step' not in text   # not trained again
  assert rljax_cli.rows(workdir) == rljax_cli.rows(tiny / 'reference')
  assert list(rljax_cli.checkpoints(path)[0]) == [step]


def rows(path):
  return [{k: v for k, v in row.items() if k not in rljax_cli.TIMING}
          for row in files.read_jsonl(path)]


# This fixture's rewards have no variance, so its gradient is the KL term's alone: ~1e-7, a
# cancellation of O(1) per-token terms whose rounding is relative to those terms, not to the result.
# Across two x86-64 CPUs these moved by up to 6e-4 of themselves, and noise_scale (a ratio over the
# difference of the two squared norms) by 4e-3: compared relatively at 10x that.
CANCELLED_RTOL = dict(grad_norm=6e-3, grad_sq_small=6e-3, grad_sq_big=6e-3, kl=6e-3,
                      noise_scale=4e-2)


def assert_same_rows(got, want):
  """Keys, counts and flags exactly; floats at ACROSS_PROGRAMS (tests/tolerance.py) or, where they
  are what a cancellation left, at CANCELLED_RTOL of themselves."""
  assert [sorted(r) for r in got] == [sorted(r) for r in want]
  for g, w in zip(got, want):
    for key, value in w.items():
      if isinstance(value, float):
        close = (dict(rtol=CANCELLED_RTOL[key], atol=0) if key in CANCELLED_RTOL
                 else tolerance.ACROSS_PROGRAMS)
        assert np.isclose(g[key], value, **close), (g['step'], key, g[key], value)
      else:
        assert g[key] == value and type(g[key]) is type(value), (g['step'], key)


@pytest.mark.parametrize('schedule, kind', [('each_step', schedules.EachStep),
                                            ('partial', schedules.Partial),
                                            ('drawn_ahead', schedules.DrawnAhead)])
def test_a_checkpoint_in_the_flat_layout_resumes_and_goes_on_as_before(tmp_path, schedule, kind):
  workdir = str(tmp_path / schedule)
  shutil.copytree(os.path.join(OLD, schedule), workdir)
  config = tiny_config(schedule, str(tmp_path / 'data'))
  run, carry, meta = run_lib.setup(config, workdir)
  run.ckpt.close()
  assert isinstance(run.schedule, kind) and meta['step'] == 2
  assert set(carry) == {'algo', 'rollout', 'rng', 'reference'}
  assert (carry['reference'] is not None) == (schedule == 'each_step')
  prompts = run_lib.make_iterator(config, run.task, None)   # the data from the start: batch k
  answers_K = [[str(answer) for answer in next(prompts)['answer']] for _ in range(3)]
  if schedule == 'partial':   # the groups in flight, their answers now on the host by serial
    serials = {int(s) for s in jax.device_get(carry['rollout'].serial_Q) if s >= 0}
    assert serials == set(range(8, 12)) and 'answer_QxW' not in carry['rollout']._fields
    assert run.schedule.answers == {str(8 + p): answer for p, answer in enumerate(answers_K[2])}
  if schedule == 'drawn_ahead':   # step 2 drew batch 2 ahead (step 1 drew batches 0 and 1)
    assert run.schedule.answers == answers_K[2] and 'answer_PxW' not in carry['rollout']
  config.train.max_steps = 3
  train.train(config, workdir)
  assert_same_rows(rows(f'{workdir}/metrics.jsonl'),
                   rows(os.path.join(OLD, schedule, 'expected.jsonl')))
  trained, = [row['trained'] for row in files.read_jsonl(f'{workdir}/prompts.jsonl')]
  # prompts the old checkpoint held have no stream index recorded: logged as null
  assert (None in trained) == (schedule != 'each_step') and len(trained) == 4
