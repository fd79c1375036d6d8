"""The programs of an RL step compiled for a mesh of compile-only devices (rljax.aot.targets), from
abstract state: what one chip holds, what one step costs, what it communicates.

The run's own programs come from rljax.train.programs (the planner lowers them with their
abstract arguments, ShapeDtypeStructs that carry rljax.sharding's layouts); `sampler` here
compiles a run's sampler at any batch, for measurements. XLA's cost analysis counts a while
loop's body once, so per-step costs come from programs of one step: one decode step of the
unrolled model at 1 and 2 layers (exact per layer, it has no loops), and one micro-batch's
gradient with one scanned layer plus one remat'ed layer on its own.
"""
import glob
import os
import pathlib
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

from rljax.aot import hlo
from rljax.model import critic as critic_lib
from rljax.model import transformer as model_lib
from rljax import policy_loss
from rljax.rollout import sampler as sampler_lib
from rljax import sharding


def compile_lowered(lowered, gpu_options=None):
  """{'compile_s', 'memory': per-device bytes, 'flops', 'bytes_accessed', 'collectives',
  'loop_kernels' (rljax.aot.hlo), and for GPUs 'graphs' (rljax.aot.hlo.graph_launches)} of a
  lowered program, compiled for GPUs with `gpu_options` (as a run on GPUs compiles it);
  ValueError('does not fit ...') when the compiler runs out of device memory."""
  start = time.perf_counter()
  gpu = 'cuda' in lowered._lowering._platforms   # pylint: disable=protected-access
  with tempfile.TemporaryDirectory() as dump:   # XLA:GPU's thunks, from its dump
    try:
      compiled = lowered.compile(compiler_options=dict(gpu_options or {}, xla_dump_to=dump)
                                 if gpu else None)
    except Exception as error:   # pylint: disable=broad-except
      text = str(error)
      if 'RESOURCE_EXHAUSTED' in text or 'HbmOom' in text or 'memory' in text.lower():
        raise MemoryError(text.splitlines()[0][:400]) from None
      raise
    seconds = time.perf_counter() - start
    thunks = sorted(glob.glob(os.path.join(dump, '*.thunk_sequence*.txt')))   # after passes last
    graphs = [hlo.graph_launches(pathlib.Path(thunks[-1]).read_text())] if thunks else []
  memory = compiled.memory_analysis()
  cost = optimized_costs(compiled)
  mem = dict(arguments=memory.argument_size_in_bytes, outputs=memory.output_size_in_bytes,
             aliased=memory.alias_size_in_bytes, temporaries=memory.temp_size_in_bytes,
             code=memory.generated_code_size_in_bytes)
  mem['peak'] = mem['arguments'] + mem['outputs'] - mem['aliased'] + mem['temporaries']
  text = compiled.as_text()
  return dict(compile_s=seconds, memory=mem, flops=float(cost.get('flops', 0.0)),
              bytes_accessed=float(cost.get('bytes accessed', 0.0)),
              collectives=hlo.loop_collectives(text), loop_kernels=hlo.loop_kernels(text),
              **(dict(graphs=graphs[0]) if graphs else {}))


def optimized_costs(compiled):
  """XLA's cost analysis of a compiled program: FLOPs and HBM bytes per device. XLA:GPU's
  compile-only executables report none; for them, XLA's HLO cost analysis of their optimized
  module (fusions as compiled, jaxlib's `hlo_module_cost_analysis`, which jax's own
  `Lowered.cost_analysis` runs on the module before optimization)."""
  cost = compiled.cost_analysis()
  if not cost:
    import jax.extend   # pylint: disable=g-import-not-at-top
    from jax._src.lib import _jax   # pylint: disable=g-import-not-at-top
    module = compiled._executable.xla_extension_executable().hlo_modules()[0]   # pylint: disable=protected-access
    cost = _jax.hlo_module_cost_analysis(jax.extend.backend.get_backend('cpu'), module)
  return cost[0] if isinstance(cost, (list, tuple)) else cost


def sampler(model, params, mesh, sampling, batch, prompt_len):
  """The sampler with settings `sampling` (a run's, rljax.train.schedules.sampling_config, or
  derived from them: another slot count or group) at `batch` prompt rows of `prompt_len`."""
  sample = sharding.on_mesh(sampler_lib.make_sampler(model, sampling), mesh)
  prompts = lambda dtype: sharding.abstract_rows(mesh, (batch, prompt_len), dtype)
  return compile_lowered(sample.lower(params, prompts(jnp.int32), prompts(bool),
                                      sharding.abstract_key(mesh)), sampler_lib.GPU_GRAPHS)


