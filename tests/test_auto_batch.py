"""rljax.auto_batch: the rule (on synthetic noise scales and throughputs, against numpy), the run's
state and the loop's schedule, the config surface and its errors, and a short training that
switches its batch and resumes mid-schedule to the same rows and arrays."""
from concurrent import futures
import json
import logging
import shutil
import types

import jax
import numpy as np
import pytest
import rljax_cli

from configs import grpo as grpo_config
from rljax.auto_batch import rule
from rljax.auto_batch import hook as auto_hook
from rljax.auto_batch import state as auto_state
from rljax.data import sources
from rljax import files
from rljax.train import config_checks
from rljax.train import loop
from rljax.train import run as run_lib

Estimate = rule.Estimate
BATCHES = rule.allowed_batches(16, 512)


def table_of(samples_per_s, spread=0.02):
  return {b: Estimate(v, v * (1 - spread), v * (1 + spread)) for b, v in samples_per_s.items()}


def test_allowed_batches_are_the_powers_of_two_within_the_bounds():
  assert rule.allowed_batches(2, 32) == [2, 4, 8, 16, 32]
  assert rule.allowed_batches(3, 40) == [4, 8, 16, 32]
  assert rule.allowed_batches(1, 1) == [1]


def test_moves_as_far_towards_the_best_as_the_gain_s_lower_end_vouches_for():
  linear = table_of({b: 10.0 * b for b in BATCHES})   # throughput still linear in the batch
  decision = rule.decide(16, BATCHES, Estimate(5000, 3000, 9000), linear, margin=0.1)
  assert decision.best == 512 and decision.batch == 512
  assert decision.gain_lo > 1.1 and decision.gain > decision.gain_lo
  # Saturating throughput: 128 is the best at the point estimate, 64 the surer gain.
  saturating = table_of({16: 1000.0, 32: 2000.0, 64: 4000.0, 128: 4400.0, 256: 4600.0, 512: 4700.0})
  decision = rule.decide(16, BATCHES, Estimate(1000, 300, 3000), saturating, margin=0.1)
  assert decision.best == 128 and decision.batch == 64


def test_the_move_is_numpys_argmax_of_the_gain_s_lower_end_on_the_way_to_the_best():
  rng = np.random.default_rng(1)
  checked = 0
  for _ in range(300):
    samples_per_s = np.sort(rng.uniform(10, 1000, len(BATCHES))) * np.array(BATCHES) ** 0.5
    value = float(np.exp(rng.uniform(np.log(8), np.log(5000))))
    noise = Estimate(value, value * rng.uniform(0.2, 1), value * rng.uniform(1, 5))
    table = table_of(dict(zip(BATCHES, samples_per_s)), spread=0.05)
    current = int(rng.choice(BATCHES))
    best = rule.best_batch(BATCHES, noise, table)
    if best == current:
      continue
    way = np.array([b for b in BATCHES
                    if b != current and min(current, best) <= b <= max(current, best)])
    worst = noise.lo if best > current else noise.hi
    rate = dict(zip(BATCHES, samples_per_s))
    lower = (np.array([rate[b] for b in way]) * 0.95 / (rate[current] * 1.05)
             * (1 + current / worst) / (1 + way / worst))
    expected = way[np.lexsort((np.abs(np.log2(way / current)), -lower))[0]]
    assert rule.surest_step(current, best, BATCHES, noise, table) == expected
    checked += 1
  assert checked > 100


def test_holds_when_throughput_is_flat():
  table = table_of({b: 1000.0 for b in BATCHES})
  noise = Estimate(5000, 3000, 9000)
  assert rule.decide(16, BATCHES, noise, table, margin=0.1).batch == 16
  # Above the best, going back down gains only efficiency, too little to clear the margin.
  assert rule.decide(64, BATCHES, noise, table, margin=0.1).batch == 64


def test_tries_an_unmeasured_bigger_batch_then_its_measurement_decides():
  noise = Estimate(5000, 3000, 9000)
  # One batch measured: the others' samples/s could grow linearly, so the top is tried.
  assert rule.decide(16, BATCHES, noise, table_of({16: 1000.0}), 0.1).batch == 512
  flat = table_of({16: 1000.0, 512: 1000.0})
  assert rule.decide(512, BATCHES, noise, flat, 0.1, left=16).batch == 512   # no gain to go
  small = Estimate(300, 200, 450)   # a small noise scale: far above it, samples are wasted
  assert rule.decide(512, BATCHES, small, flat, 0.1, left=16).batch < 512


