"""rljax.protocol.align against known truths: Welch's interval computed independently, coverage
over synthetic seeds, the three-way alignment and the lr choice."""
import numpy as np
import pytest

from rljax.protocol import align


def welch_reference(base, arm, level=0.95):
  """Welch's interval on log samples in plain numpy, with scipy's t quantile at the floored df."""
  scipy_stats = pytest.importorskip('scipy.stats')
  lb, la = np.log(base), np.log(arm)
  vb, va = np.var(lb, ddof=1) / len(lb), np.var(la, ddof=1) / len(la)
  df = (va + vb)**2 / (va**2 / (len(la) - 1) + vb**2 / (len(lb) - 1))
  half = scipy_stats.t.ppf((1 + level) / 2, np.floor(df)) * np.sqrt(va + vb)
  diff = la.mean() - lb.mean()
  return np.exp(diff - half), np.exp(diff + half)


def test_rn_interval_is_welchs_t_interval_on_logs():
  base, arm = [900.0, 1000.0, 1200.0], [1400.0, 1500.0, 1900.0, 1450.0, 1600.0]
  result = align.rn_interval(base, arm)
  assert result['rN'] == pytest.approx(np.exp(np.log(arm).mean() - np.log(base).mean()))
  assert [result['lo'], result['hi']] == pytest.approx(welch_reference(base, arm), rel=1e-6)
  assert np.isnan(align.rn_interval([1000.0], [1500.0])['lo'])   # one seed each: no interval
  assert np.isnan(align.rn_interval([900.0, 1100.0], [1500.0])['lo'])   # no arm spread


def test_rn_interval_covers_when_the_arms_spreads_differ():
  """Base 3 seeds at log-sd 0.30, arm 5 seeds at 0.10 (the committed offset-0 batch-512 case):
  a pooled spread covers about 84%, Welch about 93%."""
  rng = np.random.default_rng(0)
  covered = []
  for _ in range(2000):
    base = np.exp(0.30 * rng.standard_normal(3)) * 2000
    arm = np.exp(0.10 * rng.standard_normal(5)) * 3000
    result = align.rn_interval(base, arm)
    covered.append(result['lo'] <= 1.5 <= result['hi'])
  assert np.mean(covered) >= 0.91


def test_arm_or_base_that_never_reaches_the_target():
  result = align.rn_interval([1000.0, 1100.0], [1500.0, np.nan], arm_floor=[2000.0, 3000.0])
  assert result['status'] == 'not reached' and np.isinf(result['rN']) and np.isinf(result['hi'])
  # The seed that missed counts as the 3000 samples it reached: a lower end, never an upper one.
  assert result['lo'] == pytest.approx(align.rn_interval([1000.0, 1100.0], [1500.0, 3000.0])['lo'])
  assert np.isnan(align.rn_interval([1000.0, 1100.0], [1500.0, np.nan])['lo'])
  result = align.rn_interval([1000.0, np.nan], [1500.0, 1600.0])
  assert result['status'] == 'base not reached' and np.isnan(result['rN'])


def test_alignment_is_three_way_by_the_interval_against_the_band():
  assert align.alignment(0.9, 1.15, 0.2) == 'aligned'
  assert align.alignment(1.25, 2.0, 0.2) == 'not aligned'
  assert align.alignment(0.1, 0.7, 0.2) == 'not aligned'
  assert align.alignment(0.9, 1.5, 0.2) == 'undetermined'   # straddles 1.2
  assert align.alignment(0.5, 1.5, 0.2) == 'undetermined'   # wider than the band
  assert align.alignment(np.nan, np.nan, 0.2) == 'undetermined'


def test_aligned_range_is_contiguous_and_names_what_is_undetermined():
  arms = [
      {'batch': 64, 'rN_ci': [1.3, 1.6]},
      {'batch': 128, 'rN_ci': [0.9, 1.1]},
      {'batch': 256, 'rN_ci': [0.7, 1.3], 'base': True},
      {'batch': 512, 'rN_ci': [0.95, 1.15]},
      {'batch': 1024, 'rN_ci': [0.9, 1.6]},
      {'batch': 2048, 'rN_ci': [0.95, 1.1]},   # beyond an undetermined batch: not in the range
      {'batch': 4096, 'rN_ci': [1.5, 3.0]},
      {'batch': 8192, 'rN_ci': [0.9, 1.1]},    # beyond a batch that is not aligned: not listed
      {'batch': 1024, 'rN_ci': [2.0, 3.0], 'control': True},
  ]
  aligned = align.aligned_range(arms, 0.2)
  assert aligned['batches'] == [128, 256, 512]
  assert (aligned['lo'], aligned['hi']) == (128, 512)
  assert aligned['undetermined'] == [1024, 2048]
  assert aligned['status'][4096] == 'not aligned' and aligned['status'][64] == 'not aligned'
  assert align.aligned_range(arms[2:3], 0.2)['batches'] == [256]   # the base alone
