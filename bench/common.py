"""Shared pieces of the benchmarks: the machine's two ceilings measured in the same run, timing with
medians and spread, compile counting, and the model arithmetic behind each roofline.

A roofline is only as good as its ceilings, so both are MEASURED here, on this machine, in the run
that reports against them: memory bandwidth from a large copy and a large reduction (the faster of
the two counts), matmul peak from a large matmul in the benchmark's compute dtype.
"""
import argparse
import concurrent.futures
import contextlib
import datetime
import json
import math
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from rljax.model import transformer as model_lib

BACKEND_COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'


# ------------------------------------------------------------------ the machine


def load_average():
  """1-minute load average: the benchmarks share a small CPU with other work, so every result
  carries the load it was measured under."""
  return os.getloadavg()[0]


def machine():
  """Hardware and software, named."""
  device = jax.devices()[0]
  kind = device.device_kind if device.platform != 'cpu' else (platform.processor() or 'cpu')
  return dict(date=datetime.datetime.now().isoformat(timespec='seconds'), platform=device.platform,
              device_kind=kind, num_devices=jax.device_count(), cpu_count=os.cpu_count(),
              jax=jax.__version__, python=platform.python_version(), load_1min=load_average())


def timings(fn, *args, repeats=5, warmup=1):
  """Wall seconds of `repeats` calls of `fn(*args)` (results blocked on), after `warmup` calls."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return times


def alternated(fns, rounds, *args):
  """{name: wall seconds of each call}: one call of every `fns[name](*args)` per round, after one
  warm-up call each, so that a change in machine load hits them alike."""
  for fn in fns.values():
    jax.block_until_ready(fn(*args))
  seconds = {name: [] for name in fns}
  for _ in range(rounds):
    for name, fn in fns.items():
      seconds[name] += timings(fn, *args, repeats=1, warmup=0)
  return seconds


def median_spread(xs):
  """(median, (max - min) / median): the spread says how much to trust the median."""
  xs = np.asarray(xs, float)
  med = float(np.median(xs))
  return med, float((xs.max() - xs.min()) / med) if med else 0.0


def median_interval(xs, coverage=0.9):
  """(median, low, high, coverage): a distribution-free interval for the median of `xs`, the
  order statistics (x_(j), x_(n+1-j)) with the largest j whose binomial coverage
  1 - 2 P(Binomial(n, 1/2) < j) is still >= `coverage`; with too few values, min and max (and
  their coverage, below the target)."""
  xs = np.sort(np.asarray(xs, float))
  n = len(xs)
  cover = lambda j: 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2**n
  j = 1
  while j < n // 2 and cover(j + 1) >= coverage:
    j += 1
  return float(np.median(xs)), float(xs[j - 1]), float(xs[n - j]), cover(j)


@contextlib.contextmanager
def count_compiles():
  """Counts XLA backend compilations (and their seconds) inside the block: {'count', 'seconds'}."""
  record = dict(count=0, seconds=0.0)

  def listener(event, duration, **_):
    if event == BACKEND_COMPILE_EVENT:
      record['count'] += 1
      record['seconds'] += duration

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield record
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


# ------------------------------------------------------------------ the two ceilings


class Ceilings:
  """The two ceilings, re-measurable cheaply (arrays allocated and probes compiled once), so a
  benchmark can interleave them with the work it measures.

  Memory bandwidth: max of a copy (bytes read + written) and a sum (bytes read) over an array
  several times the last-level cache. Matmul peak: one n x n x n matmul in the compute dtype, on
  random data (zeros run faster on some chips).
  """

  def __init__(self, on_gpu, dtype, probe_bytes=None, matmul_n=None):
    n = (probe_bytes or ((2 << 30) if on_gpu else (1536 << 20))) // 4
    self.x = jax.random.uniform(jax.random.PRNGKey(0), (n,), jnp.float32)
    self.copy = jax.jit(lambda a: a * 1.0000001)   # a real pass over memory, not an aliasing no-op
    self.total = jax.jit(jnp.sum)
    m = matmul_n or (8192 if on_gpu else 2048)
    self.a = jax.random.normal(jax.random.PRNGKey(1), (m, m), jnp.float32).astype(dtype)
    self.b = jax.random.normal(jax.random.PRNGKey(2), (m, m), jnp.float32).astype(dtype)
    self.matmul = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    self.dtype = str(jnp.dtype(dtype))
    jax.block_until_ready((self.copy(self.x), self.total(self.x), self.matmul(self.a, self.b)))

  def bandwidth(self, repeats=1):
    """Bytes/s, and the copy and reduce figures behind it."""
    nbytes = self.x.size * 4
    copy_bw = 2 * nbytes / min(timings(self.copy, self.x, repeats=repeats, warmup=0))
    sum_bw = nbytes / min(timings(self.total, self.x, repeats=repeats, warmup=0))
    return max(copy_bw, sum_bw), dict(copy_GBps=copy_bw / 1e9, reduce_GBps=sum_bw / 1e9,
                                      probe_MB=nbytes / 1e6)

  def flops(self, repeats=1):
    m = self.a.shape[0]
    return 2 * m ** 3 / min(timings(self.matmul, self.a, self.b, repeats=repeats, warmup=0))


# ------------------------------------------------------------------ model arithmetic


def param_counts(cfg: model_lib.ModelConfig):
  """Parameter counts: total, per expert (one expert's three matrices, one layer), and the rest."""
  d, f = cfg.d_model, cfg.expert_hidden
  attn = cfg.d_model * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 2 * cfg.head_dim
  norms = 2 * d
  if cfg.num_experts:
    ffn_shared, expert = d * cfg.num_experts, 3 * d * f
  else:
    ffn_shared, expert = 3 * d * cfg.dense_hidden, 0
  per_layer_shared = attn + norms + ffn_shared
  embed = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2) + d
  shared = cfg.num_layers * per_layer_shared + embed
  total = shared + cfg.num_layers * cfg.num_experts * expert
  return dict(total=total, shared=shared, expert=expert)


