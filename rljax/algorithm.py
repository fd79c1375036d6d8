"""What the RL loop (rljax.train) needs from an algorithm; rljax.grpo and rljax.ppo each build one.

The loop owns everything the algorithms share: rollouts, rewards, minibatches and epochs, metrics,
evaluation, checkpoints. An algorithm owns its training state and the two jitted functions that
differ: how a rollout becomes a training batch (GRPO: group z-scores; PPO: critic values and GAE)
and what one update does (PPO also updates its critic).
"""
from typing import Callable, NamedTuple


class Algorithm(NamedTuple):
  state: dict            # pytrees, checkpointed whole; state['params'] is the policy the sampler uses
  make_batch: Callable   # (state, rollout, rewards_B, prompt_BxT, valid_BxT, ref_params) -> (batch, stats)
  update: Callable       # (state, minibatch, ref_params) -> (state, metrics); batch rows are responses
  schedules: dict        # training-row key -> schedule(update count), e.g. {'lr': ...}
  needs_reference: bool  # whether a frozen copy of the initial policy is used (KL)
  logged: tuple = ()     # update metrics averaged into each training row beyond the common ones
