"""The RL loop: rollout -> reward -> advantages -> update, on one set of parameter arrays.

One step: P prompts, G sampled responses each (GRPO: the batch unit is P x G responses; PPO: P = B,
G = 1); rewards from a verifier; advantages and the update from the algorithm (rljax.grpo: group
z-scores; rljax.ppo: critic values, GAE and a critic update); by default ONE global optimizer update
per rollout batch (as in the paper), with gradients accumulated over micro-batches so memory stays
flat as the batch grows.
"""
import collections
import functools
import os
import time

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from rljax import analysis
from rljax import checkpoint
from rljax import config_checks
from rljax import data
from rljax import evaluation
from rljax import grpo
from rljax import hf
from rljax import metrics as metrics_lib
from rljax import model as model_lib
from rljax import ppo
from rljax import preemption
from rljax import rewards
from rljax import sampler as sampler_lib
from rljax import sharding
from rljax import tasks
from rljax import warmstart
from rljax import workdir as workdir_lib


NOISE_KEYS = ('grad_sq_small', 'grad_sq_big', 'b_small', 'b_big')
NOISE_SCALE_STEPS = 50   # the logged noise_scale averages its terms over this many recent steps


@jax.jit
def rollout_stats(rewards_B, lengths_B):
  """The rollout's logged numbers in one jitted call (eager ops cost ~0.1-1 ms each per step)."""
  return dict(reward_mean=jnp.mean(rewards_B), reward_std=jnp.std(rewards_B),
              tokens=jnp.sum(lengths_B), response_len_mean=jnp.mean(lengths_B.astype(jnp.float32)))


