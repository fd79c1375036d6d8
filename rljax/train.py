"""The RL loop: rollout -> reward -> advantages -> update, on one set of parameter arrays.

One step: P prompts, G sampled responses each (GRPO: the batch unit is P x G responses; PPO: P = B,
G = 1); rewards from a verifier; advantages and the update from the algorithm (rljax.grpo: group
z-scores; rljax.ppo: critic values, GAE and a critic update); by default ONE global optimizer update
per rollout batch (as in the paper), with gradients accumulated over micro-batches so memory stays
flat as the batch grows.
"""
import os
import time

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rljax import checkpoint
from rljax import config_checks
from rljax import data
from rljax import evaluation
from rljax import grpo
from rljax import metrics as metrics_lib
from rljax import model as model_lib
from rljax import ppo
from rljax import rewards
from rljax import sampler as sampler_lib
from rljax import tokenizer as tokenizer_lib
from rljax import update
from rljax import warmstart


def task_lengths(data_cfg):
  """(prompt tokens, max response tokens incl. the end token) of the arithmetic task."""
  prompt_len = 2 * data_cfg.digits + 2
  answer_len = 2 * data_cfg.digits if '*' in data_cfg.ops else data_cfg.digits + 1
  answer_len += '-' in data_cfg.ops
  return prompt_len, answer_len + 1