def policy_batch(mesh, batch, prompt_len, new_tokens):
  """An abstract rljax.policy_loss.PolicyBatch of `batch` responses."""
  rows = lambda length, dtype: sharding.abstract_rows(mesh, (batch, length), dtype)
  return policy_loss.PolicyBatch(
      prompt_BxT=rows(prompt_len, jnp.int32), prompt_valid_BxT=rows(prompt_len, bool),
      response_BxL=rows(new_tokens, jnp.int32), mask_BxL=rows(new_tokens, jnp.float32),
      old_logp_BxL=rows(new_tokens, jnp.float32), advantages_BxL=rows(new_tokens, jnp.float32),
      weights_BxL=rows(new_tokens, jnp.float32))


def decode_step(cfg, mesh, batch, slots):
  """`compile_lowered` of `decode_step_lowered`."""
  return compile_lowered(decode_step_lowered(cfg, mesh, batch, slots))


def decode_step_lowered(cfg, mesh, batch, slots):
  """One decoding step (one token per row against a cache of `slots`, donated) of the unrolled
  model, its parameters laid out as rljax.model.transformer.decoding_params lays them out for the
  decode loop; lowered, not compiled."""
  decoder = model_lib.Transformer(cfg, unrolled=True)
  is_box = lambda x: isinstance(x, nn.Partitioned)

  def struct(box):
    names, dtype = model_lib.decoding_layout(box, cfg, mesh)
    spec = sharding.spec_for(box.value.shape, names, mesh)
    return jax.ShapeDtypeStruct(box.value.shape, dtype, sharding=jax.NamedSharding(mesh, spec))
  params = jax.tree.map(struct, model_lib.unrolled_boxes(cfg), is_leaf=is_box)
  cache = jax.eval_shape(lambda: model_lib.KVCache.zeros(cfg, batch, slots))
  names = ('batch', 'kv_heads', 'length', 'head_dim')[-cache.k[0].ndim:]
  spec = sharding.spec_for(cache.k[0].shape, names, mesh)
  cache = sharding.abstract(cache, jax.tree.map(lambda _: jax.NamedSharding(mesh, spec), cache))

  def step(params, cache, token_B, valid_BxS, index, position_B):
    logits_Bx1xV, cache, _ = decoder.apply({'params': params}, token_B[:, None], valid_BxS, cache,
                                           index, position_B[:, None])
    return logits_Bx1xV, cache

  scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=sharding.replicated(mesh))
  return sharding.on_mesh(jax.jit(step, donate_argnums=1), mesh).lower(
      params, cache, sharding.abstract_rows(mesh, (batch,)),
      sharding.abstract_rows(mesh, (batch, slots), bool), scalar,
      sharding.abstract_rows(mesh, (batch,)))


def layer_gradient(cfg, mesh, batch, length):
  """Forward and backward of one remat'ed layer (rljax.model.transformer.Block) on a micro-batch,
  its output kept (as the next layer's input is) and its recomputation apart from its forward (as
  in the model's scan over layers, where they run in different loops): both counted."""
  block = model_lib.Block
  if cfg.remat != 'none':
    block = nn.remat(block, policy=model_lib.REMAT_POLICIES[cfg.remat], prevent_cse=True)
  layer = block(cfg)
  x = jax.ShapeDtypeStruct((batch, length, cfg.d_model), jnp.dtype(cfg.dtype))
  valid = jax.ShapeDtypeStruct((batch, length), bool)
  rope = jax.eval_shape(lambda: model_lib.layers.rope_tables(
      jnp.zeros((batch, length), jnp.int32), cfg.head_dim, cfg.rope_theta))
  init_args = ((x, jnp.zeros((), jnp.float32)), None, rope, valid, 0)
  boxed = jax.eval_shape(lambda *a: layer.init(jax.random.PRNGKey(0), *a)['params'],
                         *_zeros_like(init_args))
  params = sharding.abstract(nn.unbox(boxed), sharding.param_shardings(boxed, mesh))

  def loss(params, x_BxTxD, valid_BxT):
    positions = model_lib.positions_from_valid(valid_BxT)
    rope = model_lib.layers.rope_tables(positions, cfg.head_dim, cfg.rope_theta)
    (y_BxTxD, aux), _ = layer.apply({'params': params}, (x_BxTxD, jnp.zeros((), jnp.float32)),
                                    None, rope, valid_BxT, 0)
    return jnp.sum(y_BxTxD.astype(jnp.float32)) + aux

  grad = sharding.on_mesh(jax.jit(jax.value_and_grad(loss, argnums=(0, 1))), mesh)
  return compile_lowered(grad.lower(params, sharding.abstract_rows(mesh, x.shape, x.dtype),
                                    sharding.abstract_rows(mesh, valid.shape, bool)))


