"""Multi-turn rollouts (rljax.rollout.turns) on real rollouts of a random policy with real tools:

- token for token, every response is its sampled tokens with each call's result, recomputed here
  from the response's own text, inserted right after the call; `mask` marks exactly the sampled
  tokens and `tool` exactly the results;
- up to its first call a response equals the continuous sampler's with the same keys (tokens
  exactly), and after a result the sampler's log-probs are the trainer's full forward pass over
  prompt and response (tolerance.ACROSS_PROGRAMS: two programs): appending to the KV cache
  continues the conversation as re-reading all of it would;
- a MoE's rollout records the experts of every response token, the results' too (-1 after the
  end), and they are those the model routes each position to in one forward pass over prompt
  and response (router replay: rljax.model.router);
- bad tools and a hanging one end their calls with the error result, counted by kind, and the
  rollout finishes; the call and length limits end responses.
"""
import dataclasses
import functools
import time

import jax
import numpy as np
import pytest

from rljax.data import sources
from rljax.data import tokenizer as tokenizer_lib
from rljax.envs import runner
from rljax.envs import tools
from rljax.model import transformer as model_lib
from rljax.rollout import sampler as sampler_lib
from rljax.rollout import turns
from rljax import policy_loss

import random_params as random_params_lib
from sample_tools import checksum
import sample_tools
import tolerance

TOKENIZER = tokenizer_lib.ToolTokenizer()
EOS, PAD, L = TOKENIZER.eos_id, TOKENIZER.pad_id, 32
CALL_CLOSE = TOKENIZER.encode(']')[0]
CFG = model_lib.ModelConfig(vocab_size=TOKENIZER.vocab_size, d_model=32, num_layers=2, num_heads=4,
                            num_kv_heads=2, head_dim=8, num_experts=4, experts_per_token=2,
                            expert_hidden=24, moe_impl='dense')
MODEL = model_lib.Transformer(CFG)
PROMPTS = ['12+34=', '[5+6]', '(9*9)=', '7', '{1}[', '88-3=']


TOOL = tools.Tool(checksum, TOKENIZER, ('[', ']', '{', '}'), error='?', max_chars=6, max_calls=3)
LIMITS = runner.Limits(timeout_s=5.0)


@functools.lru_cache(maxsize=None)
def turn_sampler(slots, group, greedy=False):
  cfg = sampler_lib.SamplingConfig(L, EOS, PAD, slots=slots, group=group, greedy=greedy)
  return turns.make_sampler(MODEL, cfg, TOOL, LIMITS)


def prompts(rows):
  return sources.encode_prompts((PROMPTS * rows)[:rows], TOKENIZER, 8)


def expected_row(policy_ids, tool):
  """The response of `policy_ids` (its sampled tokens, in order) with tool results inserted after
  each call-close, recomputed from the text (the error result where the tool refuses the call or
  returns no text or too much): (ids, tool mask)."""
  ids, is_tool, calls = [], [], 0
  for token in policy_ids:
    ids.append(token)
    is_tool.append(False)
    if token == CALL_CLOSE and calls < tool.max_calls:
      text = TOKENIZER.decode(ids)
      call = text[text.rindex('[') + 1:-1] if '[' in text[:-1] else None
      result = tool.error
      if call is not None and tool.fn is not None:
        try:
          result = tool.fn(call)
        except ValueError:   # the calculator refuses the call
          pass
      result = result if isinstance(result, str) and len(result) <= tool.max_chars else tool.error
      result_ids = TOKENIZER.encode('{' + result + '}')
      ids += result_ids
      is_tool += [True] * len(result_ids)
      calls += 1
  return ids, is_tool


def check_structure(out, tool):
  """Every row: its sampled tokens (mask) with the recomputed results (tool) between, then PAD."""
  tokens_NxL, mask_NxL = np.asarray(out.rollout.tokens_BxL), np.asarray(out.rollout.mask_BxL)
  tool_NxL = np.asarray(out.tool_BxL)
  spans = 0
  for tokens_L, mask_L, tool_L in zip(tokens_NxL, mask_NxL, tool_NxL):
    ids, is_tool = expected_row(list(tokens_L[mask_L]), tool)
    end = mask_L.nonzero()[0].max() + 1
    assert not (mask_L & tool_L).any() and (mask_L | tool_L)[:end].all()
    if len(ids) > end:   # the last call ended the response (no room, or no calls left)
      assert tokens_L[end - 1] == CALL_CLOSE
      ids, is_tool = ids[:end], is_tool[:end]
    np.testing.assert_array_equal(tokens_L[:end], ids)
    np.testing.assert_array_equal(tool_L[:end], is_tool)
    assert (tokens_L[end:] == PAD).all() and not tool_L[end:].any()
    spans += int(np.sum(np.diff(np.concatenate([[0], tool_L.astype(int)])) == 1))
  return spans


