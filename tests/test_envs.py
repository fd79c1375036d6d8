"""The environment contract (rljax.envs) holds for an environment nobody built in:

- `Guess` (tests/sample_envs.py, the guide's worked example) runs through the real turn loop
  on a random policy: each episode is reset from its prompt's record, every row is its sampled
  tokens with the observations the game's rules give (recomputed here in plain Python) right
  after each turn, the loss mask exactly the sampled tokens, and the episodes' rewards reach the
  step's batch (rljax.train.schedules.sample_rollout) and replace the verifier's where given;
- the calculator, now an environment (rljax.envs.tools.Tool), answers a sweep of calls as the
  integers computed in Python do, its refusals keeping their error kinds;
- an environment that breaks the contract costs one error of one kind per step (or one line of
  ValueError when it is built), never a traceback.
"""
import inspect
import math
import pathlib

import jax
import numpy as np
import pytest

from rljax.envs import calculator
from rljax.envs import reward as reward_lib
from rljax.envs import runner
from rljax.envs import tools
from rljax.rollout import sampler as sampler_lib
from rljax.rollout import turns
from rljax import sharding
from rljax.train import schedules

import random_params as random_params_lib
import sample_envs
from test_calculator import random_tree
from test_turns import L, MODEL, PROMPTS

GUESS = sample_envs.Guess()
TOKENIZER = GUESS.tokenizer
LIMITS = runner.Limits(timeout_s=5.0, workers=2)
ids = TOKENIZER.encode


def guess_reference(policy_ids, secret):
  """(row, observation mask, reward) that Guess makes of the sampled tokens `policy_ids`, by the
  game's rules: the number ending each turn against the secret, two turns at most."""
  row, observed, turn, steps, guesses = [], [], [], 0, 0
  for token in policy_ids:
    row.append(token)
    observed.append(False)
    turn.append(token)
    if token != GUESS.turn_end:
      continue
    if steps == GUESS.max_turns:   # one turn too many: the response ends here
      break
    steps += 1
    text = TOKENIZER.decode(turn)[:-1]
    turn = []
    number = text[len(text.rstrip('0123456789')):]
    guesses += bool(number)
    if number and (int(number) == secret or guesses == 2):
      return row, observed, float(int(number) == secret)
    observation = ids('{?}' if not number else '{+}' if int(number) < secret else '{-}')
    row += observation
    observed += [True] * len(observation)
  return row, observed, math.nan


