"""Sampler benchmark: decode tokens/s and per-step latency vs batch and vs response length, next to
the roofline measured in the same run; prefill tokens/s; compile time; no recompilation.

  PYTHONPATH=. python bench/sampler.py --preset=cpu --batches=1,4,16,64,256 --lengths=16

Decode time per step = (generate - prefill) / L: `generate` runs `sampler.prefill` (every prompt
column but the last) and then L decode steps, each sampling one token (no row stops: the stop id
is unreachable); `prefill` is that same `sampler.prefill` alone. Each repeat times generate,
prefill, the bandwidth probe and the matmul probe back to back, so a row's % of roofline compares
numbers taken under the same machine load.
"""
import argparse
import dataclasses
import functools
import sys

import jax
import numpy as np

from bench import common
from bench import presets
from rljax.model import moe
from rljax.model import transformer as model_lib
from rljax.rollout import sampler as sampler_lib
from rljax import sharding


def setup(cfg, seed=0):
  """Model, parameters (created on a one-axis data mesh) and the mesh."""
  mesh = sharding.make_mesh(dict(data=-1))
  model = model_lib.Transformer(cfg)
  params, _ = sharding.init_params(functools.partial(model_lib.init_params, cfg),
                                   jax.random.PRNGKey(seed), mesh)
  return model, params, mesh


def random_prompts(cfg, batch, prompt_len, mesh, seed=1):
  prompt_BxT = np.random.default_rng(seed).integers(1, cfg.vocab_size, (batch, prompt_len),
                                                    dtype=np.int32)
  return sharding.put_batch((prompt_BxT, np.ones((batch, prompt_len), bool)), mesh)


def make_prefill(model, max_new_tokens):
  """`sampler.prefill` on its own (the same call `sampler.generate` starts with)."""
  return jax.jit(lambda params, prompt_BxT, valid_BxT: sampler_lib.prefill(
      model, params, prompt_BxT, valid_BxT, max_new_tokens)[2])


def build_point(model, mesh, batch, prompt_len, length):
  """The jitted sampler and prefill for one (batch, length), with their inputs."""
  sample = sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
      max_new_tokens=length, eos_id=-1, pad_id=0))   # no row stops: every step is decoded
  prefill = make_prefill(model, length)
  prompts = random_prompts(model.cfg, batch, prompt_len, mesh)
  return dict(batch=batch, length=length, prompt_len=prompt_len, sample=sample, prefill=prefill,
              prompts=prompts)


def compile_jobs(point, params):
  prompt_BxT, valid_BxT = point['prompts']
  return [(point['sample'], (params, prompt_BxT, valid_BxT, jax.random.PRNGKey(0))),
          (point['prefill'], (params, prompt_BxT, valid_BxT))]


def measure_point(model, params, mesh, point, repeats, ceilings):
  """One (batch, response length) point: timings, roofline, recompilation check."""
  cfg = model.cfg
  batch, length, prompt_len = point['batch'], point['length'], point['prompt_len']
  sample = sharding.on_mesh(point['sample'], mesh)
  prefill = sharding.on_mesh(point['prefill'], mesh)
  prompt_BxT, valid_BxT = point['prompts']
  gen_s, pre_s, bws, peaks = [], [], [], []
  with common.count_compiles() as later:
    rollout = jax.block_until_ready(sample(params, prompt_BxT, valid_BxT, jax.random.PRNGKey(0)))
    jax.block_until_ready(prefill(params, prompt_BxT, valid_BxT))   # warm
    for r in range(repeats):
      gen_s += common.timings(sample, params, prompt_BxT, valid_BxT, jax.random.PRNGKey(r),
                              repeats=1, warmup=0)
      pre_s += common.timings(prefill, params, prompt_BxT, valid_BxT, repeats=1, warmup=0)
      bws.append(ceilings.bandwidth()[0])
      peaks.append(ceilings.flops())
  assert later['count'] == 0, f'recompiled {later["count"]} times between calls'
  assert int(rollout.lengths_B.min()) == length, 'a row stopped early: decode steps miscounted'
  gen, gen_spread = common.median_spread(gen_s)
  pre, _ = common.median_spread(pre_s)
  bandwidth, bw_spread = common.median_spread(bws)
  peak, peak_spread = common.median_spread(peaks)
  step_s = np.median([(g - p) / length for g, p in zip(gen_s, pre_s)])
  weight_itemsize = np.dtype(cfg.dtype).itemsize   # ideal: weights read in the compute dtype
  nbytes, flops = common.decode_step_cost(cfg, batch, prompt_len + length / 2, weight_itemsize)
  mem_s, compute_s = nbytes / bandwidth, flops / peak
  return dict(
      batch=batch, length=length, prompt_len=prompt_len,
      decode_step_ms=1e3 * step_s, decode_tok_s=batch / step_s,
      prefill_tok_s=batch * (prompt_len - 1) / pre, generate_s=gen, generate_spread=gen_spread,
      step_MB=nbytes / 1e6, step_GFLOP=flops / 1e9,
      mem_roof_ms=1e3 * mem_s, compute_roof_ms=1e3 * compute_s,
      pct_mem_roof=100 * mem_s / step_s, pct_roof=100 * max(mem_s, compute_s) / step_s,
      bound='memory' if mem_s >= compute_s else 'compute',
      bandwidth_GBps=bandwidth / 1e9, bw_spread=bw_spread, peak_GFLOPs=peak / 1e9,
      peak_spread=peak_spread, compile_s=point.get('compile_s', 0.0),
      recompiles=later['count'], load_1min=common.load_average())


