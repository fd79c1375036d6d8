"""Rollouts at uneven lengths: static batching vs continuous batching (rollout.slots), side by side.

  PYTHONPATH=. python bench/rollout_lengths.py --batches=64,256,512,1024 --slots=32,64

Each point samples P x G responses whose lengths are FORCED (per-response caps, a stop token the
model never emits), so both schedules decode exactly the same tokens and the comparison is of the
schedules alone. Length distributions:
  sums       the reference responses of the sums task (rljax.datasets.sums, built locally), with
             its prompts;
  lognormal  heavy-tailed: round(median * exp(sigma * z)), clipped to [1, max_len], random prompts;
  uniform    every response max_len tokens, random prompts.
Reported per point: wall seconds (median of the repeats), decode steps, decode-slot utilization
(response tokens / (slots x steps)), response tokens/s, and each schedule's tokens/s over
static's. The schedules of a point run interleaved (static, slots=a, slots=b, static, ...), so
every repeat gives one ratio per schedule taken under the same load; `vs_static` is the median of
those per-repeat ratios and `interval` a distribution-free interval of that median (coverage in
the JSON record: >= 90% from 5 repeats on). Nothing compiles while timing (asserted).
"""
import argparse
import functools
import os
import sys

import jax
import numpy as np

from bench import common
from bench import presets
from rljax import data
from rljax import model as model_lib
from rljax import sampler as sampler_lib
from rljax import sharding
from rljax import tokenizer as tokenizer_lib
from rljax.datasets import sums

DISTRIBUTIONS = ('sums', 'lognormal', 'uniform')
COLUMNS = ('dist', 'batch', 'schedule', 'wall_s', 'spread', 'steps', 'utilization', 'tok_s',
           'vs_static', 'interval', 'len_mean', 'len_max', 'load_1min')


def sums_problems(data_dir, count, seed):
  """`count` sums prompts (encoded, left-padded) and their reference response lengths (EOS
  included), drawn from the train split."""
  config = sums.make_config()
  source = data.load_tfds_split(sums.Sums, config, data_dir, 'train')
  rows = np.random.default_rng(seed).choice(len(source), count, replace=False)
  records = data._read(source, rows)  # pylint: disable=protected-access
  tokenizer = tokenizer_lib.ArithmeticTokenizer()
  prompt_len, _ = sums.lengths(config.max_operands, config.digits)
  prompts = data.encode_prompts([data._text(r['prompt']) for r in records], tokenizer, prompt_len)  # pylint: disable=protected-access
  lengths = [len(tokenizer.encode(data._text(r['answer']))) + 1 for r in records]  # pylint: disable=protected-access
  return prompts, np.asarray(lengths, np.int32)


def synthetic(dist, count, args, seed):
  """Random prompts and lengths: log-normal (heavy-tailed) or all `max_len`."""
  rng = np.random.default_rng(seed)
  prompt_NxT = rng.integers(2, 16, (count, args.prompt_len), dtype=np.int32)
  if dist == 'uniform':
    return (prompt_NxT, np.ones_like(prompt_NxT, bool)), np.full(count, args.max_len, np.int32)
  lengths = np.round(args.median * np.exp(args.sigma * rng.standard_normal(count)))
  return (prompt_NxT, np.ones_like(prompt_NxT, bool)), np.clip(lengths, 1, args.max_len).astype(
      np.int32)


def points(args, model, mesh):
  """(dist, batch, schedule name, jitted sampler, inputs) for every point of the sweep."""
  out = []
  for dist in args.dists:
    for batch in args.batches:
      if dist == 'sums':
        prompts, caps = sums_problems(args.data_dir, batch, seed=batch)
        max_len = sums.lengths(sums.make_config().max_operands, sums.make_config().digits)[1] + 1
      else:
        prompts, caps = synthetic(dist, batch, args, seed=batch)
        max_len = args.max_len
      inputs = sharding.put_batch((*prompts, caps), mesh)
      for slots in [0] + [s for s in args.slots if s < batch]:
        sample = sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
            max_new_tokens=max_len, eos_id=-1, pad_id=0, slots=slots))   # stops: the caps only
        out.append((dist, batch, f'slots={slots}' if slots else 'static', sample, inputs))
  return out


