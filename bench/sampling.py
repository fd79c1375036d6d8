"""One token draw per row, `jax.random.categorical` against `rljax.sampler.categorical`, side by side.

  PYTHONPATH=. python bench/sampling.py --shapes=64x1024,8x151936

Both are Gumbel-max; rljax's takes the argmax as a max and a min (`sampler.first_argmax`). The
draws are checked equal for the timed key before anything is timed (a fast wrong draw is no
result); rounds alternate the two, and the median of each is printed with the ratio.
"""
import argparse
import sys

import jax
import numpy as np

from bench import common
from rljax import sampler


def parse_shape(text):
  rows, vocab = (common.positive_int(n) for n in text.split('x'))
  return rows, vocab


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--shapes', default='64x1024,8x151936', help='comma-separated ROWSxVOCAB')
  parser.add_argument('--rounds', type=common.positive_int, default=5)
  args = parser.parse_args(argv)
  draws = {'jax.random.categorical': jax.jit(lambda key, x: jax.random.categorical(key, x)),
           'rljax sampler.categorical': jax.jit(sampler.categorical)}
  print(common.machine())
  for rows, vocab in map(parse_shape, args.shapes.split(',')):
    key = jax.random.PRNGKey(0)
    logits_BxV = jax.random.normal(jax.random.PRNGKey(1), (rows, vocab)) * 3
    reference, *others = [np.asarray(draw(key, logits_BxV)) for draw in draws.values()]
    for other in others:
      np.testing.assert_array_equal(other, reference)
    calls = 3000 // rows if vocab < 10000 else 20
    ms = {name: [] for name in draws}
    for _ in range(args.rounds):
      for name, draw in draws.items():
        times = common.timings(lambda: [draw(key, logits_BxV) for _ in range(calls)][-1], repeats=1)
        ms[name].append(times[0] / calls * 1e3)
    medians = {name: float(np.median(values)) for name, values in ms.items()}
    cells = ', '.join(f'{name} {value:.3f} ms' for name, value in medians.items())
    ratio = medians['jax.random.categorical'] / medians['rljax sampler.categorical']
    print(f'{rows} x {vocab}: {cells}; rljax {ratio:.2f}x faster')


if __name__ == '__main__':
  main(sys.argv[1:])
