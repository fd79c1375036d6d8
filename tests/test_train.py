"""rljax.train.loop in-process: one rl_step, a short loop and its resume, and the row it
logs (the loop also runs end to end as a command in test_reliability.py, test_ppo_e2e.py and
test_train_math.py)."""
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rljax_cli

from configs import grpo as grpo_config
from configs import rloo as rloo_config
from rljax.data import rewards
from rljax import files
from rljax.rollout import sampler
from rljax import sharding
from rljax.train import evaluation
from rljax.train import loop as train
from rljax.train import run as run_lib
from rljax.train import schedules

# The training row's contract (metrics.jsonl, read by other tools).
CONTRACT = ('step', 'samples', 'tokens', 'reward_mean', 'lr', 'grad_norm', 'step_time_s',
            'rollout_time_s', 'update_time_s')


def tiny(config_file, tmp_path, **train_overrides):
  """A random tiny policy on 1-digit addition, P=4 x G=4, no warm start: seconds per step."""
  config = config_file.get_config('runlocal,P=4,G=4')
  config.data.update(dir=str(tmp_path / 'data'), digits=1, num_train=200, num_test=20)
  config.warmstart.enabled = False
  config.metrics.update(tensorboard=False, progress=False)
  config.train.update(dict(dict(max_samples=0, max_steps=2, eval_every=2, eval_size=8,
                                micro_batch=8, checkpoint_every=1), **train_overrides))
  return config


def test_rl_step_samples_scores_and_updates(tmp_path):
  config = tiny(grpo_config, tmp_path)
  run, carry, meta = run_lib.setup(config, str(tmp_path / "run"))
  assert meta['step'] == 0 and set(carry) == {'algo', 'rollout', 'rng', 'reference'}
  assert set(carry['algo']) == {'params', 'opt_state'}
  assert carry['rollout'] is None and carry['reference'] is None   # every step; no KL
  before = jax.tree.map(np.asarray, carry['algo']['params'])
  carry, row = train.rl_step(run, carry, [next(run.iterator)], 1)
  assert row['step'] == 1 and row['retained'] == 16 and row['skipped_updates'] == 0
  assert set(CONTRACT) - {'samples', 'tokens'} <= set(row)   # the loop adds the running totals
  assert 1 <= row['tokens_step'] <= 16 * 3 and np.isfinite(row['grad_norm'])
  assert row['b_small'] == 8 and row['b_big'] == 16   # two micro-batches: noise-scale terms
  assert 0 < row['slot_utilization'] <= 1 and 1 <= row['decode_steps'] <= 3
  moved = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - b).max(), carry['algo']['params'],
                       before)
  assert max(jax.tree.leaves(moved)) > 0
  run.ckpt.close()


@pytest.mark.e2e
def test_train_logs_running_totals_and_resumes_where_it_stopped(tmp_path):
  """With the third algorithm, RLOO (GRPO's loop runs end to end in test_reliability.py)."""
  workdir = str(tmp_path / 'run')
  train.train(tiny(rloo_config, tmp_path), workdir)
  train.train(tiny(rloo_config, tmp_path, max_steps=3), workdir)   # resumes at step 2
  rows = files.read_jsonl(f'{workdir}/metrics.jsonl')
  steps = [r for r in rows if not r.get('eval')]
  assert [r['step'] for r in steps] == [1, 2, 3]
  assert all(set(CONTRACT) <= set(r) for r in steps)
  assert np.all(np.diff([r['samples'] for r in steps]) == 16)
  assert [r['step'] for r in rows if r.get('eval')] == [0, 2, 3]
  assert np.all(np.diff([r['wallclock_s'] for r in steps]) > 0)


