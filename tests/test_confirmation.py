"""The confirmation's seeds sized for power (rljax.protocol.confirmation), against scipy's t and a
Monte Carlo of the confirmation's own interval drawn in numpy."""
import json
import math
import os
import tarfile

import numpy as np
import pytest
from scipy import stats as scipy_stats

from rljax.protocol import confirmation
from rljax.protocol import report as report_lib


def _simulated_power(log_ratio, log_sds, seeds, level, draws=20_000, seed=0):
  """Share of simulated confirmations (seeds normal log-seconds a side) whose Welch interval on the
  log ratio, at Welch's floored df as the report computes it, lies below 1."""
  rng = np.random.default_rng(seed)
  pick = rng.normal(log_ratio, log_sds[0], (draws, seeds))
  base = rng.normal(0.0, log_sds[1], (draws, seeds))
  var_a, var_b = pick.var(axis=1, ddof=1) / seeds, base.var(axis=1, ddof=1) / seeds
  df = np.floor((var_a + var_b)**2 / ((var_a**2 + var_b**2) / (seeds - 1)))
  upper = pick.mean(1) - base.mean(1) + scipy_stats.t.ppf(0.5 + level / 2, df) * np.sqrt(
      var_a + var_b)
  return float(np.mean(upper < 0))


@pytest.mark.parametrize('ratio, sds, seeds', [
    (0.71, (0.2, 0.27), 4), (0.71, (0.2, 0.27), 9), (0.71, (0.15, 0.12), 3),
    (0.45, (0.09, 0.15), 3), (0.9, (0.1, 0.1), 12)])
def test_power_matches_a_monte_carlo_of_the_confirmation_interval(ratio, sds, seeds):
  """Against 20,000 other simulated confirmations, with scipy's t: within 0.02 (each side's Monte
  Carlo error is below 0.004; t quantiles are the library's own bisection against scipy's)."""
  got = confirmation.power(math.log(ratio), sds, seeds, 0.95)
  assert got == pytest.approx(_simulated_power(math.log(ratio), sds, seeds, 0.95, seed=1), abs=0.02)


def test_power_is_nothing_for_a_ratio_at_or_above_1_and_certain_without_spread():
  """(and the same on every call: a rebuilt report sizes the confirmation as the run did)"""
  assert confirmation.power(-0.3, (0.2, 0.2), 5, 0.95) == confirmation.power(-0.3, (0.2, 0.2), 5,
                                                                             0.95)
  assert confirmation.power(0.0, (0.1, 0.1), 8, 0.95) == 0.0
  assert confirmation.power(math.log(1.2), (0.1, 0.1), 8, 0.95) == 0.0
  assert confirmation.power(math.log(0.9), (0.0, 0.0), 2, 0.95) == 1.0
  assert confirmation.power(math.log(0.5), (0.1, 0.1), 1, 0.95) == 0.0   # no interval from 1


def test_seeds_for_power_are_the_fewest_that_reach_it_within_the_bounds():
  log_ratio, sds = math.log(0.71), (0.2, 0.27)
  seeds, reached = confirmation.seeds_for_power(log_ratio, sds, 0.95, 0.8, 4, 12)
  assert reached >= 0.8 > confirmation.power(log_ratio, sds, seeds - 1, 0.95)
  assert seeds == 9   # the PPO quick archive's spreads: 4 + 4 seeds see it only 0.3 of the time
  assert confirmation.seeds_for_power(math.log(0.45), (0.09, 0.15), 0.95, 0.8, 4, 12)[0] == 4
  capped = confirmation.seeds_for_power(math.log(0.95), sds, 0.95, 0.8, 4, 12)
  assert capped[0] == 12 and capped[1] < 0.8


def test_run_log_sd_adds_the_samples_and_the_throughput_spreads_in_quadrature():
  samples, rounds = [900, 1100, np.nan, 1000], [200, 180, 220, 210]
  want = math.sqrt(np.var(np.log([900, 1100, 1000]), ddof=1) + np.var(np.log(rounds), ddof=1))
  assert confirmation.run_log_sd(samples, rounds) == pytest.approx(want, rel=1e-12)
  assert np.isnan(confirmation.run_log_sd([1000.0], rounds))


def _report(fastest, pick_arm=True):
  rng = np.random.default_rng(1)
  arms = [dict(batch=16, control=False, samples_to_target_per_seed=list(1000 * np.exp(
      rng.normal(0, 0.2, 8))))]
  if pick_arm:
    arms.append(dict(batch=64, control=False, samples_to_target_per_seed=[1000.0, 1010.0]))
  throughput = [dict(batch=b, per_round=list(r * np.exp(rng.normal(0, 0.1, 16))))
                for b, r in ((16, 200.0), (64, 290.0))]
  candidates = [dict(batch=16, relative_wallclock=1.0), dict(batch=64, relative_wallclock=0.71)]
  return dict(base_batch=16, level=0.95, arms=arms, throughput=throughput,
              decision=dict(fastest=fastest, recommended=fastest, candidates=candidates,
                            verdict='faster' if fastest not in (None, 16) else 'base fastest'))


