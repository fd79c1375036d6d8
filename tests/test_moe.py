"""rljax.model.moe against plain numpy: the MoE layer for every expert implementation vs a naive
per-token loop over selected experts (the router's numpy reference: tests/test_router.py)."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rljax.model import moe
from rljax.model import transformer as model_lib
from rljax import sharding

from test_router import np_replayed, np_route, recorded_ids


# ------------------------------------------------------------------ numpy references (float64)


def np_silu(x):
  return x / (1.0 + np.exp(-x))


def np_moe(x_TxD, router, w_gate, w_up, w_down, k):
  """Naive loop: every token, each of its k experts, SwiGLU down(silu(x@gate) * (x@up))."""
  x = np.asarray(x_TxD, np.float64)
  weights, experts, _ = np_route(x @ np.asarray(router, np.float64), k)
  out = np.zeros_like(x)
  for t in range(x.shape[0]):
    for j in range(k):
      e = experts[t, j]
      hidden = np_silu(x[t] @ w_gate[e]) * (x[t] @ w_up[e])
      out[t] += weights[t, j] * (hidden @ w_down[e])
  return out, experts


# ------------------------------------------------------------------ MoE layer

D, F, E = 32, 24, 4


def moe_cfg(impl, k):
  return model_lib.ModelConfig(d_model=D, num_experts=E, experts_per_token=k, expert_hidden=F,
                               moe_impl=impl)


def random_moe_params(rng, skew):
  params = dict(router=rng.normal(size=(D, E)) * 0.5,
                w_gate=rng.normal(size=(E, D, F)) / np.sqrt(D),
                w_up=rng.normal(size=(E, D, F)) / np.sqrt(D),
                w_down=rng.normal(size=(E, F, D)) / np.sqrt(F))
  # inputs are positive, so expert 2's router logit is by far the largest for almost every token
  if skew:
    params['router'][:, 2] += 0.4
  return {name: value.astype(np.float32) for name, value in params.items()}


@pytest.mark.parametrize('devices, tokens, in_shard_map', [
    (4, 8, True), (4, 6, False), (1, 8, False)])
def test_experts_run_per_device_where_a_mesh_splits_the_tokens(devices, tokens, in_shard_map):
  """On a mesh of several devices that divides the tokens, the experts run in shard_map (XLA
  cannot partition the TPU grouped-matmul kernel); a batch it does not divide, or one device,
  keeps the local path."""
  mesh = sharding.make_mesh(ml_collections.ConfigDict(dict(fsdp=devices)), jax.devices()[:devices])
  layer = moe.MoE(moe_cfg('ragged', 2))
  x = jnp.ones((1, tokens, D), jnp.float32)
  params = jax.tree.map(jnp.asarray, random_moe_params(np.random.default_rng(0), False))
  with jax.set_mesh(mesh):
    jaxpr = jax.make_jaxpr(lambda p, x: layer.apply({'params': p}, x))(params, x)
  assert ('shard_map' in str(jaxpr)) == in_shard_map


@pytest.mark.parametrize('impl', ['ragged', 'dense', 'bucketed'])
@pytest.mark.parametrize('k', [1, 2])
@pytest.mark.parametrize('skew', [False, True])
@pytest.mark.parametrize('decoding', [False, True])   # gate and up apart, or joined
def test_moe_layer_matches_naive_loop(impl, k, skew, decoding):
  rng = np.random.default_rng(100 * k + skew)
  x = rng.normal(size=(3, 11, D)).astype(np.float32)
  if skew:
    x = np.abs(x)
  layer = moe.MoE(moe_cfg(impl, k), decoding)
  init = nn.unbox(jax.eval_shape(layer.init, jax.random.PRNGKey(0), jnp.asarray(x))['params'])
  params = random_moe_params(rng, skew)
  assert set(init) == set(params)
  for name in params:
    assert init[name].shape == params[name].shape, name
  out, aux, _ = layer.apply({'params': jax.tree.map(jnp.asarray, params)}, jnp.asarray(x))
  x_TxD = x.reshape(-1, D)
  ref, experts = np_moe(x_TxD, params['router'], params['w_gate'], params['w_up'],
                        params['w_down'], k)
  if skew:  # check that the setup really is skewed: one expert serves (nearly) every token
    counts = np.bincount(experts.reshape(-1), minlength=E)
    assert counts.max() >= 0.9 * x_TxD.shape[0], counts
  assert out.shape == x.shape
  assert np.abs(ref).max() > 0.1  # not a trivially small output
  np.testing.assert_array_less(np.abs(np.asarray(out).reshape(-1, D) - ref).max(), 1e-5)
  _, _, ref_aux = np_route(x_TxD.astype(np.float64) @ params['router'], k)
  np.testing.assert_allclose(float(aux), ref_aux, rtol=1e-5)


def test_every_impl_with_empty_experts():
  """All tokens to one expert (k=1): the other experts' groups are empty; nothing is dropped."""
  rng = np.random.default_rng(7)
  x = np.abs(rng.normal(size=(3, 11, D))).astype(np.float32)
  params = random_moe_params(rng, skew=False)
  params['router'][:, 1] += 5.0
  variables = {'params': jax.tree.map(jnp.asarray, params)}
  outs = {impl: np.asarray(moe.MoE(moe_cfg(impl, 1)).apply(variables, jnp.asarray(x))[0])
          for impl in ('ragged', 'dense', 'bucketed')}
  ref, experts = np_moe(x.reshape(-1, D), params['router'], params['w_gate'], params['w_up'],
                        params['w_down'], 1)
  assert np.all(experts == 1)
  for impl, out in outs.items():
    assert np.abs(out.reshape(-1, D) - ref).max() <= 1e-5, impl