def active_params_per_token(cfg):
  """Parameters one token multiplies with (the embedding table is a lookup, not a matmul)."""
  c = param_counts(cfg)
  lookup = cfg.vocab_size * cfg.d_model if not cfg.tie_embeddings else 0
  return c['shared'] - lookup + cfg.num_layers * cfg.experts_per_token * c['expert']


def expected_experts_touched(cfg, tokens):
  """Expected number of distinct experts (per layer) that `tokens` tokens route to, under uniform
  routing: E (1 - (1 - k/E)^tokens). At batch 1 that is k; at large batch all E."""
  if not cfg.num_experts:
    return 0.0
  e, k = cfg.num_experts, cfg.experts_per_token
  return e * (1.0 - (1.0 - k / e) ** tokens)


def decode_step_cost(cfg, batch, kv_slots, weight_itemsize):
  """(bytes, flops) of one decode step for `batch` rows attending over `kv_slots` cached tokens:
  every weight a row needs read once (experts: only those some row routes to), the used KV cache
  read once, the new K/V written; matmul FLOPs plus attention's."""
  c = param_counts(cfg)
  lookup = cfg.vocab_size * cfg.d_model if not cfg.tie_embeddings else 0
  weights = (c['shared'] - lookup + cfg.num_layers * expected_experts_touched(cfg, batch) *
             c['expert'])
  kv_itemsize = np.dtype(cfg.dtype).itemsize
  kv_row = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * kv_itemsize
  nbytes = weights * weight_itemsize + batch * kv_row * (kv_slots + 1)
  flops = 2 * batch * active_params_per_token(cfg)
  flops += 4 * batch * cfg.num_layers * cfg.num_heads * cfg.head_dim * kv_slots
  return nbytes, flops


def roofline_seconds(nbytes, flops, ceilings):
  """(memory time, compute time): the step can be no faster than the larger."""
  return nbytes / ceilings.bandwidth, flops / ceilings.flops


# ------------------------------------------------------------------ command lines


def positive_int(text):
  """argparse type: an integer >= 1 (a batch, a length, a count)."""
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f'must be >= 1, got {value}')
  return value


def positive_ints(text):
  """argparse type: comma-separated integers >= 1 (batches, lengths, micro-batches)."""
  try:
    return [positive_int(part) for part in text.split(',')]
  except (ValueError, argparse.ArgumentTypeError):
    raise argparse.ArgumentTypeError(
        f'expected comma-separated integers >= 1, got {text!r}') from None


# ------------------------------------------------------------------ output


def write_json(path, record):
  if path:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
      json.dump(record, f, indent=1, default=float)


def table(rows, columns):
  """A markdown table of dict rows (floats to 3 significant digits)."""
  fmt = lambda v: (f'{v:.3g}' if isinstance(v, float) else str(v))
  lines = ['| ' + ' | '.join(columns) + ' |', '|' + '---|' * len(columns)]
  lines += ['| ' + ' | '.join(fmt(r.get(c, '')) for c in columns) + ' |' for r in rows]
  return '\n'.join(lines)


def gib(nbytes):
  return nbytes / 2 ** 30


def precompile(jobs, mesh, workers=None):
  """Compiles `(jitted, args)` jobs ahead of their first call, in parallel threads (XLA compiles
  outside the GIL), so a sweep of many shapes pays about the longest compile, not the sum.
  The jit cache keeps the executables: the timed calls that follow compile nothing (asserted by
  the benchmarks). Returns each job's compile seconds (wall, under the parallel load)."""
  def compile_one(job):
    jitted, args = job
    start = time.perf_counter()
    with jax.set_mesh(mesh):
      jitted.lower(*args).compile()
    return time.perf_counter() - start
  with concurrent.futures.ThreadPoolExecutor(
      workers or max(1, min(len(jobs), os.cpu_count()))) as pool:
    return list(pool.map(compile_one, jobs))
