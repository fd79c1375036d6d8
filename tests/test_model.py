"""rljax.model.transformer against a plain-numpy forward pass, plus the invariances the RL
loop relies on: left-padding invariance, KV-cache decoding == full forward,
scanned/partitioned params, remat."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.model import transformer as model_lib

import random_params as random_params_lib

V = 16


def tiny_cfg(**overrides):
  values = dict(vocab_size=V, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
                num_experts=4, experts_per_token=2, expert_hidden=24, dense_hidden=40,
                moe_impl='dense', rope_theta=10000.0, norm_eps=1e-6)
  values.update(overrides)
  return model_lib.ModelConfig(**values)


def random_params(cfg, seed):
  return random_params_lib.for_model(cfg, seed)


@functools.lru_cache(maxsize=None)
def jitted_apply(cfg):
  """One jitted apply per config, shared by the tests (compiles are the slow part on CPU)."""
  return jax.jit(model_lib.Transformer(cfg).apply)


# ------------------------------------------------------------------ numpy reference forward


def np_rmsnorm(x, scale, eps):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def np_rope(x_TxNxH, positions_T, theta):
  half = x_TxNxH.shape[-1] // 2
  out = np.empty_like(x_TxNxH)
  for t, pos in enumerate(positions_T):
    for i in range(half):
      angle = pos / theta ** (2.0 * i / x_TxNxH.shape[-1])
      c, s = np.cos(angle), np.sin(angle)
      a, b = x_TxNxH[t, :, i], x_TxNxH[t, :, i + half]
      out[t, :, i] = a * c - b * s
      out[t, :, i + half] = b * c + a * s
  return out


def np_silu(x):
  return x / (1.0 + np.exp(-x))


def np_softmax(x):
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


def np_ffn(cfg, p, x_TxD):
  if not cfg.num_experts:
    return (np_silu(x_TxD @ p['ffn']['w_gate']) * (x_TxD @ p['ffn']['w_up'])) @ p['ffn']['w_down']
  m = p['moe']
  out = np.zeros_like(x_TxD)
  for t in range(x_TxD.shape[0]):
    probs = np_softmax(x_TxD[t] @ m['router'])
    top = np.argsort(-probs, kind='stable')[:cfg.experts_per_token]
    weights = probs[top] / probs[top].sum()
    for w, e in zip(weights, top):
      out[t] += w * ((np_silu(x_TxD[t] @ m['w_gate'][e]) * (x_TxD[t] @ m['w_up'][e])) @
                     m['w_down'][e])
  return out


def np_forward(cfg, params, tokens_T, valid_T):
  """float64 logits of ONE sequence; rows at padded positions are left as NaN."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  valid_T = np.asarray(valid_T, bool)
  num_tokens = len(tokens_T)
  positions = np.maximum(np.cumsum(valid_T) - 1, 0)
  x = p['embed']['embedding'][np.asarray(tokens_T)]
  group = cfg.num_heads // cfg.num_kv_heads
  for layer in range(cfg.num_layers):
    lp = jax.tree.map(lambda a, layer=layer: a[layer], p['blocks'])
    a = lp['attn']
    h = np_rmsnorm(x, lp['attn_norm']['scale'], cfg.norm_eps)
    q = np.einsum('td,dnh->tnh', h, a['w_q'])
    k = np.einsum('td,dkh->tkh', h, a['w_k'])
    v = np.einsum('td,dkh->tkh', h, a['w_v'])
    q = np_rope(np_rmsnorm(q, a['q_norm']['scale'], cfg.norm_eps), positions, cfg.rope_theta)
    k = np_rope(np_rmsnorm(k, a['k_norm']['scale'], cfg.norm_eps), positions, cfg.rope_theta)
    attn = np.zeros((num_tokens, cfg.num_heads, cfg.head_dim))
    for i in range(num_tokens):
      keys = [j for j in range(i + 1) if valid_T[j]]
      if not valid_T[i] or not keys:
        continue
      for n in range(cfg.num_heads):
        kv = n // group
        scores = np.array([q[i, n] @ k[j, kv] for j in keys]) / np.sqrt(cfg.head_dim)
        attn[i, n] = np_softmax(scores) @ v[keys, kv]
    x = x + np.einsum('tnh,nhd->td', attn, a['w_o'])
    x = x + np_ffn(cfg, lp, np_rmsnorm(x, lp['ffn_norm']['scale'], cfg.norm_eps))
  h = np_rmsnorm(x, p['final_norm']['scale'], cfg.norm_eps)
  head = p['embed']['embedding'].T if cfg.tie_embeddings else p['lm_head']
  logits = h @ head
  logits[~valid_T] = np.nan
  return logits


