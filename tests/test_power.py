"""The decision's error rates and power, measured on synthetic sweeps (tests/synthetic_protocol.py:
logs in the workdir format with the committed runs' noise) passed through the real report code
and rljax.protocol's adaptive seeds. docs/guide/protocol.md quotes these numbers."""
import numpy as np
import pytest

import synthetic_protocol as sp


def shares(results, key):
  values = [key(r) for r in results]
  return {v: values.count(v) / len(values) for v in set(values)}


def test_defaults_rarely_call_a_batch_faster_when_none_is(tmp_path):
  """All batches equal: a false 'faster' in at most 5% of 80 sweeps (nominal 2.5% per batch)."""
  results = sp.replicates(str(tmp_path), sp.NULL, 80, np.random.default_rng(0))
  assert shares(results, lambda r: r[1]).get('faster', 0.0) <= 0.05


def test_defaults_never_recommend_the_truly_slower_batch(tmp_path):
  """The paper's truth: batch 2048 is 1.23x slower than the base; recommended in <= 1%."""
  results = sp.replicates(str(tmp_path), sp.PAPER, 80, np.random.default_rng(1))
  assert shares(results, lambda r: r[0]).get(2048, 0.0) <= 0.01


def calibration_gaps(results, truly_fastest, bins=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0001)):
  """|mean reported P(fastest) - observed share truly fastest| per bin with >= 20 entries."""
  p = np.array([pf for r in results for pf in r[2].values()])
  hit = np.array([b == truly_fastest for r in results for b in r[2]])
  which = np.digitize(p, bins) - 1
  return [abs(p[which == k].mean() - hit[which == k].mean())
          for k in range(len(bins) - 1) if (which == k).sum() >= 20]


@pytest.mark.e2e
def test_power_at_the_paper_truth_with_the_powered_design(tmp_path):
  """12 seeds per arm, evals every 256 samples, 10 throughput rounds: batch 1024 (truly 0.71x the
  base's time) is recommended in >= 80% of 200 sweeps; P(fastest) calibrated within 0.1 per bin."""
  results = sp.replicates(str(tmp_path), sp.PAPER, 200, np.random.default_rng(2), seeds=12,
                          rounds=10, eval_every=256)
  assert shares(results, lambda r: r[0]).get(1024, 0.0) >= 0.80
  assert shares(results, lambda r: r[0]).get(2048, 0.0) <= 0.01
  assert max(calibration_gaps(results, 1024)) <= 0.1


@pytest.mark.e2e
def test_null_with_the_powered_design(tmp_path):
  results = sp.replicates(str(tmp_path), sp.NULL, 200, np.random.default_rng(3), seeds=12,
                          rounds=10, eval_every=256)
  assert shares(results, lambda r: r[1]).get('faster', 0.0) <= 0.05
