"""What a policy-gradient algorithm trains: every weight of the policy, or with `model.lora` only
LoRA adapters on a frozen base (rljax.model.lora). Shared by GRPO and RLOO.

With adapters, the algorithm's state holds them and their optimizer state under 'adapters'; the
base rides in the carry's reference slot (the run rebuilds it rather than checkpointing it), so
the policy the sampler, the evaluator and `make_batch` run is `merge(reference, adapters)`, and
a KL term's reference policy is the base itself: the initial policy, as with full fine-tuning.
"""
import functools
from typing import Any, Callable, NamedTuple

import jax

from rljax import algos
from rljax.model import lora
from rljax.model import transformer as model_lib
from rljax import sharding


class Trained(NamedTuple):
  key: str           # the state's key of the trained tree: 'params' or 'adapters'
  tree: Any          # its initial value (laid out on the mesh; abstract where the params are)
  policy: Callable   # (state, reference) -> the policy's params, traceable
  loss: Callable     # loss_fn(params, batch, ref) -> the same loss as a function of the tree
  adapts: bool       # whether the tree is LoRA adapters (the reference slot then holds the base)


def trained(config, model, params, mesh, rng):
  """What `config` trains, starting from policy `params` (`rng`: the adapters' init)."""
  cfg = lora.config_of(config.model)
  if cfg is None:
    return Trained('params', params, algos.params_policy, lambda loss_fn: loss_fn, False)
  boxes = jax.eval_shape(functools.partial(model_lib.init_params, model.cfg), rng)
  adapters, _ = sharding.init_params(lambda key: lora.init_adapters(boxes, cfg, key), rng, mesh,
                                     abstract_only=sharding.is_abstract(params))
  policy = lambda state, base: lora.merge(base, state['adapters'], cfg)

  def loss(loss_fn):
    return lambda adapters, batch, base: loss_fn(lora.merge(base, adapters, cfg), batch, base)
  return Trained('adapters', adapters, policy, loss, True)


def policy_program(trained_, params, mesh):
  """`trained_.policy` jitted on `mesh`, its output laid out as `params` (the base) is: what the
  loop hands the sampler and the evaluator each step."""
  if not trained_.adapts:
    return algos.params_policy
  out = jax.tree.map(lambda x: x.sharding, params)
  return sharding.on_mesh(jax.jit(trained_.policy, out_shardings=out), mesh)
