"""rljax.protocol.decision against hand computations and plain numpy: the Welch interval on the log
time ratio, its Bonferroni level, the verdicts, and the quick answer's noise-scale rN."""
import statistics

import numpy as np
import pytest

from rljax.protocol import decision as decision_lib


def lognormal_seeds(rng, median, n=4, sd=0.05):
  return list(median * np.exp(sd * rng.standard_normal(n)))


def test_decision_more_throughput_loses_to_a_larger_sample_penalty():
  """Batch 256 runs 1.3x faster per sample but needs 1.6x the samples: the base is fastest."""
  rng = np.random.default_rng(0)
  decision = decision_lib.decide([
      dict(batch=128, samples_per_seed=lognormal_seeds(rng, 10_000),
           throughput_rounds=[1000.0, 1010.0, 990.0]),
      dict(batch=256, samples_per_seed=lognormal_seeds(rng, 16_000),
           throughput_rounds=[1300.0, 1310.0, 1290.0]),
  ], base_batch=128)
  assert decision['verdict'] == 'base fastest' and decision['recommended'] == 128
  assert 'No batch is measurably faster than the base 128' in decision['statement']
  rows = {r['batch']: r for r in decision['candidates']}
  assert rows[256]['relative_wallclock'] == pytest.approx(1.6 / 1.3, rel=0.05)
  assert rows[256]['relative_wallclock_ci'][0] > 1 and rows[128]['p_fastest'] > 0.99


def test_decision_within_noise_recommends_the_base_and_says_so():
  """Batch 512's point estimate is faster, but 3 noisy seeds cannot tell: 'within noise'."""
  rng = np.random.default_rng(1)
  decision = decision_lib.decide([
      dict(batch=128, samples_per_seed=[8e3, 12e3, 10e3], throughput_rounds=[1000.0] * 3),
      dict(batch=512, samples_per_seed=[7e3, 14e3, 9e3],
           throughput_rounds=[1100.0, 1050.0, 1150.0]),
      dict(batch=4096, samples_per_seed=[], throughput_rounds=[5000.0] * 3),
  ], base_batch=128, rng=rng)
  assert decision['fastest'] == 512 and decision['verdict'] == 'within noise'
  assert decision['recommended'] == 128
  assert decision['statement'].startswith('No batch is measurably faster than the base 128')
  rows = {r['batch']: r for r in decision['candidates']}
  assert 0.4 < rows[512]['p_fastest'] < 0.95 and 'p_fastest' not in rows[4096]
  assert 'not in the align sweep' in rows[4096]['why_not']


def test_decision_recommends_a_batch_that_is_faster_beyond_noise():
  rng = np.random.default_rng(2)
  decision = decision_lib.decide([
      dict(batch=128, samples_per_seed=lognormal_seeds(rng, 1e4),
           throughput_rounds=[1000.0, 980.0, 1020.0]),
      dict(batch=512, samples_per_seed=lognormal_seeds(rng, 1.1e4),
           throughput_rounds=[2000.0, 1950.0, 2050.0]),
      dict(batch=1024, samples_per_seed=[1e4, np.nan], throughput_rounds=[4000.0] * 3),
  ], base_batch=128)
  assert decision['verdict'] == 'faster' and decision['recommended'] == 512
  rows = {r['batch']: r for r in decision['candidates']}
  assert rows[512]['relative_wallclock'] == pytest.approx(0.55, rel=0.1)
  assert rows[512]['relative_wallclock_ci'][1] < 1 and rows[512]['p_fastest'] > 0.95
  assert 'did not reach' in rows[1024]['why_not']   # unresolved rN: never recommended


def test_rn_from_noise_scale_is_mccandlish_ratio():
  b0, b_noise = 16, 64.0
  for batch in (16, 32, 128):   # E = E_min (1 + B / B_noise), relative to the base batch
    assert decision_lib.rn_from_noise_scale(batch, b0, b_noise) == pytest.approx(
        (1 + batch / b_noise) / (1 + b0 / b_noise), rel=1e-15)
  # no noise limit: rN 1 everywhere
  assert decision_lib.rn_from_noise_scale(1024, b0, np.inf) == 1.0
  assert np.isnan(decision_lib.rn_from_noise_scale(32, b0, np.nan))