def measure(args):
  cfg = presets.get(args.preset)
  mesh = sharding.make_mesh(dict(data=-1))
  model = model_lib.Transformer(cfg)
  params, _ = sharding.init_params(functools.partial(model_lib.init_params, cfg),
                                   jax.random.PRNGKey(0), mesh)
  sweep = points(args, model, mesh)
  key = jax.random.PRNGKey(1)
  call = lambda sample, inputs: sample(params, inputs[0], inputs[1], key, inputs[2])
  common.precompile([(sample, (params, inputs[0], inputs[1], key, inputs[2]))
                     for *_, sample, inputs in sweep], mesh)
  rows = []
  with common.count_compiles() as compiles, jax.set_mesh(mesh):
    for dist, batch in dict.fromkeys((d, b) for d, b, *_ in sweep):
      group = [p for p in sweep if p[:2] == (dist, batch)]
      seconds = common.alternated({name: functools.partial(call, sample, inputs)
                                   for _, _, name, sample, inputs in group}, args.repeats)
      for _, _, name, sample, inputs in group:
        rollout = jax.device_get(call(sample, inputs))
        wall, spread = common.median_spread(seconds[name])
        # The same tokens in every schedule: static's time over this one's is this one's tokens/s
        # over static's.
        tokens = int(rollout.lengths_B.sum())
        ratio, low, high, coverage = common.median_interval(
            np.divide(seconds['static'], seconds[name]))
        rows.append(dict(dist=dist, batch=batch, schedule=name, wall_s=wall, spread=spread,
                         steps=int(rollout.decode_steps), utilization=float(rollout.utilization),
                         tok_s=tokens / wall, vs_static=ratio, interval=f'{low:.2f}-{high:.2f}',
                         coverage=coverage, len_mean=float(rollout.lengths_B.mean()),
                         len_max=int(rollout.lengths_B.max()), load_1min=common.load_average()))
        print(common.table(rows[-1:], COLUMNS).splitlines()[-1], flush=True)
  if compiles['count']:
    raise RuntimeError(f"{compiles['count']} compilation(s) while timing")
  return dict(machine=common.machine(), preset=args.preset, args=vars(args), rows=rows)


def distributions(text):
  """argparse type: comma-separated names from DISTRIBUTIONS."""
  names = text.split(',')
  if not all(name in DISTRIBUTIONS for name in names):
    raise argparse.ArgumentTypeError(f'expected comma-separated names from {DISTRIBUTIONS}, '
                                     f'got {text!r}')
  return names


def positive_float(text):
  value = float(text)
  if not value > 0:
    raise argparse.ArgumentTypeError(f'must be > 0, got {text}')
  return value


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--preset', default='tiny', choices=sorted(presets.PRESETS))
  parser.add_argument('--batches', type=common.positive_ints, default='64,256,512,1024',
                      help='P x G responses per rollout')
  parser.add_argument('--slots', type=common.positive_ints, default='32,64',
                      help='continuous-batching slot counts (each below the batch is measured)')
  parser.add_argument('--dists', type=distributions, default=','.join(DISTRIBUTIONS))
  parser.add_argument('--max_len', type=common.positive_int, default=256,
                      help='synthetic: the response budget (uniform: every length)')
  parser.add_argument('--median', type=positive_float, default=16.0, help='lognormal median')
  parser.add_argument('--sigma', type=positive_float, default=1.0, help='lognormal sigma')
  parser.add_argument('--prompt_len', type=common.positive_int, default=16,
                      help='synthetic prompt tokens')
  parser.add_argument('--repeats', type=common.positive_int, default=7,
                      help='interleaved rounds: one static-vs-slots ratio each')
  parser.add_argument('--data_dir', default=os.path.expanduser('~/.cache/rljax/datasets'))
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  if any(s < 2 for s in args.slots):
    parser.error('--slots: each slot count must be >= 2 (1 slot is the static schedule)')
  record = measure(args)
  print(f"\n{record['machine']}\npreset {args.preset}")
  print(common.table(record['rows'], COLUMNS))
  common.write_json(args.out, record)


if __name__ == '__main__':
  main(sys.argv[1:])
