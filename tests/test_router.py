"""rljax.model.router against plain numpy: the top-k renormalised softmax, the load-balancing loss,
the sampler/trainer routing mismatch and router replay (a token routed by recorded ids, its weights
and their gradient)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.model import router


# ------------------------------------------------------------------ numpy references (float64)


def np_softmax(x):
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


def np_route(logits_TxE, k):
  """Top-k experts per token (largest prob first), renormalised weights, E * sum_e f_e p_e."""
  probs = np_softmax(logits_TxE)
  num_tokens, num_experts = probs.shape
  experts = np.zeros((num_tokens, k), np.int64)
  weights = np.zeros((num_tokens, k))
  counts = np.zeros(num_experts)
  for t in range(num_tokens):
    order = sorted(range(num_experts), key=lambda e: -probs[t, e])[:k]
    experts[t] = order
    weights[t] = [probs[t, e] for e in order]
    weights[t] /= weights[t].sum()
    for e in order:
      counts[e] += 1
  f = counts / (num_tokens * k)
  p = probs.mean(axis=0)
  return weights, experts, num_experts * float(np.sum(f * p))


# ------------------------------------------------------------------ route


def route_with_loss(logits, k):
  """router.route plus the load-balancing loss of its load statistics."""
  weights, experts, load_stats, _ = router.route(jnp.asarray(logits), k)
  return weights, experts, router.load_balance_loss(load_stats, k)


@pytest.mark.parametrize('k', [1, 2, 3])
def test_route_matches_numpy(k):
  rng = np.random.default_rng(k)
  logits = rng.normal(size=(23, 5)).astype(np.float32) * 2.0
  weights, experts, aux = route_with_loss(logits, k)
  ref_w, ref_e, ref_aux = np_route(logits, k)
  np.testing.assert_array_equal(np.asarray(experts), ref_e)
  np.testing.assert_allclose(np.asarray(weights), ref_w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(float(aux), ref_aux, rtol=1e-5)


def test_load_stats_add_over_shards():
  """Load statistics are sums over tokens: two halves' stats added give the whole batch's loss."""
  logits = np.random.default_rng(5).normal(size=(20, 4)).astype(np.float32) * 2.0
  _, _, ref_aux = np_route(logits, 2)
  halves = [router.route(jnp.asarray(part), 2)[2] for part in (logits[:7], logits[7:])]
  summed = jax.tree.map(lambda a, b: a + b, *halves)
  np.testing.assert_allclose(float(router.load_balance_loss(summed, 2)), ref_aux, rtol=1e-5)


@pytest.mark.parametrize('k', [1, 2])
def test_route_balanced_loss_is_one(k):
  # Every token sees a cyclic shift of the same logit vector: each expert is chosen equally often
  # and has the same mean probability, i.e. perfect balance.
  base = np.array([3.0, 1.5, 0.0, -1.0], np.float32)
  logits = np.stack([np.roll(base, s) for s in range(4)] * 3)
  _, experts, aux = route_with_loss(logits, k)
  counts = np.bincount(np.asarray(experts).reshape(-1), minlength=4)
  assert np.all(counts == counts[0])
  np.testing.assert_allclose(float(aux), 1.0, rtol=1e-6)


def test_route_imbalanced_loss_above_one():
  # Expert 0 wins every token: f = (1, 0, 0, 0), p_0 > 1/4, so the loss is E * p_0 > 1.
  logits = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
  logits[:, 0] += 10.0
  _, _, aux = route_with_loss(logits, 1)
  _, _, ref_aux = np_route(logits, 1)
  assert ref_aux > 3.9
  np.testing.assert_allclose(float(aux), ref_aux, rtol=1e-5)


# ------------------------------------------------------------------ mismatch and replay


def np_replayed(logits_TxE, k, recorded_TxK):
  """Each token's experts: its recorded ids where it has them (row >= 0), else its top-k; weights
  the softmax renormalised over them; and the tokens whose top-k set differs from the record."""
  weights, experts, _ = np_route(logits_TxE, k)
  probs = np_softmax(logits_TxE)
  mismatch = 0
  for t, row in enumerate(recorded_TxK):
    if row[0] < 0:
      continue
    mismatch += set(row) != set(experts[t])
    experts[t] = row
    weights[t] = probs[t, row] / probs[t, row].sum()
  return weights, experts, mismatch


def recorded_ids(rng, tokens, num_experts, k, unrecorded=3):
  """Random distinct ids per token, the first `unrecorded` rows -1 (tokens with no record)."""
  rows = np.stack([rng.permutation(num_experts)[:k] for _ in range(tokens)])
  rows[:unrecorded] = -1
  return rows.astype(np.int8)


@pytest.mark.parametrize('k', [1, 2, 3])
def test_replay_routes_recorded_tokens_by_their_ids_and_counts_the_mismatch(k):
  rng = np.random.default_rng(10 + k)
  logits = rng.normal(size=(23, 6)).astype(np.float32) * 2.0
  recorded = recorded_ids(rng, 23, 6, k)
  recorded[5] = np_route(logits, k)[1][5][::-1]   # the same set in another order: no mismatch
  ref_w, ref_e, ref_mismatch = np_replayed(logits, k, recorded)
  assert 0 < ref_mismatch < 20
  for replay in (False, True):
    weights, experts, _, mismatch = router.route(jnp.asarray(logits), k, jnp.asarray(recorded),
                                                 replay)
    assert int(mismatch) == ref_mismatch   # counted the same whether or not it is replayed
    if replay:
      np.testing.assert_array_equal(np.asarray(experts), ref_e)
      np.testing.assert_allclose(np.asarray(weights), ref_w, rtol=1e-5, atol=1e-6)
    else:
      np.testing.assert_array_equal(np.asarray(experts), np_route(logits, k)[1])


def test_replaying_the_routers_own_choice_changes_nothing():
  """Recorded ids equal to the top-k: the same experts and bit-equal weights as no record."""
  logits = jnp.asarray(np.random.default_rng(3).normal(size=(17, 8)).astype(np.float32))
  plain = router.route(logits, 2)
  own = jnp.asarray(plain[1], jnp.int8)
  replayed = router.route(logits, 2, own, replay=True)
  for a, b in zip(jax.tree.leaves(plain[:3]), jax.tree.leaves(replayed[:3])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert int(replayed[3]) == 0


def test_route_dtype_holds_every_expert_id_and_minus_one():
  assert router.route_dtype(128) == jnp.int8 and router.route_dtype(129) == jnp.int16
  for num_experts in (4, 128, 129, 32767):
    info = jnp.iinfo(router.route_dtype(num_experts))
    assert info.min <= -1 and info.max >= num_experts - 1
