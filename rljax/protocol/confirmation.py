"""How many seeds the confirmation runs: enough to see the pick faster beyond noise if it is as
fast as predicted.

The confirmation times fresh runs of the base and of the pick to the decision's target and puts
Welch's t-interval on the ratio of their log seconds. Each run's log seconds spread as its batch's
samples to target spread over seeds and as its samples/s spread over the throughput rounds (a run
draws both). With too few seeds that interval straddles 1 even when the prediction is right, so
the count is sized for its power (docs/guide/protocol.md, "Confirmation"). The same runs' own
spread says where a confirmation of that many seeds lands if the prediction holds (`expected`).
"""
import statistics

import numpy as np

from rljax import stats
from rljax.protocol import decision


def power(log_ratio, log_sds, seeds, level, draws=20_000):
  """P(the Welch interval at `level` of `seeds` runs a side lies below 1) when the pick's true log
  time ratio is `log_ratio` and each side's runs spread normally by `log_sds` (pick, base):
  simulated confirmations, each with its own Welch df (closed forms missed a Monte Carlo by
  0.05-0.11 at 3-4 seeds). Seeded: the same answer on every rebuild."""
  if log_ratio >= 0 or seeds < 2:
    return 0.0
  if not any(log_sds):
    return 1.0
  rng = np.random.default_rng(0)
  pick_DxS = rng.normal(log_ratio, log_sds[0], (draws, seeds))
  base_DxS = rng.normal(0.0, log_sds[1], (draws, seeds))
  var_a_D, var_b_D = (x.var(axis=1, ddof=1) / seeds for x in (pick_DxS, base_DxS))
  df_D = np.floor((var_a_D + var_b_D)**2 / ((var_a_D**2 + var_b_D**2) / (seeds - 1))).astype(int)
  t_D = np.array([stats.t_quantile(level, df) for df in df_D])
  upper_D = pick_DxS.mean(1) - base_DxS.mean(1) + t_D * np.sqrt(var_a_D + var_b_D)
  return float(np.mean(upper_D < 0))


def seeds_for_power(log_ratio, log_sds, level, target, least, most):
  """(seeds a side, their power): the fewest in [least, most] with power >= target, else most
  (least where most is below it)."""
  for seeds in range(least, max(least, most) + 1):
    reached = power(log_ratio, log_sds, seeds, level)
    if reached >= target:
      break
  return seeds, reached


def run_log_sd(samples_per_seed, throughput_rounds):
  """The spread of one run's log seconds: its log samples to target's over seeds and its log
  samples/s's over rounds, added in quadrature (seconds = samples / rate, drawn independently)."""
  samples = np.log(np.asarray(samples_per_seed, float))
  rounds = np.log(np.asarray(throughput_rounds, float))
  samples, rounds = samples[np.isfinite(samples)], rounds[np.isfinite(rounds)]
  if len(samples) < 2 or len(rounds) < 2:
    return np.nan
  return float(np.sqrt(np.var(samples, ddof=1) + np.var(rounds, ddof=1)))


def expected(predicted, predicted_ci, base_log_s, pick_log_s, level):
  """(lo, hi, df): where a confirmation's measured ratio lies with probability `level` if the
  decision's prediction holds: the prediction's uncertainty (its interval read as normal on the
  log scale) and the confirmation's own (Welch, from its runs' log seconds) in quadrature, with
  Welch-Satterthwaite's df (the prediction's counted as infinite). The decision's interval alone
  is for the expected ratio: a few seeds a side land outside it by their own noise."""
  base, pick = np.asarray(base_log_s, float), np.asarray(pick_log_s, float)
  if len(base) < 2 or len(pick) < 2:
    return np.nan, np.nan, 0
  z = statistics.NormalDist().inv_cdf((1 + level) / 2)
  var_p = (np.log(predicted_ci[1] / predicted_ci[0]) / (2 * z))**2
  var_b, var_a = np.var(base, ddof=1) / len(base), np.var(pick, ddof=1) / len(pick)
  total = var_p + var_a + var_b
  own = var_a**2 / (len(pick) - 1) + var_b**2 / (len(base) - 1)
  df = int(np.floor(total**2 / own)) if own > 0 else 10**6
  half = stats.t_quantile(level, df) * np.sqrt(total)
  return float(predicted * np.exp(-half)), float(predicted * np.exp(half)), df


def plan(report, protocol):
  """The confirmation's seeds a side from a report before it (None while protocol.confirm_power is
  0, without a confirmation, or when no batch was found faster; the pick: decision.to_confirm):
  the pick's arm gives its samples' spread, or the base arm's where the pick has none (the quick
  answer)."""
  target, pick, base = (protocol.get('confirm_power', 0.0), decision.to_confirm(report['decision']),
                        report['base_batch'])
  if not target or not protocol.get('confirm', True) or pick in (None, base):
    return None
  arms = {a['batch']: a for a in report['arms'] if not a['control']}
  rounds = {t['batch']: t['per_round'] for t in report['throughput']}
  row = next(c for c in report['decision']['candidates'] if c['batch'] == pick)
  sds = [run_log_sd(arms.get(b, arms[base])['samples_to_target_per_seed'], rounds[b])
         for b in (pick, base)]
  if not np.isfinite(sds).all():
    return None
  seeds, reached = seeds_for_power(float(np.log(row['relative_wallclock'])), sds,
                                   report['level'], target, protocol['confirm_seeds'],
                                   protocol['max_seeds'])
  return dict(seeds=seeds, power=reached, target_power=target, run_log_sd=sds,
              predicted=row['relative_wallclock'])
