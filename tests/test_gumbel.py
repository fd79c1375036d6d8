"""rljax.rollout.gumbel: the published Threefry-2x32 answers, and jax.random's bits and
Gumbel noise to the last bit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.rollout import gumbel


def np_threefry2x32(key, counter):
  """Threefry-2x32-20 in plain Python integers, from the Random123 specification."""
  mask = 0xFFFFFFFF
  rotl = lambda v, r: ((v << r) | (v >> (32 - r))) & mask
  keys = (key[0], key[1], key[0] ^ key[1] ^ 0x1BD11BDA)
  x = [(counter[0] + keys[0]) & mask, (counter[1] + keys[1]) & mask]
  for block in range(5):
    for rotation in ((13, 15, 26, 6), (17, 29, 16, 24))[block % 2]:
      x[0] = (x[0] + x[1]) & mask
      x[1] = rotl(x[1], rotation) ^ x[0]
    x[0] = (x[0] + keys[(block + 1) % 3]) & mask
    x[1] = (x[1] + keys[(block + 2) % 3] + block + 1) & mask
  return tuple(x)


# Known-answer vectors of Threefry-2x32 with 20 rounds (Random123's kat_vectors).
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


@pytest.mark.parametrize('key, counter, expected', KNOWN_ANSWERS)
def test_threefry_gives_the_published_answers(key, counter, expected):
  assert np_threefry2x32(key, counter) == expected
  got = gumbel.threefry2x32(*(np.uint32(k) for k in key), *(jnp.uint32(c) for c in counter))
  assert tuple(int(v) for v in got) == expected


def test_threefry_matches_the_numpy_reference_on_many_inputs():
  rng = np.random.default_rng(0)
  key = rng.integers(0, 2 ** 32, 2, dtype=np.uint64)
  counters = rng.integers(0, 2 ** 32, (2, 50), dtype=np.uint64)
  got = gumbel.threefry2x32(np.uint32(key[0]), np.uint32(key[1]),
                            jnp.asarray(counters[0], jnp.uint32),
                            jnp.asarray(counters[1], jnp.uint32))
  expected = [np_threefry2x32((int(key[0]), int(key[1])), (int(a), int(b)))
              for a, b in zip(*counters)]
  np.testing.assert_array_equal(np.stack([np.asarray(v) for v in got], axis=1), expected)


@pytest.mark.parametrize('shape', [(), (1,), (7,), (64, 1024), (3, 5, 11), (2, 151936)])
@pytest.mark.parametrize('seed', [0, 1, 2 ** 31 + 5])
def test_bits_and_noise_are_jax_randoms(shape, seed):
  key = jax.random.PRNGKey(seed)
  np.testing.assert_array_equal(jax.jit(gumbel.random_bits, static_argnums=1)(key, shape),
                                jax.random.bits(key, shape))
  np.testing.assert_array_equal(jax.jit(gumbel.gumbel, static_argnums=1)(key, shape),
                                jax.random.gumbel(key, shape))


def test_without_partitionable_threefry_the_bits_are_still_jaxs():
  key = jax.random.PRNGKey(7)
  with jax.threefry_partitionable(False):
    np.testing.assert_array_equal(gumbel.gumbel(key, (3, 10)), jax.random.gumbel(key, (3, 10)))


def test_typed_keys_and_split_keys_work_alike():
  key = jax.random.key(3)
  for k in (key, *jax.random.split(key, 2)):
    np.testing.assert_array_equal(gumbel.gumbel(k, (4, 9)), jax.random.gumbel(k, (4, 9)))


def test_other_keys_are_refused():
  with pytest.raises(ValueError, match='threefry key'):
    gumbel.gumbel(jax.random.key(0, impl='rbg'), (4,))
  with pytest.raises(ValueError, match='threefry key'):
    gumbel.gumbel(jnp.zeros((4,), jnp.uint32), (4,))