def _zeros_like(tree):
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype) if hasattr(s, 'shape') else s, tree,
                      is_leaf=lambda s: isinstance(s, jax.ShapeDtypeStruct))


def micro_gradient(model, params, mesh, loss_cfg, micro, prompt_len, new_tokens):
  """The policy loss's gradient on one micro-batch (logits unchunked: the same FLOPs, one loop
  fewer for the cost analysis to miss)."""
  loss_fn = policy_loss.make_policy_loss(model, loss_cfg, 1.0, 1, 0)
  grad = sharding.on_mesh(jax.jit(jax.grad(lambda p, b: loss_fn(p, b)[0])), mesh)
  return compile_lowered(grad.lower(params, policy_batch(mesh, micro, prompt_len, new_tokens)))


def scaled(model_cfg, **fields):
  """`model_cfg` with some fields replaced (fewer layers for a cost program)."""
  return model_lib.ModelConfig(**dict(vars(model_cfg), **fields))


def decode_costs(cfg, mesh, batch, cache_len):
  """Per device, one decode step's FLOPs, HBM bytes, collective bytes and kernels at full depth:
  the step compiled alone at 1 and 2 layers, plus the difference once per further layer (XLA
  counts a loop body once, so the sampler's own costs cannot tell). 'collectives': the 2-layer
  step's, as rljax.aot.hlo lists them."""
  one, two = (decode_step(scaled(cfg, num_layers=n), mesh, batch, cache_len) for n in (1, 2))
  at_depth = lambda get: get(one) + (cfg.num_layers - 1) * (get(two) - get(one))
  return dict(flops=at_depth(lambda p: p['flops']),
              bytes_accessed=at_depth(lambda p: p['bytes_accessed']),
              collective_bytes=at_depth(lambda p: p['collectives']['outside']['bytes']),
              kernels=at_depth(lambda p: p['loop_kernels']), collectives=two['collectives'])


def critic_gradient(cfg, params, mesh, algo_cfg, micro, prompt_len, new_tokens):
  """The critic's value-loss gradient on one micro-batch (PPO: a model of the policy's trunk)."""
  critic = critic_lib.Critic(cfg)
  loss_fn = critic_lib.make_critic_loss(critic, algo_cfg.value_clip, algo_cfg.moe_aux_coef, 1)
  critic_params = critic_lib.from_policy(params, jax.random.PRNGKey(0), cfg)
  critic_params['value_head'] = sharding.place(critic_params['value_head'], mesh)
  rows = lambda length, dtype: sharding.abstract_rows(mesh, (micro, length), dtype)
  batch = critic_lib.CriticBatch(
      prompt_BxT=rows(prompt_len, jnp.int32), prompt_valid_BxT=rows(prompt_len, bool),
      response_BxL=rows(new_tokens, jnp.int32), mask_BxL=rows(new_tokens, jnp.float32),
      old_values_BxL=rows(new_tokens, jnp.float32), returns_BxL=rows(new_tokens, jnp.float32),
      weights_BxL=rows(new_tokens, jnp.float32))
  grad = sharding.on_mesh(jax.jit(jax.grad(lambda p, b: loss_fn(p, b)[0])), mesh)
  return compile_lowered(grad.lower(critic_params, batch))


def per_step_costs(model, params_fn, mesh, loss_cfg, decode_batch, slots, micro, prompt_len,
                   new_tokens, decode_mesh=None, critic=False):
  """FLOPs and bytes per device of one decode step (on `decode_mesh`, default `mesh`) and one
  micro-batch gradient, at full depth; with a `critic` (PPO), its gradient on the micro-batch
  too, the algorithm's section `loss_cfg` giving its value loss."""
  cfg = model.cfg
  step = decode_costs(cfg, decode_mesh or mesh, decode_batch, slots)
  keys = ('flops', 'bytes_accessed')
  decode = {k: step[k] for k in keys}
  shallow = scaled(cfg, num_layers=1)
  micro_1 = micro_gradient(model_lib.Transformer(shallow), params_fn(shallow), mesh, loss_cfg,
                           micro, prompt_len, new_tokens)
  layer = layer_gradient(cfg, mesh, micro, prompt_len + new_tokens)
  train = {k: micro_1[k] + (cfg.num_layers - 1) * layer[k] for k in keys}
  if critic:   # a second trunk, forward and backward, on the same micro-batch
    critic_1 = critic_gradient(shallow, params_fn(shallow), mesh, loss_cfg, micro, prompt_len,
                               new_tokens)
    train = {k: train[k] + critic_1[k] + (cfg.num_layers - 1) * layer[k] for k in keys}
  return dict(decode=decode, decode_collectives=step['collectives'], micro=train)
