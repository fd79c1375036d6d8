"""Hugging Face Qwen3 / Qwen3-MoE checkpoints <-> rljax parameters.

A checkpoint directory holds config.json and safetensors files (one `model.safetensors`, or shards
listed in `model.safetensors.index.json`), in the hub layout: one [out, in] matrix per projection,
per layer and per expert. rljax stacks layers (and experts) along leading axes and keeps heads as
their own axis, so every rljax leaf is a stack of reshaped, transposed HF tensors.

Loading never materialises the model on one host: each leaf is built with
`jax.make_array_from_callback` for its target sharding, and the callback reads from safetensors
only the slice that one device shard needs. Exporting writes one file shard at a time.
"""
import contextlib
import dataclasses
import json
import math
import os
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
import safetensors.numpy

from rljax.hf import architecture
from rljax.model import transformer as model_lib
from rljax import sharding

TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja',
                   'special_tokens_map.json', 'generation_config.json')


def policy_config(config) -> model_lib.ModelConfig:
  """The policy of a training config: config.model, or with --config.init.hf_path the checkpoint's
  architecture with config.model's runtime fields (moe_impl, dtypes, remat, router_replay)."""
  hf_path = config.init.hf_path
  if not hf_path:   # model.lora is how the policy trains (rljax.model.lora), not the network
    return model_lib.ModelConfig.from_config({k: v for k, v in config.model.items()
                                              if k != 'lora'})
  runtime = {k: config.model[k] for k in architecture.RUNTIME_FIELDS if k in config.model}
  cfg = architecture.model_config(architecture.read_config(hf_path), **runtime)
  check_checkpoint(hf_path, cfg)
  return cfg


# ------------------------------------------------------------------------------------------------
# Where every rljax leaf lives in the HF layout


@dataclasses.dataclass(frozen=True)
class Mapping:
  """One rljax leaf = stack over `stack` axes ('layer', 'expert') of HF tensors named `name`.

  Each HF tensor is viewed with its dims split as `groups` (e.g. q_proj [H*Dh, D] as
  ((H, Dh), (D,))) and transposed by `perm` into the rljax layout of one stack element.
  """
  name: str
  stack: tuple = ()
  groups: Optional[tuple] = None   # None: no reshape (view == HF shape)
  perm: Optional[tuple] = None     # None: no transpose


def mappings(cfg: model_lib.ModelConfig) -> dict:
  """rljax param path ('blocks/attn/w_q') -> Mapping."""
  H, K, Dh, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_model
  layer = 'model.layers.{layer}.'
  out = {
      'embed/embedding': Mapping('model.embed_tokens.weight'),
      'final_norm/scale': Mapping('model.norm.weight'),
      'blocks/attn_norm/scale': Mapping(layer + 'input_layernorm.weight', ('layer',)),
      'blocks/ffn_norm/scale': Mapping(layer + 'post_attention_layernorm.weight', ('layer',)),
      'blocks/attn/q_norm/scale': Mapping(layer + 'self_attn.q_norm.weight', ('layer',)),
      'blocks/attn/k_norm/scale': Mapping(layer + 'self_attn.k_norm.weight', ('layer',)),
      'blocks/attn/w_q': Mapping(layer + 'self_attn.q_proj.weight', ('layer',),
                                 ((H, Dh), (D,)), (2, 0, 1)),
      'blocks/attn/w_k': Mapping(layer + 'self_attn.k_proj.weight', ('layer',),
                                 ((K, Dh), (D,)), (2, 0, 1)),
      'blocks/attn/w_v': Mapping(layer + 'self_attn.v_proj.weight', ('layer',),
                                 ((K, Dh), (D,)), (2, 0, 1)),
      'blocks/attn/w_o': Mapping(layer + 'self_attn.o_proj.weight', ('layer',),
                                 ((D,), (H, Dh)), (1, 2, 0)),
  }
  if cfg.num_experts:
    expert = layer + 'mlp.experts.{expert}.'
    out.update({
        'blocks/moe/router': Mapping(layer + 'mlp.gate.weight', ('layer',), perm=(1, 0)),
        'blocks/moe/w_gate': Mapping(expert + 'gate_proj.weight', ('layer', 'expert'), perm=(1, 0)),
        'blocks/moe/w_up': Mapping(expert + 'up_proj.weight', ('layer', 'expert'), perm=(1, 0)),
        'blocks/moe/w_down': Mapping(expert + 'down_proj.weight', ('layer', 'expert'), perm=(1, 0)),
    })
  else:
    out.update({
        'blocks/ffn/w_gate': Mapping(layer + 'mlp.gate_proj.weight', ('layer',), perm=(1, 0)),
        'blocks/ffn/w_up': Mapping(layer + 'mlp.up_proj.weight', ('layer',), perm=(1, 0)),
        'blocks/ffn/w_down': Mapping(layer + 'mlp.down_proj.weight', ('layer',), perm=(1, 0)),
    })
  if not cfg.tie_embeddings:
    out['lm_head'] = Mapping('lm_head.weight', perm=(1, 0))
  return out


