"""The RL loop: rollout -> reward -> advantages -> update, on one set of parameter arrays.

`setup` checks the config and builds (or restores) everything a run holds; `rl_step` is one rollout
batch, start to finish; `train` is the loop around it, owning only the budget, evaluation,
checkpoints, preemption and the non-finite stop. The algorithm (rljax.algos, by `config.algo`)
owns how a rollout becomes a training batch and what its update does.
"""
import functools
import time
from typing import Any, Callable, NamedTuple

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from rljax import algos
from rljax import checkpoint
from rljax import config_checks
from rljax import data
from rljax import evaluation
from rljax import hf
from rljax import metrics as metrics_lib
from rljax import model as model_lib
from rljax import preemption
from rljax import rewards
from rljax import sampler as sampler_lib
from rljax import sharding
from rljax import stats
from rljax import tasks
from rljax import warmstart
from rljax import workdir as workdir_lib


class Run(NamedTuple):
  """What stays fixed through a run. Checkpoints hold the rest (the carry, see `setup`)."""
  config: Any
  mesh: jax.sharding.Mesh
  algo: algos.Algorithm
  sample: Callable      # (params, prompt_BxT, valid_BxT, rng) -> sampler.Rollout
  evaluate: Callable    # params -> (accuracy, correct_M)
  task: tasks.Task
  prompt_len: int
  iterator: data.PromptIterator
  writer: metrics_lib.MetricsWriter
  ckpt: checkpoint.Checkpointer
  nan_steps: frozenset  # fault injection (debug.nan_steps): steps whose batch is made NaN


@jax.jit
def rollout_stats(rewards_B, rollout):
  """The rollout's logged numbers in one jitted call (each eager op is a dispatch per step)."""
  return dict(reward_mean=jnp.mean(rewards_B), reward_std=jnp.std(rewards_B),
              tokens=jnp.sum(rollout.lengths_B), **sampler_lib.rollout_metrics(rollout))


step_key = jax.jit(jax.random.fold_in)
ROLLOUT_KEYS = ('response_len_mean', 'response_len_max', 'slot_utilization', 'decode_steps')


def _model_and_task(config):
  """The policy's model, the task and the lengths, checked against each other before building."""
  model_cfg = hf.policy_config(config)
  prompt_len, task_new_tokens, vocab_size = tasks.lengths(config)
  max_new_tokens = config.rollout.max_new_tokens or task_new_tokens
  config_checks.check_lengths(prompt_len, max_new_tokens, model_cfg, vocab_size)
  return model_lib.Transformer(model_cfg), prompt_len, max_new_tokens


def _initial_params(config, model, task, evaluate, rng, mesh, workdir, lengths):
  """The policy to start from: a Hugging Face checkpoint, or a random init and the warm start."""
  hf_path = config.init.hf_path if 'init' in config else ''
  init_fn = functools.partial(model_lib.init_params, model.cfg)
  if hf_path:   # each tensor read straight onto its shards; no warm start
    shardings = sharding.param_shardings(jax.eval_shape(init_fn, rng), mesh)
    return hf.load_params(hf_path, model.cfg, shardings)
  params, _ = sharding.init_params(init_fn, rng, mesh)
  if config.warmstart.enabled:
    params, _ = warmstart.warm_start(config, model, params, task.tokenizer, task.train_source,
                                     evaluate, config.warmstart.dir or workdir, *lengths, mesh)
  return params


