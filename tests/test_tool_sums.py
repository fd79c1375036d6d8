"""The tool task (rljax.tasks.tool_sums, rljax.data.builders.tool_sums) and training on it:

- the data: answers are numpy sums, demonstrations are the calculator's own results, splits are
  disjoint, the length bounds are those of the longest problem; the final_answer verifier;
- the warm start trains on a demonstration's sampled part, never on the tool's result;
- rl_step on real multi-turn rollouts of the calculator: the batch trained on is the sampled
  tokens plus the tools' results token for token, its loss mask exactly the sampled tokens; a
  hanging tool does not stop the step and the row counts its calls, errors and time; with router
  replay the update routes every token of the turns, results included, as the sampler did; a run
  resumed from its checkpoint logs and ends as the uninterrupted one.
"""

import jax
import numpy as np
import pytest

from configs import common
from configs import grpo as grpo_config
from configs import ppo as ppo_config
from configs import rloo as rloo_config
from rljax.data.builders import tool_sums
from rljax.data import rewards
from rljax.data import sources as data
from rljax.data import tokenizer as tokenizer_lib
from rljax.envs import calculator
from rljax import files
from rljax import tasks
from rljax.train import loop as train
from rljax.train import run as run_lib
from rljax.train import warmstart

import sample_tools
import test_train
from test_turns import expected_row

TOKENIZER = tokenizer_lib.ToolTokenizer()


@pytest.fixture(scope='module')
def splits(tmp_path_factory):
  config = tool_sums.make_config(max_operands=3, digits=3, demo_frac=0.5, num_train=400,
                                 num_test=40, seed=1)
  data_dir = str(tmp_path_factory.mktemp('tool_sums'))
  return [data.load_tfds_split(tool_sums.ToolSums, config, data_dir, split)
          for split in ('train', 'test')]


def records(source):
  return [(data.text(r['prompt']), data.text(r['answer']))
          for r in data.read_records(source, range(len(source)))]


def test_answers_are_sums_and_demonstrations_the_calculators(splits):
  train, test = map(records, splits)
  demos = 0
  for prompt, answer in train + test:
    operands = np.array(prompt[:-1].split('+'), np.int64)
    assert prompt.endswith('=') and 2 <= len(operands) <= 3 and (operands < 1000).all()
    total = str(np.sum(operands))
    if answer.startswith('['):   # '[call]{result}answer', the result the calculator's own
      call, result = answer[1:].split(']{')
      result, final = result.split('}')
      assert call == prompt[:-1] and result == calculator.calculate(call) == final == total
      demos += 1
    else:
      assert answer == total
    assert rewards.final_answer(total, answer) == 1.0
  assert 150 < demos < 250 and not any(a.startswith('[') for _, a in test)   # ~half of train
  assert not {p for p, _ in test} & {p for p, _ in train}


@pytest.mark.parametrize('max_operands,digits', [(2, 1), (3, 5), (8, 12)])
def test_length_bounds_are_those_of_the_longest_problem(max_operands, digits):
  largest = [10**digits - 1] * max_operands
  prompt_len, response_len = tool_sums.lengths(max_operands, digits)
  assert len(TOKENIZER.encode('+'.join(map(str, largest)) + '=')) == prompt_len
  assert len(TOKENIZER.encode(tool_sums.demonstration(largest))) == response_len
  assert tool_sums.MAX_DIGITS == calculator.MAX_DIGITS


@pytest.mark.parametrize('response,reward', [
    ('579', 1.0), ('[123+456]{579}579', 1.0), ('[123+456]{579}', 0.0), ('[1+2]{?}579', 1.0),
    ('[123+456]{579}578', 0.0), ('[123+456', 0.0), ('0579', 1.0), ('', 0.0)])
def test_final_answer_reads_what_follows_the_last_result(response, reward):
  assert rewards.final_answer(response, '[123+456]{579}579') == reward
  assert rewards.final_answer(response, '579') == reward


