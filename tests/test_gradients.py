"""rljax.protocol.gradients against known truths: grad-norm curves with a known slope and noise
scale."""
import numpy as np
import pytest

from rljax.protocol import gradients


def test_grad_norm_slope_recovers_minus_half_with_t_intervals():
  rng = np.random.default_rng(0)
  batches = 2.0**np.arange(3, 11)
  fits = [gradients.grad_norm_slope(batches, 5 * batches**-0.5 *
                                np.exp(0.05 * rng.standard_normal(len(batches))))
          for _ in range(400)]
  slopes, stderrs = np.array([f['slope'] for f in fits]), np.array([f['stderr'] for f in fits])
  assert np.mean(slopes) == pytest.approx(-0.5, abs=0.005)
  # The stderr matches the actual spread of fitted slopes (dividing by n, not n - 2, is 15% off).
  assert np.sqrt(np.mean(stderrs**2)) == pytest.approx(np.std(slopes), rel=0.07)
  covered = np.mean([f['ci'][0] <= -0.5 <= f['ci'][1] for f in fits])
  assert 0.92 <= covered <= 0.98
  assert np.mean([f['verdict'] == 'consistent with -0.5' for f in fits]) == covered


def test_slope_verdict_uses_t_at_the_right_degrees_of_freedom():
  """3 points, df = 1: a slope 6 stderr from -1/2 is still consistent with it (t = 12.7)."""
  batches = np.array([128.0, 256.0, 512.0])
  fit = gradients.grad_norm_slope(batches, batches**-0.42 * np.array([1.0, 1.02, 1.0]))
  assert fit['df'] == 1 and abs(fit['slope'] + 0.5) > 2 * fit['stderr']
  assert fit['ci'][1] - fit['slope'] == pytest.approx(12.706 * fit['stderr'], rel=1e-3)
  assert fit['verdict'] == 'consistent with -0.5'
  assert gradients.grad_norm_slope([8, 16], [1.0, 0.7])['verdict'].startswith('no interval')
  flat = gradients.grad_norm_slope(2.0**np.arange(3, 9), (2.0**np.arange(3, 9))**-0.2)
  assert flat['verdict'] == 'flatter than -0.5'


def test_doubling_ratios_are_per_doubling():
  batches = [64, 128, 512]
  ratios = gradients.doubling_ratios(batches, [np.sqrt(64 / b) for b in batches])
  assert [(r['from'], r['to']) for r in ratios] == [(64, 128), (128, 512)]
  assert ratios[1]['ratio'] == pytest.approx(0.5)
  for r in ratios:
    assert r['per_doubling'] == pytest.approx(2**-0.5)


def test_noise_scale_from_the_grad_norm_curve():
  batches = np.array([64.0, 128.0, 256.0, 512.0])
  assert gradients.noise_scale_from_grad_norms(batches, np.sqrt(0.01 * (1 + 400 / batches))) == (
      pytest.approx(400.0))
  assert np.isnan(gradients.noise_scale_from_grad_norms([64.0], [1.0]))