def test_after_a_jump_an_untried_batch_below_is_not_taken_on_the_most_it_could_make():
  # The deep preset's CPU numbers: 16 and 256 measured; 64 could make up to 256's samples/s, and
  # the line between the two step times says 1350 (measured there: 1357).
  table = table_of({16: 779.0, 256: 1651.0}, spread=0.03)
  decision = rule.decide(256, BATCHES[:5], Estimate(709, 565, 928), table, 0.1, left=16)
  assert decision.batch == 256 and decision.best == 64


def test_an_untried_batch_s_samples_per_s_is_bounded_by_a_convex_step_time():
  most = lambda batch, measured: rule.most_per_s(batch, {b: b / v for b, v in measured.items()})
  guess = lambda batch, measured: rule.throughput_guess(batch, table_of(measured)).value
  assert guess(64, {16: 1000.0}) == pytest.approx(4000.0)   # linear growth from one batch
  assert guess(8, {16: 1000.0}) == pytest.approx(1000.0)    # flat below it
  # Above two measured batches, step seconds grow at least along their line: flat stays flat,
  # and 16 -> 32 at 1.5x (steps of 16 and 21.3 ms) puts 64 at 64 / 32 ms = 2000.
  assert guess(64, {16: 1000.0, 32: 1000.0}) == pytest.approx(1000.0)
  assert guess(64, {16: 1000.0, 32: 1500.0}) == pytest.approx(2000.0)
  slope = (32 / 1500 - 16 / 1000) / 16   # seconds per sample along the line
  assert most(8, {16: 1000.0, 32: 1500.0}) == pytest.approx(8 / (0.016 - 8 * slope))
  # Bracketed: at most the bigger batch's samples/s and linear growth from the smaller; at least
  # the line between their step times; the guess is the geometric mean of the two.
  for measured, batch, most_expected in [({16: 1000.0, 256: 2000.0}, 64, 2000.0),
                                         ({16: 1000.0, 256: 8000.0}, 32, 2000.0)]:
    assert most(batch, measured) == pytest.approx(most_expected)
    step_s = np.interp(batch, [16, 256], [16 / measured[16], 256 / measured[256]])
    assert guess(batch, measured) == pytest.approx(np.sqrt(most_expected * batch / step_s))


def test_a_move_waits_until_the_rest_of_the_budget_or_without_one_the_time_lost_repays_its_compile():  # noqa: E501
  table = table_of({16: 1000.0, 32: 2000.0})   # gain lower end (1960 / 1020) x efficiency
  noise, batches = Estimate(5000, 5000, 5000), [16, 32]
  gain_lo = rule.step_gain(16, 32, noise, table)[1]
  needed_s = 10.0 / (1 - 1 / gain_lo)   # compile 10 s; each second at 16 loses 1 - 1/gain
  decide = lambda here, remaining: rule.decide(
      16, batches, noise, table, 0.1, costs=rule.Costs(here, remaining, 10.0))
  # With a budget, its rest decides, whatever the time spent so far.
  assert decide(0.0, 1.01 * needed_s).batch == 32
  short = decide(1e6, 0.99 * needed_s)
  assert short.batch == 16 and 'compile' in short.reason
  # Without one (ski rental), the time already lost by staying must reach the compile's.
  assert decide(0.99 * needed_s, np.inf).batch == 16
  assert decide(1.01 * needed_s, np.inf).batch == 32
  # A free compile (FREE, the default) leaves goodput alone to decide.
  assert rule.decide(16, batches, noise, table, 0.1).batch == 32
  # A batch compiled already (run before, or compiled ahead of the move) has nothing to repay.
  paid = rule.Costs(0.0, 0.99 * needed_s, 10.0, frozenset({32}))
  assert rule.decide(16, batches, noise, table, 0.1, costs=paid).batch == 32