def left_padded(rng, lengths, total):
  tokens = rng.integers(0, V, size=(len(lengths), total)).astype(np.int32)  # garbage in padding
  valid = np.zeros((len(lengths), total), bool)
  for b, n in enumerate(lengths):
    valid[b, total - n:] = True
  return tokens, valid


@pytest.mark.parametrize('overrides', [
    dict(),                                                     # 1 layer, MoE (dense impl), GQA
    dict(moe_impl='ragged'),
    # dense SwiGLU, 2 scanned layers, plain multi-head attention, tied embeddings
    dict(num_experts=0, num_layers=2, num_kv_heads=4, tie_embeddings=True),
], ids=['moe_dense', 'moe_ragged', 'ffn_2layers_mha_tied'])
def test_forward_matches_numpy(overrides):
  cfg = tiny_cfg(**overrides)
  params = random_params(cfg, seed=1)
  tokens, valid = left_padded(np.random.default_rng(2), [7, 4, 1], 7)
  logits, cache, aux = jitted_apply(cfg)({'params': params}, jnp.asarray(tokens),
                                        jnp.asarray(valid))
  assert cache is None and logits.dtype == jnp.float32 and logits.shape == (3, 7, V)
  for b in range(3):
    ref = np_forward(cfg, params, tokens[b], valid[b])
    got = np.asarray(logits[b])
    assert np.abs(ref[valid[b]]).max() > 1.0
    np.testing.assert_allclose(got[valid[b]], ref[valid[b]], rtol=0, atol=1e-4)
  if not cfg.num_experts:
    assert float(aux) == 0.0


def test_left_padding_invariance():
  """The same 4-token prompt behind 3, 1 or 0 (garbage) padding tokens, then real tokens up to the
  common width of 7 (as a response follows a prompt): its logits do not depend on the padding."""
  cfg = tiny_cfg()
  params = random_params(cfg, seed=3)
  rng = np.random.default_rng(4)
  prompt = rng.integers(0, V, size=4).astype(np.int32)
  pads, width = [3, 1, 0], 7
  tokens = rng.integers(0, V, size=(len(pads), width)).astype(np.int32)
  valid = np.zeros((len(pads), width), bool)
  for b, pad in enumerate(pads):
    tokens[b, pad:pad + 4] = prompt
    valid[b, pad:] = True
  logits, _, _ = jitted_apply(cfg)({'params': params}, jnp.asarray(tokens), jnp.asarray(valid))
  real = np.stack([np.asarray(logits[b, pad:pad + 4]) for b, pad in enumerate(pads)])
  assert np.abs(real[0]).max() > 1.0
  for b in range(1, len(pads)):
    assert np.abs(real[b] - real[0]).max() <= 1e-5, pads[b]