COLUMNS = ['batch', 'length', 'decode_tok_s', 'decode_step_ms', 'mem_roof_ms', 'compute_roof_ms',
           'bound', 'pct_mem_roof', 'pct_roof', 'prefill_tok_s', 'bandwidth_GBps', 'peak_GFLOPs',
           'compile_s', 'recompiles', 'load_1min']


def run(preset, batches, lengths, prompt_len, repeats, overrides=None, length_batch=16, log=print,
        dump_hlo=''):
  """The batch sweep (first length) and the length sweep (at `length_batch`). Returns the record."""
  cfg = presets.get(preset, **(overrides or {}))
  on_gpu = jax.devices()[0].platform == 'gpu'
  model, params, mesh = setup(cfg)
  ceilings = common.Ceilings(on_gpu, cfg.dtype)
  record = dict(machine=common.machine(), preset=preset, bandwidth_probe=ceilings.bandwidth()[1],
                model=dataclasses.asdict(cfg), params=common.param_counts(cfg),
                active_params=common.active_params_per_token(cfg), rows=[])
  shapes = [(b, lengths[0]) for b in batches] + [(length_batch, l) for l in lengths[1:]]
  points = [build_point(model, mesh, b, prompt_len, l) for b, l in shapes]
  # Compile time of one point alone (the figure to quote), then the rest in parallel.
  with common.count_compiles() as first:
    common.precompile(compile_jobs(points[0], params), mesh, workers=1)
  record['compile_s'] = dict(sampler_and_prefill=first['seconds'], executables=first['count'])
  points[0]['compile_s'] = first['seconds']
  rest = [job for point in points[1:] for job in compile_jobs(point, params)]
  seconds = common.precompile(rest, mesh) if rest else []
  for i, point in enumerate(points[1:]):
    point['compile_s'] = seconds[2 * i] + seconds[2 * i + 1]
  log(f"compiled {len(points)} points; first alone {first['seconds']:.1f} s", flush=True)
  if dump_hlo:   # what the compiler made of the first point (from the compilation cache)
    with jax.set_mesh(mesh), open(dump_hlo, 'w') as f:
      job, args = compile_jobs(points[0], params)[0]
      f.write(job.lower(*args).compile().as_text())
  for point in points:
    row = measure_point(model, params, mesh, point, repeats, ceilings)
    record['rows'].append(row)
    log(f"batch {row['batch']} length {row['length']}: {row['decode_tok_s']:.4g} tok/s, step "
        f"{row['decode_step_ms']:.3g} ms, {row['pct_roof']:.0f}% of roofline ({row['bound']}), "
        f"load {row['load_1min']:.1f}", flush=True)
  return record


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--preset', default='cpu', choices=sorted(presets.PRESETS))
  parser.add_argument('--batches', type=common.positive_ints, default='1,4,16,64,256')
  parser.add_argument('--lengths', type=common.positive_ints, default='16',
                      help='first: batch sweep; rest: length sweep')
  parser.add_argument('--length_batch', type=common.positive_int, default=16)
  parser.add_argument('--prompt_len', type=common.positive_int, default=16)
  parser.add_argument('--repeats', type=common.positive_int, default=5)
  parser.add_argument('--moe_impl', default='', choices=sorted(moe.EXPERT_IMPLS))
  parser.add_argument('--dtype', default='')
  parser.add_argument('--param_dtype', default='')
  parser.add_argument('--dump_hlo', default='', help="file for the first point's compiled HLO")
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  overrides = {k: getattr(args, k) for k in ('moe_impl', 'dtype', 'param_dtype')
               if getattr(args, k)}
  record = run(args.preset, args.batches, args.lengths, args.prompt_len, args.repeats, overrides,
               args.length_batch, dump_hlo=args.dump_hlo)
  print(f"\n{record['machine']}\npreset {args.preset}: "
        f"{record['params']['total'] / 1e6:.1f}M params, "
        f"{record['active_params'] / 1e6:.1f}M active per token {overrides or ''}")
  print(common.table(record['rows'], COLUMNS))
  common.write_json(args.out, record)


if __name__ == '__main__':
  main(sys.argv[1:])
