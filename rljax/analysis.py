"""Rebuilds a protocol workdir's report from its logs, without training:

  python -m rljax.analysis --workdir=DIR
  python -m rljax.analysis --workdir=NEW --quick_from=DIR --seeds=2 --calibration_seeds=1

The second builds in NEW the quick mode's view of the full sweep in DIR (rljax.protocol.quick_view:
the runs a quick run with its seed offset trains, taken from the sweep) and its report.
"""
import os
import sys

from absl import app
from absl import flags

from rljax.protocol import quick_view
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
    if flags.FLAGS.quick_from:
      quick_view.build(flags.FLAGS.quick_from, flags.FLAGS.workdir, flags.FLAGS.seeds,
                       flags.FLAGS.calibration_seeds)
    report = report_lib.write_report(flags.FLAGS.workdir)
  except (OSError, ValueError) as e:
    _fail(e)
  print(f"wrote {os.path.join(flags.FLAGS.workdir, 'report.md')}; recommended batch: "
        f"{report['recommended']} ({report['decision']['verdict']})")


if __name__ == '__main__':
  # Defined here, not at import: rljax.main defines its own --workdir and may import this module.
  flags.DEFINE_string('workdir', None, 'Protocol workdir with arms/, throughput/, protocol.json.')
  flags.DEFINE_string('quick_from', '', 'A full sweep whose quick-mode view to build in --workdir.')
  flags.DEFINE_integer('seeds', 2, 'With --quick_from: the base arm seeds the view takes.')
  flags.DEFINE_integer('calibration_seeds', 1, 'With --quick_from: seeds per calibration lr.')
  app.run(main)
