"""rljax.stats against known truths: synthetic curves, seeds, gradients and throughputs."""
import numpy as np
import pytest

from rljax import stats

TARGET = 0.6


def curve(stretch=1.0):
  """A saturating learning curve against samples; stretch=s needs s times the samples."""
  return lambda n: 0.3 + 0.6 * (1 - np.exp(-np.asarray(n, float) / (20_000 * stretch)))


BASE_N = 20_000 * np.log(2)  # curve() reaches TARGET here.


def make_run(acc_fn, batch, n_steps, prompts_u=None, eval_every=5, step_time=1.0):
  """A run as rljax.protocol.report.load_run returns it; with prompts_u, prompt m is solved once the
  accuracy exceeds u[m] (eval-set noise, shared by every run graded on those prompts)."""
  steps = np.arange(n_steps + 1)[::eval_every].astype(float)
  acc = acc_fn(steps * batch)
  if prompts_u is not None:
    acc = (prompts_u[None, :] < acc[:, None]).mean(axis=1)
  train_steps = np.arange(1, n_steps + 1, dtype=float)
  return {
      'train': {'step': train_steps, 'samples': train_steps * batch,
                'step_time_s': np.full(n_steps, step_time), 'grad_norm': np.ones(n_steps)},
      'eval': {'step': steps, 'samples': steps * batch, 'eval_accuracy': acc},
  }


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


# ------------------------------------------------------------------------------------------------
# Student t quantiles.
# ------------------------------------------------------------------------------------------------


def test_t_quantile_matches_tables_and_scipy():
  table = {(0.95, 1): 12.706, (0.95, 2): 4.303, (0.95, 4): 2.776, (0.95, 30): 2.042,
           (0.90, 10): 1.812, (0.99, 3): 5.841}
  for (level, df), value in table.items():
    assert stats.t_quantile(level, df) == pytest.approx(value, abs=1e-3)
  scipy_stats = pytest.importorskip('scipy.stats')
  for df in (1, 2, 3, 5, 8, 17, 60):
    assert stats.t_quantile(0.95, df) == pytest.approx(scipy_stats.t.ppf(0.975, df), rel=1e-6)
  assert np.isnan(stats.t_quantile(0.95, 0))


# ------------------------------------------------------------------------------------------------
# Curves and crossings.
# ------------------------------------------------------------------------------------------------


def test_first_crossing_is_exact_on_piecewise_linear_data():
  x, y = [0, 10, 20, 30], [0.0, 0.2, 0.6, 0.8]
  assert stats.first_crossing(x, y, 0.4) == pytest.approx(15.0)
  assert stats.first_crossing(x, y, 0.7) == pytest.approx(25.0)
  assert stats.first_crossing(x, y, 0.6) == pytest.approx(20.0)
  assert stats.first_crossing(x, y, 0.0) == 0.0  # already there at the first point
  assert np.isnan(stats.first_crossing(x, y, 0.9))
  assert np.isnan(stats.first_crossing([], [], 0.5))
  # The FIRST upward crossing, even if the curve dips back below later.
  assert stats.first_crossing([0, 10, 20, 30], [0.0, 0.5, 0.3, 0.7], 0.4) == pytest.approx(8.0)


def test_smooth_is_centred_and_keeps_lines():
  np.testing.assert_allclose(stats.smooth([0, 0, 3, 0, 0], 3), [0, 1, 1, 1, 0])
  line = np.linspace(0, 1, 9)
  np.testing.assert_allclose(stats.smooth(line, 5), line)  # no lag: crossings do not move
  np.testing.assert_allclose(stats.smooth([1.0, 5.0], 1), [1.0, 5.0])


def test_to_target_in_samples_steps_and_wallclock():
  run = make_run(lambda n: n / 1000.0, batch=100, n_steps=10, eval_every=1, step_time=2.0)
  assert stats.to_target(run, 0.35) == pytest.approx(350.0)
  assert stats.to_target(run, 0.35, x_key='step') == pytest.approx(3.5)
  assert stats.wallclock_to_target(run, 0.35) == pytest.approx(7.0)
  run['train']['step_time_s'][:2] = 30.0   # compiling steps: counted at the later steps' mean
  assert stats.wallclock_to_target(run, 0.35) == pytest.approx(63.0)
  assert stats.wallclock_to_target(run, 0.35, warmup=2) == pytest.approx(7.0)
  run['train']['step_time_s'][-1] = 10.0   # the later steps' mean is 3.0, as steady_throughput's
  assert stats.wallclock_to_target(run, 0.35, warmup=2) == pytest.approx(2 * 3.0 + 2.0 + 1.0)
  assert np.isnan(stats.to_target(run, 2.0)) and np.isnan(stats.wallclock_to_target(run, 2.0))
  assert stats.samples_reached(run) == 1000.0


