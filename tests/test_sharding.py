"""Real meshes on 8 fake CPU devices (tests/conftest.py): the sharded forward, sampler and train
step equal the single-device ones (f32; only the reduction order differs: tolerance.py), and every
parameter lives where the logical-axis rules say."""
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec

from rljax.model import transformer as model_lib
from rljax import optim
from rljax import policy_loss
from rljax.rollout import sampler as sampler_lib
from rljax import sharding

import tolerance

# Every axis, in two meshes: data x fsdp x expert at once, and fsdp x tensor (the expert-parallel
# layout alone is also test_bucketed_experts_split_over_devices_equal_single_device's).
MESHES = [dict(data=2, fsdp=2, expert=2), dict(fsdp=4, tensor=2)]
CFG = model_lib.ModelConfig(d_model=64, num_heads=4, num_kv_heads=2, head_dim=16, num_experts=4,
                            experts_per_token=2, expert_hidden=64, moe_impl='ragged')
LOSS_CFG = ml_collections.ConfigDict(dict(clip_low=0.2, clip_high=0.28, kl_coef=0.0,
                                          kl_estimator='k3', moe_aux_coef=1e-2))
B, T, L = 16, 6, 5


def mesh_id(sizes):
  return 'x'.join(f'{k}{v}' for k, v in sizes.items())


def mesh_of(sizes):
  return sharding.make_mesh(ml_collections.ConfigDict(sizes))


def inputs():
  rng = np.random.default_rng(0)
  prompt_BxT = rng.integers(2, 16, (B, T)).astype(np.int32)
  valid_BxT = np.ones((B, T), bool)
  valid_BxT[: B // 2, :2] = False   # mixed prompt lengths: left padding
  prompt_BxT[~valid_BxT] = 0
  return prompt_BxT, valid_BxT


def policy_batch(rollout, prompt_BxT, valid_BxT):
  mask_BxL = np.asarray(rollout.mask_BxL, np.float32)
  advantages_BxL = np.random.default_rng(1).normal(size=(B, 1)).astype(np.float32) * mask_BxL
  return policy_loss.PolicyBatch(prompt_BxT, valid_BxT, np.asarray(rollout.tokens_BxL), mask_BxL,
                                 np.asarray(rollout.logp_BxL), advantages_BxL,
                                 np.zeros_like(mask_BxL))


def run_everything(mesh, cfg=CFG):
  """Forward logits, greedy tokens, sampled tokens and one train step on `mesh`."""
  model = model_lib.Transformer(cfg)
  params, _ = sharding.init_params(functools.partial(model_lib.init_params, cfg),
                                   jax.random.PRNGKey(0), mesh)
  prompt_BxT, valid_BxT = inputs()
  placed = sharding.put_batch((prompt_BxT, valid_BxT), mesh)
  forward = sharding.on_mesh(jax.jit(lambda p, t, v: model.apply({'params': p}, t, v)[0]), mesh)
  greedy = sharding.on_mesh(sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
      max_new_tokens=L, eos_id=1, greedy=True)), mesh)
  greedy_rollout = greedy(params, *placed, jax.random.PRNGKey(0))
  optimizer = optax.apply_if_finite(optax.adam(1e-3), 3)
  opt_state = sharding.on_mesh(jax.jit(optimizer.init), mesh)(params)
  loss_fn = policy_loss.make_policy_loss(model, LOSS_CFG, 1.0, num_micro=2)
  step = sharding.on_mesh(jax.jit(functools.partial(
      policy_loss.policy_update, loss_fn, optimizer, 'token-mean', 2)), mesh)
  batch = sharding.put_batch(policy_batch(jax.device_get(greedy_rollout), prompt_BxT, valid_BxT),
                             mesh)
  new_params, _, metrics = step(params, opt_state, batch, None)
  return dict(params=params, logits=forward(params, *placed),
              greedy=greedy_rollout.tokens_BxL, new_params=new_params, loss=metrics['loss'],
              grad_norm=metrics['grad_norm'])


@pytest.fixture(scope='module')
def single_device():
  return jax.device_get(run_everything(sharding.make_mesh(ml_collections.ConfigDict({}),
                                                          jax.devices()[:1])))


def assert_same_run(got, want):
  np.testing.assert_allclose(got['logits'], want['logits'], **tolerance.ACROSS_PROGRAMS)
  np.testing.assert_array_equal(got['greedy'], want['greedy'])
  np.testing.assert_allclose(got['loss'], want['loss'], rtol=2e-5, atol=1e-7)
  np.testing.assert_allclose(got['grad_norm'], want['grad_norm'], rtol=2e-5)
  # Adam divides by sqrt(v): a near-zero gradient entry turns rounding into up to lr of movement,
  # so updated params are compared to 1% of lr (1e-3) absolute.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-5),
               jax.device_get(got['new_params']), want['new_params'])
  assert np.abs(np.asarray(want['new_params']['lm_head']) -
                np.asarray(want['params']['lm_head'])).max() > 0   # the step did move the params