def test_a_kept_move_s_measured_progress_judges_the_next_doubling_where_the_noise_scale_holds():
  table = table_of({16: 1000.0, 32: 1500.0})   # 64 untried: guessed at 2000
  noise = Estimate(60, 40, 90)   # small: the noise scale predicts a doubling loses
  assert rule.decide(32, BATCHES, noise, table, 0.1).batch == 32
  tried = rule.decide(32, BATCHES, noise, table, 0.1, measured=0.95)
  assert (tried.batch == 64 and tried.gain == pytest.approx(2000 / 1500 * 0.95)
          and 'measured' in tried.reason)
  # Progress that fell as much as the throughput rose is no reason; nor is a compile not repaid.
  assert rule.decide(32, BATCHES, noise, table, 0.1, measured=0.7).batch == 32
  costly = rule.Costs(0.0, 1.0, 10.0)
  assert rule.decide(32, BATCHES, noise, table, 0.1, costs=costly, measured=1.0).batch == 32


def test_costs_are_seconds_at_the_current_batch_and_the_budget_left():
  state = dict(auto_state.initial_state(grpo_config.get_config('runlocal,P=auto')), arrived=512,
               compile_s=7.5)
  train = grpo_config.get_config('runlocal').train
  train.update(max_samples=10_000, max_steps=0)
  remaining = auto_state.remaining_samples(train, samples=2048, step=100, batch=32)
  assert remaining == 10_000 - 2048
  train.max_steps = 110   # 10 more steps of 32 come first
  assert auto_state.remaining_samples(train, samples=2048, step=100, batch=32) == 320
  costs = auto_state.costs(state, 2048, remaining, 256.0, settings())
  assert costs == rule.Costs((2048 - 512) / 256.0, (10_000 - 2048) / 256.0, 7.5)
  assert auto_state.costs(state, 2048, remaining, 256.0, settings(compile_s=0.0)).compile_s == 0.0


@pytest.mark.parametrize('noise', [Estimate(np.nan, np.nan, np.nan), Estimate(500, np.nan, 900),
                                   Estimate(500, -10, 900), Estimate(np.inf, np.inf, np.inf),
                                   Estimate(-50, 10, 900)])
def test_a_noise_scale_that_is_not_finite_keeps_the_batch(noise):
  table = table_of({b: 10.0 * b for b in BATCHES})
  decision = rule.decide(64, BATCHES, noise, table, margin=0.1)
  assert decision.batch == 64 and 'not estimable' in decision.reason


def test_a_point_lost_in_the_noise_is_an_unbounded_noise_scale_with_its_lower_end():
  table = table_of({b: 10.0 * b for b in BATCHES})
  unbounded = rule.decide(64, BATCHES, Estimate(np.nan, 300, np.inf), table, margin=0.1)
  huge = rule.decide(64, BATCHES, Estimate(1e300, 300, np.inf), table, margin=0.1)
  assert unbounded.batch == huge.batch == 512 and unbounded.gain_lo == pytest.approx(huge.gain_lo)


def test_the_switch_line_names_an_unbounded_noise_scale_with_its_interval():
  row = dict(step=128, auto_from=2, auto_to=32, lr=1e-5, auto_lr=4e-5, auto_noise_scale=None,
             auto_noise_lo=422.4, auto_noise_hi=None, auto_gain=15.7, auto_reason='try')
  assert ('| B_noise unbounded [422, inf] | predicted gain 15.70 | try'
          in auto_hook._switch_line(row, 'P'))
  row.update(auto_noise_scale=709.2, auto_noise_hi=928.0)
  assert '| B_noise 709 [422, 928] |' in auto_hook._switch_line(row, 'P')
  row.update(auto_noise_scale=None, auto_noise_lo=None)   # not estimable: no move made on it
  assert 'B_noise' not in auto_hook._switch_line(row, 'P')


def test_best_batch_is_numpys_argmax_of_throughput_times_efficiency():
  rng = np.random.default_rng(0)
  for _ in range(200):
    samples_per_s = rng.uniform(10, 1000, len(BATCHES)) * np.array(BATCHES) ** rng.uniform(0, 1)
    b_noise = float(np.exp(rng.uniform(np.log(4), np.log(5000))))
    expected = BATCHES[int(np.argmax(samples_per_s / (1 + np.array(BATCHES) / b_noise)))]
    table = table_of(dict(zip(BATCHES, samples_per_s)))
    assert rule.best_batch(BATCHES, Estimate(b_noise, b_noise, b_noise), table) == expected