def test_kv_cache_decode_matches_full_forward():
  """Prefill + one-token decode steps of the unrolled model on the parameters split by layer (as
  sampler.generate runs them) == the scanned model's full-sequence forward."""
  cfg = tiny_cfg(num_layers=2)
  params = random_params(cfg, seed=5)
  variables = {'params': params}
  rng = np.random.default_rng(6)
  lengths, prompt_len, steps = [6, 3, 1, 5], 6, 5
  prompt, prompt_valid = left_padded(rng, lengths, prompt_len)
  generated = rng.integers(0, V, size=(len(lengths), steps)).astype(np.int32)
  batch = len(lengths)

  full_tokens = np.concatenate([prompt, generated], axis=1)
  full_valid = np.concatenate([prompt_valid, np.ones_like(generated, bool)], axis=1)
  apply = jitted_apply(cfg)
  full_logits = np.asarray(apply(variables, jnp.asarray(full_tokens), jnp.asarray(full_valid))[0])

  decode = jax.jit(model_lib.Transformer(cfg, unrolled=True).apply)
  variables = {'params': model_lib.unstack_layers(params, cfg.num_layers)}
  cache = model_lib.KVCache.zeros(cfg, batch, prompt_len + steps)
  kv_valid = jnp.asarray(np.concatenate([prompt_valid, np.ones((batch, steps), bool)], axis=1))
  positions = np.maximum(np.cumsum(prompt_valid, axis=1) - 1, 0).astype(np.int32)
  logits, cache, _ = decode(variables, jnp.asarray(prompt), kv_valid, cache, 0,
                            jnp.asarray(positions))
  logits = np.asarray(logits)
  assert np.abs(logits[prompt_valid] - full_logits[:, :prompt_len][prompt_valid]).max() <= 1e-5
  next_position = np.asarray(lengths, np.int32)
  for t in range(steps):
    step_logits, cache, _ = decode(variables, jnp.asarray(generated[:, t:t + 1]), kv_valid, cache,
                                   prompt_len + t, jnp.asarray(next_position[:, None] + t))
    diff = np.abs(np.asarray(step_logits)[:, 0] - full_logits[:, prompt_len + t]).max()
    assert diff <= 1e-5, (t, diff)


def test_only_the_unrolled_model_takes_a_kv_cache():
  cfg = tiny_cfg(num_layers=2)
  tokens, valid = jnp.zeros((1, 3), jnp.int32), jnp.ones((1, 3), bool)
  with pytest.raises(ValueError, match='unrolled'):
    model_lib.Transformer(cfg).apply({'params': random_params(cfg, seed=1)}, tokens, valid,
                                     model_lib.KVCache.zeros(cfg, 1, 3))


def test_scanned_params_have_layer_axis_and_names():
  cfg = tiny_cfg(num_layers=3)
  boxed = jax.eval_shape(lambda: model_lib.init_params(cfg, jax.random.PRNGKey(0)))
  specs = nn.get_partition_spec(boxed)
  params = nn.unbox(boxed)
  block_specs = jax.tree_util.tree_leaves_with_path(
      specs['blocks'], is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  assert len(block_specs) >= 10
  for path, spec in block_specs:
    assert tuple(spec)[0] == 'layers', (path, spec)
    leaf = params['blocks']
    for key in path:
      leaf = leaf[key.key]
    assert leaf.shape[0] == 3 and len(spec) == leaf.ndim, (path, leaf.shape, spec)
  assert tuple(specs['blocks']['attn']['w_q']) == ('layers', 'embed', 'heads', 'head_dim')
  assert tuple(specs['blocks']['moe']['w_gate']) == ('layers', 'expert', 'embed', 'mlp')
  assert tuple(specs['embed']['embedding']) == ('vocab', 'embed')
  assert tuple(specs['lm_head']) == ('embed', 'vocab')
  assert 'layers' not in tuple(specs['final_norm']['scale'])


@pytest.mark.parametrize('num_experts', [0, 4])   # MoE: 'dots' keeps the experts' products too
def test_remat_same_logits_and_grads(num_experts):
  rng = np.random.default_rng(8)
  tokens, valid = left_padded(rng, [6, 2], 6)
  targets = jnp.asarray(rng.normal(size=(2, 6, V)).astype(np.float32))
  base = tiny_cfg(num_layers=2, num_experts=num_experts, moe_impl='ragged')
  params = random_params(base, seed=9)

  def run(remat):
    model = model_lib.Transformer(tiny_cfg(num_layers=2, num_experts=num_experts,
                                           moe_impl='ragged', remat=remat))

    def loss(p):
      logits, _, aux = model.apply({'params': p}, jnp.asarray(tokens), jnp.asarray(valid))
      return jnp.sum(jnp.where(jnp.asarray(valid)[..., None], logits * targets, 0.0)) + aux, logits
    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return np.asarray(logits), grads

  ref_logits, ref_grads = run('none')
  for remat in ('full', 'dots'):
    logits, grads = run(remat)
    assert np.abs(logits - ref_logits).max() <= 1e-5, remat
    assert jax.tree.structure(grads) == jax.tree.structure(ref_grads)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
      assert np.abs(np.asarray(g) - np.asarray(r)).max() <= 1e-5 * max(1.0, np.abs(r).max()), remat
