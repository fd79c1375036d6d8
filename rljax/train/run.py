"""What a training run holds from its first step to its last, built (or restored) before the
first step: the mesh, task, model, rollout schedule, evaluator, algorithm, logs and checkpoints.

`setup` validates the config first: bad input raises ValueError before anything compiles. The
memory a run will need per device is said before that, by the main's pre-flight
(rljax.aot.planner.preflight). Both, and `python -m rljax.plan`, start from `abstract_setup`: the
same model config, lengths, batch, sampler settings and algorithm state; the run's programs come
from rljax.train.programs, which the planner compiles, so what is planned is what is trained.
"""
import functools
from typing import Any, Callable, NamedTuple

from absl import logging
import jax
import jax.numpy as jnp

from rljax import algos
from rljax.data import sources as data
from rljax.hf import checkpoint as hf
from rljax.model import transformer as model_lib
from rljax.rollout import sampler as sampler_lib
from rljax import sharding
from rljax import tasks
from rljax.train import checkpoint
from rljax.train import config_checks
from rljax.train import evaluation
from rljax.train import metrics as metrics_lib
from rljax.train import programs as programs_lib
from rljax.train import schedules
from rljax.train import upgrades
from rljax.train import warmstart
from rljax.train import workdir as workdir_lib


class Run(NamedTuple):
  """What stays fixed through a run. Checkpoints hold the rest (the carry, see `setup`)."""
  config: Any
  mesh: jax.sharding.Mesh
  algo: algos.Algorithm
  batch: int            # responses per rollout batch (P x G): P=auto moves it with config and algo
  schedule: Any         # the rollout schedule (rljax.train.schedules): its `draw` makes a batch
  evaluate: Callable    # params -> (accuracy, correct_M)
  task: tasks.Task
  iterator: data.PromptIterator
  writer: metrics_lib.MetricsWriter
  ckpt: checkpoint.Checkpointer
  nan_steps: frozenset  # fault injection (debug.nan_steps): steps whose batch is made NaN


class Shape(NamedTuple):
  """A run of a config on a mesh with every array abstract (ShapeDtypeStructs that carry their
  shardings): what the pre-flight sizes and rljax.train.programs makes the run's programs of."""
  config: Any
  model: model_lib.Transformer
  mesh: jax.sharding.Mesh
  algo: algos.Algorithm   # algo.state: abstract, laid out as training lays it out
  params: Any             # the policy's params as the sampler and evaluator take them (abstract)
  prompt_len: int
  new_tokens: int
  batch: int              # responses per rollout batch
  micro: int              # responses per micro-batch of the update
  rollout_mesh: jax.sharding.Mesh   # the sampler's: `mesh`, or devices of its own
  sampler_params: Any     # the policy as the sampler holds it (abstract)
  sampling: sampler_lib.SamplingConfig   # the rollout's (the run's own tokenizer ids in `setup`)
  env: Any = None         # the task's environment (rljax.envs): multi-turn rollouts


def abstract_setup(config, mesh, rollout_mesh=None):
  """`config` (already checked) on `mesh` (and the sampler on `rollout_mesh`, default `mesh`),
  allocating nothing: the model (a Hugging Face config or a preset), the task's lengths, the
  batch and the algorithm's state and shardings."""
  model, prompt_len, new_tokens = _model_and_task(config)
  rng = jax.random.PRNGKey(config.seed)
  init_fn = functools.partial(model_lib.init_params, model.cfg)
  params, _ = sharding.init_params(init_fn, rng, mesh, abstract_only=True)
  algo = make_algorithm(config, model, params, mesh, rng)
  batch = algo.batch
  micro = config.train.micro_batch or batch // config.train.num_minibatches
  rollout_mesh = mesh if rollout_mesh is None else rollout_mesh
  sampler_params = (params if rollout_mesh is mesh else
                    sharding.init_params(init_fn, rng, rollout_mesh, abstract_only=True)[0])
  sampling = schedules.sampling_config(config, new_tokens,
                                       schedules.sampler_group(config, rollout_mesh))
  return Shape(config, model, mesh, algo, params, prompt_len, new_tokens, batch, micro,
               rollout_mesh, sampler_params, sampling, tasks.env(config))


