"""What a training run holds from its first step to its last, built (or restored) before the
first step: the mesh, task, model, sampler, evaluator, algorithm, logs and checkpoints.

`setup` validates the config first: bad input raises ValueError before anything compiles. The
memory a run will need per device is said before that, by the main's pre-flight
(rljax.aot.planner.preflight). Both, and `python -m rljax.plan`, start from `abstract_setup`: the
same model config, lengths, batch and algorithm state, so what is planned is what is trained.
"""
import functools
from typing import Any, Callable, NamedTuple

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from rljax import algos
from rljax.data import sources as data
from rljax.hf import checkpoint as hf
from rljax.model import transformer as model_lib
from rljax.rollout import partial as partial_lib
from rljax.rollout import sampler as sampler_lib
from rljax import sharding
from rljax import tasks
from rljax.train import checkpoint
from rljax.train import config_checks
from rljax.train import evaluation
from rljax.train import metrics as metrics_lib
from rljax.train import warmstart
from rljax.train import workdir as workdir_lib


class Run(NamedTuple):
  """What stays fixed through a run. Checkpoints hold the rest (the carry, see `setup`)."""
  config: Any
  mesh: jax.sharding.Mesh
  algo: algos.Algorithm
  sample: Callable      # (params, prompt_PxT, valid_PxT, rng) -> sampler.Rollout of P x group
  group: int            # responses the sampler makes per prompt row (`sampler_group`)
  evaluate: Callable    # params -> (accuracy, correct_M)
  task: tasks.Task
  prompt_len: int
  iterator: data.PromptIterator
  writer: metrics_lib.MetricsWriter
  ckpt: checkpoint.Checkpointer
  nan_steps: frozenset  # fault injection (debug.nan_steps): steps whose batch is made NaN
  partial: Any = None   # PartialRollouts when rollout.partial, else None
  rollout_mesh: Any = None   # the sampler's mesh: `mesh`, or its own devices (rollout.devices)
  to_sampler: Callable = None   # params -> the same params laid out on `rollout_mesh`


class PartialRollouts(NamedTuple):
  """rollout.partial's jitted programs (rljax.rollout.partial); the pool rides in the carry."""
  admit: Callable     # (flight, prompt_PxT, valid_PxT, answer_PxW, keys_Nx2, caps_N) -> flight
  advance: Callable   # (params, flight, version, max_staleness) -> (flight, Finished)


ANSWER_BYTES = 256   # an answer's room in the pool (utf-8); a longer one stops the run clearly


def make_partial(config, model, sampling, prompt_len, mesh):
  """The programs and the empty pool (two batches of groups) of rollout.partial."""
  rollout = config.rollout
  flight = partial_lib.empty(model.cfg, 2 * rollout.P, rollout.G, rollout.slots, prompt_len,
                             sampling.max_new_tokens, ANSWER_BYTES, sampling.pad_id)
  admit = jax.jit(functools.partial(partial_lib.admit, pad_id=sampling.pad_id), donate_argnums=0)
  advance = jax.jit(functools.partial(partial_lib.advance, model, cfg=sampling,
                                      num_groups=rollout.P), donate_argnums=1)
  programs = PartialRollouts(sharding.on_mesh(admit, mesh), sharding.on_mesh(advance, mesh))
  return programs, sharding.place(flight, mesh)


