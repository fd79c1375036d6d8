"""Continuous batching (rljax.rollout.sampler.generate_continuous): with per-response keys it
returns the static sampler's tokens and recorded experts exactly and its log-probs within float32
rounding (tolerance.py: they are two compiled programs), whatever the slot count and the order rows
finish in; every prompt is decoded exactly once (its schedule equals a plain-numpy simulation of the
slots); it compiles once; on a mesh it equals the static sampler on that mesh."""
import functools

import jax
import ml_collections
import numpy as np
import pytest

from rljax.model import transformer as model_lib
from rljax.rollout import sampler as sampler_lib
from rljax import sharding

import random_params as random_params_lib
import tolerance

V, EOS, PAD = 16, 1, 0
N, T, L = 12, 6, 9
CFG = model_lib.ModelConfig(vocab_size=V, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                            head_dim=8, num_experts=4, experts_per_token=2, expert_hidden=24,
                            moe_impl='dense')
MODEL = model_lib.Transformer(CFG)


def inputs(seed, num=N):
  """Left-padded prompts of mixed lengths and per-response caps (forced stops) in shuffled order."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, T + 1, num)
  prompt_NxT = rng.integers(2, V, (num, T)).astype(np.int32)
  valid_NxT = np.arange(T)[None] >= (T - lengths)[:, None]
  prompt_NxT[~valid_NxT] = PAD
  caps_N = rng.permutation(np.resize(np.arange(1, L + 1), num)).astype(np.int32)
  return prompt_NxT, valid_NxT, caps_N


@functools.lru_cache(maxsize=None)
def static_sampler(cfg):
  return jax.jit(lambda p, prompt, valid, keys, caps: sampler_lib.generate(
      MODEL, p, prompt, valid, keys, cfg, caps))


def assert_rollouts_equal(a, b):
  """Same tokens, masks, lengths and experts; log-probs within rounding (two different programs)."""
  for name in ('tokens_BxL', 'mask_BxL', 'lengths_B', 'experts_BxLxYxK'):
    np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)),
                                  err_msg=name)
  np.testing.assert_allclose(np.asarray(a.logp_BxL), np.asarray(b.logp_BxL),
                             **tolerance.ACROSS_PROGRAMS)


@pytest.mark.parametrize('slots,sampling', [
    (3, dict(temperature=1.0)),
    pytest.param(5, dict(temperature=0.7, top_k=4), marks=pytest.mark.e2e),   # more settings
    pytest.param(N, dict(greedy=True), marks=pytest.mark.e2e)])
def test_equal_to_static_with_per_response_keys(slots, sampling):
  params = random_params_lib.for_model(CFG, 0)
  prompt, valid, caps = inputs(1)
  rng = jax.random.PRNGKey(3)
  static_cfg = sampler_lib.SamplingConfig(L, EOS, PAD, **sampling)
  static = static_sampler(static_cfg)(params, prompt, valid, sampler_lib.response_keys(rng, N),
                                      caps)
  continuous = sampler_lib.make_sampler(MODEL, sampler_lib.SamplingConfig(
      L, EOS, PAD, slots=slots, **sampling))(params, prompt, valid, rng, caps)
  assert_rollouts_equal(static, continuous)
  assert 0 < np.asarray(continuous.lengths_B).min()   # every prompt decoded
  if not sampling.get('greedy'):   # the keys matter: another key, other tokens
    other = static_sampler(static_cfg)(params, prompt, valid,
                                       sampler_lib.response_keys(jax.random.PRNGKey(4), N), caps)
    assert not np.array_equal(np.asarray(other.tokens_BxL), np.asarray(static.tokens_BxL))


@pytest.mark.parametrize('slots', [5, pytest.param(16, marks=pytest.mark.e2e)])   # 16: > P x G
def test_a_group_prefills_each_prompt_once_and_equals_static_on_repeated_prompts(slots):
  """group G on P prompts (each prefilled once, its cache rows copied into every slot that
  decodes one of its responses) returns what the static sampler returns on the prompts repeated G
  times, group-major, with the same per-response keys: tokens exactly, log-probs within
  tolerance.ACROSS_PROGRAMS (different programs)."""
  P, G = 3, 4
  params = random_params_lib.for_model(CFG, 2)
  prompt_PxT, valid_PxT, _ = inputs(5, P)
  caps_N = np.random.default_rng(6).permutation(np.resize(np.arange(1, L + 1), P * G))
  rng = jax.random.PRNGKey(7)
  static = static_sampler(sampler_lib.SamplingConfig(L, EOS, PAD))(
      params, np.repeat(prompt_PxT, G, 0), np.repeat(valid_PxT, G, 0),
      sampler_lib.response_keys(rng, P * G), caps_N)
  grouped = sampler_lib.make_sampler(MODEL, sampler_lib.SamplingConfig(
      L, EOS, PAD, slots=slots, group=G))(params, prompt_PxT, valid_PxT, rng, caps_N)
  assert_rollouts_equal(static, grouped)
  assert 0 < np.asarray(grouped.lengths_B).min()   # every response decoded


def simulated_steps(caps_N, slots, rows):
  """Plain-numpy slots: before each step, while at least `rows` slots (or as many as prompts are
  left) are free, the lowest-numbered free slots take the next pending prompts, `rows` at a time.
  Returns the number of decoding steps."""
  remaining_S, pending, steps = np.zeros(slots, int), 0, 0
  while pending < len(caps_N) or remaining_S.any():
    while pending < len(caps_N) and (remaining_S == 0).sum() >= min(rows, len(caps_N) - pending):
      for slot in np.flatnonzero(remaining_S == 0)[:rows]:
        if pending < len(caps_N):
          remaining_S[slot], pending = caps_N[pending], pending + 1
    remaining_S = np.maximum(remaining_S - 1, 0)
    steps += 1
  return steps


@pytest.mark.parametrize('slots', [3, 8])
def test_every_prompt_decoded_once_in_any_finishing_order(slots):
  """No stop token (eos -1): each response stops at its shuffled cap, so rows finish in an
  arbitrary order; each is decoded to exactly its cap and the loop runs exactly as many steps as
  the simulated slots need (a dropped or repeated prompt changes the count)."""
  num = 40
  params = random_params_lib.for_model(CFG, 1)
  prompt, valid, caps = inputs(2, num)
  sampler = sampler_lib.make_sampler(MODEL, sampler_lib.SamplingConfig(L, -1, PAD, slots=slots))
  rollout = jax.device_get(sampler(params, prompt, valid, jax.random.PRNGKey(0), caps))
  np.testing.assert_array_equal(rollout.lengths_B, caps)
  steps = simulated_steps(caps, slots, sampler_lib.refill_rows(slots))
  assert int(rollout.decode_steps) == steps
  np.testing.assert_allclose(rollout.utilization, caps.sum() / (slots * steps), rtol=1e-6)
  metrics = jax.device_get(sampler_lib.rollout_metrics(rollout))
  assert metrics['response_len_max'] == caps.max()
  np.testing.assert_allclose(metrics['response_len_mean'], caps.mean(), rtol=1e-6)


def test_compiles_once():
  traces = [0]

  def traced(*args):
    traces[0] += 1
    return sampler_lib.generate_continuous(*args)

  cfg = sampler_lib.SamplingConfig(L, EOS, PAD, slots=4)
  sampler = jax.jit(lambda p, prompt, valid, rng, caps: traced(
      MODEL, p, prompt, valid, sampler_lib.response_keys(rng, N), cfg, caps))
  lengths = set()
  for seed in range(3):   # new parameters, prompts, keys and caps: other schedules, one program
    prompt, valid, caps = inputs(seed)
    rollout = sampler(random_params_lib.for_model(CFG, seed), prompt, valid,
                      jax.random.PRNGKey(seed), caps)
    lengths.add(tuple(np.asarray(rollout.lengths_B)))
  assert traces[0] == 1 and sampler._cache_size() == 1
  assert len(lengths) == 3


def test_on_a_mesh_equals_static_on_that_mesh():
  """Slots split over the batch axes (data x fsdp = 8): the same tokens as the static sampler with
  the same per-response keys on that mesh, log-probs equal up to the reduction order."""
  mesh = sharding.make_mesh(ml_collections.ConfigDict(dict(data=4, fsdp=2)))
  params, _ = sharding.init_params(functools.partial(model_lib.init_params, CFG),
                                   jax.random.PRNGKey(0), mesh)
  prompt, valid, caps = inputs(3, 16)
  placed = sharding.put_batch((prompt, valid, caps), mesh)
  rng = jax.random.PRNGKey(1)
  cfg = sampler_lib.SamplingConfig(L, EOS, PAD)
  static = sharding.on_mesh(static_sampler(cfg), mesh)(
      params, *placed[:2], sampler_lib.response_keys(rng, 16), placed[2])
  continuous = sharding.on_mesh(sampler_lib.make_sampler(
      MODEL, sampler_lib.SamplingConfig(L, EOS, PAD, slots=8)), mesh)(params, *placed[:2], rng,
                                                                       placed[2])
  np.testing.assert_array_equal(np.asarray(continuous.tokens_BxL), np.asarray(static.tokens_BxL))
  np.testing.assert_array_equal(np.asarray(continuous.mask_BxL), np.asarray(static.mask_BxL))
  np.testing.assert_allclose(np.asarray(continuous.logp_BxL), np.asarray(static.logp_BxL),
                             rtol=2e-5, atol=2e-6)
  assert int(continuous.decode_steps) > int(static.decode_steps)   # 16 responses, 8 slots


def test_negative_slots_raise_one_clear_error():
  with pytest.raises(ValueError, match='rollout.slots must be >= 0'):
    sampler_lib.SamplingConfig(L, EOS, PAD, slots=-1)
