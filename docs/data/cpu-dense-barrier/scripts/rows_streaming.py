"""How fast XLA:CPU streams a weight matrix through a product with M rows: [M, 640] x [640, 20480]
(52 MB of f32, above the L3 cache), six distinct matrices chained so that each product waits for
the one before, as in decoding; numpy's BLAS on the same chain for comparison.

  PYTHONPATH=. python docs/data/cpu-dense-barrier/scripts/rows_streaming.py
  PYTHONPATH=. taskset -c 0 python docs/data/cpu-dense-barrier/scripts/rows_streaming.py --rows=8
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

LAYERS, D, N = 6, 640, 20480


def median_seconds(run, repeats=15):
  run()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--rows', default='1,2,4,8,16,32')
  args = parser.parse_args()
  weights = [jax.random.normal(jax.random.PRNGKey(i), (D, N), jnp.float32) for i in range(LAYERS)]
  weights_np = [np.asarray(w) for w in weights]

  @jax.jit
  def chain(x_MxD, weights):
    for w_DxN in weights:
      x_MxD = (x_MxD @ w_DxN).reshape(x_MxD.shape[0], -1, D).sum(1) * 1e-3   # every column used
    return x_MxD

  def chain_np(x_MxD):
    for w_DxN in weights_np:
      x_MxD = (x_MxD @ w_DxN).reshape(x_MxD.shape[0], -1, D).sum(1) * 1e-3
    return x_MxD

  gigabytes = LAYERS * D * N * 4 / 1e9
  for rows in map(int, args.rows.split(',')):
    x_MxD = jnp.ones((rows, D), jnp.float32)
    xla = median_seconds(lambda: chain(x_MxD, weights).block_until_ready())
    blas = median_seconds(lambda: chain_np(np.ones((rows, D), np.float32)))
    print(f'{rows:3d} rows: XLA {1e3 * xla:6.1f} ms, {gigabytes / xla:5.1f} GB/s, '
          f'{2 * rows * gigabytes / 4 / xla:6.1f} GFLOP/s | numpy {1e3 * blas:6.1f} ms, '
          f'{gigabytes / blas:5.1f} GB/s', flush=True)


if __name__ == '__main__':
  main()
