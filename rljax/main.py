"""rljax command line: `python -m rljax.main --config=configs/grpo.py:P=1024 --workdir=DIR`.

Trains one configuration (config.mode == 'train', the default) or runs the align-then-accelerate
protocol (config.mode == 'protocol'). Bad configs exit non-zero with one clear message.
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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not flags.FLAGS['verbosity'].present:  # orbax and TFDS are chatty at INFO
    logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  # Imported after flag parsing: jax reads XLA_FLAGS when first imported.
  from rljax import protocol
  from rljax import train
  run = protocol.run if config.get('mode', 'train') == 'protocol' else train.train
  try:
    run(config, _WORKDIR.value)
  except ValueError as error:  # bad input: one clear message, non-zero exit
    logging.error('%s', error)
    print(f'rljax: error: {error}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  flags.mark_flags_as_required(['config', 'workdir'])
  app.run(main)