def test_a_target_stops_a_run_only_from_eval_from_samples_on():
  """MLPerf's runs converge at a validation: an eval above target before the first does not stop."""
  cfg = grpo_config.get_config('runlocal').train
  cfg.update(target=0.6, max_samples=10_000, eval_from_samples=4608)
  meta = lambda samples, acc: dict(samples=samples, step=samples // 256, eval_accuracy=acc)
  assert [bool(train._done(cfg, meta(s, a))) for s, a in  # pylint: disable=protected-access
          [(4096, 0.7), (4608, 0.59), (4608, 0.6), (10_000, 0.1)]] == [False, False, True, True]
  cfg.eval_from_samples = 0
  assert train._done(cfg, meta(4096, 0.7))  # pylint: disable=protected-access


def test_evaluations_before_the_grid_come_at_each_doubling_of_eval_first_samples():
  """Batch 16, a grid of 128 steps (2048 samples): evals at 256, 512 and 1024 samples first."""
  config = grpo_config.get_config('runlocal,P=2')   # 2 x G 8 = 16 responses a step
  config.train.update(eval_every=128, eval_first_samples=256)
  due = lambda last: [s for s in range(1, last)
                      if train.eval_due(config.train, 16, False, dict(step=s), 16 * (s - 1),
                                        16 * s)]
  assert due(300) == [16, 32, 64, 128, 256]
  config.train.eval_first_samples = 0
  assert due(300) == [128, 256]
  config.train.eval_first_samples = 24   # not a multiple of the batch: the step that passes it
  assert due(70) == [2, 3, 6, 12, 24, 48]


def test_with_a_moving_batch_evaluations_keep_the_starting_batch_s_sample_grid():
  """eval_every 4 steps at a starting batch of 16: every 64 samples, whatever the batch does."""
  train_cfg = grpo_config.get_config('runlocal').train
  train_cfg.update(eval_every=4, eval_first_samples=0, eval_from_samples=0)
  samples = [0, 16, 32, 96, 160, 168, 176, 184, 192, 256]   # batches 16, 64, 8, 64
  due = [step for step in range(1, len(samples))
         if train.eval_due(train_cfg, 16, True, dict(step=step), samples[step - 1], samples[step])]
  assert due == [3, 4, 8, 9]   # past 64, 128, 192, 256 samples
  assert [step for step in range(1, len(samples))
          if train.eval_due(train_cfg, 16, False, dict(step=step), samples[step - 1],
                            samples[step])] == [4, 8]


def test_rollout_stats_match_numpy():
  rng = np.random.default_rng(0)
  rewards_B = rng.choice([0.0, 1.0], 24).astype(np.float32)
  lengths_B = rng.integers(1, 6, 24).astype(np.int32)
  mask_BxL = np.arange(6)[None, :] < lengths_B[:, None]
  rollout = sampler.Rollout(tokens_BxL=jnp.zeros((24, 6), jnp.int32),
                            logp_BxL=jnp.zeros((24, 6)), mask_BxL=jnp.asarray(mask_BxL),
                            lengths_B=jnp.asarray(lengths_B), decode_steps=jnp.int32(6),
                            utilization=jnp.float32(lengths_B.sum() / (24 * 6)))
  stats = train.rollout_stats(jnp.asarray(rewards_B), rollout)
  assert float(stats['reward_mean']) == pytest.approx(rewards_B.mean(), rel=1e-6)
  assert float(stats['reward_std']) == pytest.approx(rewards_B.std(), rel=1e-6)   # population std
  assert int(stats['tokens']) == lengths_B.sum()
  assert float(stats['response_len_mean']) == pytest.approx(lengths_B.mean(), rel=1e-6)
  assert float(stats['response_len_max']) == lengths_B.max()
  assert float(stats['slot_utilization']) == pytest.approx(lengths_B.sum() / 144, rel=1e-6)
  assert int(stats['decode_steps']) == 6


@pytest.mark.e2e
def test_partial_rollouts_resume_mid_flight_identically(tmp_path):
  """GRPO with partial rollouts, TIS and router replay, 3 steps; then its step-3 checkpoint is
  removed and the run resumes from step 2 with responses in flight (the pool restored: tokens,
  KV cache, versions, recorded experts): it logs step 3 and its evaluation exactly as before."""
  config = tiny(grpo_config, tmp_path, max_steps=3, eval_every=10, keep_checkpoints=3)
  config.rollout.update(slots=6, schedule='partial', max_staleness=1, max_new_tokens=8)
  config.model.router_replay = True
  config.optimizer.decay = 'constant'
  config.grpo.off_policy = 'tis'
  workdir = str(tmp_path / 'run')
  rows = lambda: rljax_cli.rows(workdir)
  train.train(config, workdir)
  whole = rows()
  shutil.rmtree(f'{workdir}/checkpoints/3')
  train.train(config, workdir)
  assert rows() == whole
  steps = [row for row in whole if not row.get('eval')]
  assert [row['step'] for row in steps] == [1, 2, 3] and all(r['retained'] == 16 for r in steps)
  carried = [row for row in steps if row['staleness_frac_1'] > 0]   # tokens of the step before
  assert carried and all(row['staleness_max'] <= 1 for row in steps)
  # The TIS weights pi_old / mu: 1 on fresh tokens, near 1 on carried ones (the policy moved a
  # little), never above the cap.
  assert all(row['is_weight_max'] <= 2.0 and abs(row['is_weight_mean'] - 1) < 1e-2 for row in steps)
  assert all(row['behaviour_mismatch'] > 0 for row in carried)
  # Carried tokens were routed by an older policy: some decisions differ from the trainer's, and
  # replay overrides them (fresh tokens agree in float32).
  assert any(row['router_mismatch'] > 0 for row in carried)


@pytest.mark.e2e
def test_split_mesh_trains_one_step_behind_like_a_serial_loop(tmp_path):
  """rollout.devices=4 of the 8: devices 4-7 draw each batch one policy version early while 0-3
  update. Three steps equal a serial loop written here that draws batch k from the parameters
  after update k - 2 on the same two meshes (the same compiled programs: bit-equal); a resume
  from step 2, with a batch drawn ahead in its checkpoint (its experts recorded, replayed by the
  update), logs step 3 exactly as before."""
  config = tiny(grpo_config, tmp_path, max_steps=3, eval_every=10, keep_checkpoints=3)
  config.rollout.update(schedule='drawn_ahead', devices=4, slots=6, max_new_tokens=8)
  config.model.router_replay = True
  config.optimizer.decay = 'constant'
  workdir = str(tmp_path / 'run')
  train.train(config, workdir)
  finished, restored, meta = run_lib.setup(config, workdir)
  finished.ckpt.close()
  assert meta['step'] == 3

  run, carry, _ = run_lib.setup(config, str(tmp_path / 'serial'))
  assert {d.id for d in run.mesh.devices.flat} == {0, 1, 2, 3}
  sampler = run.schedule.sampler
  assert {d.id for d in sampler.mesh.devices.flat} == {4, 5, 6, 7}
  state = carry['algo']
  keys = [train.step_key(carry['rng'], step) for step in (1, 2, 3)]
  draw = lambda params, key: schedules.sample_rollout(
      sampler, run.schedule.to_sampler(params), next(run.iterator), key)
  drawn = [draw(state['params'], train.step_key(keys[0], 100)), draw(state['params'], keys[0])]
  rewards_logged = []
  for step in (1, 2, 3):
    if step > 1:
      drawn.append(draw(state['params'], keys[step - 1]))   # the policy before this update
    rollout, prompt_BxT, valid_BxT, answers, *_ = drawn[step - 1]
    rollout, prompt_BxT, valid_BxT = jax.tree.map(
        lambda x: jax.device_put(x, sharding.batch_sharding(run.mesh, x.ndim)),
        (rollout, prompt_BxT, valid_BxT))
    tokens = np.asarray(rollout.tokens_BxL)
    rewards_B, _ = rewards.score_batch(
        run.task.reward_fn, evaluation.decode_responses(run.task.tokenizer, tokens), answers)
    rewards_logged.append(float(np.mean(rewards_B)))
    batch, _ = run.algo.make_batch(state, rollout, sharding.put_batch(rewards_B, run.mesh),
                                   prompt_BxT, valid_BxT, None)
    state, _ = run.algo.update(state, batch, None, train.step_key(keys[step - 1], 1))
  run.ckpt.close()
  same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)),
                      restored['algo']['params'], state['params'])
  assert all(jax.tree.leaves(same))
  rows = lambda: [{k: v for k, v in row.items() if not k.endswith('_s')}
                  for row in files.read_jsonl(f'{workdir}/metrics.jsonl')]
  whole = rows()
  assert [row['reward_mean'] for row in whole if not row.get('eval')] == pytest.approx(
      rewards_logged, abs=1e-6)
  shutil.rmtree(f'{workdir}/checkpoints/3')
  train.train(config, workdir)
  assert rows() == whole
