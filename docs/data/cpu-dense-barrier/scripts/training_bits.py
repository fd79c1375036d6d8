"""Training loss and gradients with 'dense' experts, with and without the optimization barrier on
the side-by-side transpose (rljax.moe.experts_dense): how many values differ (expected: none).

  PYTHONPATH=. python docs/data/cpu-dense-barrier/scripts/training_bits.py
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bench import presets
from rljax import model as model_lib
from rljax import moe


def dense_without_barrier(x_TxD, weights_TxK, experts_TxK, w_in, w_down_ExFxD):
  """experts_dense as it was before the barrier."""
  num_experts, hidden, d_model = w_down_ExFxD.shape
  combine_TxE = jnp.sum(weights_TxK[..., None] * jax.nn.one_hot(experts_TxK, num_experts), axis=1)
  side_by_side = lambda w_ExDxF: jnp.transpose(w_ExDxF, (1, 0, 2)).reshape(d_model, -1)
  hidden_TxExF = moe.swiglu(*[(x_TxD @ side_by_side(w)).reshape(-1, num_experts, w.shape[-1])
                              for w in w_in])
  hidden_TxExF = hidden_TxExF * combine_TxE[..., None].astype(x_TxD.dtype)
  return hidden_TxExF.reshape(x_TxD.shape[0], -1) @ w_down_ExFxD.reshape(-1, d_model)


def loss_and_grads():
  cfg = presets.get('peer', moe_impl='dense')
  model = model_lib.Transformer(cfg)
  params = nn.unbox(model_lib.init_params(cfg, jax.random.PRNGKey(0)))
  tokens_BxT = jax.random.randint(jax.random.PRNGKey(1), (8, 32), 0, cfg.vocab_size)
  valid_BxT = jnp.ones(tokens_BxT.shape, bool)

  def loss(params):
    logits_BxTxV, _, aux = model.apply({'params': params}, tokens_BxT, valid_BxT)
    logp_BxTxV = jax.nn.log_softmax(logits_BxTxV[:, :-1].astype(jnp.float32))
    nll = -jnp.mean(jnp.take_along_axis(logp_BxTxV, tokens_BxT[:, 1:, None], axis=-1))
    return nll + 0.01 * aux
  return jax.jit(jax.value_and_grad(loss))(params)


with_barrier = loss_and_grads()
moe.EXPERT_IMPLS['dense'] = dense_without_barrier
without_barrier = loss_and_grads()
a, b = (jax.tree.leaves(t) for t in (with_barrier, without_barrier))
differ = sum(int(np.sum(np.asarray(x) != np.asarray(y))) for x, y in zip(a, b))
print(f'loss {float(with_barrier[0]):.9f} / {float(without_barrier[0]):.9f}; '
      f'{differ} of {sum(x.size for x in a)} values differ')