def test_quick_decision_against_a_hand_computation():
  """Throughput rounds without spread, B_simple draws at one value and no model error: every draw
  is the point."""
  candidates = [dict(batch=16, throughput_rounds=[100.0, 100.0]),
                dict(batch=32, throughput_rounds=[190.0, 190.0]),
                dict(batch=64, throughput_rounds=[200.0, 200.0]),
                dict(batch=128, throughput_rounds=[])]
  decision = decision_lib.decide_from_noise_scale(candidates, 16, 1000.0, 64.0, np.full(50, 64.0),
                                                  model_error=0.0)
  rows = {r['batch']: r for r in decision['candidates']}
  for batch, thr in ((32, 190.0), (64, 200.0)):
    rn = (1 + batch / 64) / (1 + 16 / 64)
    assert rows[batch]['rN_predicted'] == pytest.approx(rn, rel=1e-12)
    assert rows[batch]['relative_wallclock'] == pytest.approx(rn * 100 / thr, rel=1e-12)
    assert rows[batch]['relative_wallclock_ci'] == pytest.approx([rn * 100 / thr] * 2, rel=1e-12)
    assert rows[batch]['predicted_wallclock_s'] == pytest.approx(1000 * rn / thr, rel=1e-12)
  assert decision['verdict'] == 'faster' and decision['recommended'] == 32
  assert rows[32]['p_fastest'] == 1.0 and rows[128]['why_not'] == 'no throughput measurement'
  flat = [dict(c, throughput_rounds=[100.0, 100.0]) for c in candidates]
  held = decision_lib.decide_from_noise_scale(flat, 16, 1000.0, 64.0, np.full(50, 64.0))
  assert held['verdict'] == 'base fastest' and held['recommended'] == 16   # flat: stay
  no_interval = decision_lib.decide_from_noise_scale(candidates, 16, 1000.0, 64.0, np.zeros(0))
  assert no_interval['verdict'] == 'undefined' and 'no interval' in no_interval['statement']


def test_the_model_error_spreads_log_rn_by_its_sd_per_doubling_shared_by_every_batch():
  """With B_simple and throughput fixed, only the model error spreads: each batch's rN interval is
  the point x exp(+-z sd log2(B / B0)) (normal quantiles from the standard library), and one
  draw errs the same way at every batch, so the larger batch's relative time moves with the
  smaller's."""
  candidates = [dict(batch=b, throughput_rounds=[100.0 * f] * 2)
                for b, f in ((16, 1.0), (64, 2.0), (256, 3.0))]
  decision = decision_lib.decide_from_noise_scale(candidates, 16, 1e3, 500.0, np.full(50, 500.0),
                                                  n_draws=40_000, model_error=0.05)
  z = statistics.NormalDist().inv_cdf(0.975)
  for row in decision['candidates'][1:]:
    sd = 0.05 * np.log2(row['batch'] / 16)
    assert row['rN_predicted_ci'] == pytest.approx(
        [row['rN_predicted'] * np.exp(-z * sd), row['rN_predicted'] * np.exp(z * sd)], rel=0.01)
    assert row['relative_wallclock_ci'] == pytest.approx(
        [row['relative_wallclock'] * np.exp(-z * sd), row['relative_wallclock'] * np.exp(z * sd)],
        rel=0.01)
  # Shared: 256 (4 doublings) beats 64 (2) exactly when the drawn error is below the log ratio
  # of their point times over 2 doublings' sd.
  rows = {r['batch']: r for r in decision['candidates']}
  gap = np.log(rows[64]['relative_wallclock'] / rows[256]['relative_wallclock'])
  want = statistics.NormalDist().cdf(gap / (0.05 * 2))
  assert rows[256]['p_fastest'] == pytest.approx(want, abs=0.01)


def test_quick_decision_widens_with_the_noise_scale_interval():
  """Draws of B_simple spread the predicted rN: a wide B_simple interval holds 1 in the time's."""
  rng = np.random.default_rng(0)
  candidates = [dict(batch=16, throughput_rounds=[100.0] * 3),
                dict(batch=64, throughput_rounds=[130.0] * 3)]
  tight = decision_lib.decide_from_noise_scale(candidates, 16, 1e3, 400.0, rng.normal(400, 10, 500),
                                               model_error=0.0)
  wide = decision_lib.decide_from_noise_scale(candidates, 16, 1e3, 400.0, np.exp(rng.normal(
      np.log(400), 1.5, 500)), model_error=0.0)
  (t,), (w,) = ([r for r in d['candidates'] if r['batch'] == 64] for d in (tight, wide))
  assert t['relative_wallclock_ci'][1] < 1 < w['relative_wallclock_ci'][1]
  assert tight['verdict'] == 'faster' and wide['verdict'] == 'within noise'


