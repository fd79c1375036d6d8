"""Supervised warm start: RL from a random policy earns no reward, so the default recipe first
trains the policy on (prompt, answer) pairs until held-out greedy accuracy crosses a threshold.

The jump in accuracy is sharp, so training stops on the threshold, not a step count. The result is
cached under a fingerprint of everything that determines it (model, data, warm-start settings,
seed) and reused by every later run that shares it (e.g. all arms of a protocol). The cache is a
checkpoint (rljax.train.checkpoint) read as a resume reads one, checked against its manifest; a
damaged cache is set aside with one warning line and trained again.
"""
import functools
import hashlib
import json
import math
import os
import time
from typing import NamedTuple

from absl import logging
import jax
import ml_collections
import numpy as np

from rljax.data import sources as data
from rljax import losses
from rljax.model import transformer as model_lib
from rljax import optim
from rljax import sharding
from rljax.train import checkpoint
from rljax.train import upgrades
from rljax import update


class SupervisedBatch(NamedTuple):
  tokens_BxS: jax.Array
  valid_BxS: jax.Array
  weights_BxS: jax.Array   # weight of the NEXT-token loss at each position (last column 0)

  def normalized(self):
    """Loss-mask weights -> token-mean weights over the GLOBAL batch (inside jit)."""
    return self._replace(weights_BxS=losses.token_weights(self.weights_BxS, 'token-mean'))


def seed(config):
  """warmstart.seed when pinned (>= 0), else the run's seed."""
  pinned = config.warmstart.seed
  return pinned if pinned >= 0 else config.seed


def _data_fingerprint(data):
  """The data fields that determine a warm start. dir: where, not what; extra_test: held-out
  problems drawn after the train split, which leave the training data the same."""
  return upgrades.data_fingerprint({k: v for k, v in data.items()
                                    if k not in ('dir', 'extra_test')})


def fingerprint(config):
  # max_seq_len is a bound, not the model; lora how RL trains it (LoRA and full fine-tuning runs
  # start from one warm start)
  model = {k: v for k, v in config.model.items() if k not in ('max_seq_len', 'lora')}
  relevant = dict(model=model, seed=seed(config), data=_data_fingerprint(config.data),
                  warmstart={k: v for k, v in config.warmstart.items() if k not in ('dir', 'seed')})
  return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def supervised_batch(prompts, answers, tokenizer, prompt_len, seq_len, env=None):
  """Fixed-width [prompt | answer EOS | PAD] rows (fixed shapes: one compilation). With an `env`
  that marks its observations in a row (`observation_mask`, as rljax.envs.tools.Tool does),
  answers may demonstrate turns: the observations in them are the environment's, so no loss is
  on them, as none is in RL."""
  tokens_BxS, valid_BxS, loss_mask_BxS = data.encode_supervised(prompts, answers, tokenizer)
  if hasattr(env, 'observation_mask'):
    observed_BxS = np.array([env.observation_mask(row) for row in tokens_BxS], bool)
    loss_mask_BxS[:, :-1] &= ~observed_BxS[:, 1:]
  left = prompt_len - max(len(tokenizer.encode(p)) for p in prompts)
  pad = ((0, 0), (left, seq_len - left - tokens_BxS.shape[1]))
  tokens_BxS = np.pad(tokens_BxS, pad, constant_values=tokenizer.pad_id)
  valid_BxS, loss_mask_BxS = np.pad(valid_BxS, pad), np.pad(loss_mask_BxS, pad)
  return SupervisedBatch(tokens_BxS, valid_BxS, loss_mask_BxS.astype(np.float32))


def make_supervised_loss(model, moe_aux_coef):
  def loss_fn(params, batch):
    logits_BxSxV, _, aux_loss = model.apply({'params': params}, batch.tokens_BxS, batch.valid_BxS)
    logp_BxS = losses.logprobs_from_logits(logits_BxSxV[:, :-1], batch.tokens_BxS[:, 1:])
    nll = -jax.numpy.sum(batch.weights_BxS[:, :-1] * logp_BxS)
    return nll + moe_aux_coef * aux_loss, {'nll': nll}
  return loss_fn


def _cached(path, init_params):
  """(params, info) of the cache at `path` (its newest intact step), or None: no cache, or only
  damaged ones (set aside). A cache an rljax before checkpoint manifests wrote (params/ and
  info.json, written last) is read as it was written, with one warning line, and saved again in
  today's layout."""
  if not os.path.isdir(os.path.join(path, 'checkpoints')):
    return _resaved(path, upgrades.unmanifested_cache(path, init_params))
  reader = checkpoint.Checkpointer(path, read_only=True)
  try:
    return reader.restore(init_params, discard=True)
  finally:
    reader.close()


def _resaved(path, cached):
  """A cache written before manifests, saved again in today's layout, with one warning line."""
  if cached is None:
    return None
  if jax.process_index() == 0:
    print(f'rljax: warning: warm start {path} was written by an rljax before checkpoint '
          'manifests; reusing it and saving it again with one', flush=True)
  _save(path, *cached)
  return cached