@pytest.mark.parametrize('slots,group', [(0, 1), (3, 2)])
def test_responses_are_sampled_tokens_and_tool_results_token_for_token(slots, group):
  params = random_params_lib.for_model(CFG, 0)
  prompt_PxT, valid_PxT = prompts(12 // group)
  rng = jax.random.PRNGKey(1)
  out = jax.device_get(turn_sampler(slots, group)(params, prompt_PxT, valid_PxT, rng))
  spans = check_structure(out, TOOL)
  assert spans >= 6 and out.stats['turns_mean'] > 1.2   # the test exercises several turns
  assert out.stats['tool_calls'] >= spans
  rollout, tool_NxL = out.rollout, out.tool_BxL

  # Up to its first call a response is the continuous sampler's (same per-response keys).
  plain = sampler_lib.make_sampler(MODEL, dataclasses.replace(turn_sampler(slots, group).cfg,
                                                              slots=4))(
      params, prompt_PxT, valid_PxT, rng)
  first_N = [np.flatnonzero(np.append(row, True))[0] for row in tool_NxL]
  for n, first in enumerate(first_N):
    np.testing.assert_array_equal(rollout.tokens_BxL[n, :first], plain.tokens_BxL[n, :first])

  # After the results too: the sampler's log-probs are the trainer's over the whole sequence.
  prompt_NxT, valid_NxT = (np.repeat(x, group, 0) for x in (prompt_PxT, valid_PxT))
  logp_NxL, *_ = policy_loss.response_logprobs(MODEL, params, prompt_NxT, valid_NxT,
                                                 rollout.tokens_BxL, 1.0)
  mask_NxL = rollout.mask_BxL
  after_NxL = mask_NxL & (np.cumsum(tool_NxL, axis=1) > 0)
  assert after_NxL.sum() > 20
  np.testing.assert_allclose(np.where(mask_NxL, logp_NxL, 0), rollout.logp_BxL,
                             **tolerance.ACROSS_PROGRAMS)


@pytest.mark.parametrize('slots,group', [(0, 1), (3, 2)])
def test_every_token_of_a_turn_records_the_experts_the_whole_row_routes_it_to(slots, group):
  """Sampled tokens and tool results alike (PAD: -1) carry the experts of the pass that fed the
  token before them: those the unrolled model routes that position to in one teacher-forced
  forward pass over prompt and response (sets compared exactly, as tokens are: tolerance.py),
  and the trainer's forward finds no decision that differs."""
  params = random_params_lib.for_model(CFG, 0)
  prompt_PxT, valid_PxT = prompts(12 // group)
  out = jax.device_get(turn_sampler(slots, group)(params, prompt_PxT, valid_PxT,
                                                   jax.random.PRNGKey(1)))
  rollout, tool_NxL = out.rollout, out.tool_BxL
  experts_NxLxYxK = np.asarray(rollout.experts_BxLxYxK)
  filled_NxL = rollout.mask_BxL | tool_NxL
  assert tool_NxL.sum() > 20 and experts_NxLxYxK.shape[2:] == (CFG.num_layers, 2)
  np.testing.assert_array_equal(experts_NxLxYxK >= 0,
                                np.broadcast_to(filled_NxL[..., None, None], experts_NxLxYxK.shape))
  assert (experts_NxLxYxK[~filled_NxL] == -1).all()

  prompt_NxT, valid_NxT = (np.repeat(x, group, 0) for x in (prompt_PxT, valid_PxT))
  tokens_NxS, valid_NxS = policy_loss.prompt_and_response(prompt_NxT, valid_NxT,
                                                          rollout.tokens_BxL)
  decoder = model_lib.Transformer(CFG, unrolled=True)
  _, whole_NxSxYxK = model_lib.apply_recording(
      decoder, {'params': model_lib.decoding_params(params, CFG)}, tokens_NxS, valid_NxS)
  whole_NxLxYxK = policy_loss.at_response(np.asarray(whole_NxSxYxK), 8, L)
  np.testing.assert_array_equal(np.sort(experts_NxLxYxK, -1)[filled_NxL],
                                np.sort(whole_NxLxYxK, -1)[filled_NxL])
  *_, mismatch = policy_loss.response_logprobs(MODEL, params, prompt_NxT, valid_NxT,
                                               rollout.tokens_BxL, 1.0, 0, experts_NxLxYxK)
  assert int(mismatch) == 0


def test_greedy_turns_continue_as_the_full_forward_pass_chooses():
  """Greedy: every sampled token, those after a result included, is the argmax of the trainer's
  logits over the whole sequence so far."""
  params = random_params_lib.for_model(CFG, 1)   # a policy that calls greedily (not all do)
  prompt_PxT, valid_PxT = prompts(8)
  out = jax.device_get(turn_sampler(0, 1, greedy=True)(params, prompt_PxT, valid_PxT,
                                                        jax.random.PRNGKey(0)))
  check_structure(out, TOOL)
  tokens_NxS, valid_NxS = policy_loss.prompt_and_response(prompt_PxT, valid_PxT,
                                                          out.rollout.tokens_BxL)
  logits_NxSxV, _, _ = MODEL.apply({'params': params}, tokens_NxS, valid_NxS)
  choice_NxL = np.argmax(policy_loss.at_response(np.asarray(logits_NxSxV), 8, L), axis=-1)
  mask_NxL = out.rollout.mask_BxL
  assert (np.cumsum(out.tool_BxL, axis=1) > 0)[mask_NxL].sum() > 10   # tokens after results
  np.testing.assert_array_equal(out.rollout.tokens_BxL[mask_NxL], choice_NxL[mask_NxL])


@pytest.mark.parametrize('fn,kind', [
    (sample_tools.raise_error, 'raised'), (sample_tools.return_int, 'malformed'),
    (sample_tools.return_word, 'malformed'), (sample_tools.hang, 'timeout'),
    (sample_tools.return_markers, 'bad_result'), (sample_tools.exit_hard, 'crash'),
    (None, 'disabled')])
def test_bad_tools_and_a_hanging_one_get_the_error_result(fn, kind):
  tool = TOOL._replace(fn=fn)
  sampler = turn_sampler(3, 1)._replace(env=tool, limits=LIMITS._replace(timeout_s=0.2))
  params = random_params_lib.for_model(CFG, 0)
  start = time.perf_counter()
  out = jax.device_get(sampler(params, *prompts(12), jax.random.PRNGKey(1)))
  elapsed = time.perf_counter() - start
  spans = check_structure(out, tool._replace(fn=None))   # every result is '{?}'
  calls = out.stats['tool_calls']
  assert spans >= 6 and calls >= spans
  assert out.stats['tool_errors'] == out.stats[f'tool_{kind}'] + out.stats['tool_malformed'] * (
      kind != 'malformed')
  assert out.stats[f'tool_{kind}'] > 0
  if kind == 'timeout':   # every chunk's calls wait one timeout together, then the run goes on
    assert out.stats['tool_time_s'] < 0.2 * out.stats['turn_chunks'] + 1
    assert elapsed < 30


def test_call_and_length_limits_end_responses():
  tool = TOOL._replace(max_calls=1)
  sampler = turn_sampler(3, 1)._replace(env=tool)
  out = jax.device_get(sampler(random_params_lib.for_model(CFG, 0), *prompts(12),
                               jax.random.PRNGKey(1)))
  check_structure(out, tool)
  starts_N = np.sum(np.diff(out.tool_BxL.astype(int), axis=1) == 1, axis=1) + out.tool_BxL[:, 0]
  assert starts_N.max() == 1


def test_a_waiting_response_blocks_no_other():
  """After one chunk, the responses waiting on a call hold their slots, and every other response
  started has ended (end token or budget): the chunk ran on while they waited, and refilled the
  slots the others freed."""
  sampler = turn_sampler(6, 1)
  params = random_params_lib.for_model(CFG, 1)
  prompt_PxT, valid_PxT = prompts(12)
  state = sampler.empty(12, prompt_PxT.shape[1])
  served = turns.no_observations(6, TOOL.max_observation, 0)
  state = jax.device_get(sampler.chunk(params, state, *served, prompt_PxT, valid_PxT,
                                       jax.random.PRNGKey(1)))
  waiting_N = np.zeros(12, bool)
  waiting_N[state.slots.response_S[state.waiting_S]] = True
  assert not state.slots.active_S.any()
  ended = 0
  for n in range(int(state.pending)):
    row = state.tokens_NxL[n]
    if waiting_N[n]:
      assert row[state.mask_NxL[n]][-1] == CALL_CLOSE
    else:
      assert EOS in row or state.mask_NxL[n].all()
      ended += 1
  assert waiting_N.any() and ended and state.pending > 6   # refilled while others waited
