"""The protocol's decision: which batch reaches the target in the least wall-clock, beyond noise.

A batch's predicted seconds to target are its samples to target over its samples per second, both
measured (the align arm's seeds, the throughput rounds). The decision compares every batch with
the base on the log of that time (docs/guide/protocol.md, "The decision"):

- the interval of each batch's time relative to the base is Welch's t on the difference of log
  times: four independent means (samples of the arm and of the base, throughput of each), each
  with its own spread (a pooled spread under-covers when spreads differ 2x, as they do between
  arms), Welch-Satterthwaite degrees of freedom;
- the intervals are simultaneous over the m batches compared with the base and over the looks at
  the data that staged seeds took (Bonferroni: each at 1 - (1 - level) / (m x looks)), so the
  chance that any equally fast batch is called faster stays below (1 - level) / 2 however many
  batches the sweep holds and however often seeds were added until one looked faster;
- a batch is recommended only when its interval lies below 1; P(fastest) is the share of joint
  draws (each mean from its own t) in which a batch has the shortest time: a summary for the
  reader, never the rule.
"""
import numpy as np

from rljax import stats


def resolved(candidate):
  """Why a candidate cannot be compared ('' when it can): every seed reached, at least 2 seeds
  (a seed spread), throughput known."""
  n = np.asarray(candidate.get('samples_per_seed') or [], float)
  if not len(n):
    return 'not in the align sweep: no measured rN'
  if not np.isfinite(n).all():
    return 'a seed did not reach the target: rN unbounded'
  if len(n) < 2:
    return 'one seed: no seed spread'
  rounds = np.asarray(candidate.get('throughput_rounds') or [], float)
  if not len(rounds) or not (np.isfinite(rounds) & (rounds > 0)).all():
    return 'no throughput measurement'
  return ''


def _mean_terms(values):
  """(mean, variance of the mean, df) of log(values); a single value is taken as exact."""
  logs = np.log(np.asarray(values, float))
  if len(logs) < 2:
    return float(logs.mean()), 0.0, 0
  return float(logs.mean()), float(logs.var(ddof=1) / len(logs)), len(logs) - 1


def welch_log_time_ratio(candidate, base, level):
  """The candidate's time to target over the base's: point, interval at `level`, Welch df.

  log time = mean log samples - mean log samples/s; the difference with the base sums four
  independent means' variances, and its df is Welch-Satterthwaite's (floored: slightly wider).
  """
  terms = [_mean_terms(c[key]) for c in (candidate, base)
           for key in ('samples_per_seed', 'throughput_rounds')]
  (n_c, *_), (t_c, *_), (n_b, *_), (t_b, *_) = terms
  log_ratio = (n_c - t_c) - (n_b - t_b)
  variance = sum(v for _, v, _ in terms)
  if variance == 0:
    return dict(ratio=float(np.exp(log_ratio)), lo=float(np.exp(log_ratio)),
                hi=float(np.exp(log_ratio)), df=np.inf)
  df = variance**2 / sum(v**2 / d for _, v, d in terms if d > 0)
  half = stats.t_quantile(level, np.floor(df)) * np.sqrt(variance)
  return dict(ratio=float(np.exp(log_ratio)), lo=float(np.exp(log_ratio - half)),
              hi=float(np.exp(log_ratio + half)), df=float(df))


def _draw_log_means(values, n_draws, rng):
  """Draws of the mean of log(values) from its own t sampling distribution (fixed when one)."""
  logs = np.log(np.asarray(values, float))
  if len(logs) < 2:
    return np.full(n_draws, logs.mean())
  spread = logs.std(ddof=1) / np.sqrt(len(logs))
  return logs.mean() + spread * rng.standard_t(len(logs) - 1, n_draws)


def p_fastest(eligible, n_draws, rng):
  """Per candidate, the share of joint draws of every log time in which it is the shortest."""
  log_time_DxK = np.stack([_draw_log_means(c['samples_per_seed'], n_draws, rng) -
                           _draw_log_means(c['throughput_rounds'], n_draws, rng)
                           for c in eligible], axis=1)
  return np.bincount(np.argmin(log_time_DxK, axis=1), minlength=len(eligible)) / n_draws


