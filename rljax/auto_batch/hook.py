"""P=auto in the training loop (config.auto_batch): measures every step, asks rljax.auto_batch.state
at its decision points and looks, and switches the run to the batch decided; each batch's programs
compile once per process, on a thread beside the steps (docs/design/compile_ahead.md).
"""
from concurrent import futures
import time

import jax

from rljax import algos
from rljax.auto_batch import rule
from rljax.auto_batch import state as state_lib
from rljax import collective
from rljax.train import programs as programs_lib
from rljax.train import run as run_lib


def start(config, run, meta):
  """(P=auto's hook, `run` at the batch its checkpoint left it at), the top of the range compiling
  beside the first step; (None, `run`) when config.auto_batch is off."""
  if not state_lib.enabled(config):
    return None, run
  hook = Hook(config, run, meta)
  return hook, hook.resume(run, meta)


class Hook:
  """config.auto_batch in the loop: measures, decides at the decision points and looks, and
  switches `run` to the batch decided (rljax.auto_batch.state; its state rides in the checkpoint's
  meta). Each batch's programs compile once per process, on a thread beside the steps: the top of
  the range beside the process's first step (the first move, with only the starting batch
  measured, often goes there), any other batch once a look would move to it."""

  def __init__(self, config, run, meta):
    self.config, self.settings = config, config.auto_batch
    # {P: future of (config, algo, batch)}
    self.programs = {config.rollout.P: _done((run.config, run.algo, run.batch))}
    self.ready = {config.rollout.P}   # batches whose programs are at hand: a look may move there
    self.compiled = set()   # batches that ran in this process: their next steps do not compile
    self.pool = futures.ThreadPoolExecutor(1, thread_name_prefix='rljax-compile-ahead')
    self.top = max(rule.allowed_batches(config.auto_batch.min, config.auto_batch.max))
    # A checkpoint's state may predate fields the rule reads now: they start afresh.
    meta['auto_batch'] = dict(state_lib.initial_state(config), **meta.get('auto_batch', {}))

  def resume(self, run, meta):
    """`run` at the batch its checkpoint left it at; the top of the range starts compiling."""
    P = meta['auto_batch']['P']
    run = at_batch(run, self.config, P, self.programs)
    self.ready.add(P)
    self._ahead(run, self.top)
    return run

  def after_step(self, run, meta, row):
    """Records the step; checks the last move or decides when due, logs it into `row` and
    switches. Returns the (run, meta) the next step uses."""
    state, P = meta['auto_batch'], meta['auto_batch']['P']
    # A step that ran beside a compile is not a measurement of its batch's samples/s.
    alone = all(future.done() for future in self.programs.values())
    # Process 0's times on every process: they differ between hosts, and every process must take
    # the same decision (a collective, every step, everywhere).
    seconds, per_s, alone = collective.from_process_0(
        [row['step_time_s'], row['samples_per_s'], float(alone)])
    row['batch'] = run.batch
    state, fields, wanted = state_lib.advance(
        state, dict(row, step_time_s=seconds, samples_per_s=per_s), meta['samples'],
        meta['step'], row['batch'], P in self.compiled and bool(alone), self.config,
        set(self.programs), self.ready)
    first, moved = not self.compiled, state['P'] != P
    self.compiled.add(P)
    row.update(fields, **self._ahead(run, wanted))
    if 'auto_check_verdict' in row:
      run.writer.say(_check_line(row))
    if not (first or moved):
      return run, dict(meta, auto_batch=state)
    # The first step waits for the top's compile, a switch for its batch's (or compiles it): the
    # wait is counted in the step's time.
    start = time.perf_counter()
    if first:
      self.programs[self.top].result()   # a compile that failed says so here
      self.ready.add(self.top)
    if moved:
      run = at_batch(run, self.config, state['P'], self.programs)
      self.ready.add(state['P'])
      meta = dict(meta, data=run.iterator.state())
      row['auto_lr'] = float(run.algo.schedules['lr'](run.algo.updates_per_batch * row['step']))
    waited = time.perf_counter() - start
    row.update(auto_wait_s=waited, step_time_s=row['step_time_s'] + waited,
               wallclock_s=row['wallclock_s'] + waited)
    if moved:
      run.writer.say(_switch_line(row, algos.get(self.config.algo).BATCH_ARG))
    return run, dict(meta, wallclock_s=row['wallclock_s'], auto_batch=state)

  def _ahead(self, run, P):
    """Starts compiling batch P on the thread beside the steps unless its programs exist; the
    field it adds to the training row: `auto_ahead`, the batch it started compiling."""
    if P is None or P in self.programs:
      return {}
    self.programs[P] = self.pool.submit(compiled_programs, run, self.config, P)
    return dict(auto_ahead=P)


