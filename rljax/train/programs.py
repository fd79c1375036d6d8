"""Every jitted program of a run, with abstract arguments that carry their shardings: `setup` runs
these programs and `python -m rljax.plan` compiles them (rljax.aot.planner), so what is planned is
what is trained, the rollout schedule's programs, the evaluator and `make_batch` included.
"""
import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from rljax.envs import runner
from rljax.model import router
from rljax.rollout import partial as partial_lib
from rljax.rollout import sampler as sampler_lib
from rljax.rollout import turns
from rljax import sharding
from rljax.train import evaluation
from rljax.train import schedules


class Program(NamedTuple):
  fn: Callable   # jitted, traced under its mesh (sharding.on_mesh): fn(*args), fn.lower(*args)
  args: tuple    # abstract arguments: ShapeDtypeStructs carrying their shardings


def greedy(sampling):
  """The evaluator's sampler settings: the argmax of the raw logits, one response per prompt."""
  return dataclasses.replace(sampling, temperature=1.0, top_k=0, top_p=1.0, greedy=True, group=1)


def programs(s) -> dict:
  """{name: Program} of the run of rljax.train.run.Shape `s`: 'evaluate', 'make_batch', 'update'
  and the rollout schedule's (rljax.train.schedules.Schedule.PROGRAMS): 'sample' (its sampler)
  or 'admit' and 'advance' (the partial pool's, rljax.rollout.partial)."""
  out = dict(evaluate=evaluator(s), **rollout_programs(s))
  out.update(algorithm_programs(s))
  return out


def evaluator(s):
  """Greedy decoding of this process's eval prompts (rljax.train.evaluation) in one call (with a
  environment: one turn loop)."""
  num = evaluation.eval_rows(s.config.train.eval_size, s.mesh)[1]
  if s.env:
    return turn_program(s, greedy(s.sampling), num, s.mesh, s.params)
  fn = sharding.on_mesh(sampler_lib.make_sampler(s.model, greedy(s.sampling)), s.mesh)
  return Program(fn, (s.params, *prompts_and_key(s.mesh, num, s.prompt_len)))


def prompts_and_key(mesh, num, prompt_len):
  """A sampler's abstract arguments after its params: `num` prompt rows, their mask, its key."""
  return (sharding.abstract_rows(mesh, (num, prompt_len)),
          sharding.abstract_rows(mesh, (num, prompt_len), bool), sharding.abstract_key(mesh))


def rollout_programs(s):
  """The schedule's programs: the sampler at P x G / group prompt rows (with an environment: the
  turn loop), or the partial pool's."""
  rollout = s.config.rollout
  if schedules.kind(s.config).PROGRAMS == 'pool':
    return partial_programs(s)
  num = rollout.P * rollout.G // s.sampling.group
  if s.env:
    return dict(sample=turn_program(s, s.sampling, num, s.rollout_mesh, s.sampler_params))
  fn = sharding.on_mesh(sampler_lib.make_sampler(s.model, s.sampling), s.rollout_mesh)
  return dict(sample=Program(fn, (s.sampler_params,
                                  *prompts_and_key(s.rollout_mesh, num, s.prompt_len))))


def turn_program(s, sampling, num, mesh, params):
  """The turn loop (rljax.rollout.turns) over `num` prompt rows: called, it samples; lowered, it
  compiles its decoding chunk, with the turn state abstract."""
  sampler = turns.make_sampler(s.model, sampling, s.env, runner.limits(s.config.tools),
                               lambda fn: sharding.on_mesh(fn, mesh))
  room = s.env.max_observation
  state = jax.eval_shape(functools.partial(turns.empty, s.model.cfg, sampling, room,
                                           num * sampling.group, s.prompt_len))
  state = sharding.abstract(state, jax.tree.map(lambda _: sharding.replicated(mesh), state))
  host = lambda *shape, dtype=jnp.int32: jax.ShapeDtypeStruct(
      shape, dtype, sharding=sharding.replicated(mesh))
  slots = state.waiting_S.shape[0]
  return Program(sampler, (params, state, host(slots, room), host(slots), host(slots, dtype=bool),
                           *prompts_and_key(mesh, num, s.prompt_len)))


def partial_programs(s):
  """The partial schedule's `admit` and `advance`, on the pool of two batches of groups."""
  P, G, pad_id = s.config.rollout.P, s.config.rollout.G, s.sampling.pad_id
  pool = jax.eval_shape(lambda: schedules.Partial.empty_pool(s))
  pool = sharding.abstract(pool, jax.tree.map(lambda _: sharding.replicated(s.mesh), pool))
  admit = jax.jit(functools.partial(partial_lib.admit, pad_id=pad_id), donate_argnums=0)
  advance = jax.jit(functools.partial(partial_lib.advance, s.model, cfg=s.sampling,
                                      num_groups=P), donate_argnums=1)
  host = lambda *shape, dtype=jnp.int32: jax.ShapeDtypeStruct(
      shape, dtype, sharding=sharding.replicated(s.mesh))
  return dict(
      admit=Program(sharding.on_mesh(admit, s.mesh), (
          pool, host(P, s.prompt_len), host(P, s.prompt_len, dtype=bool),
          sharding.abstract_key(s.mesh), host(P * G))),
      advance=Program(sharding.on_mesh(advance, s.mesh),
                      (s.params, pool, host(), host())))


def algorithm_programs(s):
  """The algorithm's `make_batch` on a rollout batch and its `update` on the batch it makes."""
  batch, length = s.batch, s.new_tokens
  experts = jax.eval_shape(lambda: router.unrecorded(s.model.cfg, batch, length))
  rows = lambda *shape, dtype=jnp.int32: sharding.abstract_rows(s.mesh, shape, dtype)
  rollout = sampler_lib.Rollout(
      rows(batch, length), rows(batch, length, dtype=jnp.float32), rows(batch, length, dtype=bool),
      rows(batch), jax.ShapeDtypeStruct((), jnp.int32, sharding=sharding.replicated(s.mesh)),
      jax.ShapeDtypeStruct((), jnp.float32, sharding=sharding.replicated(s.mesh)),
      jax.tree.map(lambda x: rows(*x.shape, dtype=x.dtype), experts))
  state = s.algo.state
  ref = s.params if s.algo.needs_reference else None
  make_args = (state, rollout, rows(batch, dtype=jnp.float32), rows(batch, s.prompt_len),
               rows(batch, s.prompt_len, dtype=bool), ref)
  made = s.algo.make_batch.trace(*make_args).out_info[0]
  made = jax.tree.map(lambda x: rows(*x.shape, dtype=x.dtype), made)
  return dict(make_batch=Program(s.algo.make_batch, make_args),
              update=Program(s.algo.update, (state, made, ref, sharding.abstract_key(s.mesh))))