def test_targets_sit_on_the_rising_part_of_the_base_curve():
  """start + f x (top - start): top is the weakest base seed's best, so every seed crosses each."""
  runs = [make_run(curve(s), 128, 200) for s in (1.0, 1.3)]
  start, top = 0.3, float(curve(1.3)(200 * 128))
  targets = stats.targets_from_base(runs, (0.25, 0.5, 0.75))
  np.testing.assert_allclose(targets, [start + f * (top - start) for f in (0.25, 0.5, 0.75)])
  for run in runs:
    assert all(np.isfinite(stats.to_target(run, t)) for t in targets)
  flat = make_run(lambda n: np.full_like(np.asarray(n, float), 0.3), 128, 50)
  assert stats.targets_from_base([flat], (0.5,)) == []


# ------------------------------------------------------------------------------------------------
# rN and its interval.
# ------------------------------------------------------------------------------------------------


def test_rn_of_a_curve_stretched_in_samples():
  """Same accuracies at 1.5x the samples: rN is exactly 1.5 (interpolation scales with x)."""
  base = make_run(curve(), 128, 400)
  stretched = make_run(curve(), 128, 400)
  stretched['eval']['samples'] = stretched['eval']['samples'] * 1.5
  n_base, n_arm = stats.to_target(base, TARGET), stats.to_target(stretched, TARGET)
  assert n_base == pytest.approx(BASE_N, rel=0.01)
  result = stats.rn_interval([n_base, n_base], [n_arm, n_arm])
  assert result['rN'] == pytest.approx(1.5) and result['df'] == 2
  assert result['lo'] == pytest.approx(1.5) and result['hi'] == pytest.approx(1.5)  # no spread


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
  result = stats.rn_interval(base, arm)
  assert result['rN'] == pytest.approx(np.exp(np.log(arm).mean() - np.log(base).mean()))
  assert [result['lo'], result['hi']] == pytest.approx(welch_reference(base, arm), rel=1e-6)
  assert np.isnan(stats.rn_interval([1000.0], [1500.0])['lo'])   # one seed each: no interval
  assert np.isnan(stats.rn_interval([900.0, 1100.0], [1500.0])['lo'])   # no arm spread


def test_rn_interval_covers_when_the_arms_spreads_differ():
  """Base 3 seeds at log-sd 0.30, arm 5 seeds at 0.10 (the committed offset-0 batch-512 case):
  a pooled spread covers about 84%, Welch about 93%."""
  rng = np.random.default_rng(0)
  covered = []
  for _ in range(2000):
    base = np.exp(0.30 * rng.standard_normal(3)) * 2000
    arm = np.exp(0.10 * rng.standard_normal(5)) * 3000
    result = stats.rn_interval(base, arm)
    covered.append(result['lo'] <= 1.5 <= result['hi'])
  assert np.mean(covered) >= 0.91


def seeded_runs(rng, n_seeds, stretch, prompts_u):
  """Seeds differ by a random stretch in samples (seed noise); prompts add eval-set noise."""
  return [make_run(curve(stretch * np.exp(0.25 * rng.standard_normal())), 128, 500, prompts_u)
          for _ in range(n_seeds)]


def test_rn_interval_covers_the_truth_at_the_default_seed_count():
  """400 synthetic sweeps with known rN = 1.5, 3 seeds per arm, seed log-sd 0.25 (what the CPU
  protocol's seeds showed) and the eval noise of 300 held-out prompts. It covers about 95%; a
  z-interval (1.96 instead of t at df = 4) about 87%, which fails this test."""
  rng = np.random.default_rng(0)
  covered = []
  for _ in range(400):
    prompts_u = rng.uniform(size=300)
    base = [stats.to_target(r, TARGET, 3) for r in seeded_runs(rng, 3, 1.0, prompts_u)]
    arm = [stats.to_target(r, TARGET, 3) for r in seeded_runs(rng, 3, 1.5, prompts_u)]
    result = stats.rn_interval(base, arm)
    assert result['lo'] <= result['rN'] <= result['hi']
    covered.append(result['lo'] <= 1.5 <= result['hi'])
  assert np.mean(covered) >= 0.90


