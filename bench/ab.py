"""This tree against an earlier revision, in ONE process, calls alternated: a sampler call or an
update step of each, timed back to back, so both see the same machine load.

  PYTHONPATH=. python bench/ab.py --rev=fedcffb --part=sampler --preset=peer --batch=64 --length=32
  PYTHONPATH=. python bench/ab.py --rev=fedcffb --part=update --preset=peer --batch=16 --length=32

On a shared CPU whose speed drifts 1.3-5x within an hour, two benchmark runs in turn cannot resolve
a 5-10% change; paired calls can: each round times one call of each tree, and the per-round ratio's
median is reported with its spread. The revision is exported with `git archive` and imported next
to this tree under its own module objects (its functions keep their own globals), so it must have
`bench/sampler.py` and `bench/train_step.py` with the functions this script calls.
"""
import argparse
import importlib
import os
import subprocess
import sys
import tempfile

import jax
import numpy as np

from bench import common
from rljax.model import moe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # this tree
PACKAGES = ('bench', 'configs', 'rljax')
MODULES = ('bench.presets', 'bench.sampler', 'bench.train_step', 'rljax.sharding')


def import_tree(root):
  """The MODULES of the source tree at `root`, imported apart from those already loaded."""
  ours = lambda name: name.split('.')[0] in PACKAGES
  saved = {name: module for name, module in sys.modules.items() if ours(name)}
  for name in saved:
    del sys.modules[name]
  sys.path.insert(0, root)
  try:
    return {name.split('.')[-1]: importlib.import_module(name) for name in MODULES}
  finally:
    sys.path.remove(root)
    for name in [name for name in sys.modules if ours(name)]:
      del sys.modules[name]
    sys.modules.update(saved)


def export_revision(rev, directory):
  """`rev`'s files in `directory` (git archive), or ValueError with git's message."""
  archive = subprocess.run(['git', '-C', ROOT, 'archive', '--format=tar', rev],
                           capture_output=True)
  if archive.returncode:
    raise ValueError(f'cannot export revision {rev!r}: {archive.stderr.decode().strip()}')
  subprocess.run(['tar', '-x', '-C', directory], input=archive.stdout, check=True)


def sampler_call(tree, preset, batch, length, overrides):
  """A no-argument function running one sampler call of `tree` (compiled here)."""
  bench_sampler, sharding = tree['sampler'], tree['sharding']
  model, params, mesh = bench_sampler.setup(tree['presets'].get(preset, **overrides))
  point = bench_sampler.build_point(model, mesh, batch, 16, length)
  sample = sharding.on_mesh(point['sample'], mesh)
  key = jax.random.PRNGKey(0)   # the same draws every call: the same work
  return lambda: sample(params, *point['prompts'], key)


def update_call(tree, preset, batch, length, overrides):
  """A no-argument function running one update step of `tree` (one micro-batch of `batch`)."""
  model, params, mesh = tree['sampler'].setup(tree['presets'].get(preset, **overrides))
  point = tree['train_step'].build_point(model, params, mesh, batch, batch, 16, length)
  state = [jax.tree.map(lambda x: x.copy(), params)]   # the step donates its parameters
  state.append(tree['sharding'].init_optimizer(point['optimizer'], state[0], mesh))

  def call():
    state[0], state[1], metrics = point['step'](state[0], state[1], point['data'], None)
    return metrics
  return call


def summary(seconds):
  """Median and min ms of each, and the paired per-round ratio this/rev: median, quartiles."""
  this, rev = np.array(seconds['this']), np.array(seconds['rev'])
  ratio = this / rev
  return dict(this_ms=1e3 * np.median(this), rev_ms=1e3 * np.median(rev),
              this_min_ms=1e3 * this.min(), rev_min_ms=1e3 * rev.min(),
              ratio=np.median(ratio), ratio_q25=np.percentile(ratio, 25),
              ratio_q75=np.percentile(ratio, 75))


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--rev', required=True, help='git revision to compare with')
  parser.add_argument('--part', choices=('sampler', 'update'), default='sampler')
  parser.add_argument('--preset', default='peer')
  parser.add_argument('--batch', type=common.positive_int, default=64)
  parser.add_argument('--length', type=common.positive_int, default=32,
                      help='new tokens / response tokens')
  parser.add_argument('--rounds', type=common.positive_int, default=20)
  parser.add_argument('--moe_impl', default='', choices=sorted(moe.EXPERT_IMPLS),
                      help="the preset's own when not given")
  args = parser.parse_args(argv)
  this = import_tree(ROOT)
  if args.preset not in this['presets'].PRESETS:
    parser.error(f'unknown --preset {args.preset!r}; choose one of '
                 f'{sorted(this["presets"].PRESETS)}')
  make_call = dict(sampler=sampler_call, update=update_call)[args.part]
  with tempfile.TemporaryDirectory() as directory:
    try:
      export_revision(args.rev, directory)
    except ValueError as error:
      parser.error(str(error))
    rev = import_tree(directory)
    overrides = {'moe_impl': args.moe_impl} if args.moe_impl else {}
    calls = {name: make_call(tree, args.preset, args.batch, args.length, overrides)
             for name, tree in (('this', this), ('rev', rev))}
    result = summary(common.alternated(calls, args.rounds))
  print(f'{args.part}, preset {args.preset}{f" ({args.moe_impl})" if args.moe_impl else ""}, '
        f'batch {args.batch}, length {args.length}, '
        f'{args.rounds} rounds, this tree against {args.rev}:')
  print(f"  this {result['this_ms']:.1f} ms (min {result['this_min_ms']:.1f}), "
        f"rev {result['rev_ms']:.1f} ms (min {result['rev_min_ms']:.1f}); this / rev per round: "
        f"median {result['ratio']:.3f}, quartiles {result['ratio_q25']:.3f}-"
        f"{result['ratio_q75']:.3f}")
  return result


if __name__ == '__main__':
  main(sys.argv[1:])
