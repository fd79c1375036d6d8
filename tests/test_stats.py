"""rljax.stats against known truths: t quantiles, noise scales of Gaussian gradients,
throughputs."""
import numpy as np
import pytest

from rljax import stats


def test_noise_scale_recovers_b_simple_from_gaussian_gradients():
  """Per-example gradients ~ N(G, Sigma): B_simple = tr(Sigma) / |G|^2 is known."""
  rng = np.random.default_rng(0)
  d, b_small, n_micro, n_steps = 32, 8, 8, 1000
  mean_G = rng.standard_normal(d)
  mean_G /= np.linalg.norm(mean_G)
  factor = rng.standard_normal((d, d)) / np.sqrt(d)
  cov = factor @ factor.T * 20.0
  truth = np.trace(cov) / (mean_G @ mean_G)
  chol = np.linalg.cholesky(cov)
  per_example = mean_G + rng.standard_normal((n_steps, n_micro, b_small, d)) @ chol.T
  micro_means = per_example.mean(axis=2)
  g_small_sq = np.mean(np.sum(micro_means**2, axis=-1), axis=1)
  g_big_sq = np.sum(micro_means.mean(axis=1)**2, axis=-1)
  b_big = b_small * n_micro
  estimate = stats.noise_scale(g_small_sq, g_big_sq, b_small, b_big)
  assert estimate == pytest.approx(truth, rel=0.1)
  # Missing steps are skipped, per-step batch sizes are accepted.
  g_small_sq[:10] = np.nan
  assert stats.noise_scale(g_small_sq, g_big_sq, np.full(n_steps, b_small),
                              b_big) == pytest.approx(truth, rel=0.1)
  # All signal swamped by noise: not estimable.
  assert np.isnan(stats.noise_scale([1.0], [1.0 - 1e-9 * 7 / 8 - 1.0], 8, 64))


def test_noise_scale_window_goes_on_from_logged_rows_and_skips_rows_without_terms():
  rows = [dict(grad_sq_small=2.0 + i % 3, grad_sq_big=1.0, b_small=8.0, b_big=64.0)
          for i in range(60)]
  window = stats.NoiseScaleWindow(rows[:30], steps=50)
  for row in rows[30:]:
    window.update(row)
  last = rows[-1]
  expected = stats.noise_scale(
      *np.transpose([[r[k] for k in stats.NOISE_KEYS] for r in rows[-50:]]))
  assert last['noise_scale'] == pytest.approx(expected)
  plain = dict(grad_norm=1.0)
  window.update(plain)
  assert 'noise_scale' not in plain


def test_t_quantile_matches_tables_and_scipy():
  table = {(0.95, 1): 12.706, (0.95, 2): 4.303, (0.95, 4): 2.776, (0.95, 30): 2.042,
           (0.90, 10): 1.812, (0.99, 3): 5.841}
  for (level, df), value in table.items():
    assert stats.t_quantile(level, df) == pytest.approx(value, abs=1e-3)
  scipy_stats = pytest.importorskip('scipy.stats')
  for df in (1, 2, 3, 5, 8, 17, 60):
    assert stats.t_quantile(0.95, df) == pytest.approx(scipy_stats.t.ppf(0.975, df), rel=1e-6)
  assert np.isnan(stats.t_quantile(0.95, 0))


def gaussian_noise_terms(rng, n_steps, truth_scale=20.0, d=16, b_small=8, n_micro=8):
  """The trainer's four noise-scale columns from per-example gradients ~ N(G, Sigma)."""
  mean_G = np.ones(d) / np.sqrt(d)
  cov = np.eye(d) * truth_scale / d
  per_example = mean_G + rng.standard_normal((n_steps, n_micro, b_small, d)) @ np.sqrt(cov)
  micro_means = per_example.mean(axis=2)
  return (np.mean(np.sum(micro_means**2, axis=-1), axis=1),
          np.sum(micro_means.mean(axis=1)**2, axis=-1),
          np.full(n_steps, float(b_small)), np.full(n_steps, float(b_small * n_micro)))


def test_noise_scale_interval_covers_the_truth():
  """B_simple = tr(Sigma) / |G|^2 = 20 exactly; two runs of 150 steps per synthetic arm."""
  rng = np.random.default_rng(0)
  covered, widths = [], []
  for _ in range(60):
    terms = [gaussian_noise_terms(rng, 150) for _ in range(2)]
    result = stats.noise_scale_interval(terms, block=10, n_boot=500, rng=rng)
    assert result['lo'] <= result['value'] <= result['hi'] and result['blocks'] == 30
    covered.append(result['lo'] <= 20.0 <= result['hi'])
    widths.append(result['hi'] - result['lo'])
  assert np.mean(covered) >= 0.85
  longer = stats.noise_scale_interval([gaussian_noise_terms(rng, 1200)], n_boot=500, rng=0)
  assert longer['hi'] - longer['lo'] < 0.6 * np.mean(widths)
  one_block = stats.noise_scale_interval([gaussian_noise_terms(rng, 6)], block=10)
  assert np.isfinite(one_block['value']) and np.isnan(one_block['lo'])   # no interval from 1 block
  g_small_sq, g_big_sq, b_small, b_big = gaussian_noise_terms(rng, 40)
  g_big_sq[:20] = g_small_sq[:20] * b_small[0] / b_big[0] / 5   # 2 of 4 blocks with |G|^2 < 0
  swamped = stats.noise_scale_interval([(g_small_sq, g_big_sq, b_small, b_big)], n_boot=500)
  assert 0 < swamped['lo'] < np.inf and swamped['hi'] == np.inf   # some replicates unbounded


def test_one_steady_state_rule_and_rounds():
  samples, seconds = [64, 64, 64, 64, 64], [9.0, 5.0, 0.2, 0.3, 0.1]
  assert stats.steady_throughput(samples, seconds, warmup=2) == pytest.approx(3 * 64 / 0.6)
  assert np.isnan(stats.steady_throughput(samples, seconds, warmup=5))
  rounds = [900.0, 1000.0, 1100.0]
  summary = stats.throughput_interval(rounds)
  logs = np.log(rounds)
  half = 4.302653 * logs.std(ddof=1) / np.sqrt(3)
  assert summary['median'] == 1000.0 and summary['rounds'] == 3
  assert [summary['lo'], summary['hi']] == pytest.approx(
      [np.exp(logs.mean() - half), np.exp(logs.mean() + half)], rel=1e-5)
