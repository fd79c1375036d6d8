"""One MoE layer's experts, forward + backward, for each expert implementation, side by side.

  PYTHONPATH=. python bench/moe.py --tokens=832 --d=128 --f=128 --experts=4 --k=2     # runlocal
  PYTHONPATH=. python bench/moe.py --tokens=1536 --d=256 --f=256 --experts=8 --k=2    # peer
  PYTHONPATH=. python bench/moe.py --tokens=64 --d=256 --f=256 --experts=8 --k=2 --forward_only
                                                             # peer, one decode step at batch 64

Random tokens routed by random router logits; each implementation's gradients are checked
against the first one's before it is timed (a fast wrong path is no result). Rounds alternate
the implementations, so machine load hits them alike; the median of each is printed.
"""
import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

from bench import common
from rljax.model import moe
from rljax.model import router


def make_case(tokens, d, f, experts, k, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 5)
  x_TxD = jax.random.normal(keys[0], (tokens, d))
  weights_TxK, experts_TxK, _, _ = router.route(jax.random.normal(keys[1], (tokens, experts)), k)
  expert_weights = (jax.random.normal(keys[2], (experts, d, f)) * d ** -0.5,
                    jax.random.normal(keys[3], (experts, d, f)) * d ** -0.5,
                    jax.random.normal(keys[4], (experts, f, d)) * f ** -0.5)
  return x_TxD, weights_TxK, experts_TxK, expert_weights


def value_and_grads(impl, weights_TxK, experts_TxK, forward_only=False):
  """Jitted loss and gradients w.r.t. the tokens and the three expert matrices (or the output)."""
  def forward(x_TxD, w_gate, w_up, w_down):   # gate and up as the model has them: joined to decode
    w_in = (moe.gate_up(w_gate, w_up),) if forward_only else (w_gate, w_up)
    return impl(x_TxD, weights_TxK, experts_TxK, w_in, w_down)
  if forward_only:
    return jax.jit(forward)
  loss = lambda *args: jnp.sum(jnp.sin(forward(*args)))
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))


def run(tokens, d, f, experts, k, impls, rounds, forward_only=False):
  x_TxD, weights_TxK, experts_TxK, expert_weights = make_case(tokens, d, f, experts, k)
  fns = {name: value_and_grads(moe.EXPERT_IMPLS[name], weights_TxK, experts_TxK, forward_only)
         for name in impls}
  reference = None
  for name, fn in fns.items():
    out = jax.tree.leaves(jax.block_until_ready(fn(x_TxD, *expert_weights)))
    reference = reference or out
    error = max(float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))
                for a, b in zip(out, reference))
    if error > 1e-4:
      raise AssertionError(f'{name} differs from {impls[0]} by {error:.2e} (relative)')
  seconds = common.alternated(fns, rounds, x_TxD, *expert_weights)
  return {name: 1e3 * float(np.median(s)) for name, s in seconds.items()}


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--tokens', type=common.positive_int, default=832)
  parser.add_argument('--d', type=common.positive_int, default=128)
  parser.add_argument('--f', type=common.positive_int, default=128)
  parser.add_argument('--experts', type=common.positive_int, default=4)
  parser.add_argument('--k', type=common.positive_int, default=2)
  parser.add_argument('--impls', default=','.join(moe.EXPERT_IMPLS))
  parser.add_argument('--rounds', type=common.positive_int, default=20)
  parser.add_argument('--forward_only', action='store_true', help='time the output alone')
  args = parser.parse_args(argv)
  impls = args.impls.split(',')
  unknown = sorted(set(impls) - set(moe.EXPERT_IMPLS))
  if unknown or args.k > args.experts:
    parser.error(f'unknown --impls {unknown}; choose from {sorted(moe.EXPERT_IMPLS)}' if unknown
                 else f'--k {args.k} > --experts {args.experts}')
  ms = run(args.tokens, args.d, args.f, args.experts, args.k, impls, args.rounds,
           args.forward_only)
  print(f'{args.tokens} tokens, d={args.d}, f={args.f}, E={args.experts}, k={args.k}: '
        f'{"fwd" if args.forward_only else "fwd + bwd"} ms (median) '
        + ', '.join(f'{name} {t:.2f}' for name, t in ms.items()))


if __name__ == '__main__':
  main(sys.argv[1:])
