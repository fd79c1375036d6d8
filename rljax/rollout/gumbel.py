"""Gumbel noise with the values of `jax.random.gumbel` (same key, same numbers), in one fused pass.

jax lowers its Threefry-2x32 hash on CPU as a rolled loop of five iterations, each reading and
writing (and copying) the whole state; the same 20 rounds unrolled fuse into one pass over the
elements (docs/design/gumbel_threefry.md; `python bench/sampling.py` measures it). Here the hash is
Threefry-2x32 as published (Salmon et al., SC 2011; 20 rounds), unrolled, fed the counters
jax.random uses for a shape (each element's flat index; `jax_threefry_partitionable`, the default),
and its bits become uniforms and Gumbel noise as `jax.random` makes them.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np

ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
KEY_PARITY = np.uint32(0x1BD11BDA)
TINY = np.finfo(np.float32).tiny


def threefry2x32(key0, key1, x0, x1):
  """Threefry-2x32, 20 rounds: four rounds, then a key injection, five times."""
  keys = (key0, key1, key0 ^ key1 ^ KEY_PARITY)
  x0, x1 = x0 + keys[0], x1 + keys[1]
  for i in range(5):
    for rotation in ROTATIONS[i % 2]:
      x0 = x0 + x1
      x1 = jax.lax.shift_left(x1, np.uint32(rotation)) | jax.lax.shift_right_logical(
          x1, np.uint32(32 - rotation))
      x1 = x0 ^ x1
    x0 = x0 + keys[(i + 1) % 3]
    x1 = x1 + keys[(i + 2) % 3] + np.uint32(i + 1)
  return x0, x1


def random_bits(key, shape):
  """`jax.random.bits(key, shape)` (uint32) for a threefry key, raw (`PRNGKey`) or typed; jax's own
  where `jax_threefry_partitionable` is off (other counters)."""
  typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
  data = jax.random.key_data(key) if typed else key
  if data.shape != (2,) or data.dtype != jnp.uint32:
    raise ValueError(f'expected a threefry key (uint32[2] key data), got {data.dtype}{data.shape}')
  if not jax.config.jax_threefry_partitionable:
    return jax.random.bits(key, shape)
  if math.prod(shape) >= 2 ** 32:
    raise ValueError(f'shape {shape} has 2**32 elements or more')
  strides = np.cumprod((1,) + tuple(shape[:0:-1]))[::-1][:len(shape)]   # none for a scalar
  index = sum(jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * np.uint32(stride)
              for axis, stride in enumerate(strides))   # 0 for a scalar
  high, low = threefry2x32(data[0], data[1], jnp.zeros(shape, jnp.uint32), index)
  return high ^ low


def gumbel(key, shape):
  """`jax.random.gumbel(key, shape)` in float32: -log(-log(u)), u uniform in [tiny, 1)."""
  mantissa = jax.lax.shift_right_logical(random_bits(key, shape), np.uint32(32 - 23))
  one_to_two = jax.lax.bitcast_convert_type(mantissa | np.uint32(0x3F800000), jnp.float32)
  uniform = (one_to_two - 1) + TINY   # in [tiny, 1); jax's scale, 1 - tiny, is 1 in float32
  return -jnp.log(-jnp.log(uniform))