def _view_shape(m: Mapping, hf_shape):
  return tuple(hf_shape) if m.groups is None else tuple(n for group in m.groups for n in group)


def _perm(m: Mapping, ndim):
  return tuple(range(ndim)) if m.perm is None else m.perm


def _read_piece(tensor, m: Mapping, piece_index):
  """Reads from one lazily opened HF tensor only the slice that gives `piece_index` (slices over the
  rljax layout of one stack element), and returns it in that layout."""
  hf_shape = tensor.get_shape()
  view_shape = _view_shape(m, hf_shape)
  perm = _perm(m, len(view_shape))
  view_index = [None] * len(view_shape)
  for axis, index in zip(perm, piece_index):
    view_index[axis] = index
  groups = m.groups or tuple((n,) for n in hf_shape)
  hf_index, read_shape, inner_index, first = [], [], [], 0
  for group in groups:   # a split HF dim is read over whole rows of its first view dim
    lead = view_index[first]
    row = math.prod(group[1:])
    hf_index.append(slice(lead.start * row, lead.stop * row))
    read_shape += [lead.stop - lead.start, *group[1:]]
    inner_index += [slice(None)] + list(view_index[first + 1:first + len(group)])
    first += len(group)
  block = tensor[tuple(hf_index)]
  return np.transpose(block.reshape(read_shape)[tuple(inner_index)], perm)


def _open_safetensors(path, listed_in=None):
  """safe_open(path), which reads and validates the header only; ValueError naming the file when it
  is missing, empty, truncated or not safetensors at all."""
  if not os.path.isfile(path):
    raise ValueError(f'{path} is missing' + (f' (listed in {listed_in})' if listed_in else ''))
  try:
    return safe_open(path, framework='numpy')
  except (safetensors.SafetensorError, OSError) as error:
    raise ValueError(f'{path} is not a readable safetensors file ({error})') from None


class _Files(contextlib.ExitStack):
  """The safetensors files of a checkpoint by tensor name, all opened (headers checked) up front."""

  def __init__(self, hf_dir):
    super().__init__()
    self.dir, self._open = hf_dir, {}
    index, single = (os.path.join(hf_dir, name) for name in ('model.safetensors.index.json',
                                                             'model.safetensors'))
    try:
      if os.path.exists(index):
        weight_map = architecture.read_json(index).get('weight_map')
        if not isinstance(weight_map, dict) or not weight_map:
          raise ValueError(f'{index} has no weight_map of tensor names to files')
        for file in sorted(set(weight_map.values())):
          path = os.path.join(hf_dir, file)
          self._open[file] = self.enter_context(_open_safetensors(path, listed_in=index))
      elif os.path.exists(single):
        self._open['model.safetensors'] = self.enter_context(_open_safetensors(single))
        weight_map = {name: 'model.safetensors' for name in self._open['model.safetensors'].keys()}
      else:
        raise ValueError(f'{hf_dir} has neither model.safetensors nor model.safetensors.index.json')
    except BaseException:
      self.close()
      raise
    self.weight_map = weight_map

  def tensor(self, name):
    if name not in self.weight_map:
      fused = any('.mlp.experts.gate_up_proj' in key for key in self.weight_map)
      hint = (' (this checkpoint stores fused expert tensors; save it with transformers in the '
              'original per-expert hub format)') if fused else ''
      raise ValueError(f'tensor {name!r} is missing from the checkpoint in {self.dir}{hint}')
    return self._open[self.weight_map[name]].get_slice(name)


