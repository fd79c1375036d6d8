"""rljax.protocol.rcp against a plain re-statement of mlcommons' RCP checker's procedure (its
bisection with scipy's t-test, its pruning loop), and on MLPerf v6.1's own GRPO RCPs."""
import math

import numpy as np
import pytest

from rljax.protocol import mlperf
from rljax.protocol import rcp

# mlperf_logging/rcp_checker/training_6.1.0/rcps_qwen35_397b_grpo.json: six runs per batch, every
# one converged at its first validation.
MLPERF_RCPS = {256: [4608] * 6, 512: [5120] * 6, 1024: [7168] * 6}


def bisected_min_mean(mean, stdev, n_ref, n_subm, alpha=0.05, tolerance=1e-4):
  """The checker's search: the lowest mean whose one-sided equal-variance t-test p exceeds alpha."""
  scipy_stats = pytest.importorskip('scipy.stats')
  if stdev == 0:
    return mean
  lo, hi = 0.0, mean
  while hi - lo > tolerance:
    mid = (lo + hi) / 2
    t, p = scipy_stats.ttest_ind_from_stats(mid, stdev, n_ref, mean, stdev, n_subm, equal_var=True)
    p = p / 2 if t < 0 else 1 - p / 2
    lo, hi = (lo, mid) if p > alpha else (mid, hi)
  return (lo + hi) / 2


def test_olympic_mean_drops_the_fastest_and_slowest():
  rng = np.random.default_rng(0)
  for n in (3, 6, 10):
    values = rng.lognormal(9, 0.2, n)
    assert rcp.olympic_mean(values) == pytest.approx(np.sort(values)[1:-1].mean())
  assert rcp.olympic_mean([1.0, 2.0, math.inf]) == 2.0   # a run that did not converge: dropped
  assert math.isnan(rcp.olympic_mean([1.0, 2.0]))


@pytest.mark.parametrize('mean,stdev,n_ref,n_subm', [
    (10_000.0, 300.0, 4, 1), (5000.0, 50.0, 8, 1), (7000.0, 900.0, 6, 8), (100.0, 80.0, 4, 1)])
def test_the_fastest_acceptable_mean_is_the_checkers_bisection(mean, stdev, n_ref, n_subm):
  assert rcp.min_acceptable_mean(mean, stdev, n_ref, n_subm) == pytest.approx(
      bisected_min_mean(mean, stdev, n_ref, n_subm), abs=2e-4)


def test_a_record_and_an_interpolated_one():
  values = [10_240.0, 10_560.0, 10_336.0, 11_008.0, 10_432.0, 10_336.0]
  record = rcp.record(32, values, runs=3)
  assert record['mean'] == pytest.approx(np.mean(np.sort(values)[1:-1]))
  assert record['stdev'] == pytest.approx(np.std(values))
  assert record['min_mean'] == pytest.approx(
      bisected_min_mean(record['mean'], record['stdev'], 4, 1), abs=2e-4)
  assert record['max_speedup'] == pytest.approx(record['mean'] / record['min_mean'])
  high = rcp.record(128, [v * 1.2 for v in values], runs=3)
  middle = rcp.interpolated(64, record, high, runs=3)
  assert middle['mean'] == pytest.approx(record['mean'] + (high['mean'] - record['mean']) / 3)
  assert middle['stdev'] == pytest.approx(record['stdev'] + (high['stdev'] - record['stdev']) / 3)
  assert middle['min_mean'] == pytest.approx(   # the checker's n_ref: twice a submission's runs
      bisected_min_mean(middle['mean'], middle['stdev'], 6, 1), abs=2e-4)


def test_mlperfs_own_rcps_allow_no_speedup_and_bound_the_batch():
  """With every reference run at its first validation (stdev 0) the fastest acceptable mean is the
  mean. A closed run converging at its own first validation passes inside [256, 1024]; below 256
  its earlier validation start is faster than the 256 RCP, and above 1024 there is none."""
  rules = mlperf.RULES['qwen35_397b_grpo']
  records = [rcp.record(b, v, rules.runs) for b, v in MLPERF_RCPS.items()]
  assert [(r['mean'], r['stdev'], r['max_speedup']) for r in records] == [
      (4608, 0, 1), (5120, 0, 1), (7168, 0, 1)]
  assert rcp.pruned(records, rules.runs) == records   # 512 lies below the 256-1024 line
  at_start = lambda b: [mlperf.start_at(rules, b)] * 3
  verdicts = {b: rcp.check(b, at_start(b), records, rules.runs)
              for b in (128, 256, 384, 1024, 2048)}
  assert {b: v['passed'] for b, v in verdicts.items()} == {
      128: False, 256: True, 384: True, 1024: True, 2048: False}
  assert verdicts[384]['how'] == 'RCP interpolation' and verdicts[384]['reference']['mean'] == 4864
  assert verdicts[2048]['how'].startswith('missing RCP')


def plain_prune(records, runs):
  """The checker's pruning loop, re-stated on (batch, mean) pairs."""
  points = sorted(records, key=lambda r: r['batch'])
  fastest = min(points, key=lambda r: r['mean'])['batch']
  points = [r for r in points if r['batch'] >= fastest]
  i = 1
  while i < len(points) - 1:
    a, b, c = points[i - 1], points[i], points[i + 1]
    frac = (b['batch'] - a['batch']) / (c['batch'] - a['batch'])
    line = a['mean'] + (c['mean'] - a['mean']) * frac
    if b['mean'] > line:
      del points[i]
      i -= 1
    i += 1
  return [r['batch'] for r in points]


def test_pruning_follows_the_checkers_loop():
  rng = np.random.default_rng(1)
  for _ in range(50):
    batches = sorted(rng.choice(np.arange(1, 40) * 32, size=5, replace=False).tolist())
    records = [dict(batch=b, mean=float(m), stdev=10.0) for b, m in
               zip(batches, rng.uniform(4000, 9000, 5))]
    assert [r['batch'] for r in rcp.pruned(records, 3)] == plain_prune(records, 3)


def test_a_submission_is_checked_at_its_batch():
  records = [rcp.record(b, [m * f for f in (0.96, 0.98, 1.0, 1.0, 1.02, 1.04)], 3)
             for b, m in ((256, 4608.0), (1024, 7168.0))]
  fast = rcp.check(256, [4000.0, 4100.0, 4200.0], records, 3)
  assert (fast['passed'], fast['how']) == (False, 'RCP found')
  slower = rcp.check(256, [4500.0, 4600.0, 4700.0], records, 3)
  assert slower['passed'] and slower['scale'] == pytest.approx(records[0]['mean'] / 4600.0)
  assert rcp.check(256, [9000.0, 9100.0, math.inf], records, 3)['scale'] == 1.0
  failed = rcp.check(256, [4600.0, math.inf, math.inf], records, 3)
  assert not failed['passed'] and failed['how'].startswith('insufficient convergence')
  assert rcp.check(512, [5900.0] * 3, records, 3)['how'] == 'RCP interpolation'
