"""The run's side of config.auto_batch (rljax.train.auto_batch holds the rule): what the rule
reads, kept in the checkpoint's meta so a resumed run goes on with the same schedule on every
process, and the decision points.

The state is plain JSON: the current batch `P` (the algorithm's unit: GRPO's prompts, PPO's B),
the sample count of the next decision, the batch the last move left, the sample count at which the
run reached the current batch, samples/s of the first measured steps at each batch tried, the
longest compiling step, and the noise-scale terms of the last `window` steps.
Batches go to the rule in responses (P x G), the unit of the noise scale.
"""
import json
import math

import numpy as np

from rljax import stats
from rljax.train import auto_batch

NOISE_BLOCK = 5   # steps per bootstrap block of the noise-scale interval


def enabled(config):
  return 'auto_batch' in config and bool(config.auto_batch.enabled)


def initial_state(config):
  return dict(P=config.rollout.P, next_decision=config.auto_batch.every_samples, left=None,
              arrived=0, throughput={}, compile_s=0.0, noise_terms=[])


def record(state, row, measurable, settings):
  """`state` after the training row of one step at state['P']. `measurable`: the step did not
  compile (the first step at a batch in a process does), so its samples/s is a measurement; a
  step that compiled tells what a compile costs."""
  terms = state['noise_terms']
  if 'grad_sq_small' in row:
    terms = (terms + [[row[key] for key in stats.NOISE_KEYS]])[-settings.window:]
  rounds = dict(state['throughput'])
  key = str(state['P'])
  if measurable and len(rounds.get(key, [])) < settings.probe_steps:
    rounds[key] = rounds.get(key, []) + [row['samples_per_s']]
  compile_s = state['compile_s'] if measurable else max(state['compile_s'], row['step_time_s'])
  return dict(state, noise_terms=terms, throughput=rounds, compile_s=compile_s)


def measured_rounds(state, settings):
  """{P: samples/s rounds}: the run's own, replaced by throughput_file's where it has a batch."""
  rounds = {int(p): r for p, r in state['throughput'].items() if len(r) >= settings.probe_steps}
  if settings.throughput_file:
    with open(settings.throughput_file) as f:
      rounds.update({int(p): r for p, r in json.load(f).items()})
  return rounds


def due(state, samples, settings):
  """A decision point: `every_samples` since the last one, and the current batch measured."""
  return samples >= state['next_decision'] and state['P'] in measured_rounds(state, settings)


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


def costs(state, samples, remaining, samples_per_s, settings):
  """auto_batch.Costs in seconds at the current batch's measured samples/s; the compile's from
  settings.compile_s when it is given (>= 0), else the run's longest compiling step."""
  compile_s = settings.compile_s if settings.compile_s >= 0 else state['compile_s']
  return auto_batch.Costs((samples - state['arrived']) / samples_per_s, remaining / samples_per_s,
                          compile_s)


def decide(state, samples, remaining, settings, G):
  """(the state after a decision at `samples`, `remaining` samples before the budget ends; the
  fields it adds to the training row)."""
  noise = noise_estimate(state)
  batches = [P * G for P in auto_batch.allowed_batches(settings.min, settings.max)]
  left = state['left'] * G if state['left'] else None
  table = throughput_table(measured_rounds(state, settings), G)
  now = state['P'] * G
  decision = auto_batch.decide(now, batches, noise, table, settings.margin, left,
                               costs(state, samples, remaining, table[now].value, settings))
  P = decision.batch // G
  fields = dict(auto_from=state['P'], auto_to=P, auto_best=decision.best // G,
                auto_noise_scale=_number(noise.value), auto_noise_lo=_number(noise.lo),
                auto_noise_hi=_number(noise.hi), auto_gain=decision.gain,
                auto_gain_lo=decision.gain_lo, auto_reason=decision.reason)
  moved = dict(P=P, left=state['P'], arrived=samples) if P != state['P'] else {}
  return dict(state, next_decision=samples + settings.every_samples, **moved), fields


def _number(x):
  """JSON has no inf or nan: None for them."""
  return float(x) if np.isfinite(x) else None