def make_algorithm(config, model, params, mesh, rng):
  """The config's algorithm (rljax.algos.<algo>) over `params`, with its own key from `rng`."""
  return algos.get(config.algo).make(config, model, params, mesh, jax.random.fold_in(rng, 1))


def _model_and_task(config):
  """The policy's model, the task and the lengths, checked against each other before building."""
  model_cfg = hf.policy_config(config)
  prompt_len, task_new_tokens, vocab_size = tasks.lengths(config)
  max_new_tokens = config.rollout.max_new_tokens or task_new_tokens
  config_checks.check_lengths(prompt_len, max_new_tokens, model_cfg, vocab_size)
  return model_lib.Transformer(model_cfg), prompt_len, max_new_tokens


def _initial_params(config, model, task, evaluate, rng, mesh, workdir, lengths):
  """The policy to start from: a Hugging Face checkpoint, or a random init and the warm start."""
  hf_path = config.init.hf_path
  init_fn = functools.partial(model_lib.init_params, model.cfg)
  if hf_path:   # each tensor read straight onto its shards; no warm start
    shardings = sharding.param_shardings(jax.eval_shape(init_fn, rng), mesh)
    return hf.load_params(hf_path, model.cfg, shardings)
  params, _ = sharding.init_params(init_fn, rng, mesh)
  if config.warmstart.enabled:
    params, _ = warmstart.warm_start(config, model, params, task.tokenizer, task.train_source,
                                     evaluate, config.warmstart.dir or workdir, *lengths, mesh,
                                     task.env, task.demonstration)
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


def checked_shape(config, devices=None):
  """`config` checked (ValueError naming the first bad field), then its `abstract_setup` on the
  meshes it asks for over `devices` (default: all): what the pre-flight sizes and `setup` builds."""
  config_checks.check(config)
  tasks.check_needs(config)
  return abstract_setup(config, *sharding.make_meshes(config.mesh, config.rollout.devices,
                                                      devices))


def setup(config, workdir, shape=None):
  """Validates `config`, builds the run and restores its latest checkpoint: (run, carry, meta).
  `shape`: `checked_shape(config)` when the caller has it already (the main's pre-flight).

  The carry is what checkpoints hold, in named slots: `algo` (the algorithm's state), `rollout`
  (the schedule's: None, the partial pool or the batch drawn ahead), `rng` (the rollout key) and
  `reference` (the frozen reference policy, or None; with LoRA the frozen base, which checkpoints
  leave out: `checkpointed`). Bad input raises ValueError before anything is compiled.
  """
  shape = shape or checked_shape(config)
  meta = workdir_lib.prepare(workdir, config)   # None: a fresh run
  try:
    task = tasks.make_task(config)
  except OSError as error:
    raise ValueError(f'cannot build or read the dataset: {error}') from None
  config_checks.check_vocabulary(shape.model.cfg, task.tokenizer.vocab_size)
  shape = shape._replace(sampling=schedules.sampling_config(
      config, shape.new_tokens, shape.sampling.group, task.tokenizer.eos_id,
      task.tokenizer.pad_id))
  progs = programs_lib.programs(shape)
  eval_set = data.eval_set(task.test_source, config.train.eval_size)
  evaluate = evaluation.make_evaluator(progs['evaluate'].fn, task.tokenizer, *eval_set,
                                       task.reward_fn, shape.prompt_len, shape.mesh)
  algo, carry = _initial_carry(config, shape, progs, task, evaluate, workdir, meta)
  writer = metrics_lib.writer_from_config(config, workdir, jax.process_index() == 0)
  ckpt = checkpoint.Checkpointer(workdir, config.train.checkpoint_every,
                                 config.train.keep_checkpoints)
  schedule = _schedule(config, shape, progs, task)
  carry['rollout'] = schedule.init()
  if meta is None:
    writer.truncate_after(-1)   # rows of an attempt killed before its first checkpoint
    meta = dict(step=0, samples=0, tokens=0, wallclock_s=0.0, data=None, eval_accuracy=None)
  else:
    carry, meta = _restore(ckpt, carry, schedule, algo)
    writer.truncate_after(meta['step'])
  workdir_lib.claim(workdir, config)
  # config.auto_batch may have left the run at another batch (rljax.auto_batch.hook)
  iterator = make_iterator(config, task, meta['data'], meta.get('auto_batch', {}).get('P'))
  nan_steps = config_checks.step_set(config.debug.nan_steps)
  run = Run(config, shape.mesh, algo, shape.batch, schedule, evaluate, task, iterator, writer, ckpt,
            frozenset(nan_steps))
  return run, carry, meta