@pytest.mark.parametrize('sizes', [
    # The mesh that splits three axes at once is the fast check; each other mesh compiles the
    # same programs again for one more layout, so they run with the full suite.
    sizes if 'data2xfsdp2xexpert2' == mesh_id(sizes) else pytest.param(sizes, marks=pytest.mark.e2e)
    for sizes in MESHES], ids=mesh_id)
def test_sharded_equals_single_device(sizes, single_device):
  assert_same_run(run_everything(mesh_of(sizes)), single_device)


def test_bucketed_experts_split_over_devices_equal_single_device(single_device):
  """The 'bucketed' experts inside the expert-parallel shard_map (each device's pairs of other
  devices' experts in no slot) equal the same model on one device (with 'ragged' experts: both
  compute every pair exactly, rljax.model.moe)."""
  cfg = dataclasses.replace(CFG, moe_impl='bucketed')
  assert_same_run(run_everything(mesh_of(dict(data=2, expert=4)), cfg), single_device)


def sampled(mesh, slots):
  """A sampled (temperature 1) rollout of CFG's model on `mesh`."""
  model = model_lib.Transformer(CFG)
  params, _ = sharding.init_params(functools.partial(model_lib.init_params, CFG),
                                   jax.random.PRNGKey(0), mesh)
  sample = sharding.on_mesh(sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
      max_new_tokens=L, eos_id=1, slots=slots)), mesh)
  return jax.device_get(sample(params, *sharding.put_batch(inputs(), mesh), jax.random.PRNGKey(3)))


@functools.lru_cache(maxsize=None)
def sampled_on_one_device(slots):
  return sampled(sharding.make_mesh(ml_collections.ConfigDict({}), jax.devices()[:1]), slots)


@pytest.mark.parametrize('sizes, slots', [
    # The continuous sampler on fsdp8 is the fast check (decoding_params, re-split experts); the
    # static sampler's fsdp layouts are also held to one device, greedy, by
    # test_sharded_equals_single_device.
    pytest.param(dict(fsdp=8), 0, marks=pytest.mark.e2e), (dict(fsdp=8), 8),
    pytest.param(dict(data=2, fsdp=2, expert=2), 0, marks=pytest.mark.e2e),
    pytest.param(dict(fsdp=4, tensor=2), 0, marks=pytest.mark.e2e)],
                         ids=['fsdp8', 'fsdp8-continuous', 'data2xfsdp2xexpert2', 'fsdp4xtensor2'])
def test_fsdp_decoding_samples_what_one_device_samples(sizes, slots):
  """On an 'fsdp' mesh the sampler re-splits the experts over their hidden dimension
  (rljax.model.transformer.decoding_params): the same sampled tokens and log-probs as on
  one device."""
  mesh = mesh_of(sizes)
  assert sharding.spec_for((4, 64, 64), ('expert', 'replicated', 'decoding_mlp'), mesh)[2]
  want, got = sampled_on_one_device(slots), sampled(mesh, slots)
  np.testing.assert_array_equal(got.tokens_BxL, want.tokens_BxL)
  np.testing.assert_allclose(got.logp_BxL, want.logp_BxL, **tolerance.ACROSS_PROGRAMS)
  assert len(np.unique(want.tokens_BxL)) > 3   # sampled: many different tokens


def test_params_live_where_the_rules_say():
  mesh = mesh_of(dict(data=2, fsdp=2, expert=2))
  params, _ = sharding.init_params(functools.partial(model_lib.init_params, CFG),
                                   jax.random.PRNGKey(0), mesh)
  spec = lambda x: x.sharding.spec
  assert spec(params['blocks']['attn']['w_q']) == PartitionSpec(None, 'fsdp', None, None)
  assert spec(params['blocks']['moe']['w_gate']) == PartitionSpec(None, 'expert', 'fsdp', None)
  assert spec(params['blocks']['moe']['w_down']) == PartitionSpec(None, 'expert', None, 'fsdp')
  assert spec(params['embed']['embedding']) == PartitionSpec(None, 'fsdp')
  # Nothing with an 'embed' dimension is fully replicated on an fsdp mesh: only norms are.
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    name = jax.tree_util.keystr(path)
    if 'norm' not in name:
      assert leaf.sharding.spec != PartitionSpec(*([None] * leaf.ndim)), name
      assert sharding.bytes_per_device(leaf) < leaf.nbytes, name
  tensor_mesh = mesh_of(dict(fsdp=4, tensor=2))
  params, _ = sharding.init_params(functools.partial(model_lib.init_params, CFG),
                                   jax.random.PRNGKey(0), tensor_mesh)
  assert spec(params['blocks']['attn']['w_q']) == PartitionSpec(None, 'fsdp', 'tensor', None)
  assert spec(params['lm_head']) == PartitionSpec('fsdp', 'tensor')


