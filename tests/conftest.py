"""Fixtures shared by test files."""
import os

import pytest

import rljax_cli


@pytest.fixture(scope='session')
def tiny(tmp_path_factory):
  """A directory that all xdist workers of this session share (dataset, warm start, XLA cache),
  holding the uninterrupted tiny reference run in TINY/reference."""
  base = tmp_path_factory.getbasetemp()
  if os.environ.get('PYTEST_XDIST_WORKER'):  # per-worker dirs; their parent is this session's
    base = base.parent
  # Named after the xdist run too: concurrent sessions on one machine have been seen to share
  # pytest's numbered directory.
  root = base / f'rljax_tiny_run_{os.environ.get("PYTEST_XDIST_TESTRUNUID", "")}'
  rljax_cli.shared_reference(root)
  return root
