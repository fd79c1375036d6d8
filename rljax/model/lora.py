"""LoRA (Hu et al., 2021) as pure functions over the policy's parameter pytree: low-rank adapters
A, B for the chosen projections (the experts' included) and the policy they make,
W + (alpha / r) A @ B, merged in each weight's dtype.

A weight of shape [lead..., in..., out...] (lead: the stacked layers and experts; in and out the
axes its matmul contracts and produces, e.g. w_q [L, D, N, H]: in D, out (N, H)) gets
A [lead..., in..., r] and B [lead..., r, out...]: its grouped axes count as one input and one
output dimension, as Hugging Face's [out, in] matrices do, so the adapters export to PEFT's
layout by a reshape and a transpose (rljax.hf.peft).

Why merged, not a low-rank term beside each matmul: the merged weights go through the model as
it is, so every expert path (ragged, megablox, dense, bucketed, gather, expert-parallel) runs
unchanged, and the sampler, given `merge(base, adapters)` once per call, runs exactly the
adapted policy the trainer differentiates (tests/test_lora.py). The gradient reaches A and B
only, through the merge; the base is an argument, never trained. (docs/guide/lora.md)
"""
import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

# A config's target -> the weight it adapts, under 'attn' (attention) or 'ffn' / 'moe' (the dense
# feed-forward or the experts). The router ('moe/router') is never adapted, as in PEFT.
TARGETS = {'q': 'w_q', 'k': 'w_k', 'v': 'w_v', 'o': 'w_o', 'gate': 'w_gate', 'up': 'w_up',
           'down': 'w_down'}
PARENTS = {'w_q': 'attn', 'w_k': 'attn', 'w_v': 'attn', 'w_o': 'attn', 'w_gate': ('ffn', 'moe'),
           'w_up': ('ffn', 'moe'), 'w_down': ('ffn', 'moe')}
IN_AXES = {'w_o': 2}                           # (heads, head_dim); every other weight: 1
OUT_AXES = {'w_q': 2, 'w_k': 2, 'w_v': 2}      # (heads, head_dim); every other weight: 1
RANK_AXIS = 'lora'   # the adapters' rank axis: not in rljax.sharding's rules, so replicated


class LoraConfig(NamedTuple):
  rank: int
  alpha: float
  targets: tuple

  @property
  def scale(self):
    """alpha / r, PEFT's scaling (not rsLoRA's alpha / sqrt(r))."""
    return self.alpha / self.rank


def config_of(model_section):
  """The LoRA settings of a config's `model` section; None when LoRA is off (rank 0 or no
  `lora` field)."""
  section = model_section.get('lora') if hasattr(model_section, 'get') else None
  if not section or not section.get('rank'):
    return None
  return LoraConfig(int(section['rank']), float(section['alpha']), tuple(section['targets']))


def check(section):
  """ValueError naming the first bad field of a `model.lora` section (None: no section)."""
  if section is None:
    return
  rank, alpha, targets = section.get('rank'), section.get('alpha'), section.get('targets')
  if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
    raise ValueError(f'model.lora.rank must be an integer >= 0 (0: off), got {rank!r}')
  if not rank:
    return
  if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
    raise ValueError(f'model.lora.alpha must be a positive number, got {alpha!r}')
  if isinstance(targets, str) or not targets:
    raise ValueError(f'model.lora.targets must be a non-empty list of {tuple(TARGETS)}, got '
                     f'{targets!r}')
  unknown = [t for t in targets if t not in TARGETS]
  if unknown:
    raise ValueError(f'model.lora.targets: unknown target {unknown[0]!r}; the targets are '
                     f'{tuple(TARGETS)}')


def _keys(path):
  return tuple(str(getattr(k, 'key', k)) for k in path)


def target_of(keys, cfg: LoraConfig):
  """The config target adapting the weight at `keys` (its path in the params), or None."""
  name = keys[-1]
  parents = PARENTS.get(name, ())
  if len(keys) < 2 or keys[-2] not in (parents if isinstance(parents, tuple) else (parents,)):
    return None
  target = next(t for t, weight in TARGETS.items() if weight == name)
  return target if target in cfg.targets else None


def dims(name, ndim):
  """(lead, in, out) axis counts of the weight `name` with `ndim` axes."""
  num_in, num_out = IN_AXES.get(name, 1), OUT_AXES.get(name, 1)
  return ndim - num_in - num_out, num_in, num_out


def adapter_boxes(box, name, rank, key):
  """{'a', 'b'} of one boxed weight: A uniform in +-1/sqrt(fan_in) (PEFT's kaiming-uniform
  init), B zero, so the adapted policy starts as the base exactly; each with the weight's axis
  names and RANK_AXIS."""
  shape, names, dtype = box.value.shape, box.names, box.value.dtype
  lead, num_in, _ = dims(name, len(shape))
  fan_in = math.prod(shape[lead:lead + num_in])
  bound = 1.0 / math.sqrt(fan_in)
  a = jax.random.uniform(key, shape[:lead + num_in] + (rank,), dtype, -bound, bound)
  b = jnp.zeros(shape[:lead] + (rank,) + shape[lead + num_in:], dtype)
  return dict(a=nn.Partitioned(a, names[:lead + num_in] + (RANK_AXIS,)),
              b=nn.Partitioned(b, names[:lead] + (RANK_AXIS,) + names[lead + num_in:]))


def init_adapters(boxes, cfg: LoraConfig, rng):
  """Boxed adapters for every targeted weight of `boxes` (the boxed params, abstract or not):
  {path...: {'a': A, 'b': B}}, nested as the params are. Each weight's key is `rng` folded with
  its index in path order, so the adapters do not depend on which others exist."""
  flat = jax.tree_util.tree_flatten_with_path(
      boxes, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]
  out = {}
  for index, (path, box) in enumerate(flat):
    keys = _keys(path)
    if target_of(keys, cfg) is None:
      continue
    node = out
    for key in keys[:-1]:
      node = node.setdefault(key, {})
    node[keys[-1]] = adapter_boxes(box, keys[-1], cfg.rank,
                                   jax.random.fold_in(rng, index))
  return out


def delta(a, b, num_lead):
  """A @ B over the rank in float32 at full precision, [lead..., in..., out...]."""
  lead, in_shape, out_shape = a.shape[:num_lead], a.shape[num_lead:-1], b.shape[num_lead + 1:]
  rank = a.shape[-1]
  a_LxIxR = a.reshape(*lead, math.prod(in_shape), rank).astype(jnp.float32)
  b_LxRxO = b.reshape(*lead, rank, math.prod(out_shape)).astype(jnp.float32)
  product = jnp.matmul(a_LxIxR, b_LxRxO, precision=jax.lax.Precision.HIGHEST)
  return product.reshape(*lead, *in_shape, *out_shape)


def merge(params, adapters, cfg: LoraConfig):
  """The adapted policy: W + (alpha / r) A @ B for each adapted weight, in W's dtype; every other
  leaf of `params` as it is (the same array)."""
  def merged(path, w):
    node = adapters
    for key in _keys(path):
      node = node.get(key) if isinstance(node, dict) else None
    if node is None:
      return w
    lead = dims(_keys(path)[-1], w.ndim)[0]
    return (w.astype(jnp.float32) + cfg.scale * delta(node['a'], node['b'], lead)).astype(w.dtype)
  return jax.tree_util.tree_map_with_path(merged, params)


def count(tree):
  """Numbers in a pytree (parameters of the adapters, or of the model)."""
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))
