"""Train-step benchmark: tokens/s, MFU and peak memory of the GRPO policy update
vs micro-batch size.

  PYTHONPATH=. python bench/train_step.py --preset=peer --batch=64 --micro=8,16,32,64

The step is rljax's own (rljax.policy_loss.policy_update: policy loss, gradient accumulated over
micro-batches with a lax.scan, one Adam update), jitted and donated as the trainer does. MFU =
6 x active params x tokens / step time / matmul peak, the peak measured in the same run (the
forward recomputation of remat is work the formula does not count). Peak memory is the compiled
executable's own account (memory_analysis: arguments + outputs + temporaries - aliased), and on a
GPU also the allocator's high-water mark.
"""
import argparse
import concurrent.futures
import dataclasses
import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench import common
from bench import presets
from bench import sampler as sampler_bench
from configs import grpo as grpo_config
from rljax.model import moe
from rljax import optim
from rljax import policy_loss
from rljax import sharding


def grpo_defaults():
  """runlocal's GRPO settings at a held lr: benchmarks time steady steps, no run to anneal over."""
  config = grpo_config.get_config('runlocal')
  config.optimizer.decay = 'constant'
  return config


def make_update_step(model, num_micro, batch_size, mesh, logits_chunk=0):
  """The trainer's jitted update (rljax.policy_loss.policy_update): returns (step, optimizer)."""
  config = grpo_defaults()
  optimizer, _ = optim.make_optimizer(config.optimizer, batch_size)
  loss_fn = policy_loss.make_policy_loss(model, config.grpo, config.rollout.temperature, num_micro,
                                         logits_chunk)
  step = jax.jit(functools.partial(policy_loss.policy_update, loss_fn, optimizer,
                                   config.grpo.loss_agg, num_micro), donate_argnums=(0, 1))
  return sharding.on_mesh(step, mesh), step, optimizer


def random_batch(cfg, batch, prompt_len, response_len, mesh, seed=0):
  """A policy batch of random tokens, every response token trained, unit-scale advantages."""
  rng = np.random.default_rng(seed)
  tokens = lambda shape: rng.integers(1, cfg.vocab_size, shape, dtype=np.int32)
  mask = np.ones((batch, response_len), np.float32)
  host = policy_loss.PolicyBatch(
      prompt_BxT=tokens((batch, prompt_len)), prompt_valid_BxT=np.ones((batch, prompt_len), bool),
      response_BxL=tokens((batch, response_len)), mask_BxL=mask,
      old_logp_BxL=np.full((batch, response_len), -np.log(cfg.vocab_size), np.float32),
      advantages_BxL=rng.normal(size=(batch, response_len)).astype(np.float32),
      weights_BxL=np.zeros_like(mask))
  return sharding.put_batch(host, mesh)


def compiled_memory(jitted, mesh, *args):
  """Bytes the compiled executable needs: arguments + outputs + temporaries - donated aliases."""
  with jax.set_mesh(mesh):
    stats = jitted.lower(*args).compile().memory_analysis()
  return dict(argument=stats.argument_size_in_bytes, output=stats.output_size_in_bytes,
              temp=stats.temp_size_in_bytes, alias=stats.alias_size_in_bytes,
              peak=(stats.argument_size_in_bytes + stats.output_size_in_bytes +
                    stats.temp_size_in_bytes - stats.alias_size_in_bytes))


def abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def build_point(model, params, mesh, batch, micro, prompt_len, response_len, logits_chunk=0):
  """The jitted step for one micro-batch size, its abstract arguments and its batch."""
  step, jitted, optimizer = make_update_step(model, batch // micro, batch, mesh, logits_chunk)
  opt_state = abstract(sharding.init_optimizer(optimizer, params, mesh))
  data = random_batch(model.cfg, batch, prompt_len, response_len, mesh)
  return dict(batch=batch, micro=micro, step=step, jitted=jitted, optimizer=optimizer, data=data,
              args=(abstract(params), opt_state, abstract(data), None), prompt_len=prompt_len,
              response_len=response_len)


def point_memory(point, mesh):
  start = time.perf_counter()
  point['memory'] = compiled_memory(point['jitted'], mesh, *point['args'])
  point['compile_s'] = time.perf_counter() - start


def measure(model, params, mesh, point, repeats, ceilings):
  cfg = model.cfg
  batch, micro = point['batch'], point['micro']
  step = point['step']
  params = jax.tree.map(jnp.copy, params)     # the step donates its parameters
  opt_state = sharding.init_optimizer(point['optimizer'], params, mesh)
  data = point['data']
  times, peaks = [], []
  with common.count_compiles() as later:
    params, opt_state, _ = jax.block_until_ready(step(params, opt_state, data, None))
    for _ in range(repeats):
      t0 = time.perf_counter()
      params, opt_state, metrics = jax.block_until_ready(step(params, opt_state, data, None))
      times.append(time.perf_counter() - t0)
      peaks.append(ceilings.flops())
  assert later['count'] == 0, f'train step recompiled {later["count"]} times'
  assert np.isfinite(float(metrics['loss']))
  seconds, spread = common.median_spread(times)
  peak, _ = common.median_spread(peaks)
  tokens = batch * (point['prompt_len'] + point['response_len'])
  model_flops = 6 * common.active_params_per_token(cfg) * tokens
  memory = point['memory']
  row = dict(batch=batch, micro=micro, num_micro=batch // micro, tokens=tokens, step_s=seconds,
             step_spread=spread, tok_s=tokens / seconds, model_TFLOP=model_flops / 1e12,
             peak_TFLOPs=peak / 1e12, mfu_pct=100 * model_flops / seconds / peak,
             mem_peak_GiB=common.gib(memory['peak']), mem_temp_GiB=common.gib(memory['temp']),
             compile_s=point['compile_s'], recompiles=later['count'],
             load_1min=common.load_average())
  device = jax.devices()[0]
  if device.platform == 'gpu':
    row['allocator_peak_GiB'] = common.gib(device.memory_stats().get('peak_bytes_in_use', 0))
  return row


COLUMNS = ['batch', 'micro', 'tokens', 'step_s', 'step_spread', 'tok_s', 'mfu_pct', 'peak_TFLOPs',
           'mem_peak_GiB', 'mem_temp_GiB', 'compile_s', 'recompiles', 'load_1min']


def run(preset, batch, micros, prompt_len, response_len, repeats, overrides=None, log=print,
        logits_chunk=0):
  cfg = presets.get(preset, **(overrides or {}))
  on_gpu = jax.devices()[0].platform == 'gpu'
  model, params, mesh = sampler_bench.setup(cfg)
  ceilings = common.Ceilings(on_gpu, cfg.dtype)
  record = dict(machine=common.machine(), preset=preset, model=dataclasses.asdict(cfg),
                active_params=common.active_params_per_token(cfg), rows=[])
  points = [build_point(model, params, mesh, batch, m, prompt_len, response_len, logits_chunk)
            for m in micros]
  point_memory(points[0], mesh)    # alone: the compile time to quote
  with concurrent.futures.ThreadPoolExecutor(max(1, len(points) - 1)) as pool:
    list(pool.map(lambda p: point_memory(p, mesh), points[1:]))
  record['compile_s'] = points[0]['compile_s']
  log(f"compiled {len(points)} train steps; first alone {points[0]['compile_s']:.1f} s", flush=True)
  for point in points:
    row = measure(model, params, mesh, point, repeats, ceilings)
    record['rows'].append(row)
    log(f"micro {row['micro']}: {row['tok_s']:.4g} tok/s, MFU {row['mfu_pct']:.1f}%, memory "
        f"{row['mem_peak_GiB']:.3f} GiB, load {row['load_1min']:.1f}", flush=True)
  return record


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--preset', default='peer', choices=sorted(presets.PRESETS))
  parser.add_argument('--batch', type=common.positive_int, default=64,
                      help='sequences per optimizer update')
  parser.add_argument('--micro', type=common.positive_ints, default='8,16,32,64',
                      help='micro-batch sizes (sequences), each dividing --batch')
  parser.add_argument('--prompt_len', type=common.positive_int, default=16)
  parser.add_argument('--response_len', type=common.positive_int, default=16)
  parser.add_argument('--logits_chunk', type=int, default=0)
  parser.add_argument('--repeats', type=common.positive_int, default=5)
  parser.add_argument('--remat', default='')
  parser.add_argument('--moe_impl', default='', choices=sorted(moe.EXPERT_IMPLS))
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  if any(args.batch % micro for micro in args.micro):
    parser.error(f'every --micro must divide --batch={args.batch}, got {args.micro}')
  overrides = {k: getattr(args, k) for k in ('remat', 'moe_impl') if getattr(args, k)}
  record = run(args.preset, args.batch, args.micro, args.prompt_len,
               args.response_len, args.repeats, overrides, logits_chunk=args.logits_chunk)
  print(f"\n{record['machine']}\npreset {args.preset}, {record['active_params'] / 1e6:.1f}M active "
        f"params {overrides or ''}")
  print(common.table(record['rows'], COLUMNS))
  common.write_json(args.out, record)


if __name__ == '__main__':
  main(sys.argv[1:])
