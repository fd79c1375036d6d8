"""Runs `python -m rljax.main` on a tiny GRPO config in real subprocesses and reads what a run
leaves behind: the harness of tests/test_reliability.py, tests/test_bad_input.py and of the kill
trials counted in docs/reference/reliability.md (`python tests/test_reliability.py --trials N`).

The tiny run: 1-digit addition (a dataset built here with TFDS), a 40-step supervised warm start
so rewards vary, P=4 x G=4, MAX_STEPS RL steps, a checkpoint every step. All subprocesses share one
persistent XLA cache, so only the first run of a session pays for compilation.
"""
import fcntl
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from rljax import files

REPO = pathlib.Path(__file__).resolve().parents[1]
MAX_STEPS = 8
# Fields that measure time: they differ between any two runs; every other field must match.
TIMING = frozenset({'step_time_s', 'rollout_time_s', 'reward_time_s', 'update_time_s',
                    'wallclock_s', 'samples_per_s', 'eval_time_s', 'auto_wait_s'})


def args(shared, workdir, *overrides):
  """The command line of the tiny run; later --config.x=... overrides win."""
  return [sys.executable, '-m', 'rljax.main', '--config=configs/grpo.py:runlocal,P=4,G=4',
          f'--workdir={workdir}', f'--config.data.dir={shared}/data', '--config.data.digits=1',
          '--config.data.num_train=2000', '--config.data.num_test=20',
          f'--config.warmstart.dir={shared}/warmstart', '--config.warmstart.min_steps=40',
          '--config.warmstart.max_steps=40', '--config.warmstart.eval_every=40',
          '--config.warmstart.batch=64', f'--config.train.max_steps={MAX_STEPS}',
          '--config.train.checkpoint_every=1', '--config.train.keep_checkpoints=3',
          '--config.train.eval_every=3', '--config.train.eval_size=20',
          '--config.train.micro_batch=8', '--config.train.log_every=3',
          *overrides]


def env(shared, **extra):
  """CPU unless RLJAX_TEST_PLATFORMS names another JAX platform (e.g. cuda, for a GPU check); the
  test session's XLA cache (tests/conftest.py), else one in SHARED."""
  return dict(os.environ, PYTHONPATH=str(REPO),
              JAX_PLATFORMS=os.environ.get('RLJAX_TEST_PLATFORMS', 'cpu'),
              JAX_COMPILATION_CACHE_DIR=os.environ.get('JAX_COMPILATION_CACHE_DIR',
                                                       f'{shared}/xla_cache'),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0', **extra)


def launch(shared, workdir, *overrides, extra_env=None):
  """Starts the tiny run; its stdout and stderr are appended to WORKDIR.log."""
  log = open(f'{workdir}.log', 'ab')  # pylint: disable=consider-using-with
  return subprocess.Popen(args(shared, workdir, *overrides), cwd=REPO, stdout=log,
                          stderr=subprocess.STDOUT, env=env(shared, **(extra_env or {})))


def run(shared, workdir, *overrides, timeout=900):
  """Runs the tiny run to its end; returns (exit code, the log so far)."""
  process = launch(shared, workdir, *overrides)
  code = process.wait(timeout)
  return code, log(workdir)


def log(workdir):
  path = f'{workdir}.log'
  return open(path, errors='replace').read() if os.path.exists(path) else ''


def rows(workdir):
  """metrics.jsonl without its timing fields."""
  return [{k: v for k, v in row.items() if k not in TIMING}
          for row in files.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))]


def prompt_rows(workdir):
  """prompts.jsonl: the stream indices each step trained or skipped."""
  return files.read_jsonl(os.path.join(workdir, 'prompts.jsonl'))


def last_step(workdir):
  """The last training step logged so far (0: none)."""
  return max((row['step'] for row in rows(workdir) if not row.get('eval')), default=0)


def temporary(workdir):
  """The temporary directories of orbax saves in flight (or left by a killed one)."""
  try:
    return {name for name in os.listdir(os.path.join(workdir, 'checkpoints')) if 'tmp' in name}
  except FileNotFoundError:
    return set()


def saving(workdir):
  return bool(temporary(workdir))


def checkpoints(workdir):
  """({step: (state, meta)} of every readable step, {step: why} of those that fail to restore)."""
  directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
  if not os.path.isdir(directory):
    return {}, {}
  manager = ocp.CheckpointManager(directory, item_names=('state', 'meta'),
                                  options=ocp.CheckpointManagerOptions(read_only=True))
  readable, unreadable = {}, {}
  for step in manager.all_steps():
    try:
      restored = manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
      readable[step] = (jax.device_get(restored.state), restored.meta)
    except Exception as error:  # pylint: disable=broad-except
      files = sorted(str(path.relative_to(directory))
                     for path in pathlib.Path(directory, str(step)).rglob('*'))
      unreadable[step] = f'{type(error).__name__}: {str(error)[:300]} (files: {files[:12]})'
  manager.close()
  return readable, unreadable


def same_arrays(a, b):
  """Bitwise equality of two pytrees of arrays (same structure, shapes, dtypes and bits)."""
  leaves_a, tree_a = jax.tree.flatten(a)
  leaves_b, tree_b = jax.tree.flatten(b)
  return tree_a == tree_b and all(
      x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
      for x, y in zip(map(np.asarray, leaves_a), map(np.asarray, leaves_b)))


def shared_reference(root, overrides=()):
  """The uninterrupted tiny run in ROOT/reference, made once per session even under xdist (the
  workers take a file lock); it also builds the dataset, the warm start and the XLA cache."""
  root = pathlib.Path(root)
  root.mkdir(parents=True, exist_ok=True)
  reference = root / 'reference'
  with open(root / 'lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (root / 'reference.done').exists():
      code, text = run(root, reference, *overrides)
      if code:
        raise RuntimeError(f'the reference run failed ({code}):\n{text[-3000:]}')
      (root / 'reference.done').touch()
  return reference
