"""The decision's error rates and power, measured on synthetic sweeps (tests/synthetic_protocol.py:
logs in the workdir format with the noise of the runlocal preset's runs) passed through the real
report code and rljax.protocol.driver's staged seeds, at the deep preset's defaults (8 seeds per
arm, up to 4 staged seeds, 16 throughput rounds, 4000 prompts per eval).

The full table (more replicates, other designs) is printed by
  RLJAX_POWER_REPLICATES=400 python -m pytest -s tests/test_power.py
and quoted in docs/guide/protocol_results.md."""
import os

import numpy as np
import pytest

import synthetic_protocol as sp

N = int(os.environ.get('RLJAX_POWER_REPLICATES', 80))
N_NULL = max(N, 200)   # a 5% bound needs more sweeps than a power of 80%: binomial sd 1% here
TRULY_FASTEST = min(sp.true_relative_time(sp.PAPER).items(), key=lambda kv: kv[1])[0]
TRULY_SLOWER = max(sp.true_relative_time(sp.PAPER).items(), key=lambda kv: kv[1])[0]


def wilson(k, n, z=1.96):
  """Wilson's 95% interval for a proportion k / n."""
  p, half = k / n, z * np.sqrt(k / n * (1 - k / n) / n + z**2 / (4 * n**2))
  return (p + z**2 / (2 * n) - half) / (1 + z**2 / n), (p + z**2 / (2 * n) + half) / (1 + z**2 / n)


def calibration_bins(results, truth_fastest, edges=(0, 0.2, 0.4, 0.6, 0.8, 1.0001)):
  """P(fastest) against how often that batch was truly the fastest, per bin of P(fastest)."""
  pairs = [(p, batch == truth_fastest) for r in results for batch, p in r[2].items()]
  bins = []
  for lo, hi in zip(edges[:-1], edges[1:]):
    inside = [(p, hit) for p, hit in pairs if lo <= p < hi]
    if len(inside) >= 30:
      bins.append((lo, np.mean([p for p, _ in inside]), np.mean([h for _, h in inside]),
                   len(inside)))
  return bins


@pytest.fixture(scope='module')
def paper(tmp_path_factory):
  return sp.replicates(str(tmp_path_factory.mktemp('paper')), sp.PAPER, N,
                       np.random.default_rng(1))


def test_no_batch_is_called_faster_when_none_is(tmp_path):
  """All batches equal: a false 'faster' (family-wise) in at most 5% of the sweeps."""
  results = sp.replicates(str(tmp_path), sp.NULL, N_NULL, np.random.default_rng(0))
  false = sum(r[1] == 'faster' for r in results)
  print(f'\nnull: false "faster" {false}/{N_NULL} {wilson(false, N_NULL)}')
  assert false / N_NULL <= 0.05


def test_power_at_the_papers_truth(paper):
  """Batch 1024 truly takes 0.71x the base's time, 256 0.80x. At the defaults: a truly faster
  batch recommended in >= 80% (73/80), the truly fastest (1024) in >= 80% (69/80), batch 2048
  (truly 1.23x slower) in <= 1%; P(fastest) within 0.1 of the observed rate per bin."""
  truth = sp.true_relative_time(sp.PAPER)
  faster = sum(r[0] is not None and truth[r[0]] < 1 for r in paper)
  hits = sum(r[0] == TRULY_FASTEST for r in paper)
  slower = sum(r[0] == TRULY_SLOWER for r in paper)
  bins = calibration_bins(paper, TRULY_FASTEST)
  print(f'\npaper: a truly faster batch recommended {faster}/{N} {wilson(faster, N)}; '
        f'{TRULY_FASTEST} {hits}/{N} {wilson(hits, N)}; {TRULY_SLOWER} {slower}/{N}; P(fastest) '
        'bins (from, mean P, observed, n): ' +
        '; '.join(f'{lo:.1f}: {p:.2f} vs {o:.2f} ({k})' for lo, p, o, k in bins))
  assert faster / N >= 0.8 and hits / N >= 0.8 and slower / N <= 0.01
  assert all(abs(p - observed) <= 0.1 for _, p, observed, _ in bins)
