"""RL algorithms, resolved by name: `config.algo = 'grpo'` is the module rljax.algos.grpo.

The loop (rljax.train) owns what every algorithm shares: rollouts, rewards, evaluation, metrics,
checkpoints. An algorithm module owns what differs, and declares:

  BATCH_ARG                     the config-file argument that sets its batch ('P' for GRPO, 'B' for PPO),
                                a string literal: launchers read it from the source, without jax
  batch_size(config)            responses per rollout batch: the unit of the learning-rate rule
  with_batch(config, value)     a copy of `config` whose batch argument is `value`
  check(config)                 ValueError naming the first bad field of its own config section
  make(config, model, params, mesh, rng) -> Algorithm

So a new algorithm is one new file here plus a config file; nothing else changes.
"""
import importlib
import pkgutil
from typing import Callable, NamedTuple

# Update metrics that a training row averages over the optimizer updates of one rollout batch;
# every other update metric is the first update's (on-policy).
AVERAGED = ('grad_norm', 'kl', 'grad_sq_small', 'grad_sq_big', 'b_small', 'b_big')


class Algorithm(NamedTuple):
  state: dict            # pytrees, checkpointed whole; state['params'] is the policy the sampler uses
  make_batch: Callable   # (state, rollout, rewards_B, prompt_BxT, valid_BxT, ref_params) -> (batch, stats)
  update: Callable       # (state, batch, ref_params, rng) -> (state, metrics): all epochs and minibatches
  updates_per_batch: int  # optimizer updates in one call of `update`
  schedules: dict        # training-row key -> schedule(update count), e.g. {'lr': ...}
  needs_reference: bool  # whether a frozen copy of the initial policy is used (KL)
  logged: tuple = ()     # update metrics averaged into each training row beyond AVERAGED


def names():
  """The algorithms this package holds."""
  return sorted(m.name for m in pkgutil.iter_modules(__path__))


def get(name):
  """The algorithm module called `name`; ValueError naming the known ones if there is none."""
  if not isinstance(name, str) or not name.isidentifier():
    raise ValueError(f'algo must be one of {names()}, got {name!r}')
  try:
    return importlib.import_module(f'{__name__}.{name}')
  except ModuleNotFoundError as error:
    if error.name != f'{__name__}.{name}':
      raise
    raise ValueError(f'algo must be one of {names()}, got {name!r}') from None


def micro_batches(config):
  """Micro-batches per minibatch: gradients are accumulated over them, so memory is one's."""
  minibatch = config.rollout.P * config.rollout.G // config.train.num_minibatches
  return minibatch // (config.train.micro_batch or minibatch)
