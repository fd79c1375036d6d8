"""Partial rollouts (rljax.rollout.partial): across calls every admitted response is trained once
or still waits in the pool, never lost or duplicated, on the schedule of a plain-Python simulation
of the pool and its slots (which groups finish, each token's policy version, restarts for
staleness, decode steps); a response carried across calls (its KV cache kept) samples exactly the
tokens, and records exactly the experts, that the static sampler does from its prompt and key."""
import functools

import jax
import numpy as np
import pytest

from rljax.model import transformer as model_lib
from rljax.rollout import partial
from rljax.rollout import sampler as sampler_lib

import random_params as random_params_lib
import tolerance

V, PAD = 16, 0
P, G, T, L, SLOTS = 2, 3, 5, 9, 5
CFG = model_lib.ModelConfig(vocab_size=V, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1,
                            head_dim=8, num_experts=4, experts_per_token=2, expert_hidden=16,
                            moe_impl='dense')
MODEL = model_lib.Transformer(CFG)
SAMPLING = sampler_lib.SamplingConfig(L, -1, PAD)   # no stop token: responses stop at their caps


def group_prompts(serials):
  """Left-padded prompts of mixed lengths, group s's determined by s."""
  rows = []
  for s in serials:
    rng = np.random.default_rng(100 + s)
    n = 1 + s % T
    rows.append([PAD] * (T - n) + list(rng.integers(2, V, n)))
  prompt = np.asarray(rows, np.int32)
  return prompt, prompt != PAD


@functools.lru_cache(maxsize=None)
def programs():
  admit = jax.jit(partial.admit)
  advance = jax.jit(functools.partial(partial.advance, MODEL, cfg=SAMPLING, num_groups=P),
                    static_argnums=())
  static = jax.jit(lambda p, prompt, valid, keys, caps: sampler_lib.generate(
      MODEL, p, prompt, valid, keys, SAMPLING, caps))
  return admit, advance, static


def simulate(caps_N, calls, max_staleness, groups=2 * P):
  """The pool in plain Python: returns per call [(serial, index in group, versions of its
  tokens)] of the groups it returns, and the decode steps."""
  rows = sampler_lib.refill_rows(SLOTS)
  serial = [-1] * groups
  status, versions = ['empty'] * (groups * G), [[] for _ in range(groups * G)]
  slot_of = [None] * SLOTS
  admitted, out = 0, []
  for version in range(calls):
    for _ in range(2 if version == 0 else 1):   # admit P groups into the first free places
      for place in [q for q in range(groups) if serial[q] < 0][:P]:
        serial[place], admitted = admitted, admitted + 1
        for r in range(place * G, place * G + G):
          status[r], versions[r] = 'pending', []
    for r in range(groups * G):   # the staleness rule
      if status[r] in ('decoding', 'done') and min(versions[r]) < version - max_staleness:
        status[r], versions[r] = 'pending', []
        slot_of = [None if s == r else s for s in slot_of]
    complete = lambda: [q for q in range(groups) if all(status[r] == 'done'
                                                        for r in range(q * G, q * G + G))]
    cap = lambda r: caps_N[serial[r // G] * G + r % G]
    steps = 0
    while len(complete()) < P:
      while True:   # refills, `rows` at a time
        pending = sorted((serial[r // G] * G + r % G, r) for r in range(groups * G)
                         if status[r] == 'pending')
        free = [s for s in range(SLOTS) if slot_of[s] is None]
        if not pending or len(free) < min(rows, len(pending)):
          break
        for s, (_, r) in zip(free, pending[:rows]):
          slot_of[s], status[r] = r, 'decoding'
      for s, r in enumerate(slot_of):
        if r is not None:
          versions[r].append(version)
          if len(versions[r]) >= cap(r):
            status[r], slot_of[s] = 'done', None
      steps += 1
    done = sorted(complete(), key=lambda q: serial[q])[:P]
    out.append(([(serial[q], g, list(versions[q * G + g])) for q in done for g in range(G)],
                steps))
    for q in done:
      serial[q] = -1
      for r in range(q * G, q * G + G):
        status[r] = 'empty'
  return out


@pytest.mark.parametrize('max_staleness', [0, 1, 8])
def test_no_response_lost_or_duplicated_and_carried_tokens_equal_static(max_staleness):
  admit, advance, static = programs()
  params = random_params_lib.for_model(CFG, 0)
  calls = 6
  num = (calls + 1) * P * G   # responses admitted over the calls
  caps_N = np.random.default_rng(1).integers(1, L + 1, num).astype(np.int32)
  batch_keys = [jax.random.fold_in(jax.random.PRNGKey(2), i) for i in range(calls + 1)]
  keys_Nx2 = np.concatenate([sampler_lib.response_keys(k, P * G) for k in batch_keys])
  prompt_NxT, valid_NxT = group_prompts(np.arange(num) // G)
  expected = simulate(caps_N, calls, max_staleness)
  reference = jax.device_get(static(params, prompt_NxT, valid_NxT, keys_Nx2, caps_N))

  flight = partial.empty(CFG, 2 * P, G, SLOTS, T, L)
  admitted, trained = 0, []
  for version in range(calls):
    for _ in range(2 if version == 0 else 1):
      n = slice(admitted * G, (admitted + P) * G)
      flight = admit(flight, prompt_NxT[n][::G], valid_NxT[n][::G], batch_keys[admitted // P],
                     caps_N[n])
      admitted += P
    flight, out = advance(params, flight, version, max_staleness)
    out = jax.device_get(out)
    responses, steps = expected[version]
    serials = [s for s, g, _ in responses]
    rows = np.asarray([s * G + g for s, g, _ in responses])
    assert int(out.rollout.decode_steps) == steps, version
    np.testing.assert_array_equal(out.serial_P, serials[::G])
    np.testing.assert_array_equal(out.prompt_BxT, prompt_NxT[rows])
    np.testing.assert_array_equal(out.rollout.lengths_B, caps_N[rows])
    for b, (_, _, versions) in enumerate(responses):
      np.testing.assert_array_equal(out.version_BxL[b, :len(versions)], versions)
    np.testing.assert_array_equal(out.rollout.tokens_BxL, reference.tokens_BxL[rows])
    np.testing.assert_array_equal(out.rollout.experts_BxLxYxK, reference.experts_BxLxYxK[rows])
    np.testing.assert_allclose(out.rollout.logp_BxL, reference.logp_BxL[rows],
                               **tolerance.ACROSS_PROGRAMS)
    trained += [(s, g) for s, g, _ in responses]
  assert len(set(trained)) == len(trained) == calls * P * G   # none twice
  carried = [v for out, _ in expected for _, _, versions in out for v in [len(set(versions))]]
  if max_staleness:   # some response spans two policy versions (its KV cache carried)
    assert max(carried) > 1
  else:
    assert max(carried) == 1