def decide(candidates, base_batch, level=0.95, n_draws=4000, rng=0):
  """Predicted seconds to target = samples to target / throughput, per batch whose rN is resolved.

  candidates: dicts with 'batch', 'samples_per_seed' (the arm's samples-to-target per seed) and
  'throughput_rounds' (samples/s per round). Returns per-candidate rows (time relative to the
  base with its simultaneous interval, P(fastest)) and the verdict: 'faster' (some batch's
  interval lies below 1; of those, the one with the shortest predicted time is recommended),
  'within noise' or 'base fastest' (both: no batch is measurably faster, the base is recommended).
  """
  rows = [dict(batch=c['batch'], why_not=resolved(c)) for c in candidates]
  eligible = [c for c, r in zip(candidates, rows) if not r['why_not']]
  base = next((c for c in eligible if c['batch'] == base_batch), None)
  if base is None:
    return _undefined(rows, 'the base arm has no resolved samples-to-target')
  comparisons, looks = max(len(eligible) - 1, 1), staged_looks(eligible, base)
  each_level = 1 - (1 - level) / (comparisons * looks)
  wins_K = p_fastest(eligible, n_draws, np.random.default_rng(rng))
  by_batch = {}
  for c, wins in zip(eligible, wins_K):
    ratio = (dict(ratio=1.0, lo=1.0, hi=1.0, df=np.inf) if c is base else
             welch_log_time_ratio(c, base, each_level))
    by_batch[c['batch']] = dict(
        predicted_wallclock_s=float(np.exp(_mean_terms(c['samples_per_seed'])[0] -
                                           _mean_terms(c['throughput_rounds'])[0])),
        relative_wallclock=ratio['ratio'], relative_wallclock_ci=[ratio['lo'], ratio['hi']],
        relative_wallclock_df=ratio['df'], p_fastest=float(wins))
  for r in rows:
    r.update(by_batch.get(r['batch'], {}))
  fastest = min(by_batch, key=lambda b: by_batch[b]['predicted_wallclock_s'])
  method = (f'Welch t on log time, simultaneous over {comparisons} comparison'
            f"{'s' if comparisons > 1 else ''}" +
            (f' and {looks} looks at the data' if looks > 1 else '') +
            f' (Bonferroni, each at {each_level:.4g})')
  return dict(candidates=rows, fastest=fastest, interval_method=method,
              **verdict(by_batch, fastest, base_batch))


def staged_looks(eligible, base):
  """How often the decision looked at the data: 1 + the staged rounds, each of which gave the base
  one more seed than the arm with the fewest (rljax.protocol.driver.add_seeds)."""
  fewest = min(len(c['samples_per_seed']) for c in eligible)
  return 1 + len(base['samples_per_seed']) - fewest


def verdict(by_batch, fastest, base_batch):
  """The recommendation in words: a batch only when it is faster beyond noise. Every candidate's
  interval is checked, not only the point-fastest one's."""
  faster = [b for b, row in by_batch.items()
            if b != base_batch and row['relative_wallclock_ci'][1] < 1]
  if faster:
    best = min(faster, key=lambda b: by_batch[b]['relative_wallclock'])
    f = by_batch[best]
    lo, hi = f['relative_wallclock_ci']
    return dict(verdict='faster', recommended=best, statement=(
        f"Batch {best} is faster than the base {base_batch}: {f['relative_wallclock']:.2f}x "
        f"its wall-clock to target [{lo:.2f}, {hi:.2f}], fastest in {f['p_fastest']:.0%} of the "
        'bootstrap draws.'))
  f = by_batch[fastest]
  lo, hi = f['relative_wallclock_ci']
  if fastest == base_batch:
    return dict(verdict='base fastest', recommended=base_batch, statement=(
        f'No batch is measurably faster than the base {base_batch}: the base has the shortest '
        f"predicted time (fastest in {f['p_fastest']:.0%} of the bootstrap draws)."))
  return dict(verdict='within noise', recommended=base_batch, statement=(
      f'No batch is measurably faster than the base {base_batch}. Batch {fastest} has the '
      f"shortest predicted time, {f['relative_wallclock']:.2f}x the base's, but its interval "
      f"[{lo:.2f}, {hi:.2f}] includes 1 (fastest in {f['p_fastest']:.0%} of the bootstrap draws)."))


def to_confirm(decision):
  """The batch the confirmation times against the base: the recommended one where a batch is
  faster beyond noise (the point-fastest may not be), else the point-fastest (is it really no
  faster?); None without a decision."""
  return decision['recommended'] if decision['verdict'] == 'faster' else decision['fastest']


def _undefined(rows, why):
  return dict(candidates=rows, verdict='undefined', recommended=None, fastest=None,
              statement=f'No decision: {why}.')


# ------------------------------------------------------------------------------------------------
# The quick answer: every batch's rN from the base arm's noise scale, not from an arm per batch.
# ------------------------------------------------------------------------------------------------


def rn_from_noise_scale(batch, base_batch, b_noise):
  """rN(B) = (1 + B / B_noise) / (1 + B0 / B_noise).

  McCandlish et al. (2018): the samples to reach a loss grow with the batch as
  E = E_min (1 + B / B_noise), so relative to the base batch B0 the factor is this ratio. B_noise is
  taken as the measured B_simple (their approximation of it); 1 at every batch when unbounded.
  """
  b_noise = np.asarray(b_noise, float)
  with np.errstate(divide='ignore', invalid='ignore'):
    return np.where(b_noise > 0, (1 + batch / b_noise) / (1 + base_batch / b_noise), np.nan)


