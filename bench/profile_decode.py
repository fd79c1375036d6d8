"""Where a sampler call spends its time: XLA ops ranked by time, from a jax.profiler trace.

  PYTHONPATH=. python bench/profile_decode.py --preset=cpu --batch=16

Runs `sampler.generate` (16-token prompts, --length new tokens, no row stops) --calls times under
the profiler, sums the trace's per-op events and prints the top ops with their output shapes
from the compiled HLO, so "what limits decoding" is read off the compiler's own program: which
dot, which copy, how many times per call.
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

from bench import presets
from bench import sampler as sampler_bench
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


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--preset', default='cpu', choices=sorted(presets.PRESETS))
  parser.add_argument('--batch', type=int, default=1)
  parser.add_argument('--length', type=int, default=16)
  parser.add_argument('--moe_impl', default='')
  parser.add_argument('--calls', type=int, default=3)
  parser.add_argument('--top', type=int, default=15)
  args = parser.parse_args(argv)
  cfg = presets.get(args.preset, **({'moe_impl': args.moe_impl} if args.moe_impl else {}))
  model, params, mesh = sampler_bench.setup(cfg)
  point = sampler_bench.build_point(model, mesh, args.batch, 16, args.length)
  prompt_BxT, valid_BxT = point['prompts']
  sample = sharding.on_mesh(point['sample'], mesh)
  jax.block_until_ready(sample(params, prompt_BxT, valid_BxT, jax.random.PRNGKey(0)))
  with jax.set_mesh(mesh):
    hlo = point['sample'].lower(params, prompt_BxT, valid_BxT, jax.random.PRNGKey(0)).compile()
  shapes = output_shapes(hlo.as_text())
  with tempfile.TemporaryDirectory() as trace_dir:
    jax.profiler.start_trace(trace_dir)
    for i in range(args.calls):
      jax.block_until_ready(sample(params, prompt_BxT, valid_BxT, jax.random.PRNGKey(i)))
    jax.profiler.stop_trace()
    times = op_times(trace_dir, args.calls)
  ops = sorted(((ms, n, name) for name, (ms, n) in times.items() if name in shapes), reverse=True)
  print(f'preset {args.preset}, batch {args.batch}, {args.length} new tokens '
        f'({args.length - 1} decode steps): per sampler call')
  print(f"{'ms':>8} {'runs':>5}  op: output")
  for ms, runs, name in ops[:args.top]:
    print(f'{ms:8.2f} {runs:5.0f}  {name}: {shapes[name]}')
  print(f'{sum(ms for ms, _, _ in ops):8.2f}        all ops')


if __name__ == '__main__':
  main(sys.argv[1:])