def train(config, workdir):
  """Trains one configuration in `workdir`; resumes from its latest checkpoint. Returns last eval."""
  config_checks.check(config)
  os.makedirs(workdir, exist_ok=True)
  is_logger = jax.process_index() == 0

  # ------------------------------------------------------------------ task, model, evaluation
  tokenizer = tokenizer_lib.ArithmeticTokenizer()
  dcfg = config.data
  data_dir = dcfg.dir or os.path.expanduser('~/.cache/rljax/datasets')
  knobs = dict(digits=dcfg.digits, ops=dcfg.ops, zero_pad=dcfg.zero_pad, num_train=dcfg.num_train,
               num_test=dcfg.num_test, seed=dcfg.seed)
  train_source = data.load_split(data_dir, split='train', **knobs)
  test_source = data.load_split(data_dir, split='test', **knobs)
  prompt_len, max_new_tokens = task_lengths(dcfg)
  max_new_tokens = config.rollout.max_new_tokens or max_new_tokens
  reward_fn = rewards.get_reward_fn(config.reward)

  model_cfg = model_lib.ModelConfig.from_config(config.model)
  model = model_lib.Transformer(model_cfg)
  eval_prompts, eval_answers = data.eval_set(test_source, config.train.eval_size)
  evaluate = evaluation.make_evaluator(model, tokenizer, eval_prompts, eval_answers, reward_fn,
                                       prompt_len, max_new_tokens)
  rng = jax.random.PRNGKey(config.seed)
  init_rng, rollout_rng = jax.random.split(rng)
  params = nn.unbox(model_lib.init_params(model_cfg, init_rng))
  if config.warmstart.enabled:
    params, _ = warmstart.warm_start(config, model, params, tokenizer, train_source, evaluate,
                                     config.warmstart.dir or workdir, prompt_len,
                                     prompt_len + max_new_tokens)

  # ------------------------------------------------------------------ algorithm and jitted steps
  P, G = config.rollout.P, config.rollout.G   # PPO: P = B prompts, G = 1
  batch_size = P * G
  sample = sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
      max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id,
      temperature=config.rollout.temperature, top_k=config.rollout.top_k,
      top_p=config.rollout.top_p))
  num_minibatches = config.train.num_minibatches
  minibatch_size = batch_size // num_minibatches
  num_micro = minibatch_size // (config.train.micro_batch or minibatch_size)
  if config.algo == 'ppo':
    algo = ppo.make(config, model, params, num_micro, jax.random.fold_in(init_rng, 1))
  else:
    algo = grpo.make(config, model, params, num_micro)
  # A copy: the update donates the policy's buffers.
  ref_params = jax.tree.map(jnp.copy, params) if algo.needs_reference else None
  state = algo.state

  # ------------------------------------------------------------------ resume
  writer = metrics_lib.MetricsWriter(workdir, enabled=is_logger)
  ckpt = checkpoint.Checkpointer(workdir, config.train.checkpoint_every,
                                 config.train.keep_checkpoints)
  restored = ckpt.restore(state)
  if restored:
    state, meta = restored
    writer.truncate_after(meta['step'])
    logging.info('resumed from step %d (%d samples)', meta['step'], meta['samples'])
  else:
    meta = dict(step=0, samples=0, tokens=0, wallclock_s=0.0, data=None, eval_accuracy=None)
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
  while not done():
    step += 1
    step_start = time.perf_counter()
    examples = next(iterator)
    prompts = [p for p in examples['prompt'] for _ in range(G)]   # group-major rows
    answers = [a for a in examples['answer'] for _ in range(G)]
    prompt_BxT, valid_BxT = data.encode_prompts(prompts, tokenizer, prompt_len)
    rollout = sample(state['params'], prompt_BxT, valid_BxT, jax.random.fold_in(rollout_rng, step))
    response_tokens = np.asarray(rollout.tokens_BxL)   # the verifier needs text: one host copy
    rollout_time = time.perf_counter() - step_start

    reward_start = time.perf_counter()
    rewards_B, reward_failures = rewards.score_batch(
        reward_fn, evaluation.decode_responses(tokenizer, response_tokens), answers)
    batch, batch_stats = algo.make_batch(state, rollout, rewards_B, prompt_BxT, valid_BxT,
                                         ref_params)
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

    batch_stats = jax.device_get(batch_stats)
    retained = int(batch_stats.pop('retained'))
    samples += retained
    tokens += int(np.asarray(rollout.lengths_B).sum())
    first = step_metrics[0]   # computed before any update of this step: the on-policy numbers
    row = dict(step=step, samples=samples, tokens=tokens, reward_mean=float(rewards_B.mean()),
               reward_std=float(rewards_B.std()),
               grad_norm=float(np.mean([m['grad_norm'] for m in step_metrics])),
               step_time_s=step_time, rollout_time_s=rollout_time, reward_time_s=reward_time,
               update_time_s=update_time, wallclock_s=wallclock, samples_per_s=batch_size / step_time,
               logprob_mismatch=first['logprob_mismatch'], entropy=first['entropy'],
               clipfrac=first['clipfrac'], pg_loss=first['pg_loss'], approx_kl=first['approx_kl'],
               moe_aux_loss=first['moe_aux_loss'], response_len_mean=float(np.mean(rollout.lengths_B)),
               retained=retained,
               reward_failures=reward_failures, skipped_updates=int(sum(m['skipped'] for m in step_metrics)),
               data_skipped=iterator.skipped)
    for key, schedule in algo.schedules.items():
      row[key] = float(schedule((step - 1) * len(step_metrics)))
    row.update({key: float(value) for key, value in batch_stats.items()})
    for key in ('kl', 'grad_sq_small', 'grad_sq_big', 'b_small', 'b_big') + algo.logged:
      if key in first:
        row[key] = float(np.mean([m[key] for m in step_metrics]))
    writer.train(row, console=step % config.train.log_every == 0)
    bad_steps = max(int(state[key].notfinite_count) for key in state if key.endswith('opt_state'))
    if bad_steps >= config.optimizer.max_bad_steps:
      raise FloatingPointError(
          f'{config.optimizer.max_bad_steps} non-finite updates in a row at step {step}; stopping. '
          f'The last good checkpoint is step {ckpt.latest_step()} in {workdir}/checkpoints.')

    if step % config.train.eval_every == 0 or done():
      last_eval, correct = evaluate(state['params'])
      writer.eval(step, samples, last_eval, correct, wallclock)
    meta = dict(step=step, samples=samples, tokens=tokens, wallclock_s=wallclock,
                data=iterator.state(), eval_accuracy=last_eval)
    ckpt.save(step, state, meta, force=done())
  ckpt.close()
  return last_eval

