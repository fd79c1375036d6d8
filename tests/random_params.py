"""Parameter trees redrawn at O(1)-logit scale for the numerical tests: the 0.02 init gives
near-uniform next-token distributions, where every loss, sampler and reference looks alike."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rljax.model import transformer as model_lib


def redraw(shapes, rng, norm_std=0.2, wide=('router',)):
  """Norm scales ~ 1 + norm_std N(0, 1); leaves whose path names one of `wide` ~ N(0, 1); the rest
  ~ 0.3 N(0, 1). One draw per leaf, in tree order."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  values = []
  for path, leaf in leaves:
    name = jax.tree_util.keystr(path)
    if 'scale' in name:
      value = 1.0 + norm_std * rng.normal(size=leaf.shape)
    else:
      value = (1.0 if any(w in name for w in wide) else 0.3) * rng.normal(size=leaf.shape)
    values.append(jnp.asarray(value, jnp.float32))
  return jax.tree_util.tree_unflatten(treedef, values)


def model_shapes(cfg):
  return nn.unbox(jax.eval_shape(lambda: model_lib.init_params(cfg, jax.random.PRNGKey(0))))


def for_model(cfg, seed, **kwargs):
  """The policy of `cfg` with redrawn parameters (see `redraw` for the keyword arguments)."""
  return redraw(model_shapes(cfg), np.random.default_rng(seed), **kwargs)
