"""One token draw per row, `jax.random.categorical` against `rljax.rollout.sampler.categorical`,
side by side.

  PYTHONPATH=. python bench/sampling.py --shapes=64x1024,8x151936

Both are Gumbel-max; rljax's takes the argmax as a max and a min (`sampler.first_argmax`) and
hashes its noise's counters unrolled (`rljax.rollout.gumbel`; jax's CPU hash is a rolled loop). The
draws are checked equal for the timed key before anything is timed (a fast wrong draw is no
result); rounds alternate the two, and the median of each is printed with the ratio.
"""
import argparse
import sys

import jax
import numpy as np

from bench import common
from rljax.rollout import sampler


def shapes(text):
  """argparse type: comma-separated ROWSxVOCAB pairs of positive integers."""
  pairs = [item.split('x') for item in text.split(',')]
  if any(len(pair) != 2 for pair in pairs):
    raise argparse.ArgumentTypeError(f'expected ROWSxVOCAB[,ROWSxVOCAB...], got {text!r}')
  return [tuple(common.positive_int(n) for n in pair) for pair in pairs]


def run(rows, vocab, rounds):
  """{name: median ms per draw} of both draws on [rows, vocab] logits, after checking them equal."""
  draws = {'jax.random.categorical': jax.jit(lambda key, x: jax.random.categorical(key, x)),
           'rljax sampler.categorical': jax.jit(sampler.categorical)}
  key = jax.random.PRNGKey(0)
  logits_BxV = jax.random.normal(jax.random.PRNGKey(1), (rows, vocab)) * 3
  (reference_name, reference), *others = [(name, np.asarray(draw(key, logits_BxV)))
                                          for name, draw in draws.items()]
  for name, tokens in others:
    assert np.array_equal(tokens, reference), f'{name} draws other tokens than {reference_name}'
  calls = max(1, min(3000 // rows, 2_000_000 // (rows * vocab)))
  batches = {name: lambda draw=draw: [draw(key, logits_BxV) for _ in range(calls)][-1]
             for name, draw in draws.items()}
  seconds = common.alternated(batches, rounds)
  return {name: float(np.median(values)) / calls * 1e3 for name, values in seconds.items()}


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--shapes', type=shapes, default='64x1024,8x151936',
                      help='comma-separated ROWSxVOCAB')
  parser.add_argument('--rounds', type=common.positive_int, default=5)
  args = parser.parse_args(argv)
  print(common.machine())
  for rows, vocab in args.shapes:
    ms = run(rows, vocab, args.rounds)
    cells = ', '.join(f'{name} {value:.3f} ms' for name, value in ms.items())
    ratio = ms['jax.random.categorical'] / ms['rljax sampler.categorical']
    print(f'{rows} x {vocab}: {cells}; rljax {ratio:.2f}x faster')


if __name__ == '__main__':
  main(sys.argv[1:])