def _done(value):
  future = futures.Future()
  future.set_result(value)
  return future


def _switch_line(row, batch_arg):
  noise = ''
  if row.get('auto_noise_lo') is not None and 'auto_check_verdict' not in row:
    point = row['auto_noise_scale']   # None: unbounded (rule.unbounded_point)
    noise = (f" | B_noise {'unbounded' if point is None else f'{point:.0f}'} "
             f"[{row['auto_noise_lo']:.0f}, {row['auto_noise_hi'] or float('inf'):.0f}] | "
             f"predicted gain {row['auto_gain']:.2f}")
  return (f"step {row['step']} | auto batch {batch_arg} {row['auto_from']} -> {row['auto_to']} | "
          f"lr {row['lr']:.2e} -> {row['auto_lr']:.2e}{noise} | {row['auto_reason']}")


def _check_line(row):
  interval = lambda x: 'nan' if x is None else f'{x:.2f}'
  return (f"step {row['step']} | auto batch check {row['auto_check_from']} -> "
          f"{row['auto_check_to']}: progress per sample {interval(row['auto_check_progress'])} "
          f"[{interval(row['auto_check_lo'])}, {interval(row['auto_check_hi'])}] (predicted "
          f"{row['auto_check_predicted']:.2f}) | {row['auto_check_verdict']}")


def at_batch(run, base_config, P, programs):
  """`run` at batch P (config.auto_batch): its config, algorithm, batch and prompt iterator (read
  on from where the run's is; a resumed run's is at P already). The programs of each batch are
  compiled once and kept in `programs` ({P: future of (config, algo, batch)}, waited for here);
  its optimizer has the lr rule at the new batch, and the state it updates (the carry, Adam's
  moments included) goes on unchanged."""
  if P not in programs:
    programs[P] = _done(compiled_programs(run, base_config, P))
  config, algo, batch = programs[P].result()
  iterator = run.iterator if run.iterator.batch_size == P else run.iterator.with_batch(P)
  return run._replace(config=config, algo=algo, batch=batch, iterator=iterator)


def compiled_programs(run, base_config, P):
  """(config, algorithm, responses per batch) of `run` at batch P, with the programs its steps
  call compiled: the sampler's at P, `make_batch`, `update` and the schedules. Compiled here
  rather than at their first call, so that it can be done ahead of a move (Hook._ahead); a call
  then finds them in jit's caches."""
  config = state_lib.config_at(base_config, P)
  sampler = run.schedule.sampler   # the run's, its settings (rows per prompt) fixed at setup
  shape = run_lib.abstract_setup(config, run.mesh, sampler.mesh)._replace(
      sampling=sampler.sampling)
  algo = run_lib.jit_schedules(shape.algo)
  on_meshes = [(program, run.mesh) for program in programs_lib.algorithm_programs(shape).values()]
  sample = programs_lib.rollout_programs(shape)['sample']
  on_meshes.append((sample._replace(fn=sampler.sample), sampler.mesh))
  for program, mesh in on_meshes:   # compiled under the mesh it is called under: jit's cache key
    with jax.set_mesh(mesh):
      program.fn.lower(*program.args).compile()
  for schedule in algo.schedules.values():
    schedule.lower(0).compile()
  return config, algo, shape.batch
