"""Where a sampler call or a train step spends its time: XLA ops ranked, from a jax.profiler trace.

  PYTHONPATH=. python bench/xla_profile.py --part=sampler --preset=cpu --batch=16
  PYTHONPATH=. python bench/xla_profile.py --part=update --preset=peer --batch=16

sampler: `sampler.generate` (16-token prompts, --length new tokens, no row stops); update: the
trainer's jitted policy update (bench/train_step.py) on --batch sequences of 16 + --length tokens.
Runs it --calls times under the profiler, sums the trace's per-op events and prints the top ops
with their output shapes from the compiled HLO, so "what limits it" is read off the compiler's
own program: which dot, which copy, how many times per call.
"""
import argparse
import collections
import glob
import gzip
import json
import re
import sys
import tempfile

import jax

from bench import common
from bench import presets
from bench import sampler as sampler_bench
from bench import train_step as train_bench
from rljax.model import moe
from rljax import sharding


def op_times(trace_dir, calls):
  """{op name: (ms per call, executions per call)} from the trace's complete ('X') events."""
  path = glob.glob(f'{trace_dir}/**/*.trace.json.gz', recursive=True)[0]
  total_us, count = collections.Counter(), collections.Counter()
  for event in json.load(gzip.open(path))['traceEvents']:
    if event.get('ph') == 'X':
      total_us[event['name']] += event['dur']
      count[event['name']] += 1
  return {name: (us / calls / 1e3, count[name] / calls) for name, us in total_us.items()}


def output_shapes(hlo_text):
  """{instruction name: its output shape and the ops it fuses} from compiled HLO text."""
  shapes = {}
  for match in re.finditer(r'^\s+%([\w.\-]+) = (\S+) (\w+)\(', hlo_text, re.M):
    shapes[match.group(1)] = f'{match.group(2)} {match.group(3)}'
  return shapes


def sampler_call(model, params, mesh, batch, length):
  """(jitted fn, its args, args of the next call from these and the output) of a sampler call."""
  point = sampler_bench.build_point(model, mesh, batch, 16, length)
  prompt_BxT, valid_BxT = point['prompts']
  return (point['sample'], (params, prompt_BxT, valid_BxT, jax.random.PRNGKey(0)),
          lambda args, out: args)


def update_call(model, params, mesh, batch, length):
  """The same for one policy update (one micro-batch); it donates params and optimizer state."""
  _, jitted, optimizer = train_bench.make_update_step(model, 1, batch, mesh)
  opt_state = sharding.init_optimizer(optimizer, params, mesh)
  data = train_bench.random_batch(model.cfg, batch, 16, length, mesh)
  return jitted, (params, opt_state, data, None), lambda args, out: (out[0], out[1]) + args[2:]


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--part', default='sampler', choices=['sampler', 'update'])
  parser.add_argument('--preset', default='cpu', choices=sorted(presets.PRESETS))
  parser.add_argument('--batch', type=common.positive_int, default=1)
  parser.add_argument('--length', type=common.positive_int, default=16,
                      help='new tokens / response tokens')
  parser.add_argument('--moe_impl', default='', choices=sorted(moe.EXPERT_IMPLS))
  parser.add_argument('--calls', type=common.positive_int, default=3)
  parser.add_argument('--top', type=common.positive_int, default=15)
  args = parser.parse_args(argv)
  cfg = presets.get(args.preset, **({'moe_impl': args.moe_impl} if args.moe_impl else {}))
  model, params, mesh = sampler_bench.setup(cfg)
  make_call = sampler_call if args.part == 'sampler' else update_call
  jitted, call_args, next_args = make_call(model, params, mesh, args.batch, args.length)
  with jax.set_mesh(mesh):
    compiled = jitted.lower(*call_args).compile()
  shapes = output_shapes(compiled.as_text())
  run_once = sharding.on_mesh(compiled, mesh)
  call_args = next_args(call_args, jax.block_until_ready(run_once(*call_args)))
  with tempfile.TemporaryDirectory() as trace_dir:
    jax.profiler.start_trace(trace_dir)
    for _ in range(args.calls):
      call_args = next_args(call_args, jax.block_until_ready(run_once(*call_args)))
    jax.profiler.stop_trace()
    times = op_times(trace_dir, args.calls)
  ops = sorted(((ms, n, name) for name, (ms, n) in times.items() if name in shapes), reverse=True)
  print(f'{args.part}: preset {args.preset}, batch {args.batch}, length {args.length}, per call')
  print(f"{'ms':>8} {'runs':>5}  op: output")
  for ms, runs, name in ops[:args.top]:
    print(f'{ms:8.2f} {runs:5.0f}  {name}: {shapes[name]}')
  print(f'{sum(ms for ms, _, _ in ops):8.2f}        all ops '
        '(nested ones counted in their parents too)')


if __name__ == '__main__':
  main(sys.argv[1:])
