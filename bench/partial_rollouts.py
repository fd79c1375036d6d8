"""Partial rollouts (rollout.schedule=partial) vs continuous batching within the step,
on the sums task.

  PYTHONPATH=. python bench/partial_rollouts.py --P=64 --G=8 --slots=64 --rounds=41 --processes=10

Every call of either schedule returns P whole groups of G responses, a training step's batch.
`continuous` decodes the next P prompts x G over `slots` slots and waits for the last of them;
`partial` keeps a pool of 2P groups, admits the next P prompts and returns once P groups have
finished, the rest staying in flight for the next call. Lengths are forced as in
bench/rollout_lengths.py (a stop token the model never samples, per-response caps): every response
of a group is as long as its prompt's reference response in the sums training split, so both
schedules decode the same lengths (on the `tiny` model, the runlocal one, by default). Each call
advances the policy version, so partial's staleness rule (`--max_staleness`) restarts what it
would in training. Rounds interleave the two (one call each, the order alternating), and a
process's ratio is the median of the per-round ratios of continuous's time to partial's, i.e.
partial's samples/s over continuous's, with a distribution-free interval (bench/common.py). With
`--processes=N` that repeats in N fresh processes, and the ratio is their geometric mean with a
t-interval over the processes. Utilization: response tokens decoded / (slots x decode steps),
over the timed calls.
"""
import argparse
import functools
import multiprocessing
import os
import sys
import time

import jax
import numpy as np

from bench import common
from bench import presets
from bench import rollout_lengths
from rljax import stats
from rljax.data.builders import sums
from rljax.model import transformer as model_lib
from rljax.rollout import partial
from rljax.rollout import sampler as sampler_lib


def schedules(args, model, params, prompts, caps_N):
  """{name: call() -> (samples, tokens decoded, decode steps, restarted)}, each consuming the
  prompt stream from its own cursor."""
  (prompt_NxT, valid_NxT), P, G = prompts, args.P, args.G
  max_len = sums.lengths(sums.make_config().max_operands, sums.make_config().digits)[1] + 1
  sampling = sampler_lib.SamplingConfig(max_new_tokens=max_len, eos_id=-1, pad_id=0,
                                        slots=args.slots, group=G)
  continuous = sampler_lib.make_sampler(model, sampling)
  admit = jax.jit(partial.admit, donate_argnums=0)
  advance = jax.jit(functools.partial(partial.advance, model, cfg=sampling, num_groups=P),
                    donate_argnums=1)
  key, fold_in = jax.random.PRNGKey(1), jax.jit(jax.random.fold_in)   # as the training loop's
  batch = lambda i: (prompt_NxT[i * P:(i + 1) * P], valid_NxT[i * P:(i + 1) * P],
                     np.repeat(caps_N[i * P:(i + 1) * P], G))
  state = dict(continuous=0, partial=0, version=0,
               flight=partial.empty(model.cfg, 2 * P, G, args.slots, prompt_NxT.shape[1], max_len))

  def run_continuous():
    prompt, valid, caps = batch(state['continuous'])
    state['continuous'] += 1
    rollout = jax.block_until_ready(continuous(params, prompt, valid, key, caps))
    return P * G, int(rollout.lengths_B.sum()), int(rollout.decode_steps), 0

  def run_partial():
    for _ in range(2 if state['partial'] == 0 else 1):
      prompt, valid, caps = batch(state['partial'])
      state['flight'] = admit(state['flight'], prompt, valid, fold_in(key, state['partial']), caps)
      state['partial'] += 1
    state['flight'], out = advance(params, state['flight'], state['version'], args.max_staleness)
    state['version'] += 1
    out = jax.block_until_ready(out)
    decoded = float(out.rollout.utilization) * int(out.rollout.decode_steps) * args.slots
    return P * G, round(decoded), int(out.rollout.decode_steps), int(out.restarted)

  return dict(continuous=run_continuous, partial=run_partial)


