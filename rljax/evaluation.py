"""Held-out accuracy: greedy decoding of every eval prompt in one sampler call, scored by the verifier."""
import jax
import numpy as np

from rljax import data
from rljax import rewards
from rljax import sampler as sampler_lib


def decode_responses(tokenizer, tokens_BxL):
  """Response token rows -> text (stops at the end token)."""
  return [tokenizer.decode(row) for row in np.asarray(tokens_BxL)]


def make_evaluator(model, tokenizer, prompts, answers, reward_fn, prompt_len, max_new_tokens):
  """Returns `evaluate(params) -> (accuracy, correct_N bool array)`; compiled once."""
  prompt_BxT, valid_BxT = data.encode_prompts(prompts, tokenizer, prompt_len)
  greedy = sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
      max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id, greedy=True))

  def evaluate(params):
    rollout = greedy(params, prompt_BxT, valid_BxT, jax.random.PRNGKey(0))
    scores_N, _ = rewards.score_batch(reward_fn, decode_responses(tokenizer, rollout.tokens_BxL),
                                      answers)
    correct_N = scores_N > 0.5
    return float(np.mean(correct_N)), correct_N

  return evaluate
