"""Resume at several points of each rollout schedule, through the public `loop.train` only, and
account for every prompt of the stream across the kills.

An uninterrupted run keeps a checkpoint of every step. For each point k, a copy of it loses the
checkpoints after k (what a kill after step k's checkpoint leaves: the rows logged after k are
dropped on resume) and is resumed. Each continuation must log the uninterrupted run's rows and
prompts.jsonl rows (the stream index of every prompt each step trained, and of every malformed
record skipped, with its reason) and end with its arrays (policy, optimizer, the pool of partial
rollouts, the batch drawn ahead), its position in the prompt stream and the prompts its schedule
still holds. In the uninterrupted run each record drawn is trained once, still held or skipped,
none twice. The plain schedule is killed at random moments in tests/test_reliability.py (which
compares prompts.jsonl too).
"""
import json
import os
import shutil

import pytest

import rljax_cli as cli
from configs import grpo as grpo_config
from rljax.rollout import partial as partial_lib
from rljax.train import loop
from test_auto_batch import tiny_auto
from test_train_math import gsm8k_config, TESTDATA

pytestmark = pytest.mark.e2e   # several short trainings each


def tiny(tmp_path, **rollout):
  """A random tiny policy on 1-digit addition, P=4 x G=4, 3 steps, a checkpoint each step."""
  config = grpo_config.get_config('runlocal,P=4,G=4')
  config.data.update(dir=str(tmp_path / 'data'), digits=1, num_train=200, num_test=20)
  config.warmstart.enabled = False
  config.metrics.update(tensorboard=False, progress=False)
  config.optimizer.decay = 'constant'
  config.rollout.update(rollout)
  config.train.update(max_samples=0, max_steps=3, eval_every=2, eval_size=8, micro_batch=8,
                      checkpoint_every=1, keep_checkpoints=10)
  return config


# name: (config, the points resumed from)
SCHEDULES = {
    'each_step': (tiny, (1, 2)),
    # 7 slots: after step 1 and after step 2 the pool holds groups begun but not finished
    'partial': (lambda tmp: tiny(tmp, slots=7, schedule='partial', max_new_tokens=8), (1, 2)),
    'drawn_ahead': (lambda tmp: tiny(tmp, schedule='drawn_ahead', devices=4, slots=6,
                                     max_new_tokens=8), (1, 2)),
    'auto_batch': (tiny_auto, (3, 7)),   # P 4 -> 8 at step 7: before, and right after the change
}


def stream(meta):
  """Where a run is in the prompt stream, the prompts its schedule holds and its running totals."""
  return {key: meta[key] for key in ('step', 'samples', 'tokens', 'data', 'prompt_ids')}


def held(meta):
  """The stream indices of the prompts the schedule holds (drawn, not trained yet)."""
  prompt_ids = meta['prompt_ids'] or []
  return list(prompt_ids.values()) if isinstance(prompt_ids, dict) else prompt_ids


def assert_each_prompt_accounted_once(workdir, meta):
  """Every record the run read (one process, first epoch) is trained once, held by the schedule
  or skipped, and no stream index appears twice."""
  rows = cli.prompt_rows(workdir)
  assert [row['step'] for row in rows if 'trained' in row] == list(range(1, meta['step'] + 1))
  indices = [index for row in rows for index in row.get('trained', []) + row.get('skipped', [])]
  indices += held(meta)
  assert len(set(indices)) == len(indices), indices
  data = meta['data']
  assert data['epoch'] == 0 and len(indices) == data['offset'] + data['index']


def resume_from_each(reference, points, make_config):
  """Resumes a copy of `reference` cut after each of `points` and checks it against it."""
  last = cli.last_step(reference)
  (ref_state, ref_meta), = [cli.checkpoints(reference)[0][last]]
  assert_each_prompt_accounted_once(reference, ref_meta)
  for point in points:
    resumed = reference.parent / f'from{point}'
    shutil.copytree(reference, resumed)
    for step in range(point + 1, last + 1):
      shutil.rmtree(resumed / 'checkpoints' / str(step))
    loop.train(make_config(), str(resumed))
    assert cli.rows(resumed) == cli.rows(reference), point
    assert cli.prompt_rows(resumed) == cli.prompt_rows(reference), point
    state, meta = cli.checkpoints(resumed)[0][last]
    assert stream(meta) == stream(ref_meta), point
    assert cli.same_arrays(state, ref_state), point


@pytest.mark.parametrize('name', sorted(SCHEDULES))
def test_resumed_at_any_point_the_run_trains_each_prompt_as_the_uninterrupted_one(tmp_path, name):
  make_config, points = SCHEDULES[name]
  reference = tmp_path / 'reference'
  loop.train(make_config(tmp_path), str(reference))
  if name == 'partial':   # the resume points hold prompts whose responses are under way
    saved = cli.checkpoints(reference)[0]
    for point in points:
      assert (saved[point][0]['rollout']['status_R'] >= partial_lib.DECODING).any(), point
  resume_from_each(reference, points, lambda: make_config(tmp_path))


def test_malformed_records_are_logged_as_skipped_with_their_reason_across_a_resume(tmp_path):
  with open(os.path.join(TESTDATA, 'gsm8k_sample.jsonl')) as f:
    records = [json.loads(line) for line in f][:24]
  for record in records[::3]:   # an empty question: the prompt iterator skips its record
    record['question'] = ''
  path = tmp_path / 'train.jsonl'
  path.write_text(''.join(json.dumps(record) + '\n' for record in records))

  def make_config():
    config = gsm8k_config(tmp_path / 'data')
    config.data.update(path=str(path), test_path=os.path.join(TESTDATA, 'gsm8k_sample.jsonl'),
                       chat_template=False)   # the template would make an empty prompt non-empty
    config.init.hf_path = os.path.join(TESTDATA, 'tiny_qwen3')
    config.train.update(checkpoint_every=1, keep_checkpoints=10)
    return config

  reference = tmp_path / 'reference'
  loop.train(make_config(), str(reference))
  skipped = [row for row in cli.prompt_rows(reference) if 'skipped' in row]
  assert skipped and all(row['reason'].startswith('ValueError("empty prompt \'\' or answer')
                         for row in skipped)
  assert all(records[index % 24]['question'] == '' for row in skipped for index in row['skipped'])
  resume_from_each(reference, (1,), make_config)
