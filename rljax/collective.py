"""JSON values across the processes of a multi-process run (jax.distributed): collectives, so
every process calls them at the same point; with one process they return at once.

A value travels as utf-8 bytes padded to a power of two: each new array shape compiles a new
collective, so per-step values of varying size would otherwise compile at every step."""
import json

import jax
from jax.experimental import multihost_utils
import numpy as np

MIN_BYTES = 256


def from_every_process(value):
  """Every process's JSON `value`, in process order."""
  if jax.process_count() == 1:
    return [value]
  encoded = _encode(value)
  size = int(np.max(multihost_utils.process_allgather(np.int32(encoded.size))))
  rows = multihost_utils.process_allgather(_padded(encoded, size))
  return [_decode(row) for row in rows]


def from_process_0(value):
  """Process 0's JSON `value` on every process."""
  if jax.process_count() == 1:
    return value
  encoded = _encode(value)
  size = int(multihost_utils.broadcast_one_to_all(np.int32(encoded.size)))
  raw = _padded(encoded if jax.process_index() == 0 else encoded[:0], size)
  return _decode(multihost_utils.broadcast_one_to_all(raw))


def _encode(value):
  return np.frombuffer(json.dumps(value).encode(), np.uint8)


def _padded(encoded, size):
  """`encoded` zero-padded to the power of two >= max(size, MIN_BYTES)."""
  padded = np.zeros(max(MIN_BYTES, 1 << (size - 1).bit_length()), np.uint8)
  padded[:encoded.size] = encoded
  return padded


def _decode(row):
  return json.loads(bytes(np.asarray(row)).rstrip(b'\0').decode())
