"""rljax command line: `python -m rljax.main --config=configs/grpo.py:P=1024 --workdir=DIR`.

Trains one configuration (config.mode == 'train', the default) or runs the align-then-accelerate
protocol (config.mode == 'protocol'). Bad configs exit non-zero with one clear message.

Multi-host: one process per host. On a multi-worker Cloud TPU VM or under SLURM / Open MPI, JAX
finds the coordinator itself; elsewhere pass --coordinator_address, --num_processes and
--process_id (or RLJAX_COORDINATOR_ADDRESS, RLJAX_NUM_PROCESSES, RLJAX_PROCESS_ID).
"""
import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file, e.g. configs/grpo.py:runlocal',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where metrics, checkpoints and reports go.')
_COORDINATOR = flags.DEFINE_string('coordinator_address', os.environ.get('RLJAX_COORDINATOR_ADDRESS'),
                                   'host:port of process 0, for multi-process runs.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', int(os.environ.get('RLJAX_NUM_PROCESSES', 1)),
                                      'Number of processes (hosts).')
_PROCESS_ID = flags.DEFINE_integer('process_id', int(os.environ.get('RLJAX_PROCESS_ID', 0)),
                                   'Index of this process.')


def _cluster_detected():
  """A multi-host environment that jax.distributed.initialize() can read on its own."""
  tpu_hosts = os.environ.get('TPU_WORKER_HOSTNAMES', '')
  return (',' in tpu_hosts or int(os.environ.get('SLURM_NTASKS', 1)) > 1 or
          int(os.environ.get('OMPI_COMM_WORLD_SIZE', 1)) > 1)


def initialize_distributed():
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')  # CPU meshes across processes
  if _COORDINATOR.value:
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  elif _cluster_detected():
    jax.distributed.initialize()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not flags.FLAGS['verbosity'].present:  # orbax and TFDS are chatty at INFO
    logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  initialize_distributed()
  from rljax import train  # pylint: disable=g-import-not-at-top
  try:
    train.train(config, _WORKDIR.value)
  except ValueError as error:  # bad input: one clear message, non-zero exit
    print(f'rljax: error: {error}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  flags.mark_flags_as_required(['config', 'workdir'])
  app.run(main)
