"""rljax.auto_batch.check: the progress ratio of a move against an independent fit (scipy's
bounded scalar minimiser over rho, numpy's weighted polyfit for a and c), the coverage of its
interval on synthetic runs, and its verdicts."""
import numpy as np
import pytest
from scipy import optimize

from rljax.auto_batch import check as auto_check


def synthetic(rho, s0=4096, batch_before=16, batch_after=32, window=8192, noise=0.03, seed=0,
              a=0.2, c=0.0015):
  """Steps of a run that moves at s0 and then makes `rho` times the progress per sample, with
  reward means whose noise shrinks with the batch (a mean over its samples)."""
  rng = np.random.default_rng(seed)
  before = np.arange(batch_before, s0 + 1, batch_before)
  after = np.arange(s0 + batch_after, s0 + window + 1, batch_after)
  samples = np.concatenate([before, after]).astype(float)
  weight = np.where(samples <= s0, batch_before, batch_after).astype(float)
  s_eff = np.where(samples <= s0, samples, s0 + rho * (samples - s0))
  reward = a + c * np.sqrt(s_eff) + rng.normal(0, noise * np.sqrt(16 / weight))
  return samples, reward, weight, s0


def reference_rho(samples, reward, weight, s0):
  def sse(log_rho):
    s_eff = np.where(samples <= s0, samples, s0 + np.exp(log_rho) * (samples - s0))
    coef = np.polyfit(np.sqrt(s_eff), reward, 1, w=np.sqrt(weight))
    return float(np.sum(weight * (reward - np.polyval(coef, np.sqrt(s_eff))) ** 2))
  found = optimize.minimize_scalar(sse, bounds=(np.log(1 / 32), np.log(32)), method='bounded',
                                   options=dict(xatol=1e-6))
  return np.exp(found.x)


@pytest.mark.parametrize('rho', [0.3, 1.0, 2.5])
def test_the_estimate_is_the_least_squares_rho_within_the_grid_spacing(rho):
  data = synthetic(rho, seed=int(rho * 10))
  found, lo, hi = auto_check.progress_ratio(*data)
  step = auto_check.RHO_GRID[1] / auto_check.RHO_GRID[0]
  assert reference_rho(*data) / step ** 0.51 <= found <= reference_rho(*data) * step ** 0.51
  assert lo <= found <= hi


def test_the_interval_covers_the_true_progress_ratio_at_its_level():
  # 200 synthetic runs at each of two truths: a likelihood-ratio interval at 95% should cover
  # in about 95% of them; 0.9 leaves room for 200-run binomial noise (sd 1.5%) and the grid.
  for rho in (0.5, 1.0):
    covered = [lo <= rho <= hi for lo, hi in
               (auto_check.progress_ratio(*synthetic(rho, seed=seed))[1:] for seed in range(200))]
    assert np.mean(covered) >= 0.9, (rho, np.mean(covered))


def test_too_few_steps_on_either_side_tell_nothing():
  samples, reward, weight, s0 = synthetic(1.0)
  keep = samples <= s0 + 32   # one step after the move
  assert np.isnan(auto_check.progress_ratio(samples[keep], reward[keep], weight[keep], s0)[0])
  assert auto_check.judge(samples[keep], reward[keep], weight[keep], s0, 1.5, 0.9).verdict == 'keep'


def test_a_move_whose_progress_stopped_is_undone_one_that_kept_it_is_measured():
  stopped = auto_check.judge(*synthetic(0.02), throughput_ratio=1.6, predicted=0.95)
  assert stopped.verdict == 'undo' and stopped.goodput_hi < 1
  kept = auto_check.judge(*synthetic(1.0, seed=3), throughput_ratio=1.6, predicted=0.5)
  assert kept.verdict == 'keep, measured' and kept.lo <= 1.0 <= kept.hi
  # The same progress, but less than predicted: kept, yet the noise scale goes on deciding.
  assert auto_check.judge(*synthetic(1.0, seed=3), 1.6, predicted=2.0).verdict == 'keep'
