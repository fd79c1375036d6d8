"""The decision's error rates and power, measured on synthetic sweeps (tests/synthetic_protocol.py:
logs in the workdir format with the committed runs' noise) passed through the real report code
and rljax.protocol.driver's adaptive seeds. docs/guide/protocol.md quotes these numbers."""
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