def simulate(decisions, seed):
  """The loop's use of the rule: a batch's samples/s measured on the first 3 steps it runs
  (5% noise around a throughput that saturates at 128), a fresh noisy B_noise each decision."""
  rng = np.random.default_rng(seed)
  true_throughput = lambda b: 20.0 * min(b, 128)
  batch, left, rounds, path = 16, None, {}, [16]
  for _ in range(decisions):
    rounds.setdefault(batch, true_throughput(batch) * rng.lognormal(0, 0.05, 3))
    table = {b: Estimate(float(np.exp(np.log(r).mean())), r.min(), r.max())
             for b, r in rounds.items()}
    value = 300 * rng.lognormal(0, 0.3)
    noise = Estimate(value, value * np.exp(-0.6), value * np.exp(0.6))
    decision = rule.decide(batch, BATCHES, noise, table, margin=0.1, left=left)
    if decision.batch != batch:
      left, batch = batch, decision.batch
      path.append(batch)
  return path


@pytest.mark.parametrize('seed', range(5))
def test_never_oscillates_over_a_long_noisy_sequence(seed):
  path = simulate(500, seed)
  steps = np.sign(np.diff(np.log2(path)))
  assert np.count_nonzero(np.diff(steps)) <= 1, path   # at most one turn: a tried batch left
  assert 32 <= path[-1] <= 256, path


# ------------------------------------------------------------------------------ the run's state


def settings(**overrides):
  config = grpo_config.get_config('runlocal,P=auto')
  config.auto_batch.update(overrides)
  return config.auto_batch


def test_record_skips_the_compiling_step_keeps_the_latest_steps_and_a_trail():
  state = auto_state.initial_state(grpo_config.get_config('runlocal,P=auto'))
  row = dict(samples_per_s=5.0, step_time_s=3.0, grad_sq_small=2.0, grad_sq_big=1.0, b_small=8.0,
             b_big=16.0, reward_mean=0.5, retained=16)
  few = settings(probe_steps=2, verify_samples=16)
  state = auto_state.record(state, row, 16, measurable=False, settings=few)
  assert state['throughput'] == {} and len(state['noise_terms']) == 1
  state = auto_state.record(state, dict(row, step_time_s=9.0), 32, False, few)
  assert state['compile_s'] == 9.0   # the longest compiling step
  for samples, value in ((48, 6.0), (64, 7.0), (80, 8.0)):
    state = auto_state.record(state, dict(row, samples_per_s=value), samples, True, few)
  assert state['throughput'] == {'2': [6.0, 7.0, 8.0]} and len(state['noise_terms']) == 5
  assert state['compile_s'] == 9.0
  assert auto_state.measured_rounds(state, few) == {2: [6.0, 7.0, 8.0]}
  for samples in range(96, 96 + 16 * 60, 16):   # the latest `window` steps only
    state = auto_state.record(state, dict(row, samples_per_s=float(samples)), samples, True, few)
  assert state['throughput']['2'] == [float(s) for s in range(96 + 16 * 10, 96 + 16 * 60, 16)]
  assert [t[0] for t in state['trail']] == [992, 1008, 1024, 1040]   # the last 4 x verify_samples
  assert json.loads(json.dumps(state)) == state   # rides in the checkpoint's JSON meta


def test_evaluations_come_after_every_step_from_eval_from_samples_on():
  """MLPerf's validation boundaries: B x ceil(2.5 + 3840 / B) samples, then after every step."""
  config = grpo_config.get_config('P=16,G=16')   # B = 256: boundaries 4608, 4864, ...
  config.train.eval_every, config.train.eval_from_samples = 4, 4608
  due = [step for step in range(1, 25)
         if loop.eval_due(config.train, 256, False, {'step': step}, 256 * (step - 1), 256 * step)]
  assert due == [4, 8, 12, 16] + list(range(18, 25))
  config.train.eval_from_samples = 0
  assert [s for s in range(1, 25)
          if loop.eval_due(config.train, 256, False, {'step': s}, 0, 256 * s)] == [
      4, 8, 12, 16, 20, 24]


