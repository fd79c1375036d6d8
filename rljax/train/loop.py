"""The RL loop: rollout -> reward -> advantages -> update, on one set of parameter arrays.

`rljax.train.run.setup` checks the config and builds (or restores) everything a run holds;
`rl_step` is one rollout batch, start to finish; `train` is the loop around it, owning only the
budget, evaluation, checkpoints, preemption and the non-finite stop. The rollout schedule
(rljax.train.schedules) owns where a batch comes from; the algorithm (rljax.algos, by
`config.algo`) owns how a rollout becomes a training batch and what its update does.
"""
import time

from absl import logging
import jax
import jax.numpy as jnp

from rljax import algos
from rljax.auto_batch import hook as auto_hook
from rljax import collective
from rljax.envs import reward as reward_lib
from rljax import files
from rljax import preemption
from rljax.rollout import sampler as sampler_lib
from rljax import sharding
from rljax import stats
from rljax.train import evaluation
from rljax.train import run as run_lib
from rljax.train import schedules
from rljax.train import workdir as workdir_lib


@jax.jit
def rollout_stats(rewards_B, rollout):
  """The rollout's logged numbers in one jitted call (each eager op is a dispatch per step)."""
  return dict(reward_mean=jnp.mean(rewards_B), reward_std=jnp.std(rewards_B),
              tokens=jnp.sum(rollout.lengths_B), **sampler_lib.rollout_metrics(rollout))


step_key = schedules.step_key


def rl_step(run, carry, batches, step):
  """One rollout batch from `batches` of P prompts (as many as the schedule takes at `step`): the
  schedule draws G responses to each prompt, which are scored, turned into the algorithm's batch
  and trained on. Returns the new carry and the step's
  training row (the loop adds the running totals)."""
  state, ref_params, rng = carry['algo'], carry['reference'], step_key(carry['rng'], step)
  start = time.perf_counter()
  rollout_state, sampled = run.schedule.draw(run.algo.policy(state, ref_params), carry['rollout'],
                                             batches, rng, step)
  rollout = sampled.rollout
  response_tokens = evaluation.to_host(rollout.tokens_BxL, run.mesh)   # the verifier needs text
  times = dict(rollout_time_s=time.perf_counter() - start)

  reward_start = time.perf_counter()
  rewards_B, reward_failures = reward_lib.score(
      run.task.reward_fn, evaluation.decode_responses(run.task.tokenizer, response_tokens),
      sampled.answers, sampled.env_rewards)
  rewards_B = sharding.put_batch(rewards_B, run.mesh)
  batch, batch_stats = run.algo.make_batch(state, rollout, rewards_B, sampled.prompt_BxT,
                                           sampled.valid_BxT, ref_params)
  times['reward_time_s'] = time.perf_counter() - reward_start

  update_start = time.perf_counter()
  state, update_metrics = run.algo.update(state, batch, ref_params, step_key(rng, 1))
  update_metrics = jax.device_get(update_metrics)
  times['update_time_s'] = time.perf_counter() - update_start
  times['step_time_s'] = time.perf_counter() - start
  batch_stats, rollout_numbers = jax.device_get((dict(batch_stats, **sampled.stats),
                                                 rollout_stats(rewards_B, rollout)))
  row = training_row(step, run, times, rollout_numbers, batch_stats, update_metrics)
  row.update(reward_failures=reward_failures, data_skipped=run.iterator.skipped)
  _log_prompts(run, step, sampled.prompt_ids)
  return dict(carry, algo=state, rollout=rollout_state), row


def injected_faults(run, step):
  """`run`, or at a step of debug.nan_steps the run whose algorithm makes every float of the
  training batch NaN, as a diverged step's batch is (fault injection: the non-finite guards')."""
  if step not in run.nan_steps:
    return run
  make_batch = run.algo.make_batch

  def nan_batch(*args):
    batch, batch_stats = make_batch(*args)
    nan = lambda x: x * jnp.nan if jnp.issubdtype(x.dtype, jnp.floating) else x
    return jax.tree.map(nan, batch), batch_stats

  return run._replace(algo=run.algo._replace(make_batch=nan_batch))


def _log_prompts(run, step, trained):
  """prompts.jsonl's rows of the step: the stream indices of the prompts it `trained` and the
  malformed records the iterator passed over during it, every process's, process 0's first."""
  local = dict(trained=trained, skipped=run.iterator.take_skipped_records())
  everyone = collective.from_every_process(local)
  run.writer.prompts(step, [index for part in everyone for index in part['trained']],
                     [record for part in everyone for record in part['skipped']])


def training_row(step, run, times, rollout_numbers, batch_stats, update_metrics):
  """The step's metrics.jsonl row, less the running totals (samples, tokens, wallclock_s)."""
  row = dict(step=step, tokens_step=int(rollout_numbers.pop('tokens')),
             **{key: float(value) for key, value in rollout_numbers.items()}, **times,
             samples_per_s=run.batch / times['step_time_s'],
             retained=int(batch_stats.pop('retained')),
             skipped_updates=int(update_metrics.pop('skipped')))
  first_update = run.algo.updates_per_batch * (step - 1)
  row.update({key: float(schedule(first_update)) for key, schedule in run.algo.schedules.items()})
  row.update({key: float(value) for key, value in batch_stats.items()})
  logged = ('grad_norm', 'logprob_mismatch', 'router_mismatch', 'entropy', 'clipfrac', 'pg_loss',
            'approx_kl', 'moe_aux_loss') + algos.AVERAGED + run.algo.logged
  row.update({key: float(update_metrics[key]) for key in logged if key in update_metrics})
  return row