@pytest.mark.parametrize('impl', ['ragged', 'dense', 'bucketed'])
@pytest.mark.parametrize('num_tokens,k', [(1, 2), (2, 1), (2, 2), (4, 1), (3, 2)])
@pytest.mark.parametrize('decoding', [False, True])
def test_decode_sized_inputs_match_naive_loop(impl, num_tokens, k, decoding):
  """Few tokens (decoding): 'gather' is chosen when T*k <= E/2, and every path equals the loop."""
  rng = np.random.default_rng(10 * num_tokens + k)
  x = rng.normal(size=(num_tokens, 1, D)).astype(np.float32)
  params = random_moe_params(rng, skew=False)
  cfg = moe_cfg(impl, k)
  chosen = moe.expert_impl(cfg, num_tokens)
  if 2 * num_tokens * k <= E:
    assert chosen is moe.experts_gather
  else:
    assert chosen is moe.EXPERT_IMPLS[impl]
  out, _, _ = moe.MoE(cfg, decoding).apply({'params': jax.tree.map(jnp.asarray, params)},
                                          jnp.asarray(x))
  ref, _ = np_moe(x.reshape(-1, D), params['router'], params['w_gate'], params['w_up'],
                  params['w_down'], k)
  assert np.abs(ref).max() > 0.1
  np.testing.assert_array_less(np.abs(np.asarray(out).reshape(-1, D) - ref).max(), 1e-5)


