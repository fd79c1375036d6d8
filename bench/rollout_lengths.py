"""Rollouts at uneven lengths: static batching vs continuous batching (rollout.slots), side by side.

  PYTHONPATH=. python bench/rollout_lengths.py --batches=64,256,512,1024 --slots=32,64

Each point samples P x G responses whose lengths are FORCED (per-response caps, a stop token the
model never emits), so both schedules decode exactly the same tokens and the comparison is of the
schedules alone. Length distributions:
  sums       the reference responses of the sums task (rljax.data.builders.sums, built locally),
             with its prompts;
  lognormal  heavy-tailed: round(median * exp(sigma * z)), clipped to [1, max_len], random prompts;
  uniform    every response max_len tokens, random prompts.
Schedules per point: `static`; `slots=S`, continuous batching over S decode slots (each S up to
P x G; at S = P x G it is one wave, the same steps as static); and `static/S`, static batching over
chunks of S responses, one call each: the decode batch of S slots without their refills.
Reported per schedule: wall seconds (median of the repeats), decode steps, decode-slot utilization
(response tokens / (decode rows x steps)), response tokens/s, and ratios of tokens/s: `vs_static`
(over static's) and, for `slots=S`, `vs_chunked` (over `static/S`'s), which separates the refill
schedule from the machine's throughput at S rows against P x G rows. The schedules of a point run
interleaved (static, slots=a, static/a, ..., static, ...), so every repeat gives one ratio per
schedule taken under the same load; a ratio is the median of those per-repeat ratios with a
distribution-free interval of that median (coverage in the JSON record: >= 90% from 5 repeats
on). Nothing compiles while timing (asserted).
"""
import argparse
import functools
import os
import sys

import jax
import numpy as np

from bench import common
from bench import presets
from rljax.data.builders import sums
from rljax.data import sources as data
from rljax.data import tokenizer as tokenizer_lib
from rljax.model import transformer as model_lib
from rljax.rollout import sampler as sampler_lib
from rljax import sharding

DISTRIBUTIONS = ('sums', 'lognormal', 'uniform')
COLUMNS = ('dist', 'batch', 'schedule', 'wall_s', 'spread', 'steps', 'utilization', 'tok_s',
           'vs_static', 'vs_static_interval', 'vs_chunked', 'vs_chunked_interval', 'len_mean',
           'len_max', 'load_1min')


def sums_problems(data_dir, count, seed, config=None):
  """`count` sums prompts (encoded, left-padded) and their reference response lengths (EOS
  included), drawn from the train split of `config` (default: the task's)."""
  config = config or sums.make_config()
  source = data.load_tfds_split(sums.Sums, config, data_dir, 'train')
  rows = np.random.default_rng(seed).choice(len(source), count, replace=False)
  records = data.read_records(source, rows)
  tokenizer = tokenizer_lib.ArithmeticTokenizer()
  prompt_len, _ = sums.lengths(config.max_operands, config.digits)
  prompts = data.encode_prompts([data.text(r['prompt']) for r in records], tokenizer, prompt_len)
  lengths = [len(tokenizer.encode(data.text(r['answer']))) + 1 for r in records]
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
  """(dist, batch, schedule name, jitted sampler, input chunks, decode rows) for every point of the
  sweep: static batching; continuous batching at each slot count up to the batch; and, for each
  slot count S below the batch, static batching over chunks of S responses, one call each: the
  same decode batch as S slots, without refills, so that `vs_chunked` is the refill schedule's own
  cost or gain, apart from the machine's throughput at S rows against P x G."""
  out = []
  for dist in args.dists:
    for batch in args.batches:
      if dist == 'sums':
        (prompt_NxT, valid_NxT), caps_N = sums_problems(args.data_dir, batch, seed=batch)
        max_len = sums.lengths(sums.make_config().max_operands, sums.make_config().digits)[1] + 1
      else:
        (prompt_NxT, valid_NxT), caps_N = synthetic(dist, batch, args, seed=batch)
        max_len = args.max_len
      chunks = lambda size: [sharding.put_batch(
          (prompt_NxT[i:i + size], valid_NxT[i:i + size], caps_N[i:i + size]), mesh)
                             for i in range(0, batch, size)]
      sampler = lambda slots: sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
          max_new_tokens=max_len, eos_id=-1, pad_id=0, slots=slots))   # stops: the caps only
      static, whole = sampler(0), chunks(batch)
      out.append((dist, batch, 'static', static, whole, batch))
      for slots in [s for s in args.slots if s <= batch]:
        out.append((dist, batch, f'slots={slots}', sampler(slots), whole, slots))
        if slots < batch:
          out.append((dist, batch, f'static/{slots}', static, chunks(slots), slots))
  return out


def summary(rollouts, decode_rows):
  """Decode steps, utilization and lengths of a schedule's rollouts (one per chunk)."""
  lengths_N = np.concatenate([r.lengths_B for r in rollouts])
  steps = sum(int(r.decode_steps) for r in rollouts)
  return dict(steps=steps, utilization=float(lengths_N.sum() / (decode_rows * steps)),
              len_mean=float(lengths_N.mean()), len_max=int(lengths_N.max()),
              tokens=int(lengths_N.sum()))


def ratio_columns(seconds, baseline, name, prefix):
  """`prefix` and its interval: the median per-round ratio of `baseline`'s time over `name`'s."""
  ratio, low, high, coverage = common.median_interval(
      np.divide(seconds[baseline], seconds[name]))
  return {prefix: ratio, f'{prefix}_interval': f'{low:.2f}-{high:.2f}', 'coverage': coverage}


def measure(args):
  cfg = presets.get(args.preset)
  mesh = sharding.make_mesh(dict(data=-1))
  model = model_lib.Transformer(cfg)
  params, _ = sharding.init_params(functools.partial(model_lib.init_params, cfg),
                                   jax.random.PRNGKey(0), mesh)
  sweep = points(args, model, mesh)
  key = jax.random.PRNGKey(1)
  call = lambda sample, chunks: [sample(params, c[0], c[1], key, c[2]) for c in chunks]
  common.precompile([(sample, (params, c[0], c[1], key, c[2]))
                     for *_, sample, chunks, _ in sweep for c in chunks], mesh)
  rows = []
  with common.count_compiles() as compiles, jax.set_mesh(mesh):
    for dist, batch in dict.fromkeys((d, b) for d, b, *_ in sweep):
      group = [p for p in sweep if p[:2] == (dist, batch)]
      seconds = common.alternated({name: functools.partial(call, sample, chunks)
                                   for _, _, name, sample, chunks, _ in group}, args.repeats)
      for _, _, name, sample, chunks, decode_rows in group:
        row = dict(dist=dist, batch=batch, schedule=name, **summary(
            jax.device_get(call(sample, chunks)), decode_rows))
        row['wall_s'], row['spread'] = common.median_spread(seconds[name])
        # The same number of tokens in every schedule: static's time over this one's is this
        # one's tokens/s over static's.
        row.update(tok_s=row.pop('tokens') / row['wall_s'], load_1min=common.load_average(),
                   **ratio_columns(seconds, 'static', name, 'vs_static'))
        if f'static/{decode_rows}' in seconds and name.startswith('slots='):
          row.update(ratio_columns(seconds, f'static/{decode_rows}', name, 'vs_chunked'))
        rows.append(row)
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
                      help='continuous-batching slot counts (each up to the batch is measured)')
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
