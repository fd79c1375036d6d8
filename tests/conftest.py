"""Test session setup: 8 fake CPU devices in this process, so sharding tests use real meshes, fast
XLA:CPU compiles, and one persistent XLA cache.

The device count is set only while JAX starts its backend, then removed again, so subprocesses
started by tests (training runs, multi-process runs) get the devices they ask for. FAST_COMPILE
stays in XLA_FLAGS for this process and every subprocess: LLVM at -O0 and XLA:CPU's classic
fusion emitters compile the same HLO several times faster, and compiling small programs is most
of the suite's time (docs/design/test_speed.md). RLJAX_TEST_FAST_COMPILE=0 compiles as the
product does.

One persistent XLA cache serves both xdist workers and every subprocess (they inherit its
variables), kept between sessions in RLJAX_TEST_XLA_CACHE (default ~/.cache/rljax/test-xla): a
program unchanged since the last run is read back rather than compiled again. The main process
empties it when it has grown past CACHE_LIMIT_BYTES.
"""
import os

FAST_COMPILE = '--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false'
_flags = os.environ.get('XLA_FLAGS', '')
if os.environ.get('RLJAX_TEST_FAST_COMPILE', '1') == '1' and FAST_COMPILE not in _flags:
  _flags = f'{_flags} {FAST_COMPILE}'.strip()   # (xdist workers inherit it from the main process)
os.environ['XLA_FLAGS'] = f'{_flags} --xla_force_host_platform_device_count=8'
CACHE_LIMIT_BYTES = 2 ** 30
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', os.environ.get('RLJAX_TEST_XLA_CACHE') or
                      os.path.join(os.path.expanduser('~'), '.cache', 'rljax', 'test-xla'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.devices()  # starts the CPU backend with 8 devices
os.environ['XLA_FLAGS'] = _flags

import shutil  # pylint: disable=g-import-not-at-top,wrong-import-position
import subprocess  # pylint: disable=g-import-not-at-top,wrong-import-position

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

import rljax_cli  # pylint: disable=g-import-not-at-top,wrong-import-position


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


def pytest_configure(config):
  cache = os.environ['JAX_COMPILATION_CACHE_DIR']
  if not hasattr(config, 'workerinput') and os.path.isdir(cache):   # the main process, first
    entries = [entry for entry in os.scandir(cache) if entry.is_file()]
    if sum(entry.stat().st_size for entry in entries) > CACHE_LIMIT_BYTES:
      for entry in entries:
        os.remove(entry.path)


SLURM_DIR = os.environ.get('RLJAX_SLURM_DIR', '/tmp/rljax-slurm')


@pytest.fixture(scope='session')
def slurm_env():
  """The environment that reaches the one-node cluster of .ci/slurm.sh; a skip where none runs
  (.ci/run starts one and sets RLJAX_REQUIRE_SLURM=1, which makes a missing cluster a failure)."""
  env = dict(os.environ, SLURM_CONF=os.path.join(SLURM_DIR, 'slurm.conf'))
  up = os.path.exists(env['SLURM_CONF']) and shutil.which('sinfo') and subprocess.run(
      ['sinfo', '-h'], env=env, capture_output=True, timeout=30, check=False).returncode == 0
  if not up:
    if os.environ.get('RLJAX_REQUIRE_SLURM') == '1':
      pytest.fail(f'no SLURM cluster answers at {env["SLURM_CONF"]} (.ci/slurm.sh start)')
    pytest.skip('no SLURM cluster here: start one with .ci/slurm.sh start')
  return env
