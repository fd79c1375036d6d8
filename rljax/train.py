"""The RL loop: rollout -> reward -> advantages -> update, on one set of parameter arrays.

One GRPO step: P prompts, G sampled responses each (the batch unit is P x G responses); rewards
from a verifier; group z-score advantages; by default ONE global optimizer update per rollout batch
(as in the paper), with gradients accumulated over micro-batches so memory stays flat as P grows.
"""
import collections
import functools
import os
import time

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rljax import analysis
from rljax import checkpoint
from rljax import config_checks
from rljax import data
from rljax import evaluation
from rljax import losses
from rljax import metrics as metrics_lib
from rljax import model as model_lib
from rljax import optim
from rljax import policy_loss
from rljax import rewards
from rljax import sampler as sampler_lib
from rljax import tokenizer as tokenizer_lib
from rljax import update
from rljax import warmstart


NOISE_KEYS = ('grad_sq_small', 'grad_sq_big', 'b_small', 'b_big')
NOISE_SCALE_STEPS = 50   # the logged noise_scale averages its terms over this many recent steps


def task_lengths(data_cfg):
  """(prompt tokens, max response tokens incl. the end token) of the arithmetic task."""
  prompt_len = 2 * data_cfg.digits + 2
  answer_len = 2 * data_cfg.digits if '*' in data_cfg.ops else data_cfg.digits + 1
  answer_len += '-' in data_cfg.ops
  return prompt_len, answer_len + 1


def group_batch(rollout, rewards_B, prompt_BxT, valid_BxT, G, grpo_cfg):
  """GRPO advantages over groups of G consecutive rows; zero-variance groups optionally dropped."""
  rewards_PxG = rewards_B.reshape(-1, G)
  advantages_B = losses.group_advantages(rewards_PxG, grpo_cfg.normalize_std).reshape(-1)
  zero_var_P = losses.zero_variance_groups(rewards_PxG)
  keep_B = jnp.repeat(~zero_var_P, G) if grpo_cfg.filter_zero_variance else jnp.ones_like(advantages_B,
                                                                                            bool)
  mask_BxL = (rollout.mask_BxL & keep_B[:, None]).astype(jnp.float32)
  batch = policy_loss.PolicyBatch(
      prompt_BxT=prompt_BxT, prompt_valid_BxT=valid_BxT, response_BxL=rollout.tokens_BxL,
      mask_BxL=mask_BxL, old_logp_BxL=rollout.logp_BxL,
      advantages_BxL=advantages_B[:, None] * mask_BxL, weights_BxL=jnp.zeros_like(mask_BxL))
  stats = dict(zero_variance_frac=jnp.mean(zero_var_P), retained=jnp.sum(keep_B))
  return batch, stats


