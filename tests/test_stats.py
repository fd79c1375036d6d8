"""rljax.stats against known truths: synthetic gradients with a known noise scale."""
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
  expected = stats.noise_scale(*np.transpose([[r[k] for k in stats.NOISE_KEYS] for r in rows[-50:]]))
  assert last['noise_scale'] == pytest.approx(expected)
  plain = dict(grad_norm=1.0)
  window.update(plain)
  assert 'noise_scale' not in plain