def setup(config, workdir):
  """Validates `config`, builds the run and restores its latest checkpoint: (run, carry, meta).

  The carry is what checkpoints hold: the algorithm's state plus the rollout key (`rng`) and the
  frozen reference policy (`reference`, when the algorithm uses one). Bad input raises ValueError
  before anything is compiled.
  """
  config_checks.check(config)
  mesh = sharding.make_mesh(config.mesh)
  model, prompt_len, max_new_tokens = _model_and_task(config)
  meta = workdir_lib.prepare(workdir, config)   # None: a fresh run
  try:
    task = tasks.make_task(config)
  except OSError as error:
    raise ValueError(f'cannot build or read the dataset: {error}') from None
  config_checks.check_lengths(prompt_len, max_new_tokens, model.cfg, task.tokenizer.vocab_size)
  eval_prompts, eval_answers = data.eval_set(task.test_source, config.train.eval_size)
  evaluate = evaluation.make_evaluator(model, task.tokenizer, eval_prompts, eval_answers,
                                       task.reward_fn, prompt_len, max_new_tokens, mesh,
                                       slots=config.rollout.slots)
  init_rng, rollout_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  params = (_initial_params(config, model, task, evaluate, init_rng, mesh, workdir,
                            (prompt_len, prompt_len + max_new_tokens)) if meta is None else
            sharding.init_params(functools.partial(model_lib.init_params, model.cfg), init_rng,
                                 mesh)[0])   # a template: the checkpoint's values replace it
  sample = sharding.on_mesh(sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
      max_new_tokens=max_new_tokens, eos_id=task.tokenizer.eos_id, pad_id=task.tokenizer.pad_id,
      temperature=config.rollout.temperature, top_k=config.rollout.top_k,
      top_p=config.rollout.top_p, slots=config.rollout.slots)), mesh)
  algo = algos.get(config.algo).make(config, model, params, mesh, jax.random.fold_in(init_rng, 1))
  algo = algo._replace(schedules={k: jax.jit(s) for k, s in algo.schedules.items()})
  carry = dict(algo.state, rng=sharding.place(rollout_rng, mesh))
  if algo.needs_reference:   # a copy: the update donates the policy's buffers
    carry['reference'] = jax.tree.map(jnp.copy, params)
  if jax.process_index() == 0:
    print(memory_line(model.cfg, algo.state, algos.get(config.algo).batch_size(config),
                      prompt_len + max_new_tokens, mesh), flush=True)
  writer = metrics_lib.writer_from_config(config, workdir, jax.process_index() == 0)
  ckpt = checkpoint.Checkpointer(workdir, config.train.checkpoint_every,
                                 config.train.keep_checkpoints)
  if meta is None:
    writer.truncate_after(-1)   # rows of an attempt killed before its first checkpoint
    meta = dict(step=0, samples=0, tokens=0, wallclock_s=0.0, data=None, eval_accuracy=None)
  else:
    carry, meta = ckpt.restore(carry, meta['step'])
    writer.truncate_after(meta['step'])
    logging.info('resumed from step %d (%d samples)', meta['step'], meta['samples'])
  workdir_lib.claim(workdir, config)
  iterator = data.PromptIterator(
      task.train_source, config.rollout.P, seed=config.seed, process_index=jax.process_index(),
      process_count=jax.process_count(), state=meta['data'], tokenizer=task.tokenizer,
      on_bad_record=config.data.on_bad_record)
  nan_steps = config_checks.step_set(config.debug.nan_steps) if 'debug' in config else set()
  run = Run(config, mesh, algo, sample, evaluate, task, prompt_len, iterator, writer, ckpt,
            frozenset(nan_steps))
  return run, carry, meta


def _poisoned(batch):
  """The batch with every float made NaN: what a diverged step looks like to the update."""
  return jax.tree.map(lambda x: x * jnp.nan if jnp.issubdtype(x.dtype, jnp.floating) else x, batch)


def rl_step(run, carry, examples, step):
  """One rollout batch of `examples` (P prompts): sample G responses each, score them, turn them
  into the algorithm's batch and update. Returns the new carry and the step's training row (the
  loop adds the running totals)."""
  G = run.config.rollout.G
  state = {k: v for k, v in carry.items() if k not in ('rng', 'reference')}
  ref_params, rng = carry.get('reference'), step_key(carry['rng'], step)
  start = time.perf_counter()
  prompts = [p for p in examples['prompt'] for _ in range(G)]   # group-major rows
  answers = [a for a in examples['answer'] for _ in range(G)]
  prompt_BxT, valid_BxT = sharding.put_batch(
      data.encode_prompts(prompts, run.task.tokenizer, run.prompt_len), run.mesh)
  rollout = run.sample(state['params'], prompt_BxT, valid_BxT, rng)
  response_tokens = evaluation.to_host(rollout.tokens_BxL, run.mesh)   # the verifier needs text
  times = dict(rollout_time_s=time.perf_counter() - start)

  reward_start = time.perf_counter()
  rewards_B, reward_failures = rewards.score_batch(
      run.task.reward_fn, evaluation.decode_responses(run.task.tokenizer, response_tokens), answers)
  rewards_B = sharding.put_batch(rewards_B, run.mesh)
  batch, batch_stats = run.algo.make_batch(state, rollout, rewards_B, prompt_BxT, valid_BxT,
                                           ref_params)
  if step in run.nan_steps:
    batch = _poisoned(batch)
  times['reward_time_s'] = time.perf_counter() - reward_start

  update_start = time.perf_counter()
  state, update_metrics = run.algo.update(state, batch, ref_params, step_key(rng, 1))
  update_metrics = jax.device_get(update_metrics)
  times['update_time_s'] = time.perf_counter() - update_start
  times['step_time_s'] = time.perf_counter() - start
  batch_stats, rollout_numbers = jax.device_get(
      (batch_stats, rollout_stats(rewards_B, rollout)))
  row = training_row(step, run, times, rollout_numbers, batch_stats, update_metrics)
  row.update(reward_failures=reward_failures, data_skipped=run.iterator.skipped)
  return dict(carry, **state), row


def training_row(step, run, times, rollout_numbers, batch_stats, update_metrics):
  """The step's metrics.jsonl row, less the running totals (samples, tokens, wallclock_s)."""
  batch_size = run.config.rollout.P * run.config.rollout.G
  row = dict(step=step, tokens_step=int(rollout_numbers['tokens']),
             reward_mean=float(rollout_numbers['reward_mean']),
             reward_std=float(rollout_numbers['reward_std']), **times,
             samples_per_s=batch_size / times['step_time_s'],
             **{key: float(rollout_numbers[key]) for key in ROLLOUT_KEYS},
             retained=int(batch_stats.pop('retained')),
             skipped_updates=int(update_metrics.pop('skipped')))
  first_update = run.algo.updates_per_batch * (step - 1)
  row.update({key: float(schedule(first_update)) for key, schedule in run.algo.schedules.items()})
  row.update({key: float(value) for key, value in batch_stats.items()})
  logged = ('grad_norm', 'logprob_mismatch', 'entropy', 'clipfrac', 'pg_loss', 'approx_kl',
            'moe_aux_loss') + algos.AVERAGED + run.algo.logged
  row.update({key: float(update_metrics[key]) for key in logged if key in update_metrics})
  return row


