"""The run's side of config.auto_batch (rljax.train.auto_batch holds the rule): what the rule
reads, kept in the checkpoint's meta so a resumed run goes on with the same schedule on every
process, the decision points and the looks between them.

The state is plain JSON: the current batch `P` (the algorithm's unit: GRPO's prompts, PPO's B),
the sample count of the next decision, the batch the last move left, the sample count at which the
run reached the current batch, samples/s of the latest `window` measured steps at each batch
tried, the longest compiling step, the noise-scale terms of the last `window` steps, the training
reward of the steps of the last four `verify_samples` (`trail`), the move being checked (`check`)
and the progress per sample the last checked move kept (`measured`).
Batches go to the rule in responses (P x G), the unit of the noise scale.
"""
from concurrent import futures
import json
import math
import time

import jax
from jax.experimental import multihost_utils
import numpy as np

from rljax import algos
from rljax.data import sources as data
from rljax import stats
from rljax.train import auto_batch
from rljax.train import auto_check
from rljax.train import programs as programs_lib
from rljax.train import run as run_lib

NOISE_BLOCK = 5   # steps per bootstrap block of the noise-scale interval


def enabled(config):
  return 'auto_batch' in config and bool(config.auto_batch.enabled)


def initial_state(config):
  return dict(P=config.rollout.P, next_decision=config.auto_batch.every_samples, left=None,
              arrived=0, throughput={}, compile_s=0.0, noise_terms=[], trail=[], check=None,
              measured=None)


def record(state, row, samples, measurable, settings):
  """`state` after the training row of one step at state['P'] that brought the run to `samples`.
  `measurable`: the step did not compile (the first step at a batch in a process does), so its
  samples/s is a measurement; a step that compiled tells what a compile costs."""
  trail = [t for t in state['trail'] if t[0] > samples - 4 * settings.verify_samples]
  trail.append([samples, row['reward_mean'], row['retained']])
  terms = state['noise_terms']
  if 'grad_sq_small' in row:
    terms = (terms + [[row[key] for key in stats.NOISE_KEYS]])[-settings.window:]
  rounds = dict(state['throughput'])
  key = str(state['P'])
  if measurable:   # the latest `window` steps at the batch: a drifting host is followed
    rounds[key] = (rounds.get(key, []) + [row['samples_per_s']])[-settings.window:]
  compile_s = state['compile_s'] if measurable else max(state['compile_s'], row['step_time_s'])
  return dict(state, noise_terms=terms, throughput=rounds, compile_s=compile_s, trail=trail)


def measured_rounds(state, settings):
  """{P: samples/s rounds}: the run's own, replaced by throughput_file's where it has a batch."""
  rounds = {int(p): r for p, r in state['throughput'].items() if len(r) >= settings.probe_steps}
  if settings.throughput_file:
    with open(settings.throughput_file) as f:
      rounds.update({int(p): r for p, r in json.load(f).items()})
  return rounds


def due(state, samples, settings):
  """A decision point: `every_samples` since the last one, the current batch measured and the
  last move checked."""
  return (samples >= state['next_decision'] and state['P'] in measured_rounds(state, settings)
          and not state['check'])


