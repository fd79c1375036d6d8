"""P=auto's state in a run: what the rule (rljax.auto_batch.rule) reads, kept in the checkpoint's
meta so a resumed run goes on with the same schedule on every process, the decision points and the
looks between them; the settings' check (`check`). Pure functions of plain JSON.

The state: the current batch `P` (the algorithm's unit: GRPO's prompts, PPO's B), the sample count
of the next decision, the batch the last move left, the sample count at which the run reached the
current batch, samples/s of the latest `window` measured steps at each batch tried, the longest
compiling step, the noise-scale terms of the last `window` steps, the training reward of the steps
of the last four `verify_samples` (`trail`), the move being checked (`check`) and the progress per
sample the last checked move kept (`measured`). Batches go to the rule in responses (P x G), the
unit of the noise scale.
"""
import json
import math
import os

import numpy as np

from rljax import algos
from rljax import stats
from rljax.auto_batch import check as check_lib
from rljax.auto_batch import rule

NOISE_BLOCK = 5   # steps per bootstrap block of the noise-scale interval


def enabled(config):
  return 'auto_batch' in config and bool(config.auto_batch.enabled)


def check(config):
  """ValueError naming the first bad auto_batch setting of `config`; else {P: the config at
  rollout.P = P} for every batch the run may reach (`config_at`), each with the two micro-batches
  a minibatch its noise scale needs; the caller checks each as a config of its own."""
  auto = config.auto_batch
  unit = f'auto_batch bounds are in rollout.P, the batch argument of {config.algo}'
  if not (rule.is_power_of_two(auto.min) and rule.is_power_of_two(auto.max)):
    raise ValueError(f'auto_batch.min ({auto.min}) and max ({auto.max}) must be powers of two; '
                     f'{unit}')
  if auto.min > auto.max:
    raise ValueError(f'auto_batch.min ({auto.min}) is larger than auto_batch.max ({auto.max})')
  batches = rule.allowed_batches(auto.min, auto.max)
  if config.rollout.P not in batches:
    raise ValueError(f'rollout.P ({config.rollout.P}) must be a power of two in [auto_batch.min, '
                     f'auto_batch.max] = [{auto.min}, {auto.max}]: the batch auto_batch starts at')
  if (auto.every_samples < 1 or auto.probe_steps < 2 or auto.window < auto.probe_steps
      or not auto.margin >= 0 or auto.verify_samples < 1):
    raise ValueError(f'auto_batch needs every_samples >= 1, probe_steps >= 2, window >= '
                     f'probe_steps, margin >= 0 and verify_samples >= 1; got {auto.every_samples}, '
                     f'{auto.probe_steps}, {auto.window}, {auto.margin}, {auto.verify_samples}')
  if not math.isfinite(auto.compile_s):
    raise ValueError(f"auto_batch.compile_s must be a number (< 0: the run's longest compiling "
                     f'step), got {auto.compile_s}')
  if auto.throughput_file and not os.path.isfile(auto.throughput_file):
    raise ValueError(f'auto_batch.throughput_file {auto.throughput_file} is not a file')
  for section in ('optimizer', 'critic_optimizer'):
    if section in config and config[section].decay != 'constant':
      raise ValueError(f"auto_batch needs {section}.decay='constant' (a decay's horizon is in "
                       f'updates, which a changing batch moves), got {config[section].decay!r}')
  configs = {P: config_at(config, P) for P in batches}
  for P, at_P in configs.items():
    if algos.micro_batches(at_P) < 2:
      raise ValueError(f'auto_batch at rollout.P={P}: the noise scale needs 2 micro-batches per '
                       f'minibatch; set train.micro_batch below {algos.batch_size(at_P)} '
                       f'/ num_minibatches')
  return configs


def config_at(config, P):
  """`config` at batch P as P=auto runs it: the micro-batches per minibatch kept, so the noise
  scale's two micro-batch sizes scale with the batch."""
  return algos.with_batch(config, P, keep_micro_batches=True)


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
    return rule.Estimate(np.nan, np.nan, np.nan)
  found = stats.noise_scale_interval([np.transpose(state['noise_terms'])], block=NOISE_BLOCK)
  return rule.Estimate(found['value'], found['lo'], found['hi'])


def throughput_table(rounds, G):
  """{responses per batch: Estimate of samples/s} from rounds per P."""
  table = {}
  for P, values in rounds.items():
    found = stats.throughput_interval(values)
    lo, hi = (found['lo'], found['hi']) if np.isfinite(found['lo']) else (found['mean'],) * 2
    table[P * G] = rule.Estimate(found['mean'], lo, hi)
  return table


def remaining_samples(train, samples, step, batch):
  """Samples left in the budget (train.max_samples, train.max_steps at `batch` per step)."""
  left = [train.max_samples - samples] if train.max_samples else []
  left += [(train.max_steps - step) * batch] if train.max_steps else []
  return max(min(left), 0) if left else math.inf


def costs(state, samples, remaining, samples_per_s, settings, compiled=frozenset()):
  """rule.Costs in seconds at the current batch's measured samples/s; the compile's from
  settings.compile_s when it is given (>= 0), else the run's longest compiling step; `compiled`:
  the batches (in responses) whose compile is paid."""
  compile_s = settings.compile_s if settings.compile_s >= 0 else state['compile_s']
  return rule.Costs((samples - state['arrived']) / samples_per_s, remaining / samples_per_s,
                          compile_s, frozenset(compiled))


def decide(state, samples, remaining, settings, G, compiled=()):
  """(the state after a decision at `samples`, `remaining` samples before the budget ends, the
  batches `compiled` (in P) costing no compile; the fields it adds to the training row)."""
  noise = noise_estimate(state)
  batches = [P * G for P in rule.allowed_batches(settings.min, settings.max)]
  left = state['left'] * G if state['left'] else None
  table = throughput_table(measured_rounds(state, settings), G)
  now = state['P'] * G
  decision = rule.decide(now, batches, noise, table, settings.margin, left,
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
  predicted = decision.gain / rule.throughput_ratio(now, decision.batch, table)[0]
  check = dict(came_from=state['P'], went_to=P, at=samples, predicted=predicted,
               since=max(state['arrived'], samples - 3 * settings.verify_samples))
  return dict(state, P=P, left=state['P'], arrived=samples, check=check, measured=None), fields


def verify(state, samples, settings, G):
  """(the state after checking the last move by its measured progress, the fields it adds to the
  training row): check_lib.judge; an 'undo' moves back to the batch the move came from."""
  check = state['check']
  steps = np.array([t for t in state['trail'] if t[0] > check['since']])
  table = throughput_table(measured_rounds(state, settings), G)
  ratio = rule.throughput_ratio(check['came_from'] * G, check['went_to'] * G, table)[0]
  found = check_lib.judge(steps[:, 0], steps[:, 1], steps[:, 2], check['at'], ratio,
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
