"""Statistics of training logs, in plain numpy: what the trainer and the protocol's report share."""
import collections

import numpy as np

NOISE_KEYS = ('grad_sq_small', 'grad_sq_big', 'b_small', 'b_big')


def noise_scale(g_small_sq, g_big_sq, b_small, b_big):
  """McCandlish et al. (2018) simple noise scale B_simple = tr(Sigma) / |G|^2, in batch units.

  E|g_b|^2 = |G|^2 + tr(Sigma) / b at any batch b, so squared norms at two batch sizes give
  unbiased estimates of |G|^2 and tr(Sigma). Both are averaged over steps BEFORE the ratio: one
  step's |G|^2 estimate is very noisy (often negative) and a ratio of noisy numbers is biased.
  Takes per-step arrays or scalars; steps with a missing value are skipped. nan when the averaged
  |G|^2 is not positive (the noise swamps the signal over these steps: not estimable).
  """
  small, big, bs, bb = np.broadcast_arrays(
      *(np.atleast_1d(np.asarray(v, float)) for v in (g_small_sq, g_big_sq, b_small, b_big)))
  ok = np.isfinite(small) & np.isfinite(big) & np.isfinite(bs) & np.isfinite(bb) & (bb > bs)
  if not ok.any():
    return np.nan
  small, big, bs, bb = small[ok], big[ok], bs[ok], bb[ok]
  grad_sq = np.mean((bb * big - bs * small) / (bb - bs))
  trace = np.mean((small - big) / (1 / bs - 1 / bb))
  return float(trace / grad_sq) if grad_sq > 0 else np.nan


class NoiseScaleWindow:
  """B_simple over the last `steps` training rows: one step alone is mostly noise.

  Starts from the rows already logged, so a resumed run goes on with the same window.
  """

  def __init__(self, rows, steps=50):
    self._terms = collections.deque(
        ([row[k] for k in NOISE_KEYS] for row in rows if 'grad_sq_small' in row), maxlen=steps)

  def update(self, row):
    """Adds `row`'s terms and sets row['noise_scale'] (None: not estimable); rows without
    micro-batches have no terms and get no field."""
    if 'grad_sq_small' in row:
      self._terms.append([row[k] for k in NOISE_KEYS])
      value = noise_scale(*np.transpose(self._terms))
      row['noise_scale'] = value if np.isfinite(value) else None