def look_due(state, samples, retained, settings):
  """A look: the step that brought the run to `samples` (`retained` of them its own) crossed a
  multiple of every_samples / 8, with the current batch measured and the last move checked."""
  every = max(settings.every_samples // 8, 1)
  return (samples // every > (samples - retained) // every
          and state['P'] in measured_rounds(state, settings) and not state['check'])


def check_due(state, samples, settings):
  """The last move has run `verify_samples` samples: time to check it."""
  return bool(state['check']) and samples >= state['check']['at'] + settings.verify_samples


def noise_estimate(state):
  """B_simple over the window, with its block-bootstrap interval (stats.noise_scale_interval)."""
  if not state['noise_terms']:
    return auto_batch.Estimate(np.nan, np.nan, np.nan)
  found = stats.noise_scale_interval([np.transpose(state['noise_terms'])], block=NOISE_BLOCK)
  return auto_batch.Estimate(found['value'], found['lo'], found['hi'])


def throughput_table(rounds, G):
  """{responses per batch: Estimate of samples/s} from rounds per P."""
  table = {}
  for P, values in rounds.items():
    found = stats.throughput_interval(values)
    lo, hi = (found['lo'], found['hi']) if np.isfinite(found['lo']) else (found['mean'],) * 2
    table[P * G] = auto_batch.Estimate(found['mean'], lo, hi)
  return table


def remaining_samples(train, samples, step, batch):
  """Samples left in the budget (train.max_samples, train.max_steps at `batch` per step)."""
  left = [train.max_samples - samples] if train.max_samples else []
  left += [(train.max_steps - step) * batch] if train.max_steps else []
  return max(min(left), 0) if left else math.inf


def costs(state, samples, remaining, samples_per_s, settings, compiled=frozenset()):
  """auto_batch.Costs in seconds at the current batch's measured samples/s; the compile's from
  settings.compile_s when it is given (>= 0), else the run's longest compiling step; `compiled`:
  the batches (in responses) whose compile is paid."""
  compile_s = settings.compile_s if settings.compile_s >= 0 else state['compile_s']
  return auto_batch.Costs((samples - state['arrived']) / samples_per_s, remaining / samples_per_s,
                          compile_s, frozenset(compiled))


def decide(state, samples, remaining, settings, G, compiled=()):
  """(the state after a decision at `samples`, `remaining` samples before the budget ends, the
  batches `compiled` (in P) costing no compile; the fields it adds to the training row)."""
  noise = noise_estimate(state)
  batches = [P * G for P in auto_batch.allowed_batches(settings.min, settings.max)]
  left = state['left'] * G if state['left'] else None
  table = throughput_table(measured_rounds(state, settings), G)
  now = state['P'] * G
  decision = auto_batch.decide(now, batches, noise, table, settings.margin, left,
                               costs(state, samples, remaining, table[now].value, settings,
                                     {P * G for P in compiled}),
                               state['measured'])
  P = decision.batch // G
  fields = dict(auto_from=state['P'], auto_to=P, auto_best=decision.best // G,
                auto_noise_scale=_number(noise.value), auto_noise_lo=_number(noise.lo),
                auto_noise_hi=_number(noise.hi), auto_gain=decision.gain,
                auto_gain_lo=decision.gain_lo, auto_reason=decision.reason)
  state = dict(state, next_decision=samples + settings.every_samples)
  if P == state['P']:
    return state, fields
  predicted = decision.gain / auto_batch.throughput_ratio(now, decision.batch, table)[0]
  check = dict(came_from=state['P'], went_to=P, at=samples, predicted=predicted,
               since=max(state['arrived'], samples - 3 * settings.verify_samples))
  return dict(state, P=P, left=state['P'], arrived=samples, check=check, measured=None), fields


def verify(state, samples, settings, G):
  """(the state after checking the last move by its measured progress, the fields it adds to the
  training row): auto_check.judge; an 'undo' moves back to the batch the move came from."""
  check = state['check']
  steps = np.array([t for t in state['trail'] if t[0] > check['since']])
  table = throughput_table(measured_rounds(state, settings), G)
  ratio = auto_batch.throughput_ratio(check['came_from'] * G, check['went_to'] * G, table)[0]
  found = auto_check.judge(steps[:, 0], steps[:, 1], steps[:, 2], check['at'], ratio,
                           check['predicted'])
  fields = dict(auto_check_from=check['came_from'], auto_check_to=check['went_to'],
                auto_check_progress=_number(found.progress), auto_check_lo=_number(found.lo),
                auto_check_hi=_number(found.hi), auto_check_predicted=check['predicted'],
                auto_check_goodput_hi=_number(found.goodput_hi), auto_check_verdict=found.verdict)
  kept = found.progress if found.verdict == 'keep, measured' else None
  state = dict(state, check=None, measured=kept)
  if found.verdict == 'undo':
    state = dict(state, P=check['came_from'], left=check['went_to'], arrived=samples)
    fields.update(auto_from=check['went_to'], auto_to=check['came_from'],
                  auto_reason='undo: measured progress per second below 1')
  return state, fields


def _number(x):
  """JSON has no inf or nan: None for them."""
  return float(x) if np.isfinite(x) else None


def eval_due(config, row, samples_before, samples_after):
  """Every train.eval_every steps; with auto_batch every as many samples as those steps hold at
  the starting batch, so the eval grid stays in samples while the batch changes. After every
  step once train.eval_from_samples are trained (when > 0): MLPerf's validation boundaries."""
  if 0 < config.train.eval_from_samples <= samples_after:
    return True
  if not enabled(config):
    return row['step'] % config.train.eval_every == 0
  every = config.train.eval_every * algos.batch_size(config)
  return samples_after // every > samples_before // every


class BatchSchedule:
  """config.auto_batch in the loop: measures, decides at the decision points and looks, and
  switches `run` to the batch decided (rljax.train.rebatch; its state rides in the checkpoint's
  meta). Each batch's programs compile once per process, on a thread beside the steps: the top of
  the range beside the process's first step (the first move, with only the starting batch
  measured, often goes there), any other batch once a look would move to it."""

  def __init__(self, config, run, meta):
    self.config, self.settings = config, config.auto_batch
    self.programs = {config.rollout.P: _done((run.config, run.algo))}   # {P: future (config, algo)}
    self.ready = {config.rollout.P}   # batches whose programs are at hand: a look may move there
    self.compiled = set()   # batches that ran in this process: their next steps do not compile
    self.pool = futures.ThreadPoolExecutor(1, thread_name_prefix='rljax-compile-ahead')
    self.top = max(auto_batch.allowed_batches(config.auto_batch.min, config.auto_batch.max))
    # A checkpoint's state may predate fields the rule reads now: they start afresh.
    meta['auto_batch'] = dict(initial_state(config), **meta.get('auto_batch', {}))

  def resume(self, run, meta):
    """`run` at the batch its checkpoint left it at; the top of the range starts compiling."""
    P = meta['auto_batch']['P']
    run = at_batch(run, self.config, P, self.programs, meta['data'])
    self.ready.add(P)
    self._ahead(run, self.top)
    return run

  def after_step(self, run, meta, row):
    """Records the step; checks the last move or decides when due, logs it into `row` and
    switches. Returns the (run, meta) the next step uses."""
    state, P = meta['auto_batch'], meta['auto_batch']['P']
    # A step that ran beside a compile is not a measurement of its batch's samples/s.
    alone = all(future.done() for future in self.programs.values())
    seconds, per_s, alone = _agreed(row['step_time_s'], row['samples_per_s'], float(alone))
    row['batch'] = algos.batch_size(run.config)
    state, fields, wanted = advance(
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
      data_state = data.continue_with_batch(run.iterator.state(), P)
      run = at_batch(run, self.config, state['P'], self.programs, data_state)
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


def advance(state, row, samples, step, batch, measurable, config, compiled=(), ready=()):
  """(the state after one step's training row, the fields it adds to the row, the batch to compile
  ahead or None): records the step (`measurable`: it did not compile), then checks the last move
  or decides, whichever is due. At a decision point the batches `compiled` (or compiling) cost no
  compile. A look decides too, but moves only to a batch `ready` (its programs at hand: a move that
  waits for nothing need not wait for the decision point); otherwise it names the batch the rule
  would move to, so that it compiles ahead. `samples`, `step`: the run's after the step; `batch`:
  its responses; `compiled`, `ready`: in P."""
  settings, G = config.auto_batch, config.rollout.G
  state = record(state, row, samples, measurable, settings)
  if check_due(state, samples, settings):
    return (*verify(state, samples, settings, G), None)
  deciding = due(state, samples, settings)
  if not (deciding or look_due(state, samples, row['retained'], settings)):
    return state, {}, None
  remaining = remaining_samples(config.train, samples, step, batch)
  decided, fields = decide(state, samples, remaining, settings, G, compiled)
  if deciding or (decided['P'] != state['P'] and decided['P'] in ready):
    return decided, fields, None
  return state, {}, None if decided['P'] == state['P'] else decided['P']


def _agreed(*values):
  """Process 0's `values` on every process (collective: every step, everywhere): step times
  differ between hosts, and every process must take the same decision."""
  if jax.process_count() == 1:
    return values
  return tuple(float(v) for v in multihost_utils.broadcast_one_to_all(np.float32(values)))


def _switch_line(row, batch_arg):
  noise = ''
  if row.get('auto_noise_lo') is not None and 'auto_check_verdict' not in row:
    point = row['auto_noise_scale']   # None: unbounded (auto_batch.unbounded_point)
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


def at_batch(run, base_config, P, programs, data_state):
  """`run` at batch P (config.auto_batch): its config, algorithm and prompt iterator. The
  programs of each batch are compiled once and kept in `programs` ({P: future of (config,
  algo)}, waited for here); its optimizer has the lr rule at the new batch, and the state it
  updates (the carry, Adam's moments included) goes on unchanged."""
  if P not in programs:
    programs[P] = _done(compiled_programs(run, base_config, P))
  config, algo = programs[P].result()
  return run._replace(config=config, algo=algo,
                      iterator=run_lib.make_iterator(config, run.task, data_state))


def compiled_programs(run, base_config, P):
  """(config, algorithm) of `run` at batch P, with the programs its steps call compiled: the
  sampler's at P, `make_batch`, `update` and the schedules. Compiled here rather than at their
  first call, so that it can be done ahead of a move (BatchSchedule._ahead); a call then
  finds them in jit's caches."""
  config = algos.with_batch(base_config, P, algos.micro_batches(base_config))
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
  return config, algo
