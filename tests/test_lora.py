"""rljax.model.lora and LoRA training (rljax.algos._lora): the merge and its gradient against
plain numpy, the base model's logits exactly at step 0, the sampler on the adapted policy, and a
resume that continues exactly from checkpoints that hold the adapters only."""
import pathlib
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import random_params
import rljax_cli as cli
import test_train
from configs import common
from configs import grpo as grpo_config
from rljax.model import lora
from rljax.model import transformer as model_lib
from rljax.train import loop
from rljax.train import run as run_lib

ALL = tuple(lora.TARGETS)
# (input axes, output axes) of each weight, written out here apart from rljax.model.lora's tables
AXES = {'w_q': (1, 2), 'w_k': (1, 2), 'w_v': (1, 2), 'w_o': (2, 1), 'w_gate': (1, 1),
        'w_up': (1, 1), 'w_down': (1, 1)}


def model_cfg(num_experts, moe_impl='dense'):
  return model_lib.ModelConfig(num_experts=num_experts, moe_impl=moe_impl, d_model=32,
                               head_dim=8, expert_hidden=16, dense_hidden=48)


def adapters_for(cfg, lora_cfg, seed, b_std=0.0):
  """Adapters as initialised (B = 0), or with B ~ N(0, b_std^2): an adapted policy."""
  boxes = jax.eval_shape(lambda: model_lib.init_params(cfg, jax.random.PRNGKey(0)))
  adapters = nn.unbox(lora.init_adapters(boxes, lora_cfg, jax.random.PRNGKey(seed)))
  if not b_std:
    return adapters
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: (jnp.asarray(rng.normal(0, b_std, x.shape), x.dtype)
                       if path[-1].key == 'b' else x), adapters)