def test_moe_layer_bucketed_with_training_sized_batches():
  """Training-sized inputs (a ladder of 4 capacities): the whole layer still equals the
  numpy loop."""
  cfg = moe_cfg('bucketed', 2)
  num_tokens = 64 * E
  assert moe.capacities(num_tokens * 2, num_tokens, E) == [128, 168, 216, 256]
  rng = np.random.default_rng(3)
  x = rng.normal(size=(4, num_tokens // 4, D)).astype(np.float32)
  params = random_moe_params(rng, skew=False)
  out, _, _ = moe.MoE(cfg).apply({'params': jax.tree.map(jnp.asarray, params)}, jnp.asarray(x))
  ref, _ = np_moe(x.reshape(-1, D), params['router'], params['w_gate'], params['w_up'],
                  params['w_down'], 2)
  np.testing.assert_array_less(np.abs(np.asarray(out).reshape(-1, D) - ref).max(), 1e-5)


def test_capacities_start_at_the_balanced_share_and_end_at_every_token():
  assert moe.capacities(pairs=128, tokens=64, num_experts=8) == [16, 24, 32, 48, 64]
  assert moe.capacities(pairs=3, tokens=3, num_experts=4) == [2, 3]
  assert moe.capacities(pairs=16, tokens=8, num_experts=16) == [2, 4, 6, 8]   # 2 rows up to 8
  assert moe.capacities(pairs=32, tokens=16, num_experts=16) == [2, 4, 6, 8, 16]   # then 8
  for pairs, tokens, experts in [(1664, 832, 4), (26, 13, 4), (10**4, 5000, 64)]:
    buckets = moe.capacities(pairs, tokens, experts)
    assert buckets[0] * experts >= pairs and buckets[-1] == tokens   # the last holds any load
    assert buckets == sorted(set(buckets))


@pytest.mark.parametrize('busiest,bucket', [(2, 0), (3, 1), (5, 2), (8, 3)])
def test_bucketed_small_capacities_match_naive_loop(busiest, bucket):
  """Decoding-sized loads ([2, 4, 6, 8] for 8 tokens, k = 1): whichever small capacity the busiest
  expert needs, every token gets its expert."""
  rng = np.random.default_rng(busiest)
  others = 1 + np.arange(8 - busiest) % (E - 1)
  experts_TxK = np.concatenate([np.zeros(busiest, int), others])[:, None]
  assert np.bincount(experts_TxK[:, 0]).max() == busiest
  buckets = moe.capacities(8, 8, E)
  assert buckets == [2, 4, 6, 8] and min(b for b in buckets if b >= busiest) == buckets[bucket]
  weights_TxK = rng.random((8, 1)).astype(np.float32)
  x_TxD = rng.normal(size=(8, D)).astype(np.float32)
  params = random_moe_params(rng, skew=False)
  out = jax.jit(moe.experts_bucketed)(
      jnp.asarray(x_TxD), jnp.asarray(weights_TxK), jnp.asarray(experts_TxK),
      (jnp.asarray(params['w_gate']), jnp.asarray(params['w_up'])), jnp.asarray(params['w_down']))
  np.testing.assert_array_less(
      np.abs(np.asarray(out) - np_experts(x_TxD, weights_TxK, experts_TxK, params)).max(), 1e-5)


def np_experts(x_TxD, weights_TxK, experts_TxK, params):
  """Each token's k experts applied one by one; an expert index past the last is no expert."""
  y_TxD = np.zeros(x_TxD.shape)
  for t, (weights, experts) in enumerate(zip(weights_TxK, experts_TxK)):
    for weight, e in zip(weights, experts):
      if e < E:
        hidden = np_silu(x_TxD[t] @ params['w_gate'][e]) * (x_TxD[t] @ params['w_up'][e])
        y_TxD[t] += weight * (hidden @ params['w_down'][e])
  return y_TxD


def _bucketed_of_args(joined, weights_TxK, experts_TxK, x_TxD, w_gate, w_up, w_down):
  """experts_bucketed with the routing an argument: every load runs one compiled program."""
  w_in = (moe.gate_up(w_gate, w_up),) if joined else (w_gate, w_up)
  return moe.experts_bucketed(x_TxD, weights_TxK, experts_TxK, w_in, w_down)


_bucketed = jax.jit(_bucketed_of_args, static_argnums=0)
_bucketed_grads = jax.jit(jax.grad(lambda *args: jnp.sum(jnp.tanh(_bucketed_of_args(*args))),
                                   argnums=(3, 4, 5, 6)), static_argnums=0)


@pytest.mark.parametrize('load', ['balanced', 'one_busy', 'all_on_one', 'off_device'])
@pytest.mark.parametrize('joined', [False, True])
def test_bucketed_picks_a_capacity_that_holds_every_token(load, joined):
  """The capacity is chosen at run time from the busiest expert: each load lands in a different
  bucket, and outputs and gradients equal the numpy loop's (gradients: directional derivatives
  of it by central differences). 'off_device': the expert-parallel path's
  index E for pairs routed to other devices, with weight 0."""
  rng = np.random.default_rng(5)
  num_tokens, k = 64, 2
  experts_TxK = (np.arange(num_tokens)[:, None] + np.arange(k)) % E          # 32 pairs per expert
  alternating = 2 + np.arange(num_tokens) % 2                                 # experts 2 and 3
  if load == 'one_busy':                                                      # 40 on expert 1
    experts_TxK = np.stack([np.where(np.arange(num_tokens) < 40, 1, 0), alternating], axis=1)
  elif load == 'all_on_one':                                                  # 64 on expert 2
    experts_TxK = np.stack([np.full(num_tokens, 2), alternating - 2], axis=1)
  weights_TxK = rng.random((num_tokens, k)).astype(np.float32)
  if load == 'off_device':
    experts_TxK[::3, 1] = E
    weights_TxK[::3, 1] = 0.0
  buckets = moe.capacities(experts_TxK.size, num_tokens, E)
  busiest = np.bincount(experts_TxK.reshape(-1), minlength=E + 1)[:E].max()
  chosen = min(b for b in buckets if b >= busiest)
  assert buckets == [32, 48, 64]
  assert buckets.index(chosen) == {'balanced': 0, 'one_busy': 1, 'all_on_one': 2,
                                   'off_device': 0}[load]
  x_TxD = rng.normal(size=(num_tokens, D)).astype(np.float32)
  params = random_moe_params(rng, skew=False)
  expert_weights = [jnp.asarray(params[n]) for n in ('w_gate', 'w_up', 'w_down')]
  routing = (jnp.asarray(weights_TxK), jnp.asarray(experts_TxK))
  out = _bucketed(joined, *routing, jnp.asarray(x_TxD), *expert_weights)
  np.testing.assert_array_less(
      np.abs(np.asarray(out) - np_experts(x_TxD, weights_TxK, experts_TxK, params)).max(), 1e-5)

  grads = _bucketed_grads(joined, *routing, jnp.asarray(x_TxD), *expert_weights)
  eps = 1e-3
  for probe in range(3):   # directional derivatives of the numpy loop along random directions
    directions = [rng.normal(size=g.shape) for g in grads]
    shifted = lambda sign: np_experts(
        x_TxD + sign * eps * directions[0], weights_TxK, experts_TxK,
        {n: params[n].astype(np.float64) + sign * eps * d
         for n, d in zip(('w_gate', 'w_up', 'w_down'), directions[1:])})
    numeric = np.sum(np.tanh(shifted(1)) - np.tanh(shifted(-1))) / (2 * eps)
    analytic = sum(float(np.sum(np.asarray(g) * d)) for g, d in zip(grads, directions))
    np.testing.assert_allclose(analytic, numeric, rtol=1e-3, atol=1e-3)


# ------------------------------------------------------------------ the grouped matmul on TPU


def test_megablox_matmul_and_its_gradients_match_numpy():
  """The Pallas kernels TPU runs for 'ragged' (interpreted here), rows not a whole tile, one group
  empty: the product, and the gradients of <y, c> for x (gmm) and the weights (tgmm)."""
  rng = np.random.default_rng(0)
  sizes_E = np.array([70, 0, 33, 97], np.int32)   # 200 rows: 2 tiles of 128, the second partial
  x_NxD = rng.normal(size=(200, 256)).astype(np.float32)
  w_ExDxF = rng.normal(size=(4, 256, 128)).astype(np.float32)
  cotangent_NxF = rng.normal(size=(200, 128)).astype(np.float32)
  matmul = lambda x, w: moe.megablox_matmul(x, w, jnp.asarray(sizes_E), interpret=True)
  y_NxF, vjp = jax.vjp(matmul, x_NxD, w_ExDxF)
  dx_NxD, dw_ExDxF = vjp(jnp.asarray(cotangent_NxF))
  group_N = np.repeat(np.arange(4), sizes_E)
  x64, w64, c64 = (a.astype(np.float64) for a in (x_NxD, w_ExDxF, cotangent_NxF))
  want_y = np.einsum('nd,ndf->nf', x64, w64[group_N])
  want_dx = np.einsum('nf,ndf->nd', c64, w64[group_N])
  want_dw = np.stack([x64[group_N == e].T @ c64[group_N == e] for e in range(4)])
  np.testing.assert_allclose(y_NxF, want_y, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(dx_NxD, want_dx, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(dw_ExDxF, want_dw, rtol=1e-4, atol=1e-3)
  assert not np.any(dw_ExDxF[1])   # the empty group's weights get no gradient


# ------------------------------------------------------------------ the grouped matmul on GPU


@pytest.mark.parametrize('sizes', [(70, 0, 33, 97), (0, 200, 0, 0), (5, 0, 0, 180)])
def test_tiled_matmul_and_its_gradients_match_numpy(sizes):
  """What GPUs run for 'ragged' (on any backend here): tiles of 16 rows, groups not whole tiles,
  empty groups, the whole load on one group, and 15 rows in no group (another device's pairs:
  zeros, no gradient). The product, and the gradients of <y, c> for x and the weights."""
  rng = np.random.default_rng(sum(sizes[:2]))
  sizes_E, rows = np.array(sizes, np.int32), 215
  x_NxD = rng.normal(size=(rows, 32)).astype(np.float32)
  w_ExDxF = rng.normal(size=(4, 32, 24)).astype(np.float32)
  cotangent_NxF = rng.normal(size=(rows, 24)).astype(np.float32)
  matmul = jax.jit(lambda x, w: moe.tiled_matmul(x, w, jnp.asarray(sizes_E), tile=16))
  y_NxF, vjp = jax.vjp(matmul, x_NxD, w_ExDxF)
  dx_NxD, dw_ExDxF = vjp(jnp.asarray(cotangent_NxF))
  group_N = np.repeat(np.arange(4), sizes_E)
  grouped = len(group_N)
  x64, w64, c64 = (a.astype(np.float64) for a in (x_NxD, w_ExDxF, cotangent_NxF))
  want_y = np.zeros((rows, 24))
  want_y[:grouped] = np.einsum('nd,ndf->nf', x64[:grouped], w64[group_N])
  want_dx = np.zeros((rows, 32))
  want_dx[:grouped] = np.einsum('nf,ndf->nd', c64[:grouped], w64[group_N])
  want_dw = np.stack([x64[:grouped][group_N == e].T @ c64[:grouped][group_N == e]
                      for e in range(4)])
  np.testing.assert_allclose(y_NxF, want_y, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(dx_NxD, want_dx, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(dw_ExDxF, want_dw, rtol=1e-4, atol=1e-4)


def test_tile_rows_bound_the_padding():
  """Tiles of up to 512 rows, a quarter of the rows at most in padding (E tiles), none below 16."""
  assert moe.tile_rows(65536, 32) == 512 and moe.tile_rows(16384, 32) == 128
  assert moe.tile_rows(4096, 32) == 32 and moe.tile_rows(2047, 32) == 0
  for rows in (2048, 5000, 65536, 10 ** 6):
    assert 4 * 32 * moe.tile_rows(rows, 32) <= rows


@pytest.mark.e2e   # a TPU compile of the Mosaic grouped-matmul kernels
def test_tpu_trains_the_experts_at_the_routed_flops():
  """On TPU the expert layer's gradient costs about 3x its forward (as a dense layer's does), not
  the E/k-fold dense product XLA:TPU makes of `ragged_dot`'s weight gradient."""
  from rljax.aot import targets   # pylint: disable=g-import-not-at-top
  device = targets.parse_target('tpu:v5e-8').devices()[0]
  T, D, F, E, k = 1024, 512, 256, 64, 2
  args = [jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device))
          for shape, dtype in [((T, D), jnp.bfloat16), ((T, k), jnp.float32), ((T, k), jnp.int32),
                               ((E, D, F), jnp.bfloat16), ((E, D, F), jnp.bfloat16),
                               ((E, F, D), jnp.bfloat16)]]

  def loss(x, weights, experts, w_gate, w_up, w_down):
    y = moe.experts_ragged(x, weights, experts, (w_gate, w_up), w_down)
    return jnp.sum(y.astype(jnp.float32) ** 2)

  grad = jax.jit(jax.grad(loss, argnums=(0, 3, 4, 5)))
  costs = grad.lower(*args).compile().cost_analysis()
  flops = (costs[0] if isinstance(costs, list) else costs)['flops']
  forward = 3 * 2 * T * k * D * F   # three routed matmuls
  assert 2.5 * forward < flops < 4 * forward, flops / forward


# ------------------------------------------------------------------ router replay


def np_moe_replayed(x_TxD, params, k, recorded_TxK, cotangent_TxD):
  """The layer routed by `recorded_TxK` (tests/test_router.py's np_replayed), and the gradients of
  sum(out * cotangent) with respect to the router and w_down. A token's weights are the softmax
  over its chosen experts' logits, so with a_j = cotangent . y_j (expert j's output),
  d/d logit_{e_j} = w_j (a_j - sum_i w_i a_i): the router learns from the replayed experts."""
  x = np.asarray(x_TxD, np.float64)
  w_gate, w_up, w_down = (np.asarray(params[n], np.float64) for n in ('w_gate', 'w_up', 'w_down'))
  weights, experts, _ = np_replayed(x @ np.asarray(params['router'], np.float64), k, recorded_TxK)
  out, d_router, d_down = np.zeros_like(x), np.zeros((D, E)), np.zeros_like(w_down)
  for t in range(x.shape[0]):
    a = np.zeros(k)
    for j, e in enumerate(experts[t]):
      hidden = np_silu(x[t] @ w_gate[e]) * (x[t] @ w_up[e])
      y = hidden @ w_down[e]
      out[t] += weights[t, j] * y
      a[j] = cotangent_TxD[t] @ y
      d_down[e] += weights[t, j] * np.outer(hidden, cotangent_TxD[t])
    d_logits = weights[t] * (a - weights[t] @ a)
    for j, e in enumerate(experts[t]):
      d_router[:, e] += x[t] * d_logits[j]
  return out, d_router, d_down, experts


def replay_case(seed, k, tokens):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(3, tokens // 3, D)).astype(np.float32)
  recorded = recorded_ids(rng, tokens, E, k)
  cotangent = rng.normal(size=(tokens, D))
  return x, random_moe_params(rng, skew=False), recorded, cotangent


def replayed_forward_and_grad(cfg, params, x, recorded, cotangent):
  layer = moe.MoE(cfg)

  def loss(p):
    out, _, routed = layer.apply({'params': p}, jnp.asarray(x),
                                 jnp.asarray(recorded).reshape(*x.shape[:2], -1))
    return jnp.sum(out.reshape(-1, D) * jnp.asarray(cotangent, jnp.float32)), (out, routed)
  return jax.jit(jax.value_and_grad(loss, has_aux=True))(jax.tree.map(jnp.asarray, params))


@pytest.mark.parametrize('impl', ['ragged', 'dense', 'bucketed'])
@pytest.mark.parametrize('k', [1, 2])
def test_replayed_layer_and_its_gradient_match_numpy(impl, k):
  """cfg.router_replay: tokens with recorded ids run those experts, weighted by the softmax over
  their logits, and the router's and experts' gradients are those of that function. Float32
  against float64: outputs within 1e-5 as the layer tests; the gradients sum ~30 tokens' outer
  products of O(1) terms, so 1e-4 relative."""
  x, params, recorded, cotangent = replay_case(20 + k, k, 33)
  cfg = dataclasses.replace(moe_cfg(impl, k), router_replay=True)
  (_, (out, routed)), grads = replayed_forward_and_grad(cfg, params, x, recorded, cotangent)
  ref, d_router, d_down, experts = np_moe_replayed(x.reshape(-1, D), params, k, recorded,
                                                   cotangent)
  assert np.any(experts != np_route(x.reshape(-1, D) @ params['router'], k)[1])   # replay bites
  np.testing.assert_array_less(np.abs(np.asarray(out).reshape(-1, D) - ref).max(), 1e-5)
  np.testing.assert_allclose(np.asarray(grads['router']), d_router, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(grads['w_down']), d_down, rtol=1e-4, atol=1e-5)
  assert int(routed.mismatch) == np_replayed(x.reshape(-1, D) @ params['router'], k,
                                             recorded)[2]


@pytest.mark.parametrize('mesh_cfg', [dict(data=2, expert=2), dict(fsdp=2, expert=2)])
def test_replay_and_recorded_ids_on_a_mesh_match_numpy(mesh_cfg):
  """Expert parallel (shard_map): the recorded ids travel with their tokens, the mismatch is
  counted over the whole batch, and decoding returns each device's own tokens' ids."""
  k = 2
  x, params, recorded, cotangent = replay_case(30, k, 24)
  mesh = sharding.make_mesh(ml_collections.ConfigDict(mesh_cfg), jax.devices()[:4])
  cfg = dataclasses.replace(moe_cfg('ragged', k), router_replay=True)
  ref, d_router, _, _ = np_moe_replayed(x.reshape(-1, D), params, k, recorded, cotangent)
  logits = x.reshape(-1, D).astype(np.float64) @ params['router']
  with jax.set_mesh(mesh):
    (_, (out, routed)), grads = replayed_forward_and_grad(cfg, params, x, recorded, cotangent)
    _, _, decoded = jax.jit(lambda p, x: moe.MoE(cfg, decoding=True).apply({'params': p}, x))(
        jax.tree.map(jnp.asarray, params), jnp.asarray(x))
  np.testing.assert_array_less(np.abs(np.asarray(out).reshape(-1, D) - ref).max(), 1e-5)
  np.testing.assert_allclose(np.asarray(grads['router']), d_router, rtol=1e-4, atol=1e-5)
  assert int(routed.mismatch) == np_replayed(logits, k, recorded)[2]
  np.testing.assert_array_equal(np.asarray(decoded.experts_BxTxK).reshape(-1, k),
                                np_route(logits, k)[1])