def test_indivisible_dimensions_stay_replicated():
  mesh = mesh_of(dict(tensor=8))
  assert sharding.spec_for((64, 4, 16), ('embed', 'heads', 'head_dim'), mesh) == PartitionSpec(
      None, None, None)   # 4 heads cannot be split 8 ways
  assert sharding.spec_for((64, 16), ('embed', 'vocab'), mesh) == PartitionSpec(None, 'tensor')


@pytest.mark.parametrize('sizes,message', [
    (dict(data=3), 'needs 3 devices'),
    (dict(data=-1, fsdp=-1), 'only one mesh axis may be -1'),
    (dict(data=-1, fsdp=3), 'not divisible by 3'),
    (dict(data=0), 'positive'),
    (dict(pipeline=2), 'unknown mesh axes'),
])
def test_bad_meshes_are_rejected(sizes, message):
  with pytest.raises(ValueError, match=message):
    mesh_of(sizes)


def test_minus_one_takes_the_rest():
  assert sharding.mesh_shape(ml_collections.ConfigDict(dict(data=-1, expert=4)), 8) == dict(
      data=2, fsdp=1, expert=4, tensor=1)


def test_chunked_logprobs_equal_unchunked_values_and_gradients():
  cfg = dataclasses.replace(CFG, num_layers=1, num_experts=0)   # chunks split only the LM head
  model = model_lib.Transformer(cfg)
  params = nn.unbox(model_lib.init_params(cfg, jax.random.PRNGKey(0)))
  prompt_BxT, valid_BxT = inputs()
  response_BxL = np.random.default_rng(2).integers(0, 16, (B, 6)).astype(np.int32)

  def total(p, chunk):
    logp, entropy, *_ = policy_loss.response_logprobs(model, p, prompt_BxT, valid_BxT,
                                                      response_BxL, 0.8, chunk)
    return jnp.sum(logp * jnp.arange(6)) + jnp.sum(entropy), (logp, entropy)

  total_and_grads = jax.jit(jax.value_and_grad(total, has_aux=True), static_argnums=1)
  (want, (logp, entropy)), grads = total_and_grads(params, 0)
  for chunk in (2, 3):
    (got, (logp_c, entropy_c)), grads_c = total_and_grads(params, chunk)
    np.testing.assert_allclose(logp_c, logp, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(entropy_c, entropy, rtol=1e-6, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
                 grads_c, grads)
  with pytest.raises(ValueError, match='must divide'):
    total_and_grads(params, 4)


def test_adam_moments_are_created_on_the_shards_of_their_parameters():
  """Plain Adam and a multi_transform over {policy, value_head} (PPO's shared trunk): every moment
  has its parameter's sharding; counts and other scalars are replicated."""
  mesh = mesh_of(dict(data=2, fsdp=2, tensor=2))
  params, _ = sharding.init_params(functools.partial(model_lib.init_params, CFG),
                                   jax.random.PRNGKey(0), mesh)
  opt = ml_collections.ConfigDict(dict(lr=1e-3, base_batch=8, lr_rule='sqrt', warmup_steps=0,
                                       decay='constant', max_grad_norm=1.0, clip_rule='constant',
                                       b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0,
                                       max_bad_steps=3))
  head = sharding.place({'w': jnp.zeros((CFG.d_model, 1))}, mesh)
  joint, _ = optim.make_joint_optimizer(dict(policy=opt, value_head=opt), 8)
  for tx, tree in ((optim.make_optimizer(opt, 8)[0], params),
                   (joint, dict(policy=params, value_head=head))):
    state = sharding.init_optimizer(tx, tree, mesh)
    by_path = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
    moments = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
      name = jax.tree_util.keystr(path)
      mirrored = [k for k in by_path if name.endswith(k) and by_path[k].shape == leaf.shape]
      if mirrored and ('.mu' in name or '.nu' in name):
        moments += 1
        assert leaf.sharding == by_path[mirrored[0]].sharding, name
      elif not leaf.shape:
        assert leaf.sharding.is_fully_replicated, name
    assert moments == 2 * len(by_path)
    assert any(not x.sharding.is_fully_replicated for x in by_path.values())