def leaves(tree):
  return {'/'.join(str(k.key) for k in path): np.asarray(x, np.float64)
          for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def numpy_merge(w, a, b, name, scale):
  """W + scale A @ B for each layer (and expert): the weight's in and out axes flattened."""
  num_in, num_out = AXES[name]
  lead = w.ndim - num_in - num_out
  out = np.empty_like(w)
  for index in np.ndindex(*w.shape[:lead]):
    w_IxO = w[index].reshape(np.prod(w.shape[lead:lead + num_in]), -1)
    a_IxR = a[index].reshape(w_IxO.shape[0], -1)
    b_RxO = b[index].reshape(a_IxR.shape[1], -1)
    out[index] = (w_IxO + scale * a_IxR @ b_RxO).reshape(w.shape[lead:])
  return out


@pytest.mark.parametrize('num_experts', [4, 0], ids=['moe', 'dense'])
def test_merge_adds_the_scaled_low_rank_product_as_numpy_does(num_experts):
  cfg, lora_cfg = model_cfg(num_experts), lora.LoraConfig(3, 6.0, ALL)
  params = random_params.for_model(cfg, 0)
  adapters = adapters_for(cfg, lora_cfg, 1, b_std=0.5)
  merged, base, pieces = leaves(lora.merge(params, adapters, lora_cfg)), leaves(params), leaves(
      adapters)
  adapted = {path for path in base if path + '/a' in pieces}
  ffn = 'moe' if num_experts else 'ffn'
  assert adapted == {f'blocks/attn/w_{n}' for n in 'qkvo'} | {
      f'blocks/{ffn}/w_{n}' for n in ('gate', 'up', 'down')}
  for path, w in base.items():
    if path in adapted:
      expected = numpy_merge(w, pieces[path + '/a'], pieces[path + '/b'], path.split('/')[-1],
                             6.0 / 3)
      np.testing.assert_allclose(merged[path], expected, rtol=1e-5, atol=1e-6, err_msg=path)
      assert np.abs(merged[path] - w).max() > 0.1, path   # the adapters moved it
    else:   # the router, norms, embedding and lm_head: as they are
      np.testing.assert_array_equal(merged[path], w, err_msg=path)


def test_adapter_shapes_and_targets():
  cfg = model_cfg(4)
  adapters = adapters_for(cfg, lora.LoraConfig(2, 4.0, ('q', 'o', 'down')), 0)
  shapes = {path: x.shape for path, x in leaves(adapters).items()}
  L, D, N, H, E, F = 2, 32, 4, 8, 4, 16
  assert shapes == {'blocks/attn/w_q/a': (L, D, 2), 'blocks/attn/w_q/b': (L, 2, N, H),
                    'blocks/attn/w_o/a': (L, N, H, 2), 'blocks/attn/w_o/b': (L, 2, D),
                    'blocks/moe/w_down/a': (L, E, F, 2), 'blocks/moe/w_down/b': (L, E, 2, D)}
  a = leaves(adapters)['blocks/attn/w_o/a']
  assert 0 < np.abs(a).max() <= 1 / np.sqrt(N * H)   # PEFT's kaiming-uniform bound, fan-in N*H
  assert all(not np.any(x) for path, x in leaves(adapters).items() if path.endswith('/b'))


@pytest.mark.parametrize('num_experts, moe_impl', [(4, 'dense'), (4, 'bucketed'), (4, 'ragged'),
                                                   (0, 'dense')])
def test_zero_b_gives_the_base_models_logits_exactly(num_experts, moe_impl):
  cfg, lora_cfg = model_cfg(num_experts, moe_impl), lora.LoraConfig(4, 32.0, ALL)
  params = random_params.for_model(cfg, 2)
  merged = lora.merge(params, adapters_for(cfg, lora_cfg, 3), lora_cfg)
  tokens_BxT = jnp.asarray(np.random.default_rng(0).integers(0, 16, (2, 7)), jnp.int32)
  valid_BxT = jnp.ones((2, 7), bool)
  apply = jax.jit(model_lib.Transformer(cfg).apply)
  base_logits, merged_logits = (np.asarray(apply({'params': p}, tokens_BxT, valid_BxT)[0])
                                for p in (params, merged))
  np.testing.assert_array_equal(merged_logits, base_logits)
  assert cli.same_arrays(merged, params)


def test_gradient_reaches_a_and_b_by_the_chain_rule_of_the_merge():
  """d/dA = s dW B^T and d/dB = s A^T dW (per layer and expert) from the full model's gradient
  with respect to the merged weights, computed in numpy."""
  cfg, lora_cfg = model_cfg(4), lora.LoraConfig(2, 4.0, ALL)
  params = random_params.for_model(cfg, 4)
  adapters = adapters_for(cfg, lora_cfg, 5, b_std=0.3)
  tokens_BxT = jnp.asarray(np.random.default_rng(1).integers(0, 16, (2, 6)), jnp.int32)
  weights_BxTxV = jnp.asarray(np.random.default_rng(2).normal(size=(2, 6, 16)), jnp.float32)
  model = model_lib.Transformer(cfg)
  loss = lambda p: jnp.sum(weights_BxTxV * model.apply(
      {'params': p}, tokens_BxT, jnp.ones((2, 6), bool))[0])
  grad_W = leaves(jax.grad(loss)(lora.merge(params, adapters, lora_cfg)))
  grad_AB = leaves(jax.grad(lambda ad: loss(lora.merge(params, ad, lora_cfg)))(adapters))
  pieces = leaves(adapters)
  for path in {p.rsplit('/', 1)[0] for p in pieces}:
    num_in, num_out = AXES[path.split('/')[-1]]
    g = grad_W[path]
    lead = g.ndim - num_in - num_out
    for index in np.ndindex(*g.shape[:lead]):
      a = pieces[path + '/a'][index]
      g_IxO = g[index].reshape(np.prod(a.shape[:-1]), -1)
      a_IxR, b_RxO = a.reshape(g_IxO.shape[0], -1), pieces[path + '/b'][index].reshape(
          a.shape[-1], -1)
      np.testing.assert_allclose(grad_AB[path + '/a'][index].reshape(a_IxR.shape),
                                 2.0 * g_IxO @ b_RxO.T, rtol=2e-4, atol=1e-6, err_msg=path)
      np.testing.assert_allclose(grad_AB[path + '/b'][index].reshape(b_RxO.shape),
                                 2.0 * a_IxR.T @ g_IxO, rtol=2e-4, atol=1e-6, err_msg=path)


def tiny(tmp_path, rank=4, **train):
  """The tiny GRPO run of tests/test_train.py with LoRA adapters of `rank`."""
  return common.lora(test_train.tiny(grpo_config, tmp_path, **train), rank)


def test_the_sampler_runs_the_adapted_policy(tmp_path):
  """With adapters far from zero, the trainer's log-probs of the sampled responses (on
  merge(base, adapters)) equal the sampler's; a sampler given the base instead is caught."""
  run, carry, _ = run_lib.setup(tiny(tmp_path), str(tmp_path / 'run'))
  assert set(carry['algo']) == {'adapters', 'opt_state'} and carry['reference'] is not None
  rng = np.random.default_rng(0)
  carry['algo']['adapters'] = jax.tree_util.tree_map_with_path(
      lambda path, x: x + (rng.normal(0, 0.5, x.shape).astype(np.float32)
                           if path[-1].key == 'b' else 0), carry['algo']['adapters'])
  examples = next(run.iterator)
  _, row = loop.rl_step(run, jax.tree.map(jnp.copy, carry), [examples], 1)
  base_run = run._replace(algo=run.algo._replace(policy=lambda state, base: base))
  _, base_row = loop.rl_step(base_run, carry, [examples], 1)
  run.ckpt.close()
  assert row['logprob_mismatch'] < 1e-4, row['logprob_mismatch']
  assert base_row['logprob_mismatch'] > 0.05, base_row['logprob_mismatch']


@pytest.mark.e2e   # three short trainings
def test_resume_continues_exactly_from_checkpoints_that_hold_the_adapters(tmp_path):
  """An uninterrupted LoRA run and one resumed after step 1 log the same rows and end with the
  same adapters and optimizer state; a checkpoint holds no copy of the base (which the resumed
  run rebuilds: here a warm start, from its cache)."""
  def config():
    c = tiny(tmp_path, max_steps=3, keep_checkpoints=10)
    c.warmstart.update(enabled=True, min_steps=2, max_steps=2, threshold=0.0, eval_every=2,
                       batch=16)
    return c
  reference = tmp_path / 'reference'
  loop.train(config(), str(reference))
  resumed = tmp_path / 'resumed'
  shutil.copytree(reference, resumed)
  for step in (2, 3):
    shutil.rmtree(resumed / 'checkpoints' / str(step))
  loop.train(config(), str(resumed))
  assert cli.rows(resumed) == cli.rows(reference)
  (state, _), (ref_state, _) = (cli.checkpoints(w)[0][3] for w in (resumed, reference))
  assert cli.same_arrays(state, ref_state)
  assert set(state['algo']) == {'adapters', 'opt_state'} and state.get('reference') is None
  assert not any(pathlib.Path(reference).glob('checkpoints/*/state/*reference*'))
