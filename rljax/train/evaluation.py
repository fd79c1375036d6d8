"""Held-out accuracy: greedy decoding of every eval prompt in one sampler call,
scored by the verifier.

Each process decodes its own slice of the eval set (padded to a multiple of the data-parallel
size); the per-prompt results are gathered so every process holds the same accuracy.
"""
import jax
from jax.experimental import multihost_utils
import numpy as np

from rljax.data import sources as data
from rljax.envs import reward as reward_lib
from rljax.rollout import turns
from rljax import sharding


def decode_responses(tokenizer, tokens_BxL):
  """Response token rows -> text (stops at the end token)."""
  return [tokenizer.decode(row) for row in np.asarray(tokens_BxL)]


def to_host(tree, mesh):
  """Global batch-sharded arrays -> this process's rows as numpy (inverse of sharding.put_batch)."""
  if jax.process_count() == 1:
    return jax.tree.map(np.asarray, tree)
  specs = jax.tree.map(lambda x: x.sharding.spec, tree)
  return jax.tree.map(np.asarray,
                      multihost_utils.global_array_to_host_local_array(tree, mesh, specs))


def eval_rows(num, mesh):
  """(rows per process, rows this process decodes: padded to the data-parallel devices it holds,
  its first row)."""
  per_process = -(-num // jax.process_count())
  local_devices = sharding.data_parallel_size(mesh) // jax.process_count()
  return per_process, -(-per_process // local_devices) * local_devices, (jax.process_index()
                                                                        * per_process)


def make_evaluator(greedy, tokenizer, prompts, answers, reward_fn, prompt_len, mesh):
  """Returns `evaluate(params) -> (accuracy, correct_N bool array)`, decoding with `greedy`
  (rljax.train.programs' 'evaluate': compiled once)."""
  num = len(prompts)
  per_process, local_rows, first = eval_rows(num, mesh)
  rows = [min(first + i, num - 1) for i in range(local_rows)]    # pad by repeating the last prompt
  prompt_BxT, valid_BxT = data.encode_prompts([prompts[r] for r in rows], tokenizer, prompt_len)
  real = min(max(num - first, 0), per_process)
  records = [dict(prompt=prompts[r], answer=answers[r]) for r in rows]

  def evaluate(params):
    inputs = sharding.put_batch((prompt_BxT, valid_BxT), mesh)
    rollout = turns.draw(greedy, params, *inputs, jax.random.PRNGKey(0), records)
    tokens_BxL = to_host(rollout.tokens_BxL, mesh)[:real]
    env_rewards = rollout.reward_B[:real] if isinstance(rollout, turns.TurnRollout) else None
    scores, _ = reward_lib.score(reward_fn, decode_responses(tokenizer, tokens_BxL),
                                 [answers[r] for r in rows[:real]], env_rewards)
    correct_local = np.zeros(per_process, bool)
    correct_local[:real] = scores >= 1.0   # full marks: a partial score is not a right answer
    correct_N = correct_local
    if jax.process_count() > 1:
      correct_N = np.asarray(multihost_utils.process_allgather(correct_local)).reshape(-1)
    correct_N = correct_N[:num]
    return float(np.mean(correct_N)), correct_N

  return evaluate
