"""Rebuilds a protocol workdir's report from its logs, without training:

  python -m rljax.analysis --workdir=DIR
"""
import os
import sys

from absl import app
from absl import flags

from rljax.protocol import report as report_lib


def _fail(message):
  """Bad input, as rljax.main says it: one line, exit code 2."""
  print(f'rljax.analysis: error: {message}', file=sys.stderr, flush=True)
  sys.exit(2)


def main(argv):
  """Rebuilds DIR/report.{json,md} and the plots from logged runs, without training."""
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not flags.FLAGS.workdir:
    _fail('--workdir is required')
  try:
    report = report_lib.write_report(flags.FLAGS.workdir)
  except (OSError, ValueError) as e:
    _fail(e)
  print(f"wrote {os.path.join(flags.FLAGS.workdir, 'report.md')}; recommended batch: "
        f"{report['recommended']} ({report['decision']['verdict']})")


if __name__ == '__main__':
  # Defined here, not at import: rljax.main defines its own --workdir and may import this module.
  flags.DEFINE_string('workdir', None, 'Protocol workdir with arms/, throughput/, protocol.json.')
  app.run(main)