def _leaf_loader(files, m: Mapping, shape, dtype) -> Callable:
  """The make_array_from_callback callback of one leaf: device index -> numpy shard."""
  num_stack = len(m.stack)
  cache = {}   # devices holding replicas of one shard read it once (freed with this leaf)

  def load(index):
    index = tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape))
    key = tuple((s.start, s.stop) for s in index)
    if key in cache:   # a copy: a device buffer may alias host memory, never share it
      return cache[key].copy()
    cache[key] = read(index)
    return cache[key]

  def read(index):
    stack_index, piece_index = index[:num_stack], index[num_stack:]
    ranges = [range(s.start, s.stop) for s in stack_index]
    out = np.empty([s.stop - s.start for s in index], dtype)
    for position in np.ndindex(*[len(r) for r in ranges]):
      names = {axis: r[p] for axis, r, p in zip(m.stack, ranges, position)}
      tensor = files.tensor(m.name.format(**names))
      out[position] = _read_piece(tensor, m, piece_index).astype(dtype)
    return out

  return load


def _check_shapes(files, m, cfg, path, shape):
  """Every HF tensor of a leaf must exist with exactly the shape the config implies (a wrong or
  truncated checkpoint fails here, before anything is placed). Reads metadata only."""
  counts = {'layer': cfg.num_layers, 'expert': cfg.num_experts}
  for position in np.ndindex(*[counts[axis] for axis in m.stack]):
    name = m.name.format(**dict(zip(m.stack, position)))
    hf_shape = tuple(files.tensor(name).get_shape())
    view = _view_shape(m, hf_shape)
    if m.groups is not None and tuple(math.prod(g) for g in m.groups) != hf_shape:
      raise ValueError(f'{name} has shape {hf_shape}; config.json implies '
                       f'{tuple(math.prod(g) for g in m.groups)}')
    expected = tuple(view[a] for a in _perm(m, len(view)))
    if expected != tuple(shape[len(m.stack):]):
      raise ValueError(f'{name} has shape {hf_shape}, which does not fit rljax {path} '
                       f'{tuple(shape)}')


def _unflatten(flat):
  tree = {}
  for path, value in flat.items():
    node = tree
    *parents, last = path.split('/')
    for key in parents:
      node = node.setdefault(key, {})
    node[last] = value
  return tree


def abstract_params(cfg: model_lib.ModelConfig):
  """Shapes and dtypes of the (unboxed) rljax params of `cfg`, without allocating them."""
  boxed = jax.eval_shape(lambda: model_lib.init_params(cfg, jax.random.PRNGKey(0)))
  return nn.unbox(boxed)


def check_checkpoint(hf_dir, cfg: model_lib.ModelConfig):
  """Raises ValueError, naming the file or tensor, unless every safetensors file of `hf_dir` is
  readable and holds every tensor of `cfg` with the shape it implies. Reads headers only, so a bad
  checkpoint fails before anything is built."""
  table = mappings(cfg)
  with _Files(hf_dir) as files:
    for path, leaf in _flatten_paths(abstract_params(cfg)):
      _check_shapes(files, table[path], cfg, path, leaf.shape)


def load_params(hf_dir, cfg: model_lib.ModelConfig, shardings: Any = None):
  """Reads an HF checkpoint into rljax params (a nested dict of jax.Arrays, dtype cfg.param_dtype).

  `shardings`: a pytree of `jax.sharding.Sharding` matching the params (e.g. from rljax.sharding),
  or one Sharding for every leaf. Each device shard is read from disk on its own, so no host ever
  holds more than its shards. Default: uncommitted arrays on the default device (as init_params
  gives; committed ones would make jitted steps recompile once their outputs come back committed),
  read one leaf at a time.
  """
  abstract = {path: leaf for path, leaf in _flatten_paths(abstract_params(cfg))}
  if isinstance(shardings, jax.sharding.Sharding):
    shardings = {path: shardings for path in abstract}
  elif shardings is not None:
    shardings = dict(_flatten_paths(shardings))
  table = mappings(cfg)
  if set(table) != set(abstract):
    raise AssertionError(
        f'HF mapping and rljax params disagree: {sorted(set(table) ^ set(abstract))}')
  out = {}
  with _Files(hf_dir) as files:
    for path, leaf in abstract.items():
      _check_shapes(files, table[path], cfg, path, leaf.shape)
      loader = _leaf_loader(files, table[path], leaf.shape, np.dtype(leaf.dtype))
      if shardings is None:   # uncommitted on the default device, like freshly initialised params
        out[path] = jnp.asarray(loader(tuple(slice(None) for _ in leaf.shape)))
      else:
        out[path] = jax.make_array_from_callback(leaf.shape, shardings[path], loader)
  return _unflatten(out)


