"""Sampler benchmark: decode tokens/s and per-step latency vs batch and vs response length, next to
the roofline measured in the same run; prefill tokens/s; compile time; no recompilation.

  PYTHONPATH=. python bench/sampler.py --preset=cpu --batches=1,4,16,64,256 --lengths=16

Decode time per step = (generate - prefill) / (L - 1): `generate` runs one prefill, L samples and
L - 1 decode steps (no row stops: the stop id is unreachable), `prefill` is the same prompt
forward alone. Each repeat times generate, prefill, the bandwidth probe and the matmul probe back
to back, so a row's % of roofline compares numbers taken under the same machine load.
"""
import argparse
import dataclasses
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from bench import common
from bench import presets
from rljax import model as model_lib
from rljax import sampler as sampler_lib
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
  """The prompt forward of `sampler.generate` on its own (same cache size, same positions)."""
  def prefill(params, prompt_BxT, valid_BxT):
    batch, prompt_len = prompt_BxT.shape
    cache = model_lib.KVCache.zeros(model.cfg, batch, prompt_len + max_new_tokens)
    kv_valid_BxS = jnp.concatenate([valid_BxT, jnp.ones((batch, max_new_tokens), bool)], axis=1)
    logits, cache, _ = model.apply({'params': params}, prompt_BxT, kv_valid_BxS, cache, 0,
                                   model_lib.positions_from_valid(valid_BxT))
    return logits[:, -1], cache
  return jax.jit(prefill)


def measure_point(model, params, mesh, batch, prompt_len, length, repeats, ceilings):
  """One (batch, response length) point: timings, roofline, compile time, recompilation check."""
  cfg = model.cfg
  sample = sharding.on_mesh(sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
      max_new_tokens=length, eos_id=-1, pad_id=0)), mesh)
  prefill = sharding.on_mesh(make_prefill(model, length), mesh)
  prompt_BxT, valid_BxT = random_prompts(cfg, batch, prompt_len, mesh)
  rng = jax.random.PRNGKey(0)
  with common.count_compiles() as first:
    rollout = jax.block_until_ready(sample(params, prompt_BxT, valid_BxT, rng))
  assert int(rollout.lengths_B.min()) == length, 'a row stopped early: decode steps miscounted'
  with common.count_compiles() as prefill_compile:
    jax.block_until_ready(prefill(params, prompt_BxT, valid_BxT))
  gen_s, pre_s, bws, peaks = [], [], [], []
  with common.count_compiles() as later:
    for r in range(repeats):
      gen_s += common.timings(sample, params, prompt_BxT, valid_BxT, jax.random.PRNGKey(r),
                              repeats=1, warmup=0)
      pre_s += common.timings(prefill, params, prompt_BxT, valid_BxT, repeats=1, warmup=0)
      bws.append(ceilings.bandwidth()[0])
      peaks.append(ceilings.flops())
  assert later['count'] == 0, f'recompiled {later["count"]} times between calls'
  gen, gen_spread = common.median_spread(gen_s)
  pre, _ = common.median_spread(pre_s)
  bandwidth, bw_spread = common.median_spread(bws)
  peak, peak_spread = common.median_spread(peaks)
  step_s = np.median([(g - p) / (length - 1) for g, p in zip(gen_s, pre_s)])
  weight_itemsize = np.dtype(cfg.param_dtype).itemsize
  nbytes, flops = common.decode_step_cost(cfg, batch, prompt_len + length / 2, weight_itemsize)
  mem_s, compute_s = nbytes / bandwidth, flops / peak
  return dict(
      batch=batch, length=length, prompt_len=prompt_len,
      decode_step_ms=1e3 * step_s, decode_tok_s=batch / step_s,
      prefill_tok_s=batch * prompt_len / pre, generate_s=gen, generate_spread=gen_spread,
      step_MB=nbytes / 1e6, step_GFLOP=flops / 1e9,
      mem_roof_ms=1e3 * mem_s, compute_roof_ms=1e3 * compute_s,
      pct_mem_roof=100 * mem_s / step_s, pct_roof=100 * max(mem_s, compute_s) / step_s,
      bound='memory' if mem_s >= compute_s else 'compute',
      bandwidth_GBps=bandwidth / 1e9, bw_spread=bw_spread, peak_GFLOPs=peak / 1e9,
      peak_spread=peak_spread, compile_s=first['seconds'], compiles=first['count'],
      prefill_compile_s=prefill_compile['seconds'], recompiles=later['count'],
      load_1min=common.load_average())


COLUMNS = ['batch', 'length', 'decode_tok_s', 'decode_step_ms', 'mem_roof_ms', 'compute_roof_ms',
           'bound', 'pct_mem_roof', 'pct_roof', 'prefill_tok_s', 'bandwidth_GBps', 'peak_GFLOPs',
           'compile_s', 'recompiles', 'load_1min']


def run(preset, batches, lengths, prompt_len, repeats, overrides=None, length_batch=16, log=print):
  """The batch sweep (first length) and the length sweep (at `length_batch`). Returns the record."""
  cfg = presets.get(preset, **(overrides or {}))
  on_gpu = jax.devices()[0].platform == 'gpu'
  model, params, mesh = setup(cfg)
  ceilings = common.Ceilings(on_gpu, cfg.dtype)
  record = dict(machine=common.machine(), preset=preset, bandwidth_probe=ceilings.bandwidth()[1], model=dataclasses.asdict(cfg),
                params=common.param_counts(cfg),
                active_params=common.active_params_per_token(cfg), rows=[])
  points = [(b, lengths[0]) for b in batches]
  points += [(length_batch, l) for l in lengths[1:]]
  for batch, length in points:
    row = measure_point(model, params, mesh, batch, prompt_len, length, repeats, ceilings)
    record['rows'].append(row)
    log(f"batch {batch} length {length}: {row['decode_tok_s']:.4g} tok/s, step "
        f"{row['decode_step_ms']:.3g} ms, {row['pct_roof']:.0f}% of roofline ({row['bound']}), "
        f"compile {row['compile_s']:.1f} s, load {row['load_1min']:.1f}", flush=True)
  return record


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--preset', default='cpu', choices=sorted(presets.PRESETS))
  parser.add_argument('--batches', default='1,4,16,64,256')
  parser.add_argument('--lengths', default='16', help='first: batch sweep; rest: length sweep')
  parser.add_argument('--length_batch', type=int, default=16)
  parser.add_argument('--prompt_len', type=int, default=16)
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--moe_impl', default='')
  parser.add_argument('--dtype', default='')
  parser.add_argument('--param_dtype', default='')
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  overrides = {k: getattr(args, k) for k in ('moe_impl', 'dtype', 'param_dtype') if getattr(args, k)}
  record = run(args.preset, [int(b) for b in args.batches.split(',')],
               [int(l) for l in args.lengths.split(',')], args.prompt_len, args.repeats, overrides,
               args.length_batch)
  print(f"\n{record['machine']}\npreset {args.preset}: {record['params']['total'] / 1e6:.1f}M params, "
        f"{record['active_params'] / 1e6:.1f}M active per token {overrides or ''}")
  print(common.table(record['rows'], COLUMNS))
  common.write_json(args.out, record)


if __name__ == '__main__':
  main(sys.argv[1:])
