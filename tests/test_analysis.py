"""`python -m rljax.analysis` on the protocol runs whose logs the repository keeps: the report they
document is rebuilt from their raw logs, byte for byte."""
import glob
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
  (tmp_path / 'report.json').unlink()
  result = subprocess.run([sys.executable, '-m', 'rljax.analysis', f'--workdir={tmp_path}'],
                          capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr
  assert (tmp_path / 'report.json').read_bytes() == committed