def test_the_iterator_reads_on_across_a_batch_change_without_repeats():
  source = [dict(prompt=f'{i}+0=', answer=str(i)) for i in range(50)]
  one = sources.PromptIterator(source, 4, seed=1)
  straight = [p for _ in range(10) for p in next(one)['prompt']]   # 40 records of epoch 0
  small = sources.PromptIterator(source, 4, seed=1)
  first = [p for _ in range(3) for p in next(small)['prompt']]
  big = small.with_batch(8)
  assert big.batch_size == 8
  after = [p for _ in range(3) for p in next(big)['prompt']]
  assert first + after == straight[:36]
  resumed = sources.PromptIterator(source, 8, seed=1, state=big.state())
  assert next(resumed) == next(big)   # the new layout's state resumes exactly
  # Two processes at the new batch read the single process's records between them.
  halves = []
  for p in range(2):
    process = sources.PromptIterator(source, 4, seed=1, process_index=p, process_count=2)
    for _ in range(3):
      next(process)
    halves.append(process.with_batch(8))
  assert sorted(halves[0].__next__()['prompt'] + halves[1].__next__()['prompt']) == sorted(
      straight[12:20])


# ------------------------------------------------------------------------------ config surface


def auto_config(**bounds):
  config = grpo_config.get_config('runlocal,P=auto')
  config.auto_batch.update(bounds)
  config.rollout.P = config.auto_batch.min
  return config


def test_p_auto_turns_it_on_at_the_lower_bound_with_a_constant_lr():
  config = grpo_config.get_config('runlocal,P=auto')
  assert config.auto_batch.enabled and config.rollout.P == config.auto_batch.min == 2
  assert config.optimizer.decay == 'constant' and config.train.micro_batch == 8
  config_checks.check(config, device_count=1, process_count=1)
  assert not grpo_config.get_config('runlocal').auto_batch.enabled
  with pytest.raises(ValueError, match="config arg G='auto': expected an integer"):
    grpo_config.get_config('G=auto')


@pytest.mark.parametrize('bounds, message', [
    (dict(min=8, max=4), r'auto_batch.min \(8\) is larger than auto_batch.max \(4\)'),
    (dict(min=3, max=32), 'must be powers of two'),
    (dict(min=2, max=48), 'must be powers of two'),
    (dict(min=1, max=32), 'auto_batch at rollout.P=1: the noise scale needs 2 micro-batches'),
    (dict(verify_samples=0), r'verify_samples >= 1; got .*, 0$'),
    (dict(window=4, probe_steps=8), 'window >= probe_steps'),
    (dict(compile_s=float('nan')), r"auto_batch.compile_s must be a number .*, got nan"),
])
def test_bad_bounds_are_one_clear_error(bounds, message):
  with pytest.raises(ValueError, match=message):
    config_checks.check(auto_config(**bounds), device_count=1, process_count=1)


def test_a_batch_the_mesh_cannot_split_is_named():
  config = auto_config(min=2, max=32)   # P=2 x G=8 = 16 responses: not over 32 devices
  with pytest.raises(ValueError, match=r'the batch P\*G \(16\) is not divisible by the '
                                       'data-parallel size'):   # the batch it starts at
    config_checks.check(config, device_count=32, process_count=1)


def test_a_bigger_batch_that_does_not_fit_is_named():
  config = auto_config(min=2, max=32)
  config.data.num_train = 20
  with pytest.raises(ValueError, match=r'auto_batch at rollout.P=32: data.num_train \(20\) is '
                                       'smaller than one batch'):
    config_checks.check(config, device_count=1, process_count=1)


def test_a_decaying_lr_is_refused():
  config = auto_config(min=2, max=32)
  config.optimizer.decay = 'linear'
  with pytest.raises(ValueError, match="auto_batch needs optimizer.decay='constant'"):
    config_checks.check(config, device_count=1, process_count=1)


