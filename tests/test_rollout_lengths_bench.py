"""bench/rollout_lengths.py: bad input is one argparse line; a small sweep (on the 8 fake devices'
data mesh, 1 slot per device) runs both schedules on the same forced lengths."""
import numpy as np
import pytest

from bench import rollout_lengths


@pytest.mark.parametrize('args', [['--slots=1'], ['--slots=0'], ['--dists=sums,nope'],
                                  ['--batches=64,'], ['--sigma=0'], ['--median=x']])
def test_rejects_bad_arguments_in_one_line(args, capsys):
  with pytest.raises(SystemExit) as exit_info:
    rollout_lengths.main(args)
  last_line = capsys.readouterr().err.strip().splitlines()[-1]
  assert exit_info.value.code == 2 and ': error: ' in last_line


@pytest.mark.e2e   # the whole benchmark, both schedules compiled and timed
def test_small_sweep_compares_the_same_tokens(capsys):
  rollout_lengths.main(['--preset=tiny', '--batches=16', '--slots=8', '--dists=lognormal,uniform',
                        '--max_len=12', '--median=3', '--repeats=1'])
  rows = [line.split('|')[1:-1] for line in capsys.readouterr().out.splitlines()
          if line.startswith('| lognormal') or line.startswith('| uniform')]
  table = {(r[0].strip(), r[2].strip()): [c.strip() for c in r] for r in rows}
  for dist in ('lognormal', 'uniform'):
    static, slots = table[dist, 'static'], table[dist, 'slots=8']
    assert static[10:12] == slots[10:12]   # the same mean and longest length: the same tokens
  assert table['uniform', 'static'][5] == '12' and float(table['uniform', 'static'][6]) == 1.0
  assert float(table['lognormal', 'slots=8'][6]) > float(table['lognormal', 'static'][6])
  assert np.isclose(float(table['uniform', 'slots=8'][6]), 1.0)