def train(config, workdir, stop=None):
  """Trains one configuration in `workdir`; resumes from its latest checkpoint. Returns last eval.

  Bad input raises ValueError before anything is compiled. `stop` (a preemption.StopRequest) ends
  the run after the current step with a checkpoint of it, raising preemption.Preempted.
  """
  config_checks.check(config)
  mesh = sharding.make_mesh(config.mesh)
  is_logger = jax.process_index() == 0

  # ------------------------------------------------------------------ task, model, evaluation
  dcfg = config.data
  model_cfg = hf.policy_config(config)
  prompt_len, task_new_tokens, vocab_size = tasks.lengths(config)
  max_new_tokens = config.rollout.max_new_tokens or task_new_tokens
  config_checks.check_lengths(prompt_len, max_new_tokens, model_cfg, vocab_size)  # before building
  meta = workdir_lib.prepare(workdir, config)   # None: a fresh run
  try:
    task = tasks.make_task(config)   # tokenizer, splits, lengths, verifier of config.data.name
  except OSError as error:
    raise ValueError(f'cannot build or read the dataset: {error}') from None
  tokenizer, train_source, test_source = task.tokenizer, task.train_source, task.test_source
  config_checks.check_lengths(prompt_len, max_new_tokens, model_cfg, tokenizer.vocab_size)
  reward_fn = task.reward_fn
  hf_path = config.init.hf_path if 'init' in config else ''

  model = model_lib.Transformer(model_cfg)
  eval_prompts, eval_answers = data.eval_set(test_source, config.train.eval_size)
  evaluate = evaluation.make_evaluator(model, tokenizer, eval_prompts, eval_answers, reward_fn,
                                       prompt_len, max_new_tokens, mesh,
                                       slots=config.rollout.get('slots', 0))
  rng = jax.random.PRNGKey(config.seed)
  init_rng, rollout_rng = jax.random.split(rng)
  rollout_rng = sharding.place(rollout_rng, mesh)   # saved in checkpoints, also multi-host
  init_fn = functools.partial(model_lib.init_params, model_cfg)
  if hf_path:   # a pretrained policy, each tensor read straight onto its shards; no warm start
    shardings = sharding.param_shardings(jax.eval_shape(init_fn, init_rng), mesh)
    params = hf.load_params(hf_path, model_cfg, shardings)
    logging.info('initialised from the Hugging Face checkpoint %s', hf_path)
  else:
    params, _ = sharding.init_params(init_fn, init_rng, mesh)
  if config.warmstart.enabled and not hf_path and meta is None:   # on resume: the checkpoint
    params, _ = warmstart.warm_start(config, model, params, tokenizer, train_source, evaluate,
                                     config.warmstart.dir or workdir, prompt_len,
                                     prompt_len + max_new_tokens, mesh)

  # ------------------------------------------------------------------ optimizer and jitted steps
  P, G = config.rollout.P, config.rollout.G
  batch_size = P * G
  sample = sharding.on_mesh(sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
      max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id,
      temperature=config.rollout.temperature, top_k=config.rollout.top_k,
      top_p=config.rollout.top_p, slots=config.rollout.get('slots', 0))), mesh)
  num_minibatches = config.train.num_minibatches
  minibatch_size = batch_size // num_minibatches
  num_micro = minibatch_size // (config.train.micro_batch or minibatch_size)
  if config.algo == 'ppo':
    algo = ppo.make(config, model, params, num_micro, jax.random.fold_in(init_rng, 1), mesh)
  else:
    algo = grpo.make(config, model, params, num_micro, mesh)
  # A copy (the update donates the policy's buffers), checkpointed with the run.
  ref_params = jax.tree.map(jnp.copy, params) if algo.needs_reference else None

  if is_logger:
    print(memory_line(model_cfg, algo.state, batch_size, prompt_len + max_new_tokens, mesh),
          flush=True)

  # ------------------------------------------------------------------ resume
  writer = metrics_lib.writer_from_config(config, workdir, is_logger)
  ckpt = checkpoint.Checkpointer(workdir, config.train.checkpoint_every,
                                 config.train.keep_checkpoints)
  state = algo.state

  def checkpointed():
    """The algorithm's state plus what the loop owns: the rollout key and the reference policy."""
    extras = dict(rng=rollout_rng) if ref_params is None else dict(rng=rollout_rng,
                                                                   reference=ref_params)
    return dict(state, **extras)

  step_key = jax.jit(jax.random.fold_in)
  schedules = {key: jax.jit(schedule) for key, schedule in algo.schedules.items()}
  if meta is not None:
    state, meta = ckpt.restore(checkpointed(), meta['step'])
    rollout_rng, ref_params = state.pop('rng'), state.pop('reference', None)
    writer.truncate_after(meta['step'])
    logging.info('resumed from step %d (%d samples)', meta['step'], meta['samples'])
  else:
    writer.truncate_after(-1)   # rows of an attempt killed before its first checkpoint
    meta = dict(step=0, samples=0, tokens=0, wallclock_s=0.0, data=None, eval_accuracy=None)
  workdir_lib.claim(workdir, config)
  config_json = workdir_lib.config_json(config)
  nan_steps = config_checks.step_set(config.debug.nan_steps) if 'debug' in config else set()
  step, samples, tokens, wallclock = meta['step'], meta['samples'], meta['tokens'], meta['wallclock_s']
  iterator = data.PromptIterator(train_source, P, seed=config.seed,
                                 process_index=jax.process_index(),
                                 process_count=jax.process_count(), state=meta['data'],
                                 tokenizer=tokenizer, on_bad_record=dcfg.on_bad_record)
  last_eval = meta['eval_accuracy']
  if step == 0:
    last_eval, correct = evaluate(state['params'])
    writer.eval(0, 0, last_eval, correct, 0.0)

  def done():
    budget_spent = ((config.train.max_samples and samples >= config.train.max_samples) or
                    (config.train.max_steps and step >= config.train.max_steps))
    target_hit = config.train.target and last_eval is not None and last_eval >= config.train.target
    return budget_spent or target_hit

  # ------------------------------------------------------------------ the loop
  noise_terms = collections.deque(  # on resume the window goes on from the rows kept on disk
      ([row[k] for k in NOISE_KEYS] for row in metrics_lib.read_jsonl(writer.path)
       if 'grad_sq_small' in row), maxlen=NOISE_SCALE_STEPS)
  while not done():
    step += 1
    step_start = time.perf_counter()
    examples = next(iterator)
    prompts = [p for p in examples['prompt'] for _ in range(G)]   # group-major rows
    answers = [a for a in examples['answer'] for _ in range(G)]
    prompt_BxT, valid_BxT = sharding.put_batch(
        data.encode_prompts(prompts, tokenizer, prompt_len), mesh)
    rollout = sample(state['params'], prompt_BxT, valid_BxT, step_key(rollout_rng, step))
    response_tokens = evaluation.to_host(rollout.tokens_BxL, mesh)  # the verifier needs text
    rollout_time = time.perf_counter() - step_start

    reward_start = time.perf_counter()
    rewards_B, reward_failures = rewards.score_batch(
        reward_fn, evaluation.decode_responses(tokenizer, response_tokens), answers)
    rewards_B = sharding.put_batch(rewards_B, mesh)
    batch, batch_stats = algo.make_batch(state, rollout, rewards_B, prompt_BxT, valid_BxT,
                                         ref_params)
    if step in nan_steps:   # fault injection (debug.nan_steps)
      batch = jax.tree.map(lambda x: x * jnp.nan if jnp.issubdtype(x.dtype, jnp.floating) else x,
                           batch)
    reward_time = time.perf_counter() - reward_start

    update_start = time.perf_counter()
    step_metrics = []
    for epoch in range(config.train.num_epochs):
      order = np.arange(batch_size)
      if num_minibatches > 1:   # shuffle whole groups so each minibatch keeps its groups intact
        groups = np.random.default_rng([config.seed, step, epoch]).permutation(P)
        order = (groups[:, None] * G + np.arange(G)).reshape(-1)
      for mb in np.split(order, num_minibatches):
        minibatch = jax.tree.map(lambda x, mb=mb: x[mb], batch) if num_minibatches > 1 else batch
        state, m = algo.update(state, minibatch, ref_params)
        step_metrics.append(m)
    step_metrics = jax.device_get(step_metrics)
    update_time = time.perf_counter() - update_start
    step_time = time.perf_counter() - step_start
    wallclock += step_time

    batch_stats, stats = jax.device_get((batch_stats, rollout_stats(rewards_B, rollout.lengths_B)))
    retained = int(batch_stats.pop('retained'))
    samples += retained
    tokens += int(stats['tokens'])
    first = step_metrics[0]   # computed before any update of this step: the on-policy numbers
    row = dict(step=step, samples=samples, tokens=tokens, reward_mean=float(stats['reward_mean']),
               reward_std=float(stats['reward_std']),
               grad_norm=float(np.mean([m['grad_norm'] for m in step_metrics])),
               step_time_s=step_time, rollout_time_s=rollout_time, reward_time_s=reward_time,
               update_time_s=update_time, wallclock_s=wallclock, samples_per_s=batch_size / step_time,
               logprob_mismatch=first['logprob_mismatch'], entropy=first['entropy'],
               clipfrac=first['clipfrac'], pg_loss=first['pg_loss'], approx_kl=first['approx_kl'],
               moe_aux_loss=first['moe_aux_loss'],
               response_len_mean=float(stats['response_len_mean']), retained=retained,
               reward_failures=reward_failures, skipped_updates=int(sum(m['skipped'] for m in step_metrics)),
               data_skipped=iterator.skipped)
    for key, schedule in schedules.items():
      row[key] = float(schedule((step - 1) * len(step_metrics)))
    row.update({key: float(value) for key, value in batch_stats.items()})
    row.update({key: float(value) for key, value in
                jax.device_get(sampler_lib.rollout_metrics(rollout)).items()})
    for key in ('kl', 'grad_sq_small', 'grad_sq_big', 'b_small', 'b_big') + algo.logged:
      if key in first:
        row[key] = float(np.mean([m[key] for m in step_metrics]))
    if 'grad_sq_small' in row:  # B_simple over recent steps: one step alone is mostly noise
      noise_terms.append([row[k] for k in NOISE_KEYS])
      noise_scale = analysis.noise_scale(*np.transpose(noise_terms))
      row['noise_scale'] = noise_scale if np.isfinite(noise_scale) else None
    writer.train(row, console=step % config.train.log_every == 0)
    if row['skipped_updates']:
      logging.warning('step %d: %d non-finite update(s) skipped', step, row['skipped_updates'])
    bad_steps = max(int(state[key].notfinite_count) for key in state if key.endswith('opt_state'))
    if bad_steps >= config.optimizer.max_bad_steps:
      ckpt.close()   # lets the in-flight save commit; skipped updates left its params good
      raise FloatingPointError(
          f'{config.optimizer.max_bad_steps} non-finite updates in a row at step {step}; stopping. '
          f'The last good checkpoint is step {ckpt.latest_step()} in {workdir}/checkpoints.')

    if step % config.train.eval_every == 0 or done():
      last_eval, correct = evaluate(state['params'])
      writer.eval(step, samples, last_eval, correct, wallclock)
    # Every process gets the same answer at the same step; a request during the last step is moot.
    stopping = stop is not None and stop.agreed() and not done()
    meta = dict(step=step, samples=samples, tokens=tokens, wallclock_s=wallclock,
                data=iterator.state(), eval_accuracy=last_eval, config=config_json)
    ckpt.save(step, checkpointed(), meta, force=done() or stopping)
    if stopping:
      ckpt.close()
      raise preemption.Preempted(step)
  ckpt.close()
  writer.close()
  return last_eval


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