def _done(train_cfg, meta):
  budget_spent = ((train_cfg.max_samples and meta['samples'] >= train_cfg.max_samples) or
                  (train_cfg.max_steps and meta['step'] >= train_cfg.max_steps))
  accuracy = meta['eval_accuracy']
  return budget_spent or (train_cfg.target and accuracy is not None and accuracy >= train_cfg.target)


def _advance(meta, row, iterator):
  """The running totals after `row`, written into the row too."""
  meta = dict(meta, step=row['step'], samples=meta['samples'] + row['retained'],
              tokens=meta['tokens'] + row.pop('tokens_step'),
              wallclock_s=meta['wallclock_s'] + row['step_time_s'], data=iterator.state())
  row.update(samples=meta['samples'], tokens=meta['tokens'], wallclock_s=meta['wallclock_s'])
  return meta


def _stop_if_diverged(run, carry, step, workdir):
  limit = run.config.optimizer.max_bad_steps
  if max(int(carry[key].notfinite_count) for key in carry if key.endswith('opt_state')) >= limit:
    run.ckpt.close()   # lets the in-flight save commit; skipped updates left its params good
    raise FloatingPointError(
        f'{limit} non-finite updates in a row at step {step}; stopping. The last good checkpoint '
        f'is step {run.ckpt.latest_step()} in {workdir}/checkpoints.')


def train(config, workdir, stop=None):
  """Trains one configuration in `workdir`; resumes from its latest checkpoint. Returns last eval.

  Bad input raises ValueError before anything is compiled. `stop` (a preemption.StopRequest) ends
  the run after the current step with a checkpoint of it, raising preemption.Preempted.
  """
  run, carry, meta = setup(config, workdir)
  noise = stats.NoiseScaleWindow(metrics_lib.read_jsonl(run.writer.path))   # goes on on resume
  if meta['step'] == 0:
    meta['eval_accuracy'], correct = run.evaluate(carry['params'])
    run.writer.eval(0, 0, meta['eval_accuracy'], correct, 0.0)
  while not _done(config.train, meta):
    carry, row = rl_step(run, carry, next(run.iterator), meta['step'] + 1)
    meta = _advance(meta, row, run.iterator)
    noise.update(row)
    run.writer.train(row, console=row['step'] % config.train.log_every == 0)
    if row['skipped_updates']:
      logging.warning('step %d: %d non-finite update(s) skipped', row['step'],
                      row['skipped_updates'])
    _stop_if_diverged(run, carry, row['step'], workdir)
    if row['step'] % config.train.eval_every == 0 or _done(config.train, meta):
      meta['eval_accuracy'], correct = run.evaluate(carry['params'])
      run.writer.eval(row['step'], meta['samples'], meta['eval_accuracy'], correct,
                      meta['wallclock_s'])
    # Every process gets the same answer at the same step; a request during the last step is moot.
    stopping = stop is not None and stop.agreed() and not _done(config.train, meta)
    run.ckpt.save(meta['step'], carry, dict(meta, config=workdir_lib.config_json(config)),
                  force=_done(config.train, meta) or stopping)
    if stopping:
      run.ckpt.close()
      raise preemption.Preempted(meta['step'])
  run.ckpt.close()
  run.writer.close()
  return meta['eval_accuracy']


def memory_line(model_cfg, state, rollout_batch, seq_len, mesh):
  """Start-up summary of what one device holds: parameters, optimizer state, the rollout KV cache."""
  params = state['params']
  opt_state = {k: v for k, v in state.items() if k.endswith('opt_state')}
  kv_spec = sharding.spec_for((model_cfg.num_layers, rollout_batch, model_cfg.num_kv_heads, seq_len,
                               model_cfg.head_dim), ('layers', 'batch', 'kv_heads', 'length',
                                                     'head_dim'), mesh)
  kv_shards = np.prod([np.prod([mesh.shape[a] for a in np.atleast_1d(axes)])
                       for axes in kv_spec if axes is not None] or [1])
  kv_bytes = (2 * model_cfg.num_layers * rollout_batch * seq_len * model_cfg.num_kv_heads *
              model_cfg.head_dim * np.dtype(model_cfg.dtype).itemsize / kv_shards)
  gib = lambda b: f'{b / 2**30:.3f} GiB'
  num_params = sum(x.size for x in jax.tree.leaves(params))
  return (f'mesh {dict(mesh.shape)} | {num_params / 1e6:.2f}M params | per device: params '
          f'{gib(sharding.bytes_per_device(params))}, optimizer '
          f'{gib(sharding.bytes_per_device(opt_state))}, rollout KV cache {gib(kv_bytes)}')