def measure(args):
  cfg = presets.get(args.preset)
  model = model_lib.Transformer(cfg)
  params = model_lib.init_params(cfg, jax.random.PRNGKey(0))
  calls = args.warmup + args.rounds + 2
  prompts, caps_N = rollout_lengths.sums_problems(args.data_dir, args.P * calls, seed=0)
  fns = schedules(args, model, params, prompts, caps_N)
  for _ in range(args.warmup):   # compiles; fills partial's pool to its steady state
    for fn in fns.values():
      fn()
  seconds, totals = {name: [] for name in fns}, {name: np.zeros(4) for name in fns}
  with common.count_compiles() as compiles:
    for r in range(args.rounds):
      for name in (fns if r % 2 == 0 else reversed(list(fns))):
        start = time.perf_counter()
        totals[name] += fns[name]()
        seconds[name].append(time.perf_counter() - start)
  if compiles['count']:
    raise RuntimeError(f"{compiles['count']} compilation(s) while timing")
  ratio, low, high, coverage = common.median_interval(
      np.divide(seconds['continuous'], seconds['partial']))
  rows = []
  for name in fns:
    samples, decoded, steps, restarted = totals[name]
    wall, spread = common.median_spread(seconds[name])
    rows.append(dict(schedule=name, wall_s=wall, spread=spread,
                     samples_per_s=args.P * args.G / wall,
                     utilization=decoded / (steps * args.slots), steps_per_call=steps / args.rounds,
                     restarted_per_call=restarted / args.rounds))
  return dict(machine=common.machine(), args=vars(args), rows=rows, ratio=ratio,
              interval=[low, high], coverage=coverage, seconds=seconds,
              load_1min=common.load_average())


def measure_in_processes(args):
  """`measure` in `args.processes` fresh processes, one after another, and the geometric mean of
  their ratios with a t-interval over processes: the ratio moves between processes by more than
  one process's interval admits, so the process, not the round, is the unit."""
  with multiprocessing.get_context('spawn').Pool(1, maxtasksperchild=1) as pool:
    runs = [pool.apply(measure, (args,)) for _ in range(args.processes)]
  summary = stats.log_mean_interval([run['ratio'] for run in runs])
  return dict(runs=runs, ratio=summary['mean'], interval=[summary['lo'], summary['hi']],
              df=summary['df'])


def report(record, rounds):
  print(f"\n{record['machine']}")
  print(common.table(record['rows'], ('schedule', 'wall_s', 'spread', 'samples_per_s',
                                      'utilization', 'steps_per_call', 'restarted_per_call')))
  print(f"partial / continuous samples/s: {record['ratio']:.2f}x "
        f"({record['interval'][0]:.2f}-{record['interval'][1]:.2f}, coverage "
        f"{record['coverage']:.2f}, {rounds} rounds)")


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--preset', default='tiny', choices=sorted(presets.PRESETS))
  parser.add_argument('--P', type=common.positive_int, default=64, help='groups per call')
  parser.add_argument('--G', type=common.positive_int, default=8, help='responses per group')
  parser.add_argument('--slots', type=common.positive_int, default=64)
  parser.add_argument('--max_staleness', type=int, default=1)
  parser.add_argument('--rounds', type=common.positive_int, default=15)
  parser.add_argument('--warmup', type=common.positive_int, default=3)
  parser.add_argument('--processes', type=common.positive_int, default=1,
                      help='repeat the measurement in this many fresh processes')
  parser.add_argument('--data_dir', default=os.path.expanduser('~/.cache/rljax/datasets'))
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  if args.processes == 1:
    record = measure(args)
    report(record, args.rounds)
  else:
    record = measure_in_processes(args)
    for run in record['runs']:
      report(run, args.rounds)
    print(f"\nover {args.processes} processes: {record['ratio']:.2f}x "
          f"({record['interval'][0]:.2f}-{record['interval'][1]:.2f}, 95% t-interval, df "
          f"{record['df']})")
  common.write_json(args.out, record)


if __name__ == '__main__':
  main(sys.argv[1:])
