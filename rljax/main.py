"""rljax command line: `python -m rljax.main --config=configs/grpo.py:P=1024 --workdir=DIR`.

Trains one configuration (config.mode == 'train', the default) or runs the align-then-accelerate
protocol (config.mode == 'protocol'). Exit codes (docs/reference/reliability.md):
  0   done                       2   bad input: one `rljax: error: ...` line, nothing compiled
  3   K non-finite updates in a row, or a state that is not finite (the last good checkpoint
      is kept)
  4   checkpoint storage: no checkpoint in the workdir is intact, or one cannot be written
  75  stopped by SIGTERM / SIGINT after saving a checkpoint of the current step: re-run to resume

Multi-host: one process per host. On a multi-worker Cloud TPU VM or under SLURM / Open MPI, JAX
finds the coordinator itself; elsewhere pass --coordinator_address, --num_processes and
--process_id (or RLJAX_COORDINATOR_ADDRESS, RLJAX_NUM_PROCESSES, RLJAX_PROCESS_ID).
"""
import functools
import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from rljax import cli
from rljax.train import upgrades

FLAGS = flags.FLAGS
# cli.parse_flags, naming what replaced a field an earlier rljax had
parse_flags = functools.partial(cli.parse_flags, renamed=upgrades.RENAMED_FLAGS)


def define_flags(flag_values):
  """rljax.main's command line, on `flag_values` (flags.FLAGS when run; tests use their own)."""
  config_flags.DEFINE_config_file('config', None, 'Config file, e.g. configs/grpo.py:runlocal',
                                  flag_values=flag_values, lock_config=True)
  flags.DEFINE_string('workdir', None, 'Where metrics, checkpoints and reports go.',
                      flag_values=flag_values)
  flags.DEFINE_string('coordinator_address', os.environ.get('RLJAX_COORDINATOR_ADDRESS'),
                      'host:port of process 0, for multi-process runs.', flag_values=flag_values)
  flags.DEFINE_integer('num_processes', int(os.environ.get('RLJAX_NUM_PROCESSES', 1)),
                       'Number of processes (hosts).', flag_values=flag_values)
  flags.DEFINE_integer('process_id', int(os.environ.get('RLJAX_PROCESS_ID', 0)),
                       'Index of this process.', flag_values=flag_values)
  flags.mark_flags_as_required(['config', 'workdir'], flag_values=flag_values)


def _cluster_detected():
  """A multi-host environment that jax.distributed.initialize() can read on its own."""
  tpu_hosts = os.environ.get('TPU_WORKER_HOSTNAMES', '')
  return (',' in tpu_hosts or int(os.environ.get('SLURM_NTASKS', 1)) > 1 or
          int(os.environ.get('OMPI_COMM_WORLD_SIZE', 1)) > 1)


def initialize_distributed():
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')  # CPU meshes across processes
  if FLAGS.coordinator_address:
    jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  elif _cluster_detected():
    jax.distributed.initialize()


def guarded(fn):
  """fn(stop) under the exit-code contract: every failure becomes its one line on stderr and its
  exit code; `stop` (preemption.StopRequest) ends a run at its next step with a checkpoint."""
  # Imported here, after flag parsing: jax reads XLA_FLAGS when first imported.
  from rljax.train import checkpoint  # pylint: disable=g-import-not-at-top
  from rljax import preemption  # pylint: disable=g-import-not-at-top
  try:
    with preemption.StopRequest() as stop:
      fn(stop)
  except ValueError as error:  # bad input
    cli.fail(error, cli.EXIT_BAD_INPUT)
  except FloatingPointError as error:  # persistent NaN / inf
    cli.fail(error, cli.EXIT_NON_FINITE)
  except (checkpoint.Damaged, checkpoint.WriteFailed, OSError) as error:   # the disk, or the
    cli.fail(error, cli.EXIT_STORAGE, wait_for_threads=False)   # cluster's jobs: not the input
  except preemption.Preempted as stopped:
    print(f'rljax: {stopped}', file=sys.stderr, flush=True)
    sys.exit(preemption.EXIT_CODE)


def run(config, workdir):
  """Trains `config` (or runs the protocol) in `workdir`, guarded."""
  def go(stop):
    from rljax.protocol import driver as protocol  # pylint: disable=g-import-not-at-top
    from rljax.train import loop as train  # pylint: disable=g-import-not-at-top
    if config.mode == 'protocol':
      protocol.run(config, workdir, stop)
      return
    import jax  # pylint: disable=g-import-not-at-top
    from rljax.aot import planner as plan  # pylint: disable=g-import-not-at-top
    from rljax.train import run as run_lib  # pylint: disable=g-import-not-at-top
    shape = run_lib.checked_shape(config)   # checked and set up abstractly once
    line = plan.preflight(shape)   # every process refuses what cannot fit
    if jax.process_index() == 0:   # one line per run, not one per process
      print(line, flush=True)
    train.train(config, workdir, stop, shape)
  guarded(go)


class _NoCheckpointIOTracebacks(logging.logging.Filter):
  """orbax (and asyncio, for its unawaited writes) log each failed checkpoint write with a
  traceback; rljax says it in one line."""

  def filter(self, record):
    return not (record.exc_info or 'exception was never retrieved' in str(record.msg)) or not (
        f'{os.sep}orbax{os.sep}' in record.pathname or record.name == 'asyncio')


class _NoDatasetNotices(logging.logging.Filter):
  """TFDS warns of its own normal operation each time a dataset is opened (a custom config, a
  folder still being built): three long lines per run that say nothing to act on."""

  NOTICES = ('Using custom data configuration', 'has no dataset_info.json')

  def filter(self, record):
    return f'{os.sep}tensorflow_datasets{os.sep}' not in record.pathname or not any(
        notice in record.getMessage() for notice in self.NOTICES)


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments: {argv[1:]}', cli.EXIT_BAD_INPUT)
  if not FLAGS['verbosity'].present:  # orbax and TFDS are chatty at INFO
    logging.set_verbosity(logging.WARNING)
  logging.get_absl_handler().addFilter(_NoCheckpointIOTracebacks())
  logging.get_absl_handler().addFilter(_NoDatasetNotices())
  sys.unraisablehook = cli.drop_checkpoint_io_noise
  initialize_distributed()
  run(FLAGS.config, FLAGS.workdir)


if __name__ == '__main__':
  define_flags(FLAGS)
  app.run(main, flags_parser=parse_flags)
