"""What every launcher shares: one rljax run per batch size of a sweep.

Pure: no cloud, no scheduler, no xmanager; so dry runs and tests need nothing else.
"""

import argparse
import ast
import dataclasses
import os
import shlex
import sys

ENTRY = ('-m', 'rljax.main')  # what each job runs, after the python interpreter
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # jobs run from here


class LaunchError(ValueError):
  """Bad launcher input: the scripts print it as one line and exit 1."""


@dataclasses.dataclass(frozen=True)
class Point:
  """One sweep point: a full rljax run of its own, in its own workdir."""
  name: str  # e.g. rljax-P128: job name on the cluster
  workdir: str
  args: tuple[str, ...]  # arguments of `python -m rljax.main`


def parse_batches(text):
  """'128,256,1024' -> [128, 256, 1024]; duplicates would share a workdir, so they are errors."""
  items = [s.strip() for s in (text or '').split(',') if s.strip()]
  if not items:
    raise LaunchError('--batches is empty: give at least one batch size, e.g. --batches=128,256')
  try:
    batches = [int(s) for s in items]
  except ValueError:
    raise LaunchError(f'--batches={text!r}: expected comma-separated integers') from None
  if any(b <= 0 for b in batches):
    raise LaunchError(f'--batches={text!r}: batch sizes must be positive')
  if len(set(batches)) != len(batches):
    raise LaunchError(f'--batches={text!r}: repeated batch size')
  return batches


def batch_arg(algo):
  """The BATCH_ARG literal of rljax/algos/<algo>.py, or None: read from the source, since importing
  an algorithm imports jax, which the machine that launches need not have."""
  path = os.path.join(REPO, 'rljax', 'algos', f'{algo}.py')
  if not algo.isidentifier() or not os.path.isfile(path):
    return None
  with open(path, encoding='utf-8') as f:
    module = ast.parse(f.read())
  for node in module.body:
    if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and
        [getattr(target, 'id', None) for target in node.targets] == ['BATCH_ARG']):
      return node.value.value
  return None


def sweep_key(config, key=''):
  """The config argument the sweep sets: --sweep_key, else that of the algorithm the config file is
  named after."""
  if key:
    return key
  stem = os.path.splitext(os.path.basename(config.split(':', 1)[0]))[0]
  key = batch_arg(stem)
  if key is None:
    raise LaunchError(f'cannot tell which config argument is the batch size of {config!r}; '
                      f'pass --sweep_key (e.g. P for GRPO, B for PPO)')
  return key


def with_sweep_value(config, key, value):
  """'configs/grpo.py:runlocal' -> 'configs/grpo.py:P=128,runlocal'."""
  path, _, rest = config.partition(':')
  others = [a for a in rest.split(',') if a]
  if any(a.split('=', 1)[0] == key for a in others):
    raise LaunchError(f'--config={config!r} already sets {key}; give its values with --batches')
  return f'{path}:' + ','.join([f'{key}={value}'] + others)


def points(config, workdir, batches, extra_args='', key=''):
  """One Point per batch size, in the order given."""
  if not config:
    raise LaunchError('--config is required, e.g. --config=configs/grpo.py:runlocal')
  if not workdir:
    raise LaunchError('--workdir is required: each run gets <workdir>/<key><batch>')
  key = sweep_key(config, key)
  try:
    extra = shlex.split(extra_args or '')
  except ValueError as e:
    raise LaunchError(f'--extra_args={extra_args!r}: {e}') from None
  result = []
  for b in parse_batches(batches):
    point_dir = f'{workdir.rstrip("/")}/{key}{b}'
    args = (f'--config={with_sweep_value(config, key, b)}', f'--workdir={point_dir}', *extra)
    result.append(Point(name=f'rljax-{key}{b}', workdir=point_dir, args=args))
  return result


def add_flags(parser):
  """The flags all launchers share."""
  parser.add_argument('--config', required=True,
                      help='rljax config without the batch, e.g. configs/grpo.py:runlocal')
  parser.add_argument('--workdir', required=True, help='base dir; run b goes to <workdir>/<key><b>')
  parser.add_argument('--batches', required=True, help='comma-separated batch sizes: one job each')
  parser.add_argument('--sweep_key', default='', help='config argument to sweep (default: P for '
                      'grpo, B for ppo)')
  parser.add_argument('--extra_args', default='', help='more rljax.main args, shell-quoted, e.g. '
                      '"--config.optimizer.lr_rule=constant"')
  parser.add_argument('--dry_run', action='store_true', help='print what would run; run nothing')


def run(main):
  """Runs main(); a LaunchError becomes one line on stderr and exit status 1."""
  try:
    main()
  except LaunchError as e:
    sys.exit(f'error: {e}')


def parser(doc):
  """An argparse parser whose help is the launcher's module docstring."""
  return argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