def test_a_checkpoint_state_without_the_compile_fields_resumes_with_them_afresh():
  config = grpo_config.get_config('runlocal,P=auto')
  saved = {k: v for k, v in auto_state.initial_state(config).items()
           if k not in ('arrived', 'compile_s')}
  meta = dict(auto_batch=dict(saved, P=4, next_decision=4096))
  auto_hook.Hook(config, types.SimpleNamespace(config=config, algo=None, batch=None), meta)
  assert meta['auto_batch'] == dict(auto_state.initial_state(config), P=4, next_decision=4096)


def drive(rewards_after, tmp_path, steps=400, seed=0, ready=()):
  """auto_state.advance over synthetic rows: P=2 (16 responses) moves to P=4 at the first decision
  (a large noise scale, samples/s 1.6x from a file, free compile), or at a look when 4 is `ready`;
  after the move the training reward follows `rewards_after(samples)`. Returns the rows' added
  fields (with `wanted`, the batch a look would compile ahead) and the states."""
  config = grpo_config.get_config('runlocal,P=auto')
  throughput = tmp_path / 'throughput.json'
  throughput.write_text(json.dumps({'2': [500, 505, 495], '4': [800, 810, 790]}))
  config.auto_batch.update(min=2, max=4, every_samples=1024, verify_samples=2048, compile_s=0.0,
                           throughput_file=str(throughput))
  rng = np.random.default_rng(seed)
  state, samples, log = auto_state.initial_state(config), 0, []
  for step in range(1, steps + 1):
    batch = state['P'] * 8
    samples += batch
    moved_at = state['check']['at'] if state['check'] else None
    reward = (0.2 + 0.003 * np.sqrt(samples) if moved_at is None else rewards_after(samples))
    row = dict(samples_per_s=500.0, step_time_s=0.1, grad_sq_small=626 * rng.uniform(0.9, 1.1),
               grad_sq_big=313.5 * rng.uniform(0.9, 1.1), b_small=8.0, b_big=16.0,
               reward_mean=reward + rng.normal(0, 0.02 * np.sqrt(16 / batch)), retained=batch)
    state, fields, wanted = auto_state.advance(state, row, samples, step, batch, True, config,
                                            ready=ready)
    log.append((samples, dict(fields, **{'wanted': wanted} if wanted else {}), state))
  return log


def first(log, key):
  return next((samples, fields, state) for samples, fields, state in log if key in fields)


def test_a_move_that_stopped_progress_is_undone_and_its_batch_needs_the_return_bar(tmp_path):
  log = drive(lambda samples: 0.2 + 0.003 * np.sqrt(1024), tmp_path)   # flat after the move
  moved_at, move, _ = first(log, 'auto_from')
  assert (moved_at, move['auto_from'], move['auto_to']) == (1024, 2, 4)
  checked_at, check, state = first(log, 'auto_check_verdict')
  assert checked_at == 1024 + 2048 and check['auto_check_verdict'] == 'undo'
  assert (check['auto_from'], check['auto_to'], state['P'], state['left']) == (4, 2, 2, 4)
  assert check['auto_check_hi'] * 1.6 < 1 and state['measured'] is None


def test_a_look_moves_to_a_ready_batch_and_names_one_to_compile_ahead_otherwise(tmp_path):
  same_curve = lambda samples: 0.2 + 0.003 * np.sqrt(samples)
  # 4 not ready: the looks (every 128 samples) from the first noise-scale interval name it to
  # compile ahead; the decision point (1024) moves.
  log = drive(same_curve, tmp_path)
  wanted = [samples for samples, fields, _ in log if 'wanted' in fields]
  assert wanted and wanted[0] < 1024 and all(s % 128 == 0 for s in wanted)
  assert {fields['wanted'] for _, fields, _ in log if 'wanted' in fields} == {4}
  assert first(log, 'auto_from')[0] == 1024
  # 4 ready (its programs at hand): the first look that would move to it moves.
  moved_at, move, state = first(drive(same_curve, tmp_path, ready={2, 4}), 'auto_from')
  assert moved_at == wanted[0] and (move['auto_from'], move['auto_to'], state['P']) == (2, 4, 4)
  assert state['next_decision'] == moved_at + 1024 and state['check']['at'] == moved_at


