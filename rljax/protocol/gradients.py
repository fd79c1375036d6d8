"""Gradient diagnostics across batches: the log-log slope of grad norm on batch against the
noise-dominated -1/2, ratios per doubling, and the noise scale from the grad-norm curve."""
import numpy as np

from rljax import stats

NOISE_DOMINATED_SLOPE = -0.5
NOISE_DOMINATED_DOUBLING = 2**-0.5  # grad norm ratio per doubling of batch when noise dominates.


def loglog_fit(x, y):
  """(slope, intercept, stderr of slope, df) of log y on log x over the finite positive pairs."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
  lx, ly = np.log(x[ok]), np.log(y[ok])
  if len(lx) < 2 or np.ptp(lx) == 0:
    return np.nan, np.nan, np.nan, 0
  dx = lx - lx.mean()
  slope = dx @ (ly - ly.mean()) / (dx @ dx)
  intercept = ly.mean() - slope * lx.mean()
  resid = ly - intercept - slope * lx
  df = len(lx) - 2
  stderr = np.sqrt(resid @ resid / df / (dx @ dx)) if df else np.nan
  return float(slope), float(intercept), float(stderr), df


def grad_norm_slope(batches, median_grad_norms, level=0.95, reference=NOISE_DOMINATED_SLOPE):
  """The log-log slope of grad norm on batch, its t-interval (df = points - 2) and a verdict.

  -1/2 is the noise-dominated regime (the gradient is an average of B noisy per-sample terms); a
  flatter slope means more samples per step no longer buy a less noisy step.
  """
  slope, _, stderr, df = loglog_fit(batches, median_grad_norms)
  half = stats.t_quantile(level, df) * stderr if df else np.nan
  ci = [slope - half, slope + half]
  if not np.isfinite(slope):
    verdict = 'no slope (fewer than 2 batches)'
  elif not np.isfinite(half):
    verdict = 'no interval (2 batches, no residual degrees of freedom)'
  elif ci[0] <= reference <= ci[1]:
    verdict = f'consistent with {reference:g}'
  else:
    verdict = ('flatter' if ci[0] > reference else 'steeper') + f' than {reference:g}'
  return dict(slope=slope, stderr=stderr, df=df, ci=ci, verdict=verdict)


def doubling_ratios(batches, median_grad_norms):
  """Grad norm ratio between consecutive measured batches, per doubling, beside 2**-0.5 = 0.707.

  Arms sharing a batch are combined by geometric mean. For batches not exactly 2x apart the
  ratio is normalised to one doubling: (g2 / g1) ** (1 / log2(B2 / B1)).
  """
  logs = {}
  for b, g in zip(batches, median_grad_norms):
    if np.isfinite(g) and g > 0:
      logs.setdefault(b, []).append(np.log(g))
  points = sorted((b, float(np.exp(np.mean(v)))) for b, v in logs.items())
  return [dict(ratio=g2 / g1, per_doubling=(g2 / g1)**(1 / np.log2(b2 / b1)),
               theory=NOISE_DOMINATED_DOUBLING, **{'from': b1, 'to': b2})
          for (b1, g1), (b2, g2) in zip(points, points[1:])]


def noise_scale_from_grad_norms(batches, grad_norms):
  """B_simple from the grad-norm curve: E|g_B|^2 = |G|^2 (1 + B_simple / B), fit by least squares
  of g^2 on 1/B. Medians of norms stand in for root-mean-square norms, so this is a cross-check,
  not a second exact estimate. nan when the fit's |G|^2 or noise term is not positive."""
  b, g = np.asarray(batches, float), np.asarray(grad_norms, float)
  ok = np.isfinite(b) & np.isfinite(g) & (b > 0)
  if len(set(b[ok])) < 2:
    return np.nan
  x, y = 1 / b[ok], g[ok]**2
  slope = ((x - x.mean()) @ (y - y.mean())) / ((x - x.mean()) @ (x - x.mean()))
  intercept = y.mean() - slope * x.mean()
  return float(slope / intercept) if intercept > 0 and slope > 0 else np.nan