def test_guess_runs_through_the_turn_loop_and_its_rewards_reach_the_batch():
  cfg = sampler_lib.SamplingConfig(L, TOKENIZER.eos_id, TOKENIZER.pad_id, slots=3, group=2)
  mesh = sharding.make_mesh(dict(fsdp=1), jax.devices()[:1])
  sampler = schedules.Sampler(turns.make_sampler(MODEL, cfg, GUESS, LIMITS), cfg, 2, TOKENIZER,
                              8, mesh)
  secrets = [3, 7, 0, 5, 9, 4, 12, 2]
  examples = dict(prompt=(PROMPTS * 2)[:8], answer=[str(s) for s in secrets], id=list(range(8)))
  params = random_params_lib.for_model(MODEL.cfg, 1)   # a policy that wins and loses games
  sampled = jax.device_get(schedules.sample_rollout(sampler, params, examples,
                                                    jax.random.PRNGKey(0)))
  rollout, rewards = sampled.rollout, []
  for b, (tokens_L, mask_L) in enumerate(zip(rollout.tokens_BxL, rollout.mask_BxL)):
    row, observed, reward = guess_reference(list(tokens_L[mask_L]), secrets[b // 2])
    end = mask_L.nonzero()[0].max() + 1
    row, observed = row[:end], observed[:end]   # a hint with no room left ends the response
    np.testing.assert_array_equal(tokens_L[:end], row)
    np.testing.assert_array_equal(mask_L[:end], ~np.array(observed))
    assert (tokens_L[end:] == TOKENIZER.pad_id).all()
    rewards.append(reward)
  np.testing.assert_array_equal(sampled.env_rewards, np.array(rewards, np.float32))
  given = ~np.isnan(rewards)
  assert 1.0 in rewards and 0.0 in rewards and (~given).any()   # not vacuous
  assert sampled.stats['tool_calls'] >= 8
  assert sampled.stats['tool_errors'] == sampled.stats['tool_malformed'] > 0
  scores, failures = reward_lib.score(lambda response, answer: 0.5, ['x'] * 16, sampled.answers,
                                      sampled.env_rewards)
  np.testing.assert_array_equal(scores, np.where(given, rewards, 0.5).astype(np.float32))
  assert failures == 0


def test_an_episode_reward_replaces_the_verifier_and_only_verified_rows_can_fail():
  def verifier(response, answer):
    return {'good': 1.0, 'bad': math.nan}.get(response, float(response == answer))
  responses, answers = ['good', 'bad', '7', 'bad', '3'], ['1', '2', '7', '4', '5']
  env_rewards = [math.nan, 0.25, math.nan, math.nan, -1.0]
  scores, failures = reward_lib.score(verifier, responses, answers, env_rewards)
  np.testing.assert_array_equal(scores, np.float32([1.0, 0.25, 1.0, 0.0, -1.0]))
  assert failures == 1   # the second 'bad' was the episode's reward's to give, not the verifier's
  assert reward_lib.score(verifier, responses, answers)[1] == 2
  with pytest.raises(ValueError, match='5 responses but 2 episode rewards'):
    reward_lib.score(verifier, responses, answers, [1.0, 2.0])


def run_steps(env, turns_of, records, limits=LIMITS):
  """The runner's Outcome of each first turn, one fresh episode each."""
  episodes = runner.Episodes(env, limits, records, budget=1000)
  return episodes, episodes.step(list(range(len(turns_of))), turns_of)


def test_the_calculator_environment_answers_as_python_integers_do():
  tool = tools.Tool(calculator.calculate, TOKENIZER, ('[', ']', '{', '}'), error='?',
                    max_chars=calculator.RESULT_CHARS)
  rng = np.random.default_rng(0)
  calls = [random_tree(rng, 2) for _ in range(40)]   # intermediate values below 10**12
  calls += [('999999999999*999999', 999999999999 * 999999), ('-(-(7))', 7),
            ('999999999999*999999999', None),   # past 18 digits: refused
            ('1+', None), ('(1', None), ('', None)]
  episodes, outcomes = run_steps(tool, [ids(f'5[{text}]') for text, _ in calls], [{}] * len(calls))
  for (text, value), outcome in zip(calls, outcomes):
    fits = (value is not None and abs(value) < 10**calculator.MAX_RESULT_DIGITS and
            len(text) <= calculator.MAX_CHARS)
    assert outcome.ids == ids('{%d}' % value if fits else '{?}'), text
    assert outcome.error == ('' if fits else 'raised') and outcome.resume
  refused = sum(o.error == 'raised' for o in outcomes)
  assert episodes.stats(0.0)['tool_raised'] == episodes.stats(0.0)['tool_errors'] == refused >= 4
  _, (outcome,) = run_steps(tool, [ids('12+3]')], [{}])   # no call-open marker: not run
  assert outcome.ids == ids('{?}') and outcome.error == 'malformed'
  assert np.isnan(episodes.reward_N).all()   # a tool gives no reward: the verifier scores


BAD = {'text observation': 'malformed', 'id past the vocabulary': 'bad_result',
       'end token': 'bad_result', 'empty observation': 'malformed', 'too long': 'oversize',
       'nan reward': 'malformed', 'done is 1': 'malformed', 'unknown error kind': 'malformed',
       'not a step': 'malformed', 'raises': 'raised', 'reset raises': 'raised',
       'state is a set': 'malformed'}


def test_an_answer_that_breaks_the_contract_is_one_error_of_its_kind():
  hows = list(BAD) + ['nothing wrong']
  records = [dict(answer='5', how=how) for how in hows]
  episodes, outcomes = run_steps(sample_envs.Misbehaving(), [ids('12]')] * len(hows), records)
  for how, outcome in zip(hows, outcomes):
    expected = (ids('{-}'), '') if how == 'nothing wrong' else (ids('{?}'), BAD[how])
    assert (outcome.ids, outcome.error) == expected, how
  stats = episodes.stats(0.0)
  assert stats['tool_errors'] == len(BAD) and stats['tool_calls'] == len(hows)
  assert {kind: stats[f'tool_{kind}'] for kind in set(BAD.values())} == {
      kind: list(BAD.values()).count(kind) for kind in set(BAD.values())}
  assert episodes.states[hows.index('raises')] is None   # a failed step leaves the state as it was
  assert episodes.states[-1] == dict(secret=5, guesses=1, how='nothing wrong')


@pytest.mark.parametrize('edit,message', [
    (dict(turn_end=1), 'turn_end must be a token id of its tokenizer other than the end'),
    (dict(turn_end=99), 'turn_end must be a token id'),
    (dict(turn_end=']'), 'turn_end must be a token id'),
    (dict(max_observation=0), 'max_observation must be an integer >= 1, got 0'),
    (dict(max_turns=-1), 'max_turns must be an integer >= 0, got -1'),
    (dict(error_observation=[1]), r'error_observation \[1\] is not a valid observation '
                                  r'\(bad_result\)'),
    (dict(error_observation='{?}'), r'is not a valid observation \(malformed\)'),
    (dict(step=None), r'environment Broken has no step\(\) method'),
])
def test_an_environment_that_breaks_the_contract_is_one_line_of_value_error(edit, message):
  runner.check(GUESS)
  broken = type('Broken', (sample_envs.Guess,), edit)()
  with pytest.raises(ValueError, match=message):
    runner.check(broken)


def test_the_guide_shows_the_tested_example():
  guide = (pathlib.Path(__file__).resolve().parent.parent / 'docs' / 'guide' /
           'environments.md').read_text()
  assert inspect.getsource(sample_envs.Guess) in guide