def _done(train_cfg, meta):
  """The budget spent, or the target reached; with train.eval_from_samples, reached only from there
  on (MLPerf's runs converge only at a validation, never at an evaluation before the first)."""
  budget_spent = ((train_cfg.max_samples and meta['samples'] >= train_cfg.max_samples) or
                  (train_cfg.max_steps and meta['step'] >= train_cfg.max_steps))
  accuracy = meta['eval_accuracy']
  reached = (train_cfg.target and accuracy is not None and accuracy >= train_cfg.target and
             meta['samples'] >= train_cfg.eval_from_samples)
  return budget_spent or reached


def _advance(meta, row, iterator):
  """The running totals after `row`, written into the row too."""
  meta = dict(meta, step=row['step'], samples=meta['samples'] + row['retained'],
              tokens=meta['tokens'] + row.pop('tokens_step'),
              wallclock_s=meta['wallclock_s'] + row['step_time_s'], data=iterator.state())
  row.update(samples=meta['samples'], tokens=meta['tokens'], wallclock_s=meta['wallclock_s'])
  return meta


def _evaluate(run, carry, meta, step, wallclock_s):
  """Evaluates the policy into meta and the logs; the row keeps how long it took (not training
  time: wallclock_s leaves it out)."""
  start = time.perf_counter()
  meta['eval_accuracy'], correct = run.evaluate(run.algo.policy(carry['algo'],
                                                                carry['reference']))
  run.writer.eval(step, meta['samples'], meta['eval_accuracy'], correct, wallclock_s,
                  eval_time_s=time.perf_counter() - start)


def _check_updates(run, carry, row, workdir):
  """Warns of skipped non-finite updates; stops the run after `max_bad_steps` in a row."""
  step, limit = row['step'], run.config.optimizer.max_bad_steps
  if row['skipped_updates']:
    logging.warning('step %d: %d non-finite update(s) skipped', step, row['skipped_updates'])
  state = carry['algo']
  if max(int(state[key].notfinite_count) for key in state if key.endswith('opt_state')) >= limit:
    run.ckpt.close()   # lets the in-flight save commit; skipped updates left its params good
    raise FloatingPointError(
        f'{limit} non-finite updates in a row at step {step}; stopping. The last good checkpoint '
        f'is step {run.ckpt.latest_step()} in {workdir}/checkpoints.')


def eval_due(train, batch, moves, row, samples_before, samples_after):
  """Every train.eval_every steps; when the batch `moves` (auto_batch) every as many samples as
  those steps hold at the starting `batch`, so the eval grid stays in samples while the batch
  changes. Before the first of those, at train.eval_first_samples x 2^k (when > 0). After every
  step once train.eval_from_samples are trained (when > 0): MLPerf's validation boundaries."""
  if 0 < train.eval_from_samples <= samples_after:
    return True
  every = train.eval_every * batch
  if _lead_in_due(train.eval_first_samples, every, samples_before, samples_after):
    return True
  if not moves:
    return row['step'] % train.eval_every == 0
  return samples_after // every > samples_before // every


def _lead_in_due(first, every, samples_before, samples_after):
  """Whether a step from samples_before to samples_after passed first x 2^k < every (first > 0)."""
  point = first
  while 0 < point < every and point <= samples_after:
    if point > samples_before:
      return True
    point *= 2
  return False


def train(config, workdir, stop=None, shape=None):
  """Trains one configuration in `workdir`; resumes from its latest checkpoint. Returns last eval.

  Bad input raises ValueError before anything is compiled. `stop` (a preemption.StopRequest) ends
  the run after the current step with a checkpoint of it, raising preemption.Preempted. `shape`:
  the config checked and set up abstractly (run.checked_shape), when the caller has it.
  """
  run, carry, meta = run_lib.setup(config, workdir, shape)
  start_batch = run.batch
  auto_batch, run = auto_hook.start(config, run, meta)
  noise = stats.NoiseScaleWindow(files.read_jsonl(run.writer.path))   # goes on on resume
  if meta['step'] and _done(config.train, meta) and jax.process_index() == 0:
    print(f'rljax: the run in {workdir} is already complete (step {meta["step"]}, '
          f'{meta["samples"]} samples); nothing to do. Raise train.max_steps or '
          'train.max_samples to continue it', flush=True)
  if meta['step'] == 0:
    _evaluate(run, carry, meta, step=0, wallclock_s=0.0)
  while not _done(config.train, meta):
    step = meta['step'] + 1
    batches = [next(run.iterator) for _ in range(run.schedule.batches(step))]
    carry, row = rl_step(injected_faults(run, step), carry, batches, step)
    samples_before, meta = meta['samples'], _advance(meta, row, run.iterator)
    noise.update(row)
    if auto_batch:
      run, meta = auto_batch.after_step(run, meta, row)
    run.writer.train(row, console=row['step'] % config.train.log_every == 0)
    _check_updates(run, carry, row, workdir)
    if (eval_due(config.train, start_batch, auto_batch is not None, row, samples_before,
                 meta['samples']) or _done(config.train, meta)):
      _evaluate(run, carry, meta, step=row['step'], wallclock_s=meta['wallclock_s'])
    done = _done(config.train, meta)   # the evaluation may have reached the target
    # Every process gets the same answer at the same step; a request during the last step is moot.
    stopping = stop is not None and stop.agreed() and not done
    saved = dict(meta, **run.schedule.state(), config=workdir_lib.config_json(config))
    run.ckpt.save(meta['step'], run_lib.checkpointed(run.algo, carry), saved,
                  force=done or stopping)
    if stopping:
      run.ckpt.close()
      raise preemption.Preempted(meta['step'])
  run.ckpt.close()
  run.writer.close()
  return meta['eval_accuracy']