def grid_run(stretch, batch=128, every=1024, stop=None, noise=None):
  """A run of curve()-like shape, start 0.319, evaluated every `every` samples (as the logs)."""
  acc = lambda n: 0.319 + 0.10 * (1 - np.exp(-np.asarray(n, float) / (2500 * stretch)))
  run = make_run(acc, batch, 40_000 // batch, eval_every=every // batch)
  if noise is not None:
    run['eval']['eval_accuracy'][1:] += noise(len(run['eval']['samples']) - 1)
  if stop is not None:   # the protocol's stop rule: the first eval at or above `stop`
    end = np.flatnonzero(run['eval']['eval_accuracy'] >= stop)[0] + 1
    run['eval'] = {k: v[:end] for k, v in run['eval'].items()}
  return run


def reference_log_stretch(run, shape):
  """Brute force: the SSE at 60,001 log stretches in a plain loop over the evals."""
  x, y = run['eval']['samples'][1:], run['eval']['eval_accuracy'][1:]
  grid = np.linspace(-3, 3, 60_001)
  sse = np.zeros_like(grid)
  for xi, yi in zip(x, y):
    sse += (yi - shape['start'] - shape['rise'] * (1 - np.exp(-xi / np.exp(grid) / shape['scale'])))**2
  return grid[np.argmin(sse)]


def test_curve_shape_and_log_stretch_against_independent_fits():
  rng = np.random.default_rng(0)
  noise = lambda n: 0.015 * rng.standard_normal(n)
  base = [grid_run(1.0, noise=noise, stop=0.40) for _ in range(3)]
  shape = stats.fit_curve_shape(base)
  optimize = pytest.importorskip('scipy.optimize')
  x = np.concatenate([r['eval']['samples'][1:] for r in base])
  y = np.concatenate([r['eval']['eval_accuracy'][1:] for r in base])
  fitted = lambda x, rise, scale: stats.saturating(x, 0.319, rise, scale)
  (rise, scale), _ = optimize.curve_fit(fitted, x, y, p0=[0.1, 2000.0])
  sse = lambda r, s: np.sum((y - fitted(x, r, s))**2)
  assert shape['start'] == 0.319
  assert sse(shape['rise'], shape['scale']) <= sse(rise, scale) * 1.001   # a grid, 1% apart
  for stretch in (0.7, 1.0, 1.6, 2.5):
    run = grid_run(stretch, noise=noise, stop=0.40)
    assert stats.log_stretch(run, shape) == pytest.approx(reference_log_stretch(run, shape),
                                                          abs=2e-4)
  assert stats.fit_curve_shape([make_run(lambda n: np.full_like(n, 0.3), 128, 50)]) is None
  assert stats.shape_samples_to(shape, 0.30) != stats.shape_samples_to(shape, 0.30)   # below start


def test_stretch_rn_has_no_grid_bias_where_crossings_have_it():
  """Noise-free curves on the logs' grid (evals every 1024 samples, stop at 0.40, J at 1-3 evals
  in): the stretch recovers rN within 1%; one smoothed crossing is 5-15% low, which fails here."""
  base = [grid_run(1.0, stop=0.40)]
  shape = stats.fit_curve_shape(base)
  target = 0.36
  for truth in (1.5, 2.2):
    arm = [grid_run(truth, stop=0.40)]
    by_stretch = stats.rn_interval(stats.stretch_samples_to_target(base, shape, target, 5),
                                   stats.stretch_samples_to_target(arm, shape, target, 5))['rN']
    by_crossing = stats.rn_interval([stats.to_target(base[0], target, 5)],
                                    [stats.to_target(arm[0], target, 5)])['rN']
    assert by_stretch == pytest.approx(truth, rel=0.01)
    assert abs(by_crossing / truth - 1) > 0.03


@pytest.mark.parametrize('shape', ['saturating', 'late rise'])
def test_deep_targets_have_no_grid_bias(shape):
  """The runlocal preset's grid (evals every 8192 samples on a 64k budget, base batch 16, targets
  at 50/70/90% of the way to the base's top, smoothing 3): on noise-free curves the stretch
  recovers rN within 3% at the deciding target, for the fitted curve's own shape and for one
  that stays flat for 16k samples first (as a warm start stopped too early does)."""
  rise = {'saturating': lambda n: 1 - np.exp(-n / 40_000),
          'late rise': lambda n: 1 - 1 / (1 + (n / 30_000)**2)}[shape]
  run = lambda stretch, batch: make_run(
      lambda n: 0.372 + 0.25 * rise(np.asarray(n, float) / stretch), batch, 65_536 // batch,
      eval_every=8192 // batch)
  base = [run(1.0, 16)]
  shape_fit = stats.fit_curve_shape(base)
  target = stats.targets_from_base(base, (0.5, 0.7, 0.9), 3)[1]
  for truth, batch in ((1.0, 64), (1.3, 256)):
    rn = stats.rn_interval(stats.stretch_samples_to_target(base, shape_fit, target, 3),
                           stats.stretch_samples_to_target([run(truth, batch)], shape_fit,
                                                           target, 3))['rN']
    assert rn == pytest.approx(truth, rel=0.03)


def test_arm_or_base_that_never_reaches_the_target():
  result = stats.rn_interval([1000.0, 1100.0], [1500.0, np.nan], arm_floor=[2000.0, 3000.0])
  assert result['status'] == 'not reached' and np.isinf(result['rN']) and np.isinf(result['hi'])
  # The seed that missed counts as the 3000 samples it reached: a lower end, never an upper one.
  assert result['lo'] == pytest.approx(stats.rn_interval([1000.0, 1100.0], [1500.0, 3000.0])['lo'])
  assert np.isnan(stats.rn_interval([1000.0, 1100.0], [1500.0, np.nan])['lo'])
  result = stats.rn_interval([1000.0, np.nan], [1500.0, 1600.0])
  assert result['status'] == 'base not reached' and np.isnan(result['rN'])


def test_alignment_is_three_way_by_the_interval_against_the_band():
  assert stats.alignment(0.9, 1.15, 0.2) == 'aligned'
  assert stats.alignment(1.25, 2.0, 0.2) == 'not aligned'
  assert stats.alignment(0.1, 0.7, 0.2) == 'not aligned'
  assert stats.alignment(0.9, 1.5, 0.2) == 'undetermined'   # straddles 1.2
  assert stats.alignment(0.5, 1.5, 0.2) == 'undetermined'   # wider than the band
  assert stats.alignment(np.nan, np.nan, 0.2) == 'undetermined'


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
  aligned = stats.aligned_range(arms, 0.2)
  assert aligned['batches'] == [128, 256, 512]
  assert (aligned['lo'], aligned['hi']) == (128, 512)
  assert aligned['undetermined'] == [1024, 2048]
  assert aligned['status'][4096] == 'not aligned' and aligned['status'][64] == 'not aligned'
  assert stats.aligned_range(arms[2:3], 0.2)['batches'] == [256]   # the base alone


# ------------------------------------------------------------------------------------------------
# Gradient diagnostics.
# ------------------------------------------------------------------------------------------------


def test_grad_norm_slope_recovers_minus_half_with_t_intervals():
  rng = np.random.default_rng(0)
  batches = 2.0**np.arange(3, 11)
  fits = [stats.grad_norm_slope(batches, 5 * batches**-0.5 *
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
  fit = stats.grad_norm_slope(batches, batches**-0.42 * np.array([1.0, 1.02, 1.0]))
  assert fit['df'] == 1 and abs(fit['slope'] + 0.5) > 2 * fit['stderr']
  assert fit['ci'][1] - fit['slope'] == pytest.approx(12.706 * fit['stderr'], rel=1e-3)
  assert fit['verdict'] == 'consistent with -0.5'
  assert stats.grad_norm_slope([8, 16], [1.0, 0.7])['verdict'].startswith('no interval')
  flat = stats.grad_norm_slope(2.0**np.arange(3, 9), (2.0**np.arange(3, 9))**-0.2)
  assert flat['verdict'] == 'flatter than -0.5'


def test_doubling_ratios_are_per_doubling():
  batches = [64, 128, 512]
  ratios = stats.doubling_ratios(batches, [np.sqrt(64 / b) for b in batches])
  assert [(r['from'], r['to']) for r in ratios] == [(64, 128), (128, 512)]
  assert ratios[1]['ratio'] == pytest.approx(0.5)
  for r in ratios:
    assert r['per_doubling'] == pytest.approx(2**-0.5)


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


def test_noise_scale_from_the_grad_norm_curve():
  batches = np.array([64.0, 128.0, 256.0, 512.0])
  assert stats.noise_scale_from_grad_norms(batches, np.sqrt(0.01 * (1 + 400 / batches))) == (
      pytest.approx(400.0))
  assert np.isnan(stats.noise_scale_from_grad_norms([64.0], [1.0]))


# ------------------------------------------------------------------------------------------------
# Throughput, the lr choice and the decision.
# ------------------------------------------------------------------------------------------------


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


def test_choose_lr_takes_the_fewest_samples_and_flags_the_edge():
  choice = stats.choose_lr([1e-4, 2.5e-5, 5e-5], [[9e3, 1.1e4], [8e3, np.nan], [5e3, 6e3]])
  assert choice['lr0'] == 5e-5 and not choice['at_edge']
  assert [r['lr'] for r in choice['lrs']] == [2.5e-5, 5e-5, 1e-4]
  assert not choice['lrs'][0]['reached']   # 8k on one seed, but the other never got there
  assert choice['lrs'][1]['samples_to_target'] == pytest.approx(np.sqrt(5e3 * 6e3))
  assert stats.choose_lr([1e-4, 5e-5], [[4e3, 4e3], [6e3, 6e3]])['at_edge']