def test_expected_range_against_scipy():
  """The prediction's interval read as a normal sd on logs, the runs' Welch variance added, the df
  Welch-Satterthwaite's with the prediction's infinite: by hand with scipy's quantiles."""
  base, pick = np.log([4.9, 3.5, 4.0, 4.0]), np.log([4.3, 3.8, 3.5, 3.3])
  lo, hi, df = confirmation.expected(0.71, [0.57, 0.89], base, pick, 0.95)
  var_p = (np.log(0.89 / 0.57) / (2 * scipy_stats.norm.ppf(0.975)))**2
  var_b, var_a = base.var(ddof=1) / 4, pick.var(ddof=1) / 4
  want_df = np.floor((var_p + var_a + var_b)**2 / ((var_a**2 + var_b**2) / 3))
  half = scipy_stats.t.ppf(0.975, want_df) * np.sqrt(var_p + var_a + var_b)
  assert df == want_df
  assert [lo, hi] == pytest.approx([0.71 * np.exp(-half), 0.71 * np.exp(half)], rel=1e-6)
  assert np.isnan(confirmation.expected(0.71, [0.57, 0.89], base[:1], pick, 0.95)[0])


def test_expected_range_covers_simulated_confirmations_at_its_level():
  """Truths drawn from the prediction's interval, 4 seeds a side drawn around each: the range
  holds the measured ratio in 0.95 of 4,000 (Monte Carlo sd 0.004; floored df widen it a little)."""
  rng, level, sds, seeds = np.random.default_rng(3), 0.95, (0.13, 0.11), 4
  predicted, ci = 0.71, [0.57, 0.89]
  sd_p = np.log(ci[1] / ci[0]) / (2 * scipy_stats.norm.ppf(0.975))
  inside = []
  for _ in range(4000):
    truth = np.log(predicted) + rng.normal(0, sd_p)
    pick, base = rng.normal(truth, sds[0], seeds), rng.normal(0.0, sds[1], seeds)
    lo, hi, _ = confirmation.expected(predicted, ci, base, pick, level)
    inside.append(lo <= np.exp(pick.mean() - base.mean()) <= hi)
  assert 0.94 <= np.mean(inside) <= 0.975


def test_the_plan_sizes_from_the_pick_arm_or_the_base_arm_and_only_when_asked():
  protocol = dict(confirm_power=0.8, confirm_seeds=4, max_seeds=12)
  report = _report(64)
  plan = confirmation.plan(report, protocol)
  arms = {a['batch']: a for a in report['arms']}
  rounds = {t['batch']: t['per_round'] for t in report['throughput']}
  assert plan['run_log_sd'] == [confirmation.run_log_sd(arms[b]['samples_to_target_per_seed'],
                                                        rounds[b]) for b in (64, 16)]
  assert plan['seeds'] == confirmation.seeds_for_power(
      math.log(0.71), plan['run_log_sd'], 0.95, 0.8, 4, 12)[0]
  quick = confirmation.plan(_report(64, pick_arm=False), protocol)   # the base arm's samples
  assert quick['run_log_sd'][0] == pytest.approx(confirmation.run_log_sd(
      arms[16]['samples_to_target_per_seed'], rounds[64]))
  assert confirmation.plan(report, dict(protocol, confirm_power=0.0)) is None
  assert confirmation.plan(report, dict(protocol, confirm=False)) is None   # nothing to size
  assert confirmation.plan(report, {k: v for k, v in protocol.items() if k != 'confirm_power'}) \
      is None
  assert confirmation.plan(_report(16), protocol) is None
  assert confirmation.plan(_report(None), protocol) is None


def test_a_report_with_confirm_power_states_its_plan(tmp_path):
  """The tool task's archive rebuilt with the deep preset's confirm_power: the plan from its base
  arm (2 seeds, the quick answer) and throughput rounds, and its sentence in the summary."""
  archive = os.path.join(os.path.dirname(__file__), '..', 'docs', 'guide', 'protocol',
                         'grpo-tools-deep-quick-epyc-avx2.tar.xz')
  with tarfile.open(archive) as tar:
    tar.extractall(tmp_path, filter='data')
  as_run = report_lib.build_report(str(tmp_path))
  assert 'confirm_plan' not in as_run   # protocol.json without confirm_power: as it was run
  path = tmp_path / 'protocol.json'
  protocol = json.loads(path.read_text())
  protocol['protocol']['confirm_power'] = 0.8
  path.write_text(json.dumps(protocol))
  report = report_lib.build_report(str(tmp_path))
  plan = report['confirm_plan']
  assert plan['seeds'] == confirmation.seeds_for_power(
      math.log(plan['predicted']), plan['run_log_sd'], 0.95, 0.8, 4, 12)[0]
  assert plan['predicted'] == report['confirmation_ratio']['predicted']
  assert f"The confirmation runs {plan['seeds']} seeds a side" in report['summary']
