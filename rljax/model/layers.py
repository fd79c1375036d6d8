"""Small building blocks shared by the policy and critic: parameters with logical axis names,
RMSNorm, rotary embeddings and the dense SwiGLU feed-forward."""
import flax.linen as nn
import jax.numpy as jnp
import numpy as np


def param(module, name, shape, axes, cfg):
  """A parameter with logical axis names (mapped to mesh axes by rljax.sharding).

  Initialised N(0, init_std^2) as Hugging Face Qwen3 does (initializer_range): Adam moves every
  weight by about lr per step, so the init scale sets the *relative* step size, and with it the
  learning rates that work: the configs' were calibrated at this scale (docs/design/init_scale.md).
  """
  init = nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std), axes)
  return module.param(name, init, shape, cfg.param_dtype)


class RMSNorm(nn.Module):
  """Root-mean-square norm over the last axis, computed in float32."""
  cfg: 'rljax.model.transformer.ModelConfig'  # noqa: F821  (a name: transformer imports this)
  axis_name: str = 'norm'

  @nn.compact
  def __call__(self, x):
    scale = self.param('scale',
                       nn.with_logical_partitioning(nn.initializers.ones, (self.axis_name,)),
                       (x.shape[-1],), self.cfg.param_dtype)
    x32 = x.astype(jnp.float32)
    x32 = x32 * jnp.reciprocal(jnp.sqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True)
                                        + self.cfg.norm_eps))
    return (x32 * scale.astype(jnp.float32)).astype(self.cfg.dtype)


def rope_tables(positions_BxT, head_dim, theta):
  """(sin, cos) of the rotary angles, [B, T, 1, head_dim / 2]: computed once for all layers."""
  inv_freq_F = 1.0 / (theta ** (np.arange(head_dim // 2, dtype=np.float32) * 2.0 / head_dim))
  angles_BxTx1xF = (positions_BxT[..., None].astype(jnp.float32) * inv_freq_F)[:, :, None, :]
  return jnp.sin(angles_BxTx1xF), jnp.cos(angles_BxTx1xF)


def rope(x_BxTxNxH, tables):
  """Rotary position embedding, rotate-half convention (as Qwen3 in Hugging Face)."""
  sin, cos = tables
  x1, x2 = jnp.split(x_BxTxNxH.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x_BxTxNxH.dtype)


class SwiGLU(nn.Module):
  """Dense gated feed-forward: down(silu(gate(x)) * up(x))."""
  cfg: 'rljax.model.transformer.ModelConfig'  # noqa: F821  (a name: transformer imports this)

  @nn.compact
  def __call__(self, x_BxTxD):
    cfg = self.cfg
    d_model = x_BxTxD.shape[-1]
    w_gate = param(self, 'w_gate', (d_model, cfg.dense_hidden), ('embed', 'mlp'), cfg)
    w_up = param(self, 'w_up', (d_model, cfg.dense_hidden), ('embed', 'mlp'), cfg)
    w_down = param(self, 'w_down', (cfg.dense_hidden, d_model), ('mlp', 'embed'), cfg)
    gate = jnp.dot(x_BxTxD, w_gate.astype(cfg.dtype))
    up = jnp.dot(x_BxTxD, w_up.astype(cfg.dtype))
    return jnp.dot(nn.silu(gate) * up, w_down.astype(cfg.dtype))
