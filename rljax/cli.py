"""The command line's contract, shared by every `python -m rljax.X` command: exit codes, and every
failure as one `rljax: error: ...` line on stderr (no traceback)."""
import os
import re
import sys

from absl import flags

EXIT_BAD_INPUT = 2
EXIT_NON_FINITE = 3
EXIT_STORAGE = 4


def fail(message, code, wait_for_threads=True):
  """Prints the one error line and exits. After a failed checkpoint write, orbax's threads wait
  for signals that will never come: `wait_for_threads=False` exits without joining them."""
  message = str(message).replace('\n', ' ')   # one line, always
  print(f'rljax: error: {message}', file=sys.stderr, flush=True)
  if not wait_for_threads:
    sys.stdout.flush()
    os._exit(code)  # pylint: disable=protected-access
  sys.exit(code)


def drop_checkpoint_io_noise(unraisable, previous=sys.unraisablehook):
  """A failed checkpoint read or write closes orbax's event loop while tensorstore I/O is in
  flight; each then reports 'Event loop is closed', or its read's error that nothing awaits any
  more, as an unraisable traceback: noise, since the failure itself is reported in one line."""
  code = getattr(unraisable.object, 'cr_code', None)   # a coroutine's
  from_orbax = code is not None and f'{os.sep}orbax{os.sep}' in code.co_filename
  if not (from_orbax or isinstance(unraisable.exc_value, RuntimeError) and
          str(unraisable.exc_value) == 'Event loop is closed'):
    previous(unraisable)


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


def flag_error_message(error, argv, renamed=None):
  """One line naming the bad flag, config file or config field, from whatever absl / ml_collections
  raised while parsing `argv`; a field an earlier rljax had says what replaced it (`renamed`:
  old dotted name -> the new setting)."""
  config_file = _config_file(argv)
  if config_file is not None and not os.path.isfile(config_file):
    return f'no config file {config_file}'
  old = [name for name in renamed or {} if any(arg.startswith(f'--config.{name}=') for arg in argv)]
  if old:
    return f'config field {old[0]} is gone: {renamed[old[0]]}'
  if isinstance(error, flags.UnrecognizedFlagError) and error.flagname.startswith('config.'):
    return f'unknown config field {error.flagname[len("config."):]}'
  if isinstance(error, (AttributeError, KeyError)):  # a --config.a.b=... that names no field
    return _unknown_field(error, argv)
  if '\n' not in str(error):
    return str(error)
  root = list(_causes(error))[-1]   # the config file's own exception, behind absl's wrapping
  lines = [line.strip() for line in str(root).splitlines() if line.strip()]
  return lines[-1] if lines else str(error).splitlines()[0]


def parse_flags(argv, flag_values=None, renamed=None):
  """absl flag parsing where every failure is one `rljax: error:` line and exit code 2."""
  flag_values = flags.FLAGS if flag_values is None else flag_values
  try:
    remaining = flag_values(argv)
    flag_values.config.keys()   # a config file that failed to load raises only when first read
    return remaining
  except Exception as error:  # pylint: disable=broad-except
    fail(flag_error_message(error, argv, renamed), EXIT_BAD_INPUT)