def test_a_look_falls_on_the_step_that_crosses_an_eighth_of_every_samples():
  config = grpo_config.get_config('runlocal,P=auto')   # every_samples 2048: a look every 256
  state = dict(auto_state.initial_state(config), throughput={'2': [500.0] * 8})
  looks = lambda samples, retained: auto_state.look_due(state, samples, retained, config.auto_batch)
  assert looks(256, 16) and looks(260, 16) and not looks(272, 16)
  # Fewer responses retained than the batch (GRPO's filter_zero_variance): the step's own count.
  assert looks(257, 4) and not looks(264, 4)
  assert not auto_state.look_due(dict(state, check={'at': 0}), 256, 16, config.auto_batch)


def test_a_move_that_kept_its_progress_is_kept_and_measured(tmp_path):
  log = drive(lambda samples: 0.2 + 0.003 * np.sqrt(samples), tmp_path)   # the same curve
  checked_at, check, state = first(log, 'auto_check_verdict')
  assert check['auto_check_verdict'] == 'keep, measured' and state['P'] == 4
  assert check['auto_check_lo'] <= 1 <= check['auto_check_hi']
  assert state['measured'] == check['auto_check_progress']
  assert check['auto_check_predicted'] == pytest.approx(
      rule.efficiency(32, 5000) / rule.efficiency(16, 5000), rel=0.05)
  # No decision while a move waits for its check; the next one comes right after it.
  decisions = [samples for samples, fields, _ in log if 'auto_reason' in fields]
  assert decisions[0] == 1024 and decisions[1] > checked_at
  assert json.loads(json.dumps(state)) == state


# ------------------------------------------------------------------------------ one short run


def tiny_auto(tmp_path):
  """A random tiny policy on 1-digit addition, P=4 then 8 (x G=4), samples/s from a file so the
  schedule is the same on every run: the top of the range (16, no faster than 8) compiles beside
  step 1; from step 6 (the first noise-scale interval) P=8 compiles ahead, the first decision
  (step 7) doubles P, step 9 checks it."""
  config = grpo_config.get_config('runlocal,P=auto,G=4')
  config.data.update(dir=str(tmp_path / 'data'), digits=1, num_train=200, num_test=20)
  config.warmstart.enabled = False
  config.metrics.update(tensorboard=False, progress=False)
  throughput = tmp_path / 'throughput.json'
  throughput.write_text(json.dumps({'4': [100, 101, 99], '8': [200, 202, 198],
                                    '16': [200, 202, 198]}))
  config.auto_batch.update(min=4, max=16, every_samples=112, throughput_file=str(throughput),
                           compile_s=0.0, verify_samples=64)
  config.rollout.P = 4
  config.train.update(max_samples=0, max_steps=9, eval_every=4, eval_size=8, micro_batch=8,
                      checkpoint_every=1, keep_checkpoints=10)
  return config


def without_timing(rows):
  return [{k: v for k, v in row.items() if k not in rljax_cli.TIMING} for row in rows]