# The noise-scale model's own error: the RMS of log(measured rN / predicted rN) per doubling of
# the batch over the base, over the deep presets' full sweeps (docs/guide/protocol.md, "Quick
# answer"). B_simple's sampling noise alone leaves it out of the quick answer's interval.
MODEL_ERROR_PER_DOUBLING = 0.05


def decide_from_noise_scale(candidates, base_batch, base_samples, b_noise, b_noise_draws,
                            level=0.95, n_draws=4000, rng=0,
                            model_error=MODEL_ERROR_PER_DOUBLING):
  """The decision with rN(B) predicted from the base arm's B_simple instead of measured per arm.

  candidates: dicts with 'batch' and 'throughput_rounds'. base_samples: the base arm's samples to
  target (it scales every time alike, so it cancels in the relative times). b_noise_draws: the
  bootstrap draws of B_simple (noise_scale_draws), resampled jointly with the throughput draws;
  the interval of each relative time is their quantiles (no closed form for B_simple's). Each draw
  also scales log rN by one normal error of sd `model_error` x log2(B / B0), shared by every batch
  (a model that misjudges one batch misjudges the larger ones more, the same way). Rows add the
  predicted rN with its interval; the verdict follows the same rule as decide's.
  """
  rows = [dict(batch=c['batch'], why_not='' if len(c.get('throughput_rounds') or []) else
               'no throughput measurement') for c in candidates]
  eligible = [c for c, r in zip(candidates, rows) if not r['why_not']]
  k_base = next((k for k, c in enumerate(eligible) if c['batch'] == base_batch), None)
  if k_base is None:
    return _undefined(rows, 'the base batch has no throughput measurement')
  if not np.isfinite(base_samples):
    return _undefined(rows, 'the base arm has no samples to target')
  if not np.isfinite(b_noise) or not len(b_noise_draws):
    return _undefined(rows, "the base arm's B_simple has no interval (not estimable, or too few "
                            'steps)')
  gen = np.random.default_rng(rng)
  noise_D = gen.choice(np.asarray(b_noise_draws, float), n_draws)
  batches = [c['batch'] for c in eligible]
  rn_K = np.array([float(rn_from_noise_scale(b, base_batch, b_noise)) for b in batches])
  rn_DxK = np.stack([rn_from_noise_scale(b, base_batch, noise_D) for b in batches], axis=1)
  log_thr_K = np.array([np.log(c['throughput_rounds']).mean() for c in eligible])
  log_thr_DxK = np.stack([_draw_log_means(c['throughput_rounds'], n_draws, gen)
                          for c in eligible], axis=1)
  doublings_K = np.abs(np.log2(np.asarray(batches, float) / base_batch))
  rn_DxK = rn_DxK * np.exp(gen.standard_normal((n_draws, 1)) * model_error * doublings_K)
  point_K = np.log(base_samples) + np.log(rn_K) - log_thr_K
  log_time_DxK = np.log(base_samples) + np.log(rn_DxK) - log_thr_DxK
  by_batch = _by_draws(batches, point_K, log_time_DxK, k_base, level)
  tail = (1 - level) / 2
  for k, b in enumerate(batches):
    by_batch[b].update(rN_predicted=float(rn_K[k]), rN_predicted_ci=[
        float(q) for q in np.quantile(rn_DxK[:, k], [tail, 1 - tail])])
  for r in rows:
    r.update(by_batch.get(r['batch'], {}))
  fastest = batches[int(np.argmin(point_K))]
  return dict(candidates=rows, fastest=fastest, b_noise=float(b_noise),
              interval_method='quantiles of joint draws of B_simple, the model error and '
                              'throughput',
              **verdict(by_batch, fastest, base_batch))


def _by_draws(batches, point_K, log_time_DxK, k_base, level):
  """Per batch: predicted seconds, time relative to the base with its draws' interval and
  P(fastest)."""
  rel_DxK = np.exp(log_time_DxK - log_time_DxK[:, [k_base]])
  wins_K = np.bincount(np.argmin(log_time_DxK, axis=1), minlength=len(batches)) / len(rel_DxK)
  tail = (1 - level) / 2
  return {b: dict(predicted_wallclock_s=float(np.exp(point_K[k])),
                  relative_wallclock=float(np.exp(point_K[k] - point_K[k_base])),
                  relative_wallclock_ci=[float(q) for q in
                                         np.quantile(rel_DxK[:, k], [tail, 1 - tail])],
                  p_fastest=float(wins_K[k]))
          for k, b in enumerate(batches)}