def _initial_carry(config, s, progs, task, evaluate, workdir, meta):
  """The algorithm (its programs from `progs`) and the carry before any restore. With LoRA the
  base is built as a fresh run builds it (HF import, or init and the cached warm start) on resume
  too: checkpoints hold only the adapters."""
  init_rng, rollout_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  params = (_initial_params(config, s.model, task, evaluate, init_rng, s.mesh, workdir,
                            (s.prompt_len, s.prompt_len + s.new_tokens))
            if meta is None or s.algo.adapts else
            sharding.init_params(functools.partial(model_lib.init_params, s.model.cfg), init_rng,
                                 s.mesh)[0])   # a template: the checkpoint's values replace it
  algo = make_algorithm(config, s.model, params, s.mesh, init_rng)
  algo = jit_schedules(algo._replace(make_batch=progs['make_batch'].fn,
                                     update=progs['update'].fn))
  # A copy of the initial policy: the update donates the policy's buffers. LoRA's base is never
  # donated (the update trains the adapters), so it is its own reference.
  reference = (params if algo.adapts else
               jax.tree.map(jnp.copy, params) if algo.needs_reference else None)
  return algo, dict(algo=algo.state, rollout=None, rng=sharding.place(rollout_rng, s.mesh),
                    reference=reference)


def checkpointed(algo, carry):
  """What a checkpoint holds of `carry`: all of it, less LoRA's base (rebuilt on resume)."""
  return dict(carry, reference=None) if algo.adapts else carry


def _schedule(config, s, progs, task):
  """The rollout schedule, sampling on the sampler's mesh."""
  sample = progs['sample'].fn if 'sample' in progs else None
  sampler = schedules.Sampler(sample, s.sampling, config.rollout.G, task.tokenizer, s.prompt_len,
                              s.rollout_mesh)
  to_sampler = functools.partial(  # once per step: the policy in the sampler's layout
      sharding.move, shardings=jax.tree.map(lambda x: x.sharding, s.sampler_params))
  return schedules.make(config, s, sampler, progs, to_sampler)


def _restore(ckpt, carry, schedule, algo):
  """(carry, meta) of the newest intact checkpoint: in the carry's named slots, or in the flat
  layout of checkpoints written before them (converted). LoRA's base comes from `carry`."""
  template = checkpointed(algo, carry)
  legacy = (upgrades.flat_carry(template, schedule),
            lambda old, meta: upgrades.from_flat_carry(old, meta, template, schedule))
  restored, meta = ckpt.restore(template, legacy=legacy)
  carry = dict(restored, reference=carry['reference']) if algo.adapts else restored
  answers = meta.get('answers', schedule.answers)
  schedule.restore(answers, upgrades.held_prompt_ids(meta, answers))
  logging.info('resumed from step %d (%d samples)', meta['step'], meta['samples'])
  return carry, meta