def test_a_run_switches_its_batch_rescales_lr_and_resumes_mid_schedule_identically(tmp_path):
  reference, killed = tmp_path / 'reference', tmp_path / 'killed'
  loop.train(tiny_auto(tmp_path), str(reference))
  rows = files.read_jsonl(reference / 'metrics.jsonl')
  steps = [row for row in rows if not row.get('eval')]
  switch = steps[6]
  assert (switch['step'], switch['auto_from'], switch['auto_to']) == (7, 4, 8)
  assert switch['auto_noise_lo'] > 0 and switch['auto_gain_lo'] > 1.1
  assert [row['batch'] for row in steps] == [16] * 7 + [32] * 2
  # The top (16) compiled beside step 1, which waited for it; P=8 was compiled ahead, beside the
  # step at 4 before the switch; the switch waited for the rest.
  assert [(row['step'], row['auto_ahead']) for row in steps if 'auto_ahead' in row] == [(6, 8)]
  assert steps[0]['auto_wait_s'] >= 0 and switch['auto_wait_s'] >= 0
  assert steps[-1]['lr'] == pytest.approx(steps[0]['lr'] * 2 ** 0.5, rel=1e-6)   # sqrt rule
  assert switch['auto_lr'] == pytest.approx(steps[-1]['lr'], rel=1e-6)
  assert [row['samples'] for row in rows if row.get('eval')] == [0, 64, 144, 176]   # in samples
  assert 'auto_check_verdict' in steps[8] and steps[8]['auto_check_to'] == 8
  # Killed after step 8, at P=8 mid-schedule and mid-check (its later checkpoint never written):
  # the resumed run logs the same rows, its check included, and ends with the same arrays and
  # schedule.
  shutil.copytree(reference, killed)
  shutil.rmtree(killed / 'checkpoints' / '9')
  loop.train(tiny_auto(tmp_path), str(killed))
  assert without_timing(files.read_jsonl(killed / 'metrics.jsonl')) == without_timing(rows)
  (state, meta), (ref_state, ref_meta) = (rljax_cli.checkpoints(w)[0][9]
                                          for w in (killed, reference))
  assert rljax_cli.same_arrays(state, ref_state)
  schedule = lambda m: {k: v for k, v in m['auto_batch'].items()
                        if k not in ('throughput', 'compile_s')}   # timing
  assert schedule(meta) == schedule(ref_meta) and meta['auto_batch']['P'] == 8
  # Samples/s measured at 4 on steps 2-6: not step 1 (it compiled), nor 7 (beside the compile
  # ahead); at 8 on step 9 (8's first step is taken as compiling, as every batch's is).
  assert {P: len(r) for P, r in ref_meta['auto_batch']['throughput'].items()} == {'4': 5, '8': 1}


def test_the_top_of_the_range_compiles_beside_the_first_step_and_a_look_moves_there(tmp_path):
  """16 makes the most progress per second: the first look with a noise-scale interval (step 6)
  moves there, ahead of the first decision point (step 7), since its programs are at hand."""
  config = tiny_auto(tmp_path)
  config.train.max_steps = 7
  throughput = tmp_path / 'throughput.json'
  throughput.write_text(json.dumps({'4': [100, 101, 99], '8': [200, 202, 198],
                                    '16': [800, 808, 792]}))
  loop.train(config, str(tmp_path / 'run'))
  steps = [row for row in files.read_jsonl(tmp_path / 'run' / 'metrics.jsonl')
           if not row.get('eval')]
  assert [(row['step'], row['auto_to']) for row in steps if 'auto_to' in row] == [(6, 16)]
  assert [row['batch'] for row in steps] == [16] * 6 + [64]
  assert not any('auto_ahead' in row for row in steps)


class CompileLog(logging.Handler):
  """The programs XLA compiles under jax.log_compiles (cache hits are not compiled)."""

  def __init__(self):
    super().__init__()
    self.names = set()

  def emit(self, record):
    message = record.getMessage()
    if message.startswith('Finished XLA compilation of jit('):
      self.names.add(message.split('jit(', 1)[1].split(')', 1)[0])


def compiled_in_step(run, carry, step):
  """(names of the programs the step compiled, the carry after it)."""
  log, logger = CompileLog(), logging.getLogger('jax')
  logger.addHandler(log)
  try:
    with jax.log_compiles():
      carry, _ = loop.rl_step(run, carry, [next(run.iterator)], step)
  finally:
    logger.removeHandler(log)
  return log.names, carry


def test_a_batch_compiled_ahead_on_a_thread_takes_its_first_step_without_compiling(tmp_path):
  """auto_hook.compiled_programs, run on a thread as a look ahead runs it: the first step at its
  batch finds the sampler ('<lambda>'), make_batch and update compiled, as the first step at the
  starting batch does not (the control)."""
  config = tiny_auto(tmp_path)
  run, carry, _ = run_lib.setup(config, str(tmp_path / 'run'))
  compiled, carry = compiled_in_step(run, carry, 1)
  assert {'<lambda>', 'make_batch', 'update'} <= compiled
  with futures.ThreadPoolExecutor(1) as pool:
    programs = {8: pool.submit(auto_hook.compiled_programs, run, config, 8)}
    at_8 = auto_hook.at_batch(run, config, 8, programs)
  compiled, _ = compiled_in_step(at_8, carry, 2)
  assert compiled <= {'rollout_stats'}   # the step's own statistics, milliseconds to compile
