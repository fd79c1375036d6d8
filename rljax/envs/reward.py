"""An episode's reward: the environment's where its steps gave one, else the task's verifier's
(the rule of rljax.envs)."""
import numpy as np

from rljax.data import rewards


def score(reward_fn, responses, answers, env_rewards=None):
  """(rewards_B float32, verifier failures) of the decoded `responses`: `env_rewards[b]` (the sum
  of episode b's step rewards, NaN where its steps gave none) where it is a number, else
  `reward_fn(response, answer)` as rljax.data.rewards.score_batch scores it. `env_rewards`
  None: single-turn responses, every one the verifier's."""
  if env_rewards is None:
    return rewards.score_batch(reward_fn, responses, answers)
  env_rewards = np.asarray(env_rewards, np.float32)
  if len(env_rewards) != len(responses):
    raise ValueError(f'{len(responses)} responses but {len(env_rewards)} episode rewards')
  verified = np.flatnonzero(np.isnan(env_rewards))
  scores, failures = rewards.score_batch(reward_fn, [responses[b] for b in verified],
                                         [answers[b] for b in verified])
  out = env_rewards.copy()
  out[verified] = scores
  return out, failures
