"""rljax command line: `python -m rljax.main --config=configs/grpo.py:P=1024 --workdir=DIR`.

Trains one configuration (config.mode == 'train', the default) or runs the align-then-accelerate
protocol (config.mode == 'protocol'). Exit codes (docs/reliability.md):
  0   done                       2   bad input: one `rljax: error: ...` line, nothing compiled
  3   K non-finite updates in a row (the last good checkpoint is kept)
  75  stopped by SIGTERM / SIGINT after saving a checkpoint of the current step: re-run to resume

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

EXIT_BAD_INPUT = 2
EXIT_NON_FINITE = 3

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


def fail(message, code):
  print(f'rljax: error: {message}', file=sys.stderr, flush=True)
  sys.exit(code)


def flag_error_message(error, argv):
  """One line naming the bad flag or config field, from whatever absl / ml_collections raised."""
  if isinstance(error, flags.UnrecognizedFlagError) and error.flagname.startswith('config.'):
    return f'unknown config field {error.flagname[len("config."):]!r} (--{error.flagname})'
  if isinstance(error, (AttributeError, KeyError)):  # a top-level --config.<name> that does not exist
    name = str(error).strip('"\'')
    used = [arg for arg in argv
            if arg.startswith('--config.') and name in arg.partition('=')[0].split('.')[1:]]
    return f'unknown config field {name!r}' + (f' ({used[0]})' if used else '')
  if '\n' not in str(error):
    return str(error)
  root = error   # the config file's own exception, behind absl's wrapping and traceback text
  while root.__cause__ or (root.__context__ and not root.__suppress_context__):
    root = root.__cause__ or root.__context__
  lines = [line.strip() for line in str(root).splitlines() if line.strip()]
  return lines[-1] if lines else str(error).splitlines()[0]


def parse_flags(argv):
  """absl flag parsing where every failure is one `rljax: error:` line and exit code 2."""
  try:
    return flags.FLAGS(argv)
  except Exception as error:  # pylint: disable=broad-except
    fail(flag_error_message(error, argv), EXIT_BAD_INPUT)


def main(argv):
  if len(argv) > 1:
    fail(f'unexpected arguments: {argv[1:]}', EXIT_BAD_INPUT)
  if not flags.FLAGS['verbosity'].present:  # orbax and TFDS are chatty at INFO
    logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  initialize_distributed()
  # Imported after flag parsing: jax reads XLA_FLAGS when first imported.
  from rljax import preemption  # pylint: disable=g-import-not-at-top
  from rljax import protocol  # pylint: disable=g-import-not-at-top
  from rljax import train  # pylint: disable=g-import-not-at-top
  try:
    with preemption.StopRequest() as stop:
      if config.get('mode', 'train') == 'protocol':
        protocol.run(config, _WORKDIR.value)
      else:
        from rljax import plan  # pylint: disable=g-import-not-at-top
        print(plan.preflight(config), flush=True)   # model, devices, memory; refuses what cannot fit
        train.train(config, _WORKDIR.value, stop)
  except ValueError as error:  # bad input
    fail(error, EXIT_BAD_INPUT)
  except FloatingPointError as error:  # persistent NaN / inf
    fail(error, EXIT_NON_FINITE)
  except preemption.Preempted as stopped:
    print(f'rljax: {stopped}', file=sys.stderr, flush=True)
    sys.exit(preemption.EXIT_CODE)


if __name__ == '__main__':
  flags.mark_flags_as_required(['config', 'workdir'])
  app.run(main, flags_parser=parse_flags)