def test_welch_interval_against_a_hand_computation():
  """Point, Welch-Satterthwaite df and the t quantile (from a printed table) by hand in numpy."""
  arm = dict(samples_per_seed=[9e3, 12e3, 10e3, 11e3], throughput_rounds=[2000.0, 2100.0, 1900.0])
  base = dict(samples_per_seed=[10e3, 14e3, 8e3], throughput_rounds=[1000.0, 1050.0, 980.0])
  logs = [np.log(arm['samples_per_seed']), np.log(arm['throughput_rounds']),
          np.log(base['samples_per_seed']), np.log(base['throughput_rounds'])]
  point = logs[0].mean() - logs[1].mean() - logs[2].mean() + logs[3].mean()
  v = np.array([x.var(ddof=1) / len(x) for x in logs])
  df = v.sum()**2 / (v**2 / np.array([len(x) - 1 for x in logs])).sum()
  assert np.floor(df) == 2   # t(0.975, 2) = 4.303, t(0.9875, 2) = 6.205 (printed tables)
  for level, t in ((0.95, 4.302653), (0.975, 6.205347)):
    got = decision_lib.welch_log_time_ratio(arm, base, level)
    assert got['ratio'] == pytest.approx(np.exp(point), rel=1e-12)
    assert got['df'] == pytest.approx(df, rel=1e-12)
    assert [got['lo'], got['hi']] == pytest.approx(
        [np.exp(point - t * np.sqrt(v.sum())), np.exp(point + t * np.sqrt(v.sum()))], rel=1e-5)


def test_intervals_are_simultaneous_over_the_batches_compared():
  """Three batches besides the base: each interval is Welch's at 1 - 0.05 / 3."""
  rng = np.random.default_rng(3)
  cands = [dict(batch=b, samples_per_seed=lognormal_seeds(rng, 1e4, sd=0.2),
                throughput_rounds=lognormal_seeds(rng, 1e3, n=5, sd=0.05))
           for b in (16, 32, 64, 128)]
  result = decision_lib.decide(cands, base_batch=16, n_draws=100)
  rows = {r['batch']: r for r in result['candidates']}
  for c in cands[1:]:
    alone = decision_lib.welch_log_time_ratio(c, cands[0], 1 - 0.05 / 3)
    assert rows[c['batch']]['relative_wallclock_ci'] == pytest.approx([alone['lo'], alone['hi']])
  assert rows[16]['relative_wallclock_ci'] == [1.0, 1.0] and '3 comparisons' in result[
      'interval_method']


def test_staged_seeds_count_as_looks_at_the_data():
  """Two staged rounds gave the base (and the arm then fastest) two more seeds than the arm with
  the fewest: every interval is Welch's at 1 - 0.05 / (2 comparisons x 3 looks)."""
  rng = np.random.default_rng(4)
  cands = [dict(batch=b, samples_per_seed=lognormal_seeds(rng, 1e4, n=n, sd=0.2),
                throughput_rounds=lognormal_seeds(rng, 1e3, n=5, sd=0.05))
           for b, n in ((16, 10), (32, 10), (64, 8))]
  result = decision_lib.decide(cands, base_batch=16, n_draws=100)
  rows = {r['batch']: r for r in result['candidates']}
  for c in cands[1:]:
    alone = decision_lib.welch_log_time_ratio(c, cands[0], 1 - 0.05 / 6)
    assert rows[c['batch']]['relative_wallclock_ci'] == pytest.approx([alone['lo'], alone['hi']])
  assert '2 comparisons and 3 looks' in result['interval_method']


@pytest.mark.parametrize('spreads', [(0.2, 0.2, 0.2, 0.2), (0.35, 0.175, 0.175, 0.175)],
                         ids=['equal', 'base-2x'])
def test_no_batch_is_called_faster_when_all_are_equal(spreads):
  """The method's test: equal truths, 3 seeds and 5 rounds per batch, spreads equal or the base's
  2x the others' (where a pooled spread under-covers). Family-wise false 'faster' <= 2.5% nominal
  (one-sided 0.05 / 2 over the family); checked <= 4% over 1500 sweeps (binomial sd 0.4%), and
  every interval covers the truth jointly in >= 94%."""
  rng, n, false, covered = np.random.default_rng(7), 1500, 0, 0
  for _ in range(n):
    cands = [dict(batch=b, samples_per_seed=lognormal_seeds(rng, 1e4, n=3, sd=sd),
                  throughput_rounds=lognormal_seeds(rng, 1e3, n=5, sd=0.07))
             for b, sd in zip((16, 32, 64, 128), spreads)]
    result = decision_lib.decide(cands, base_batch=16, n_draws=20)
    false += result['verdict'] == 'faster'
    covered += all(r['relative_wallclock_ci'][0] <= 1 <= r['relative_wallclock_ci'][1]
                   for r in result['candidates'])
  assert false / n <= 0.04 and covered / n >= 0.94


def test_the_confirmation_times_the_recommendation_or_else_the_point_fastest():
  """A batch faster beyond noise is what the user is told to run: the confirmation times it, not
  a point-faster batch whose interval holds 1. With none faster, the point-fastest is timed."""
  faster = dict(verdict='faster', recommended=64, fastest=256)
  assert decision_lib.to_confirm(faster) == 64
  assert decision_lib.to_confirm(dict(verdict='within noise', recommended=16, fastest=256)) == 256
  assert decision_lib.to_confirm(dict(verdict='undefined', recommended=None, fastest=None)) is None
