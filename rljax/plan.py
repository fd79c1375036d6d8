"""Whether a training config fits a TPU slice or GPU host, and how fast it can run, without one:

  python -m rljax.plan --config=configs/grpo.py:P=1024,model=qwen3-30b-a3b --target=tpu:v5p-128

The command line of rljax.aot.planner (what it compiles and reports is said there).
"""
import functools
import json
import os

# Compile-only targets on a CPU host: JAX itself runs on the CPU.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from ml_collections import config_flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from rljax.aot import planner  # pylint: disable=g-import-not-at-top,wrong-import-position
from rljax.aot import table  # pylint: disable=g-import-not-at-top,wrong-import-position
from rljax.aot import targets  # pylint: disable=g-import-not-at-top,wrong-import-position
from rljax import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from rljax.train import upgrades  # pylint: disable=g-import-not-at-top,wrong-import-position

# Defined at import: this module is the command, nothing else imports it.
config_flags.DEFINE_config_file('config', None, 'Config file, e.g. configs/grpo.py:model=qwen3-8b',
                                lock_config=True)
_TARGET = flags.DEFINE_string('target', None, f'Hardware: {targets.TARGET_HELP}.')
_MESH = flags.DEFINE_string('mesh', '', 'e.g. fsdp=4,expert=2; empty: propose one that fits.')
_COSTS = flags.DEFINE_bool('costs', True, 'Also compile one decode step and one micro-batch '
                           'for per-step FLOPs, bytes and roofline bounds.')
_COMPILE = flags.DEFINE_bool('compile', True, 'Compile the programs; --nocompile: only what is '
                             'resident (params, optimizer state, KV cache), in seconds.')
_DECODE_BATCHES = flags.DEFINE_string(
    'decode_batches', '', 'e.g. 1,16,256: also bound one decode step at these batches.')
_JSON = flags.DEFINE_string('json', '', 'Also write the report as JSON to this path.')
flags.mark_flags_as_required(['config', 'target'])


def _parse_mesh(text):
  """'fsdp=4,expert=2' -> dict; ValueError naming the bad part."""
  mesh = {}
  for part in filter(None, text.split(',')):
    axis, _, size = part.partition('=')
    if not size.isdigit() or int(size) < 1:
      raise ValueError(f'--mesh {text!r}: expected axis=size pairs, e.g. fsdp=4,expert=2')
    mesh[axis.strip()] = int(size)
  return mesh


def parse_batches(text):
  """'1,16,256' -> [1, 16, 256]; ValueError with one clear line otherwise."""
  parts = [p.strip() for p in text.split(',') if p.strip()]
  if not all(p.isdigit() and int(p) > 0 for p in parts):
    raise ValueError(f'--decode_batches must be positive integers separated by commas, got '
                     f'{text!r}')
  return [int(p) for p in parts]


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments: {argv[1:]}', cli.EXIT_BAD_INPUT)
  try:
    target = targets.parse_target(_TARGET.value)
    config = flags.FLAGS.config
    batches = parse_batches(_DECODE_BATCHES.value)
    report = planner.plan(config, target, _parse_mesh(_MESH.value), costs=_COSTS.value,
                          compile_programs_too=_COMPILE.value, decode_batches=batches)
  except ValueError as error:
    cli.fail(error, cli.EXIT_BAD_INPUT)
  print(table.format_report(report), flush=True)
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump(planner.to_json(report), f, indent=1)


if __name__ == '__main__':
  app.run(main, flags_parser=functools.partial(cli.parse_flags, renamed=upgrades.RENAMED_FLAGS))
