"""rljax command line: `python -m rljax.main --config=configs/grpo.py:P=1024 --workdir=DIR`.

Trains one configuration (config.mode == 'train', the default) or runs the align-then-accelerate
protocol (config.mode == 'protocol'). Exit codes (docs/reference/reliability.md):
  0   done                       2   bad input: one `rljax: error: ...` line, nothing compiled
  3   K non-finite updates in a row, or a state that is not finite (the last good checkpoint is kept)
  4   checkpoint storage: no checkpoint in the workdir is intact, or one cannot be written
  75  stopped by SIGTERM / SIGINT after saving a checkpoint of the current step: re-run to resume

Multi-host: one process per host. On a multi-worker Cloud TPU VM or under SLURM / Open MPI, JAX
finds the coordinator itself; elsewhere pass --coordinator_address, --num_processes and
--process_id (or RLJAX_COORDINATOR_ADDRESS, RLJAX_NUM_PROCESSES, RLJAX_PROCESS_ID).
"""
import os
import re
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

FLAGS = flags.FLAGS

EXIT_BAD_INPUT = 2
EXIT_NON_FINITE = 3
EXIT_STORAGE = 4


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


def fail(message, code, wait_for_threads=True):
  """Prints the one error line and exits. After a failed checkpoint write, orbax's threads wait
  for signals that will never come: `wait_for_threads=False` exits without joining them."""
  message = str(message).replace('\n', ' ')   # one line, always
  print(f'rljax: error: {message}', file=sys.stderr, flush=True)
  if not wait_for_threads:
    sys.stdout.flush()
    os._exit(code)
  sys.exit(code)


def _causes(error):
  """error, then what it was raised from or during, down to the root."""
  while error is not None:
    yield error
    error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)


def _config_file(argv):
  """The file of --config=FILE[:ARGS] or --config FILE[:ARGS]; None without one."""
  for i, arg in enumerate(argv):
    if arg.startswith(('--config=', '-config=')):
      return arg.partition('=')[2].partition(':')[0]
    if arg in ('--config', '-config') and i + 1 < len(argv):
      return argv[i + 1].partition(':')[0]
  return None


def _unknown_field(error, argv):
  """'unknown config field a.b (did you mean a.c?)' from ml_collections' KeyError / AttributeError
  (whose text is a repr of a repr, with the suggestion on a second line)."""
  while error.args and isinstance(error.args[0], BaseException):
    error = error.args[0]
  text = str(error.args[0]) if error.args else str(error)
  suggestion = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text)
  name = re.search(r'^\W*(?:Key ")?([^\'"\n]+)', text)
  name = suggestion.group(2) if suggestion else (name.group(1) if name else text)
  paths = [arg.partition('=')[0].lstrip('-').split('.')[1:] for arg in argv
           if arg.startswith('--config.')]
  path = next((p for p in paths if name in p), [name])
  message = f'unknown config field {".".join(path)}'
  if suggestion:
    fixed = [suggestion.group(1) if part == name else part for part in path]
    message += f' (did you mean {".".join(fixed)}?)'
  return message


def flag_error_message(error, argv):
  """One line naming the bad flag, config file or config field, from whatever absl / ml_collections
  raised while parsing `argv`."""
  config_file = _config_file(argv)
  if config_file is not None and not os.path.isfile(config_file):
    return f'no config file {config_file}'
  if isinstance(error, flags.UnrecognizedFlagError) and error.flagname.startswith('config.'):
    return f'unknown config field {error.flagname[len("config."):]}'
  if isinstance(error, (AttributeError, KeyError)):  # a --config.a.b=... that names no field
    return _unknown_field(error, argv)
  if '\n' not in str(error):
    return str(error)
  root = list(_causes(error))[-1]   # the config file's own exception, behind absl's wrapping
  lines = [line.strip() for line in str(root).splitlines() if line.strip()]
  return lines[-1] if lines else str(error).splitlines()[0]


def parse_flags(argv, flag_values=None):
  """absl flag parsing where every failure is one `rljax: error:` line and exit code 2."""
  flag_values = FLAGS if flag_values is None else flag_values
  try:
    remaining = flag_values(argv)
    flag_values.config.keys()   # a config file that failed to load raises only when first read
    return remaining
  except Exception as error:  # pylint: disable=broad-except
    fail(flag_error_message(error, argv), EXIT_BAD_INPUT)


def run(config, workdir):
  """Trains `config` (or runs the protocol) in `workdir`; every failure of the exit-code contract
  becomes its line on stderr and its exit code."""
  # Imported here, after flag parsing: jax reads XLA_FLAGS when first imported.
  from rljax import checkpoint  # pylint: disable=g-import-not-at-top
  from rljax import preemption  # pylint: disable=g-import-not-at-top
  from rljax import protocol  # pylint: disable=g-import-not-at-top
  from rljax import train  # pylint: disable=g-import-not-at-top
  try:
    with preemption.StopRequest() as stop:
      if config.get('mode', 'train') == 'protocol':
        protocol.run(config, workdir)
      else:
        import jax  # pylint: disable=g-import-not-at-top
        from rljax import plan  # pylint: disable=g-import-not-at-top
        line = plan.preflight(config)   # every process refuses what cannot fit
        if jax.process_index() == 0:   # one line per run, not one per process
          print(line, flush=True)
        train.train(config, workdir, stop)
  except ValueError as error:  # bad input
    fail(error, EXIT_BAD_INPUT)
  except FloatingPointError as error:  # persistent NaN / inf
    fail(error, EXIT_NON_FINITE)
  except (checkpoint.Damaged, checkpoint.WriteFailed, OSError) as error:  # the disk, not the input
    fail(error, EXIT_STORAGE, wait_for_threads=False)
  except preemption.Preempted as stopped:
    print(f'rljax: {stopped}', file=sys.stderr, flush=True)
    sys.exit(preemption.EXIT_CODE)


class _NoCheckpointIOTracebacks(logging.logging.Filter):
  """orbax (and asyncio, for its unawaited writes) log each failed checkpoint write with a
  traceback; rljax says it in one line."""

  def filter(self, record):
    return not (record.exc_info or 'exception was never retrieved' in str(record.msg)) or not (
        f'{os.sep}orbax{os.sep}' in record.pathname or record.name == 'asyncio')


def _drop_closed_loop_callbacks(unraisable, previous=sys.unraisablehook):
  """A failed checkpoint read or write closes orbax's event loop while tensorstore I/O is in
  flight; each then reports 'Event loop is closed' as an unraisable traceback: noise, since the
  failure itself is reported in one line."""
  if not (isinstance(unraisable.exc_value, RuntimeError) and
          str(unraisable.exc_value) == 'Event loop is closed'):
    previous(unraisable)


def main(argv):
  if len(argv) > 1:
    fail(f'unexpected arguments: {argv[1:]}', EXIT_BAD_INPUT)
  if not FLAGS['verbosity'].present:  # orbax and TFDS are chatty at INFO
    logging.set_verbosity(logging.WARNING)
  logging.get_absl_handler().addFilter(_NoCheckpointIOTracebacks())
  sys.unraisablehook = _drop_closed_loop_callbacks
  initialize_distributed()
  run(FLAGS.config, FLAGS.workdir)


if __name__ == '__main__':
  define_flags(FLAGS)
  app.run(main, flags_parser=parse_flags)