def _save(path, params, info):
  cache = checkpoint.Checkpointer(path, every=1, keep=1)   # a step appears only when complete
  cache.save(info['steps'], params, info, force=True)
  cache.close()


def check(ws, process_count):
  """ValueError naming the first bad field of the `warmstart` section (when it is enabled)."""
  if not (isinstance(ws.lr, (int, float)) and math.isfinite(ws.lr) and ws.lr > 0):
    raise ValueError(f'warmstart.lr must be a positive number, got {ws.lr!r}')
  if not 0 <= ws.threshold <= 1:
    raise ValueError(f'warmstart.threshold (an accuracy) must be in [0, 1], got {ws.threshold}')
  if ws.batch < 1 or ws.eval_every < 1 or not 0 <= ws.min_steps <= ws.max_steps:
    raise ValueError(f'warmstart needs batch >= 1, eval_every >= 1 and 0 <= min_steps <= '
                     f'max_steps; got {ws.batch}, {ws.eval_every}, {ws.min_steps}, {ws.max_steps}')
  if ws.seed < -1:
    raise ValueError(f"warmstart.seed must be >= 0, or -1 for the run's, got {ws.seed}")
  if ws.batch % process_count:
    raise ValueError(f'warmstart.batch ({ws.batch}) is not divisible by the {process_count} '
                     'processes (each reads its own slice of the prompts)')


def cache_path(config, cache_dir):
  """Where `config`'s warm start is cached under `cache_dir`."""
  return os.path.abspath(os.path.join(cache_dir, f'warmstart-{fingerprint(config)}'))


def is_cached(config, cache_dir):
  """Whether a finished warm start of `config` waits under `cache_dir` (a step saved, not read)."""
  checkpoints = os.path.join(cache_path(config, cache_dir), 'checkpoints')
  return os.path.isdir(checkpoints) and any(name.isdigit() for name in os.listdir(checkpoints))


def warm_start(config, model, init_params, tokenizer, source, evaluate, cache_dir, prompt_len,
               seq_len, mesh, env=None, demonstration=None):
  """Returns (params, info): restored from the cache, or trained now and cached. `env`: the
  task's, whose observations in demonstrations are not trained on (`supervised_batch`).
  `demonstration`: the task's text to imitate for an answer (rljax.tasks), if not the answer."""
  ws = config.warmstart
  path = cache_path(config, cache_dir)
  cached = _cached(path, init_params)
  if cached:
    logging.info('warm start: reusing %s (accuracy %.3f)', path, cached[1]['accuracy'])
    return cached

  optimizer, _ = optim.make_optimizer(ml_collections.ConfigDict(dict(
      lr=ws.lr, base_batch=ws.batch, lr_rule='constant', warmup_steps=0, decay='constant',
      max_grad_norm=1.0, clip_rule='constant', b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0,
      max_bad_steps=5)),
      ws.batch)
  loss_fn = make_supervised_loss(model, config[config.algo].moe_aux_coef)
  step_fn = sharding.on_mesh(jax.jit(
      lambda p, s, b: update.apply_update(loss_fn, optimizer, p, s, b.normalized(), 1),
      donate_argnums=(0, 1)),
                             mesh)
  if seed(config) != config.seed:  # pinned: the start must not depend on the run's own seed
    init_params, _ = sharding.init_params(
        functools.partial(model_lib.init_params, model.cfg),
        jax.random.split(jax.random.PRNGKey(seed(config)))[0], mesh)
  params = init_params
  opt_state = sharding.init_optimizer(optimizer, params, mesh)
  iterator = data.PromptIterator(source, ws.batch, seed=seed(config) + 7919,
                                 process_index=jax.process_index(),
                                 process_count=jax.process_count(), tokenizer=tokenizer)
  start, accuracy, step = time.time(), 0.0, 0
  for step in range(1, ws.max_steps + 1):
    examples = next(iterator)
    answers = list(map(demonstration or str, examples['answer']))
    batch = sharding.put_batch(supervised_batch(examples['prompt'], answers, tokenizer,
                                                prompt_len, seq_len, env), mesh)
    params, opt_state, metrics = step_fn(params, opt_state, batch)
    if step >= ws.min_steps and step % ws.eval_every == 0:
      accuracy, _ = evaluate(params)
      print(f"warm start step {step} | nll {float(metrics['nll']):.3f} | eval accuracy "
            f'{accuracy:.3f}', flush=True)
      if accuracy >= ws.threshold:
        break
  info = dict(steps=step, accuracy=accuracy, seconds=time.time() - start, fingerprint=path)
  if accuracy < ws.threshold:
    logging.warning('warm start reached only %.3f < threshold %.3f after %d steps',
                    accuracy, ws.threshold, step)
  _save(path, params, info)
  return params, info
