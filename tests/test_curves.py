"""rljax.protocol.curves against known truths: synthetic eval curves, seeds and eval-set noise,
and fits computed independently (scipy, brute force)."""
import numpy as np
import pytest

from rljax.protocol import align
from rljax.protocol import curves

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


def test_first_crossing_is_exact_on_piecewise_linear_data():
  x, y = [0, 10, 20, 30], [0.0, 0.2, 0.6, 0.8]
  assert curves.first_crossing(x, y, 0.4) == pytest.approx(15.0)
  assert curves.first_crossing(x, y, 0.7) == pytest.approx(25.0)
  assert curves.first_crossing(x, y, 0.6) == pytest.approx(20.0)
  assert curves.first_crossing(x, y, 0.0) == 0.0  # already there at the first point
  assert np.isnan(curves.first_crossing(x, y, 0.9))
  assert np.isnan(curves.first_crossing([], [], 0.5))
  # The FIRST upward crossing, even if the curve dips back below later.
  assert curves.first_crossing([0, 10, 20, 30], [0.0, 0.5, 0.3, 0.7], 0.4) == pytest.approx(8.0)


def test_smooth_is_centred_and_keeps_lines():
  np.testing.assert_allclose(curves.smooth([0, 0, 3, 0, 0], 3), [0, 1, 1, 1, 0])
  line = np.linspace(0, 1, 9)
  np.testing.assert_allclose(curves.smooth(line, 5), line)  # no lag: crossings do not move
  np.testing.assert_allclose(curves.smooth([1.0, 5.0], 1), [1.0, 5.0])


def test_to_target_in_samples_steps_and_wallclock():
  run = make_run(lambda n: n / 1000.0, batch=100, n_steps=10, eval_every=1, step_time=2.0)
  assert curves.to_target(run, 0.35) == pytest.approx(350.0)
  assert curves.to_target(run, 0.35, x_key='step') == pytest.approx(3.5)
  assert curves.wallclock_to_target(run, 0.35) == pytest.approx(7.0)
  run['train']['step_time_s'][:2] = 30.0   # compiling steps: counted at the later steps' mean
  assert curves.wallclock_to_target(run, 0.35) == pytest.approx(63.0)
  assert curves.wallclock_to_target(run, 0.35, warmup=2) == pytest.approx(7.0)
  run['train']['step_time_s'][-1] = 10.0   # the later steps' mean is 3.0, as steady_throughput's
  assert curves.wallclock_to_target(run, 0.35, warmup=2) == pytest.approx(2 * 3.0 + 2.0 + 1.0)
  assert np.isnan(curves.to_target(run, 2.0)) and np.isnan(curves.wallclock_to_target(run, 2.0))
  assert curves.samples_reached(run) == 1000.0


def test_targets_sit_on_the_rising_part_of_the_base_curve():
  """start + f x (top - start): top is the weakest base seed's best, so every seed crosses each."""
  runs = [make_run(curve(s), 128, 200) for s in (1.0, 1.3)]
  start, top = 0.3, float(curve(1.3)(200 * 128))
  targets = curves.targets_from_base(runs, (0.25, 0.5, 0.75))
  np.testing.assert_allclose(targets, [start + f * (top - start) for f in (0.25, 0.5, 0.75)])
  for run in runs:
    assert all(np.isfinite(curves.to_target(run, t)) for t in targets)
  flat = make_run(lambda n: np.full_like(np.asarray(n, float), 0.3), 128, 50)
  assert curves.targets_from_base([flat], (0.5,)) == []


def test_rn_of_a_curve_stretched_in_samples():
  """Same accuracies at 1.5x the samples: rN is exactly 1.5 (interpolation scales with x)."""
  base = make_run(curve(), 128, 400)
  stretched = make_run(curve(), 128, 400)
  stretched['eval']['samples'] = stretched['eval']['samples'] * 1.5
  n_base, n_arm = curves.to_target(base, TARGET), curves.to_target(stretched, TARGET)
  assert n_base == pytest.approx(BASE_N, rel=0.01)
  result = align.rn_interval([n_base, n_base], [n_arm, n_arm])
  assert result['rN'] == pytest.approx(1.5) and result['df'] == 2
  assert result['lo'] == pytest.approx(1.5) and result['hi'] == pytest.approx(1.5)  # no spread


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
    base = [curves.to_target(r, TARGET, 3) for r in seeded_runs(rng, 3, 1.0, prompts_u)]
    arm = [curves.to_target(r, TARGET, 3) for r in seeded_runs(rng, 3, 1.5, prompts_u)]
    result = align.rn_interval(base, arm)
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
    sse += (yi - shape['start']
            - shape['rise'] * (1 - np.exp(-xi / np.exp(grid) / shape['scale'])))**2
  return grid[np.argmin(sse)]


def test_curve_shape_and_log_stretch_against_independent_fits():
  rng = np.random.default_rng(0)
  noise = lambda n: 0.015 * rng.standard_normal(n)
  base = [grid_run(1.0, noise=noise, stop=0.40) for _ in range(3)]
  shape = curves.fit_curve_shape(base)
  optimize = pytest.importorskip('scipy.optimize')
  x = np.concatenate([r['eval']['samples'][1:] for r in base])
  y = np.concatenate([r['eval']['eval_accuracy'][1:] for r in base])
  fitted = lambda x, rise, scale: curves.saturating(x, 0.319, rise, scale)
  (rise, scale), _ = optimize.curve_fit(fitted, x, y, p0=[0.1, 2000.0])
  sse = lambda r, s: np.sum((y - fitted(x, r, s))**2)
  assert shape['start'] == 0.319
  assert sse(shape['rise'], shape['scale']) <= sse(rise, scale) * 1.001   # a grid, 1% apart
  for stretch in (0.7, 1.0, 1.6, 2.5):
    run = grid_run(stretch, noise=noise, stop=0.40)
    assert curves.log_stretch(run, shape) == pytest.approx(reference_log_stretch(run, shape),
                                                          abs=2e-4)
  assert curves.fit_curve_shape([make_run(lambda n: np.full_like(n, 0.3), 128, 50)]) is None
  # below start
  assert curves.shape_samples_to(shape, 0.30) != curves.shape_samples_to(shape, 0.30)


def test_stretch_rn_has_no_grid_bias_where_crossings_have_it():
  """Noise-free curves on the logs' grid (evals every 1024 samples, stop at 0.40, J at 1-3 evals
  in): the stretch recovers rN within 1%; one smoothed crossing is 5-15% low, which fails here."""
  base = [grid_run(1.0, stop=0.40)]
  shape = curves.fit_curve_shape(base)
  target = 0.36
  for truth in (1.5, 2.2):
    arm = [grid_run(truth, stop=0.40)]
    by_stretch = align.rn_interval(curves.stretch_samples_to_target(base, shape, target, 5),
                                   curves.stretch_samples_to_target(arm, shape, target, 5))['rN']
    by_crossing = align.rn_interval([curves.to_target(base[0], target, 5)],
                                    [curves.to_target(arm[0], target, 5)])['rN']
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
  shape_fit = curves.fit_curve_shape(base)
  target = curves.targets_from_base(base, (0.5, 0.7, 0.9), 3)[1]
  for truth, batch in ((1.0, 64), (1.3, 256)):
    rn = align.rn_interval(curves.stretch_samples_to_target(base, shape_fit, target, 3),
                           curves.stretch_samples_to_target([run(truth, batch)], shape_fit,
                                                           target, 3))['rN']
    assert rn == pytest.approx(truth, rel=0.03)
