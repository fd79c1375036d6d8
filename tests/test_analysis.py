"""`python -m rljax.analysis` on the protocol runs whose logs the repository keeps: the report they
document is rebuilt from their raw logs: report.md byte for byte, report.json leaf by leaf."""
import glob
import json
import math
import os
import subprocess
import sys
import tarfile

import pytest

RUNS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), '..', 'docs', 'guide', 'protocol',
                                     '*.tar.xz')))


def test_the_repository_keeps_protocol_runs():
  assert RUNS, 'no docs/guide/protocol/*.tar.xz'


@pytest.mark.e2e
@pytest.mark.parametrize('archive', RUNS, ids=os.path.basename)
def test_analysis_rebuilds_the_committed_report(archive, tmp_path):
  with tarfile.open(archive) as tar:
    tar.extractall(tmp_path, filter='data')
  committed = (tmp_path / 'report.json').read_bytes()
  committed_md = (tmp_path / 'report.md').read_bytes()
  (tmp_path / 'report.json').unlink()
  (tmp_path / 'report.md').unlink()
  result = subprocess.run([sys.executable, '-m', 'rljax.analysis', f'--workdir={tmp_path}'],
                          capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr
  assert_same_report(json.loads((tmp_path / 'report.json').read_bytes()), json.loads(committed))
  assert (tmp_path / 'report.md').read_bytes() == committed_md


# Another BLAS build sums in another order: the last bit of some float leaves changes (2e-16
# relative seen on two x86-64 machines). 1e-12 is four orders above that and far below any digit
# the report prints; every other leaf (keys, strings, counts, verdicts) must be identical.
REL_TOL = 1e-12


def assert_same_report(got, want, where='report'):
  if isinstance(want, dict):
    assert isinstance(got, dict) and sorted(got) == sorted(want), where
    for key in want:
      assert_same_report(got[key], want[key], f'{where}.{key}')
  elif isinstance(want, list):
    assert isinstance(got, list) and len(got) == len(want), where
    for i, (a, b) in enumerate(zip(got, want)):
      assert_same_report(a, b, f'{where}[{i}]')
  elif isinstance(want, float) and not isinstance(got, bool):
    assert isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=REL_TOL), \
        (where, got, want)
  else:
    assert type(got) is type(want) and got == want, (where, got, want)


def test_the_report_comparison_fails_where_it_must():
  report = {'a': [1.0, 2, 'x'], 'b': {'p': 0.25}}
  assert_same_report(json.loads(json.dumps(report)), report)
  for wrong in ({'a': [1.0 + 1e-9, 2, 'x'], 'b': {'p': 0.25}},
                {'a': [1.0, 3, 'x'], 'b': {'p': 0.25}},
                {'a': [1.0, 2, 'y'], 'b': {'p': 0.25}}, {'a': [1.0, 2], 'b': {'p': 0.25}},
                {'a': [1.0, 2, 'x'], 'b': {'q': 0.25}}):
    with pytest.raises(AssertionError):
      assert_same_report(wrong, report)


DEEP = [r for r in RUNS if 'deep' in os.path.basename(r)   # full deep sweeps: a quick run has
        and 'quick' not in os.path.basename(r)]           # no sweep to take a quick view of


@pytest.mark.e2e
@pytest.mark.parametrize('archive', DEEP, ids=os.path.basename)
def test_the_quick_view_of_a_deep_sweep_answers_a_larger_batch_at_a_third_of_its_samples(
    archive, tmp_path):
  with tarfile.open(archive) as tar:
    tar.extractall(tmp_path / 'sweep', filter='data')
  result = subprocess.run([sys.executable, '-m', 'rljax.analysis',
                           f'--workdir={tmp_path / "quick"}',
                           f'--quick_from={tmp_path / "sweep"}', '--seeds=2',
                           '--calibration_seeds=1'], capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr
  quick = json.loads((tmp_path / 'quick' / 'report.json').read_bytes())
  full = json.loads((tmp_path / 'sweep' / 'report.json').read_bytes())
  assert quick['mode'] == 'quick' and quick['recommended'] > full['base_batch']
  assert quick['cost']['quick'] <= full['cost']['full_sweep'] / 3
  sweep_row = next(c for c in full['decision']['candidates'] if c['batch'] == quick['recommended'])
  assert sweep_row['relative_wallclock_ci'][1] < 1   # the sweep also measured the quick pick faster
