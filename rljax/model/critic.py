"""The critic of PPO: the policy's transformer trunk with a scalar value head, one value per token.

By default the critic is a separate model of the policy's family, initialised from the
(warm-started) policy trunk with a fresh value head, as PPO for LLMs is usually run: it starts
from features that already read the task. Its trunk is `model.Transformer` with tied
embeddings, which only means it has no `lm_head` parameter (the critic never computes
vocabulary logits). Every parameter carries logical axis names, so the critic is placed on the
same mesh by the same rules as the policy.

With a shared trunk the critic owns only the value head and reads the policy's own trunk.
"""
import dataclasses
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from rljax import losses
from rljax.model import transformer as model_lib
from rljax import policy_loss
from rljax import sharding


class ValueHead(nn.Module):
  """h -> w . h + b in float32. Zero-initialised: a fresh critic predicts 0 for every state."""

  @nn.compact
  def __call__(self, h_BxSxD):
    w_D = self.param('w', nn.with_logical_partitioning(nn.initializers.zeros, ('embed',)),
                     (h_BxSxD.shape[-1],), jnp.float32)
    b = self.param('b', nn.with_logical_partitioning(nn.initializers.zeros, ()), (), jnp.float32)
    return jnp.dot(h_BxSxD.astype(jnp.float32), w_D) + b


class Critic(nn.Module):
  """Returns (values_BxS, MoE load-balancing loss): V(prefix up to and including token s)."""
  cfg: model_lib.ModelConfig

  def setup(self):
    self.trunk = model_lib.Transformer(trunk_config(self.cfg))
    self.value_head = ValueHead()

  def __call__(self, tokens_BxS, valid_BxS):
    h_BxSxD, _, aux_loss = self.trunk.hidden(tokens_BxS, valid_BxS)
    return self.value_head(h_BxSxD), aux_loss


def trunk_config(cfg):
  """The policy's architecture without the vocabulary head."""
  return dataclasses.replace(cfg, tie_embeddings=True)


def trunk_of(policy_params):
  """The policy's parameters minus its lm_head: exactly the critic trunk's parameter tree."""
  return {name: value for name, value in policy_params.items() if name != 'lm_head'}


def init_params(cfg, rng):
  """Boxed critic parameters (logical axis names kept, for placement on the mesh)."""
  tokens = jnp.zeros((1, 4), jnp.int32)
  return Critic(cfg).init(rng, tokens, jnp.ones((1, 4), bool))['params']


def from_policy(policy_params, head_rng, cfg):
  """A critic whose trunk is a copy of the policy's and whose value head is fresh."""
  head = nn.unbox(ValueHead().init(head_rng, jnp.zeros((1, 1, cfg.d_model), cfg.dtype))['params'])
  trunk = trunk_of(policy_params)   # ShapeDtypeStructs stay (an abstract setup); arrays get their
  if not sharding.is_abstract(trunk):   # own buffers: both copies get donated
    trunk = jax.tree.map(jnp.copy, trunk)
  return dict(trunk=trunk, value_head=head)


class CriticBatch(NamedTuple):
  prompt_BxT: jax.Array
  prompt_valid_BxT: jax.Array
  response_BxL: jax.Array
  mask_BxL: jax.Array          # float: 1 on trained response tokens
  old_values_BxL: jax.Array    # the critic's values when the batch was made (for value clipping)
  returns_BxL: jax.Array       # GAE returns: the regression targets
  weights_BxL: jax.Array       # aggregation weights from the FULL (mini)batch


def response_values(critic, critic_params, prompt_BxT, prompt_valid_BxT, response_BxL):
  """V(s_t) for every response token t, s_t = prompt + response[:t] (the state that chose token t).

  Same left-padded layout and the same slice as the policy's log-probs, so value t and log-prob t
  are read at the same position.
  """
  values_BxS, aux_loss = critic.apply(
      {'params': critic_params},
      *policy_loss.prompt_and_response(prompt_BxT, prompt_valid_BxT, response_BxL))
  return policy_loss.at_response(values_BxS, prompt_BxT.shape[1], response_BxL.shape[1]), aux_loss


def make_critic_loss(critic, value_clip, moe_aux_coef, num_micro):
  """`loss_fn(critic_params, CriticBatch) -> (loss, metric sums)` for rljax.update.

  value_clip <= 0 turns value clipping off. Additive over micro-batches (weights from the
  full batch).
  """
  clip = value_clip if value_clip > 0 else None

  def loss_fn(critic_params, batch):
    values_BxL, aux_loss = response_values(critic, critic_params, batch.prompt_BxT,
                                           batch.prompt_valid_BxT, batch.response_BxL)
    loss_BxL = losses.value_loss(values_BxL, batch.old_values_BxL, batch.returns_BxL, clip)
    value_loss = jnp.sum(batch.weights_BxL * loss_BxL)
    unclipped_BxL = losses.value_loss(values_BxL, batch.old_values_BxL, batch.returns_BxL, None)
    clipped_BxL = (loss_BxL > unclipped_BxL).astype(jnp.float32)  # the clip took the gradient away
    metrics = dict(value_loss=value_loss, value_clipfrac=jnp.sum(batch.weights_BxL * clipped_BxL),
                   critic_moe_aux_loss=aux_loss / num_micro)
    return value_loss + moe_aux_coef * aux_loss / num_micro, metrics

  return loss_fn
