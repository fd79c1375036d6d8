"""One protocol run as a scheduler's job (rljax.protocol.jobs):

  python -m rljax.job RUN_DIR [COMPILATION_CACHE_DIR]

trains the config the protocol's driver recorded in RUN_DIR/config.json, resuming from RUN_DIR's
checkpoints, and writes RUN_DIR/done.json; the exit codes are rljax.main's.
"""
import os
import sys

import ml_collections

from rljax import cli
from rljax import files


def main(argv):
  if len(argv) not in (2, 3):
    cli.fail('usage: python -m rljax.job RUN_DIR [COMPILATION_CACHE_DIR]',
             cli.EXIT_BAD_INPUT)
  run_dir = argv[1]
  from rljax import main as rljax_main  # pylint: disable=g-import-not-at-top
  from rljax.protocol import runs  # pylint: disable=g-import-not-at-top
  recorded = files.read_json(os.path.join(run_dir, 'config.json'))
  if recorded is None:
    cli.fail(f'{run_dir} holds no config.json: the driver records it before it submits a job',
             cli.EXIT_BAD_INPUT)
  if len(argv) == 3:
    import jax  # pylint: disable=g-import-not-at-top
    jax.config.update('jax_compilation_cache_dir', argv[2])
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)
  config = ml_collections.ConfigDict(recorded)
  rljax_main.guarded(lambda stop: runs.run_once(config, run_dir, f'job {run_dir}', stop))


if __name__ == '__main__':
  main(sys.argv)