def test_the_warm_start_does_not_train_on_the_tools_result():
  tool = tasks.get('tool_sums').env(grpo_config.get_config('runlocal,task=tools'))
  batch = warmstart.supervised_batch(['12+30=', '5+6='], ['[12+30]{42}42', '11'], TOKENIZER, 6,
                                     20, tool)
  targets = [TOKENIZER.decode(row[1:][weights[:-1] > 0]) for row, weights in
             zip(batch.tokens_BxS, batch.weights_BxS)]   # the tokens each row's loss predicts
  assert targets == ['[12+30]42', '11']


def tiny(tmp_path, config_file=grpo_config, **train_overrides):
  """test_train's random tiny policy, P=4 x G=4, on 2-digit tool sums."""
  config = common.tool_task(test_train.tiny(config_file, tmp_path, **train_overrides), True)
  config.data.update(digits=2, demo_frac=0.5)
  return config


def test_trained_sequences_are_sampled_tokens_plus_tool_results(tmp_path):
  config = tiny(tmp_path)
  run, carry, _ = run_lib.setup(config, str(tmp_path / 'run'))
  examples = next(run.iterator)
  sampler = run.schedule.sampler
  prompt_PxT, valid_PxT = data.encode_prompts(examples['prompt'], run.task.tokenizer,
                                              sampler.prompt_len)
  rows = lambda x, n: np.repeat(x, n, 0)   # prompt rows, each sampled `group` times
  out = jax.device_get(sampler.sample(
      carry['algo']['params'], rows(prompt_PxT, sampler.G // sampler.sampling.group),
      rows(valid_PxT, sampler.G // sampler.sampling.group), jax.random.PRNGKey(5)))
  rollout, tool_BxL = out.rollout, out.tool_BxL
  for tokens_L, mask_L, is_tool_L in zip(rollout.tokens_BxL, rollout.mask_BxL, tool_BxL):
    ids, is_tool = expected_row(list(tokens_L[mask_L]), run.task.env)
    end = min(len(ids), mask_L.nonzero()[0].max() + 1)
    np.testing.assert_array_equal(tokens_L[:end], ids[:end])   # the calculator's results
    np.testing.assert_array_equal(is_tool_L[:end], is_tool[:end])
  assert tool_BxL.sum() > 0
  prompt_BxT, valid_BxT = rows(prompt_PxT, sampler.G), rows(valid_PxT, sampler.G)
  rewards_B = np.arange(16, dtype=np.float32) % 3
  batch, _ = run.algo.make_batch(carry['algo'], rollout, rewards_B, prompt_BxT, valid_BxT, None)
  np.testing.assert_array_equal(batch.response_BxL, rollout.tokens_BxL)   # trained as sampled
  np.testing.assert_array_equal(batch.mask_BxL, rollout.mask_BxL)         # not on the results
  assert not (np.asarray(batch.mask_BxL) * tool_BxL).any()
  run.ckpt.close()


def test_ppo_steps_over_the_results_to_the_next_turn(tmp_path):
  """PPO on episodes with turns: the reward sits on the last sampled token, and with gamma = lam
  = 1 every sampled token's return is the episode's reward, also the one before a result (a
  result is the environment's, not an end of the response); results get no advantage."""
  config = ppo_config.get_config('runlocal,B=32,task=tools')
  config.data.update(dir=str(tmp_path / 'data'), digits=2, demo_frac=0.5, num_train=200,
                     num_test=20)
  config.warmstart.enabled = False
  config.metrics.update(tensorboard=False, progress=False)
  config.ppo.update(lam=1.0, whiten_advantages=False)
  config.train.update(max_samples=0, max_steps=1, eval_every=1, eval_size=8, micro_batch=16)
  run, carry, _ = run_lib.setup(config, str(tmp_path / 'run'))
  examples = next(run.iterator)
  sampler = run.schedule.sampler
  prompt_BxT, valid_BxT = data.encode_prompts(examples['prompt'], run.task.tokenizer,
                                              sampler.prompt_len)
  out = jax.device_get(sampler.sample(carry['algo']['params'], prompt_BxT, valid_BxT,
                                      jax.random.PRNGKey(5)))
  rollout, tool_BxL = out.rollout, out.tool_BxL
  rewards_B = np.arange(32, dtype=np.float32) % 3
  batch, _ = run.algo.make_batch(carry['algo'], rollout, rewards_B, prompt_BxT, valid_BxT, None)
  mask_BxL = np.asarray(rollout.mask_BxL)
  returns_BxL = np.asarray(batch.critic.returns_BxL)
  before_a_result = mask_BxL[:, :-1] & tool_BxL[:, 1:]
  assert before_a_result.sum() > 0   # some responses called the tool and went on
  np.testing.assert_allclose(returns_BxL, np.where(mask_BxL, rewards_B[:, None], 0.0), atol=1e-5)
  assert not np.asarray(batch.policy.advantages_BxL)[tool_BxL].any()
  carry, row = train.rl_step(run, carry, [examples], 1)
  assert row['tool_calls'] > 0 and np.isfinite(row['grad_norm']) and np.isfinite(row['value_loss'])
  run.ckpt.close()


def test_a_hanging_tool_does_not_stop_the_step_and_the_row_counts_it(tmp_path):
  config = tiny(tmp_path)
  config.tools.timeout_s = 0.2
  run, carry, _ = run_lib.setup(config, str(tmp_path / 'run'))
  sample = run.schedule.sampler.sample
  hanging = sample._replace(env=sample.env._replace(fn=sample_tools.hang))
  run.schedule.sampler = run.schedule.sampler._replace(sample=hanging)
  carry, row = train.rl_step(run, carry, [next(run.iterator)], 1)
  assert row['tool_calls'] > 0 and row['tool_errors'] == row['tool_calls']
  assert row['tool_timeout'] + row['tool_malformed'] == row['tool_calls'] and row['tool_timeout']
  rounds = -(-16 // config.tools.workers)   # of each chunk's up to 16 calls on the workers
  assert row['tool_time_s'] < 0.2 * rounds * row['turn_chunks'] + 1 and row['turns_mean'] > 1
  assert row['logprob_mismatch'] < 1e-5   # over the sampled tokens only
  run.ckpt.close()


@pytest.mark.e2e
def test_router_replay_trains_on_the_turns_as_the_sampler_routed_them(tmp_path):
  """model.router_replay on the tiny MoE: two steps and an evaluation of the tool task run, the
  updates replaying the turns' recorded experts (test_turns: the results' too) and overriding
  none (float32: the trainer's top-k agrees with every one)."""
  config = tiny(tmp_path)
  config.model.router_replay = True
  workdir = str(tmp_path / 'run')
  train.train(config, workdir)
  rows = files.read_jsonl(f'{workdir}/metrics.jsonl')
  steps = [row for row in rows if not row.get('eval')]
  assert [row['step'] for row in steps] == [1, 2] and any(row.get('eval') for row in rows)
  assert all(row['router_mismatch'] == 0 and row['logprob_mismatch'] < 1e-5 for row in steps)
  assert sum(row['tool_calls'] for row in steps) > 0


@pytest.mark.e2e
def test_rloo_on_the_tool_task_resumes_as_if_never_stopped(tmp_path):
  """Three steps straight, and two then one more from the checkpoint: the same rows, the same
  final evaluation (the turn loop keeps nothing between steps)."""
  straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
  train.train(tiny(tmp_path, rloo_config, max_steps=3), straight)
  train.train(tiny(tmp_path, rloo_config), resumed)
  train.train(tiny(tmp_path, rloo_config, max_steps=3), resumed)
  keys = ('reward_mean', 'tool_calls', 'tool_errors', 'turns_mean', 'tokens', 'grad_norm')
  rows = [[{k: r[k] for k in keys} for r in files.read_jsonl(f'{w}/metrics.jsonl')
           if not r.get('eval')] for w in (straight, resumed)]
  assert rows[0] == rows[1] and len(rows[0]) == 3 and rows[0][-1]['tool_calls'] > 0
  evals = [[r['eval_accuracy'] for r in files.read_jsonl(f'{w}/metrics.jsonl') if r.get('eval')]
           for w in (straight, resumed)]
  assert evals[0][-1] == evals[1][-1]