def _flatten_paths(tree):
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    yield '/'.join(str(getattr(k, 'key', k)) for k in path), leaf


# ------------------------------------------------------------------------------------------------
# Export


def _hf_tensors(params, cfg):
  """Yields (HF name, numpy array) one tensor at a time, in checkpoint order."""
  flat = dict(_flatten_paths(params))
  counts = {'layer': cfg.num_layers, 'expert': cfg.num_experts}
  for path, m in mappings(cfg).items():
    leaf = flat[path]
    for position in np.ndindex(*[counts[axis] for axis in m.stack]):
      piece = sharding.to_numpy(leaf[position] if position else leaf)
      perm = _perm(m, piece.ndim)
      view = np.transpose(piece, np.argsort(perm))
      hf_shape = view.shape if m.groups is None else tuple(math.prod(g) for g in m.groups)
      yield (m.name.format(**dict(zip(m.stack, position))),
             np.ascontiguousarray(view.reshape(hf_shape)))


def save_params(params, cfg: model_lib.ModelConfig, out_dir, config: Optional[dict] = None,
                dtype=None, max_shard_bytes=2 << 30, tokenizer_dir=None):
  """Writes `params` as an HF checkpoint (config.json, safetensors shards + index) into `out_dir`.

  `config`: the config.json to write (default: `architecture.hf_config(cfg)`); `dtype`: cast on
  export (e.g. 'bfloat16'); `tokenizer_dir`: copy tokenizer files from there. Only process 0
  writes.
  """
  expected = {path: leaf.shape for path, leaf in _flatten_paths(abstract_params(cfg))}
  got = {path: tuple(leaf.shape) for path, leaf in _flatten_paths(params)}
  if got != expected:
    wrong = sorted(p for p in set(got) | set(expected) if got.get(p) != expected.get(p))
    raise ValueError(f'params do not fit the model config at {wrong[:3]}: '
                     f'{[(got.get(p), expected.get(p)) for p in wrong[:3]]}')
  writer = jax.process_index() == 0
  if writer:
    os.makedirs(out_dir, exist_ok=True)
  dtype = jnp.dtype(dtype) if dtype is not None else None
  shard, shard_bytes, shards = {}, 0, []

  def flush():
    nonlocal shard, shard_bytes
    if shard:
      name = f'model-{len(shards) + 1:05d}.safetensors'
      if writer:
        safetensors.numpy.save_file(shard, os.path.join(out_dir, name), metadata={'format': 'pt'})
      shards.append((name, list(shard)))
    shard, shard_bytes = {}, 0

  total = 0
  for name, array in _hf_tensors(params, cfg):
    array = array.astype(dtype) if dtype is not None else array
    if shard and shard_bytes + array.nbytes > max_shard_bytes:
      flush()
    shard[name] = array
    shard_bytes += array.nbytes
    total += array.nbytes
  flush()
  if not writer:
    return
  count = len(shards)
  weight_map = {}
  for i, (name, names) in enumerate(shards):
    final = 'model.safetensors' if count == 1 else f'model-{i + 1:05d}-of-{count:05d}.safetensors'
    os.replace(os.path.join(out_dir, name), os.path.join(out_dir, final))
    weight_map.update({n: final for n in names})
  if count > 1:
    with open(os.path.join(out_dir, 'model.safetensors.index.json'), 'w') as f:
      json.dump({'metadata': {'total_size': total}, 'weight_map': weight_map}, f, indent=2)
  config = dict(config or architecture.hf_config(cfg))
  leaf_dtype = dtype or np.dtype(jax.tree.leaves(params)[0].dtype)
  config['dtype'] = config['torch_dtype'] = str(leaf_dtype)
  with open(os.path.join(out_dir, 'config.json'), 'w') as f:
    json.dump(config, f, indent=2)
  if tokenizer_dir:
    _copy_tokenizer(tokenizer_dir, out_dir)


def _copy_tokenizer(tokenizer_dir, out_dir):
  for name in TOKENIZER_FILES:
    source = os.path.join(tokenizer_dir, name)
    if os.path.exists(source):
      with open(source, 'rb') as src, open(os.path.join(out_dir, name), 'wb') as dst:
        dst.write(src.read())