def policy_update(loss_fn, optimizer, loss_agg, num_micro, params, opt_state, batch, ref_params):
  """Weights from this (mini)batch, then one accumulated gradient step."""
  batch = batch._replace(weights_BxL=losses.token_weights(batch.mask_BxL, loss_agg))
  micro_loss = lambda p, b: loss_fn(p, b, ref_params)
  params, opt_state, metrics = update.apply_update(micro_loss, optimizer, params, opt_state, batch,
                                                   num_micro)
  metrics['logprob_mismatch'] = metrics.pop('logprob_mismatch_sum') / jnp.maximum(
      metrics['num_tokens'], 1)
  return params, opt_state, metrics


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
  ref_params = params if config.grpo.kl_coef else None

  # ------------------------------------------------------------------ optimizer and jitted steps
  P, G = config.rollout.P, config.rollout.G
  batch_size = P * G
  optimizer, schedule = optim.make_optimizer(config.optimizer, batch_size)
  # Committed to the device, like every step's outputs (restored arrays are, fresh ones are not):
  # a mix compiles the sampler and the update twice, for step 1 and again for step 2.
  params = jax.device_put(params, jax.devices()[0])
  opt_state = jax.device_put(optimizer.init(params), jax.devices()[0])
  sample = sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
      max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id,
      temperature=config.rollout.temperature, top_k=config.rollout.top_k,
      top_p=config.rollout.top_p))
  make_batch = jax.jit(functools.partial(group_batch, G=G, grpo_cfg=config.grpo))
  num_minibatches = config.train.num_minibatches
  minibatch_size = batch_size // num_minibatches
  num_micro = minibatch_size // (config.train.micro_batch or minibatch_size)
  loss_fn = policy_loss.make_policy_loss(model, config.grpo, config.rollout.temperature, num_micro)
  update_step = jax.jit(functools.partial(policy_update, loss_fn, optimizer, config.grpo.loss_agg,
                                          num_micro), donate_argnums=(0, 1))

  # ------------------------------------------------------------------ resume
  writer = metrics_lib.MetricsWriter(workdir, enabled=is_logger)
  ckpt = checkpoint.Checkpointer(workdir, config.train.checkpoint_every,
                                 config.train.keep_checkpoints)
  restored = ckpt.restore(dict(params=params, opt_state=opt_state))
  if restored:
    state, meta = restored
    params, opt_state = state['params'], state['opt_state']
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
    last_eval, correct = evaluate(params)
    writer.eval(0, 0, last_eval, correct, 0.0)

  def done():
    budget_spent = ((config.train.max_samples and samples >= config.train.max_samples) or
                    (config.train.max_steps and step >= config.train.max_steps))
    target_hit = config.train.target and last_eval is not None and last_eval >= config.train.target
    return budget_spent or target_hit

  # ------------------------------------------------------------------ the loop
  noise_terms = collections.deque(maxlen=NOISE_SCALE_STEPS)
  while not done():
    step += 1
    step_start = time.perf_counter()
    examples = next(iterator)
    prompts = [p for p in examples['prompt'] for _ in range(G)]   # group-major rows
    answers = [a for a in examples['answer'] for _ in range(G)]
    prompt_BxT, valid_BxT = data.encode_prompts(prompts, tokenizer, prompt_len)
    rollout = sample(params, prompt_BxT, valid_BxT, jax.random.fold_in(rollout_rng, step))
    response_tokens = np.asarray(rollout.tokens_BxL)   # the verifier needs text: one host copy
    rollout_time = time.perf_counter() - step_start

    reward_start = time.perf_counter()
    rewards_B, reward_failures = rewards.score_batch(
        reward_fn, evaluation.decode_responses(tokenizer, response_tokens), answers)
    batch, batch_stats = make_batch(rollout, rewards_B, prompt_BxT, valid_BxT)
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
        params, opt_state, m = update_step(params, opt_state, minibatch, ref_params)
        step_metrics.append(m)
    step_metrics = jax.device_get(step_metrics)
    update_time = time.perf_counter() - update_start
    step_time = time.perf_counter() - step_start
    wallclock += step_time

    retained = int(batch_stats['retained'])
    samples += retained
    tokens += int(np.asarray(rollout.lengths_B).sum())
    first = step_metrics[0]   # computed before any update of this step: the on-policy numbers
    row = dict(step=step, samples=samples, tokens=tokens, reward_mean=float(rewards_B.mean()),
               reward_std=float(rewards_B.std()), lr=float(schedule((step - 1) * len(step_metrics))),
               grad_norm=float(np.mean([m['grad_norm'] for m in step_metrics])),
               step_time_s=step_time, rollout_time_s=rollout_time, reward_time_s=reward_time,
               update_time_s=update_time, wallclock_s=wallclock, samples_per_s=batch_size / step_time,
               logprob_mismatch=first['logprob_mismatch'], entropy=first['entropy'],
               clipfrac=first['clipfrac'], pg_loss=first['pg_loss'], approx_kl=first['approx_kl'],
               moe_aux_loss=first['moe_aux_loss'], response_len_mean=float(np.mean(rollout.lengths_B)),
               zero_variance_frac=float(batch_stats['zero_variance_frac']), retained=retained,
               reward_failures=reward_failures, skipped_updates=int(sum(m['skipped'] for m in step_metrics)),
               data_skipped=iterator.skipped)
    for key in ('kl', 'grad_sq_small', 'grad_sq_big', 'b_small', 'b_big'):
      if key in first:
        row[key] = float(np.mean([m[key] for m in step_metrics]))
    if 'grad_sq_small' in row:  # B_simple over recent steps: one step alone is mostly noise
      noise_terms.append([row[k] for k in NOISE_KEYS])
      noise_scale = analysis.noise_scale(*np.transpose(noise_terms))
      row['noise_scale'] = noise_scale if np.isfinite(noise_scale) else None
    writer.train(row, console=step % config.train.log_every == 0)
    if int(opt_state.notfinite_count) >= config.optimizer.max_bad_steps:
      raise FloatingPointError(
          f'{config.optimizer.max_bad_steps} non-finite updates in a row at step {step}; stopping. '
          f'The last good checkpoint is step {ckpt.latest_step()} in {workdir}/checkpoints.')

    if step % config.train.eval_every == 0 or done():
      last_eval, correct = evaluate(params)
      writer.eval(step, samples, last_eval, correct, wallclock)
    meta = dict(step=step, samples=samples, tokens=tokens, wallclock_s=wallclock,
                data=iterator.state(), eval_accuracy=last_eval)
    ckpt.save(step, dict(params=params, opt_state=opt_state), meta, force=done())
  ckpt.close()
  return last_eval