def empty_pending(sample, params, P, group, G, prompt_len, rollout_mesh):
  """rollout.devices: the batch drawn one step ahead (`rljax.train.loop.overlapped_rollout`), as
  zeros laid out where the sampler leaves it: what a checkpoint restores it into."""
  prompt = jax.ShapeDtypeStruct((P * G // group, prompt_len), jnp.int32)
  valid = jax.ShapeDtypeStruct(prompt.shape, jnp.bool_)
  with jax.set_mesh(rollout_mesh):
    rollout = jax.eval_shape(sample, params, prompt, valid, jax.random.PRNGKey(0))
  pending = dict(rollout=rollout, prompt_BxT=jax.ShapeDtypeStruct((P * G, prompt_len), jnp.int32),
                 valid_BxT=jax.ShapeDtypeStruct((P * G, prompt_len), jnp.bool_),
                 answer_PxW=jax.ShapeDtypeStruct((P, ANSWER_BYTES), jnp.uint8))
  zeros = lambda x: jax.device_put(np.zeros(x.shape, x.dtype),
                                   sharding.batch_sharding(rollout_mesh, x.ndim))
  return jax.tree.map(zeros, pending)


def check(config):
  """ValueError naming the first bad field of a config about to be trained."""
  config_checks.check(config)
  tasks.check(config)


class Shape(NamedTuple):
  """A run of a config on a mesh with every array abstract (ShapeDtypeStructs that carry their
  shardings): what the pre-flight sizes and rljax.plan compiles."""
  config: Any
  model: model_lib.Transformer
  mesh: jax.sharding.Mesh
  algo: algos.Algorithm   # algo.state: abstract, laid out as training lays it out
  prompt_len: int
  new_tokens: int
  batch: int              # responses per rollout batch
  micro: int              # responses per micro-batch of the update
  rollout_mesh: jax.sharding.Mesh = None   # the sampler's: `mesh`, or devices of its own
  sampler_params: Any = None   # the policy as the sampler holds it (abstract)


def sampler_group(config, mesh):
  """Responses per prompt the sampler makes from one prefill of it: rollout.G when the P prompt
  rows split evenly over the data-parallel devices, else 1 (the prompts repeated G times)."""
  if config.rollout.P % sharding.data_parallel_size(mesh):
    return 1
  return config.rollout.G


def abstract_setup(config, mesh, rollout_mesh=None):
  """`config` (already checked) on `mesh` (and the sampler on `rollout_mesh`, default `mesh`),
  allocating nothing: the model (a Hugging Face config or a preset), the task's lengths, the
  batch and the algorithm's state and shardings."""
  model, prompt_len, new_tokens = _model_and_task(config)
  rng = jax.random.PRNGKey(config.seed)
  init_fn = functools.partial(model_lib.init_params, model.cfg)
  params, _ = sharding.init_params(init_fn, rng, mesh, abstract_only=True)
  algo = algos.get(config.algo).make(config, model, params, mesh, jax.random.fold_in(rng, 1))
  batch = algos.batch_size(config)
  micro = config.train.micro_batch or batch // config.train.num_minibatches
  rollout_mesh = mesh if rollout_mesh is None else rollout_mesh
  sampler_params = (params if rollout_mesh is mesh else
                    sharding.init_params(init_fn, rng, rollout_mesh, abstract_only=True)[0])
  return Shape(config, model, mesh, algo, prompt_len, new_tokens, batch, micro, rollout_mesh,
               sampler_params)


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


def jit_schedules(algo):
  """`algo` with its schedules jitted: the loop evaluates them every step."""
  return algo._replace(schedules={k: jax.jit(s) for k, s in algo.schedules.items()})


def make_iterator(config, task, state, P=None):
  """The train prompts in batches of P (default rollout.P), from iterator state `state`."""
  return data.PromptIterator(
      task.train_source, P or config.rollout.P, seed=config.seed,
      process_index=jax.process_index(), process_count=jax.process_count(), state=state,
      tokenizer=task.tokenizer, on_bad_record=config.data.on_bad_record)


def at_batch(run, base_config, P, programs, data_state):
  """`run` at batch P (config.auto_batch): its config, algorithm and prompt iterator. The
  algorithm's jitted programs are built once per batch and kept in `programs` ({P: (config,
  algo)}), so each batch compiles once; its optimizer has the lr rule at the new batch, and the
  state it updates (the carry, Adam's moments included) goes on unchanged."""
  if P not in programs:
    config = algos.with_batch(base_config, P)
    programs[P] = config, jit_schedules(abstract_setup(config, run.mesh).algo)
  config, algo = programs[P]
  return run._replace(config=config, algo=algo,
                      iterator=make_iterator(config, run.task, data_state))


def setup(config, workdir):
  """Validates `config`, builds the run and restores its latest checkpoint: (run, carry, meta).

  The carry is what checkpoints hold: the algorithm's state plus the rollout key (`rng`) and the
  frozen reference policy (`reference`, when the algorithm uses one). Bad input raises ValueError
  before anything is compiled.
  """
  check(config)
  mesh, rollout_mesh = sharding.make_meshes(config.mesh, config.rollout.get('devices', 0))
  shape = abstract_setup(config, mesh, rollout_mesh)   # what the pre-flight sized
  model, prompt_len, max_new_tokens = shape.model, shape.prompt_len, shape.new_tokens
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
  group = sampler_group(config, rollout_mesh)
  sampling = sampler_lib.SamplingConfig(
      max_new_tokens=max_new_tokens, eos_id=task.tokenizer.eos_id, pad_id=task.tokenizer.pad_id,
      temperature=config.rollout.temperature, top_k=config.rollout.top_k,
      top_p=config.rollout.top_p, slots=config.rollout.slots, group=group)
  sampler = sampler_lib.make_sampler(model, sampling)
  sample = sharding.on_mesh(sampler, rollout_mesh)
  algo = algos.get(config.algo).make(config, model, params, mesh, jax.random.fold_in(init_rng, 1))
  algo = jit_schedules(algo)
  carry = dict(algo.state, rng=sharding.place(rollout_rng, mesh))
  partial = None
  if config.rollout.get('partial', False):
    partial, carry['flight'] = make_partial(config, model, sampling, prompt_len, mesh)
  to_sampler = lambda params: params
  if rollout_mesh is not mesh:
    to_sampler = functools.partial(  # once per step: the policy in the sampler's layout
        jax.device_put, device=jax.tree.map(lambda x: x.sharding, shape.sampler_params))
    carry['pending'] = empty_pending(sampler, shape.sampler_params, config.rollout.P, group,
                                     config.rollout.G, prompt_len, rollout_mesh)
  if algo.needs_reference:   # a copy: the update donates the policy's buffers
    carry['reference'] = jax.tree.map(jnp.copy, params)
  writer = metrics_lib.writer_from_config(config, workdir, jax.process_index() == 0)
  ckpt = checkpoint.Checkpointer(workdir, config.train.checkpoint_every,
                                 config.train.keep_checkpoints)
  if meta is None:
    writer.truncate_after(-1)   # rows of an attempt killed before its first checkpoint
    meta = dict(step=0, samples=0, tokens=0, wallclock_s=0.0, data=None, eval_accuracy=None)
  else:
    carry, meta = ckpt.restore(carry)   # the newest intact step
    writer.truncate_after(meta['step'])
    logging.info('resumed from step %d (%d samples)', meta['step'], meta['samples'])
  workdir_lib.claim(workdir, config)
  # config.auto_batch may have left the run at another batch (rljax.train.rebatch)
  iterator = make_iterator(config, task, meta['data'], meta.get('auto_batch', {}).get('P'))
  nan_steps = config_checks.step_set(config.debug.nan_steps) if 'debug' in config else set()
  run = Run(config, mesh, algo, sample, group, evaluate, task, prompt_len, iterator, writer, ckpt,
            frozenset(nan_steps), partial, rollout_mesh, to_sampler)
  return run, carry, meta
