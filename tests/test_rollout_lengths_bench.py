"""bench/rollout_lengths.py: bad input is one argparse line; a small sweep (on the 8 fake devices'
data mesh, 1 slot per device) runs both schedules on the same forced lengths."""
import numpy as np
import pytest

from bench import rollout_lengths
from rljax.data.builders import sums
from rljax.data import tokenizer as tokenizer_lib


@pytest.mark.parametrize('args', [['--slots=1'], ['--slots=0'], ['--dists=sums,nope'],
                                  ['--batches=64,'], ['--sigma=0'], ['--median=x']])
def test_rejects_bad_arguments_in_one_line(args, capsys):
  with pytest.raises(SystemExit) as exit_info:
    rollout_lengths.main(args)
  last_line = capsys.readouterr().err.strip().splitlines()[-1]
  assert exit_info.value.code == 2 and ': error: ' in last_line


@pytest.mark.e2e   # the whole benchmark, every schedule compiled and timed
def test_small_sweep_compares_the_same_tokens(capsys):
  rollout_lengths.main(['--preset=tiny', '--batches=16', '--slots=8,16',
                        '--dists=lognormal,uniform', '--max_len=12', '--median=3', '--repeats=1'])
  lines = capsys.readouterr().out.splitlines()
  cells = lambda line: [c.strip() for c in line.split('|')[1:-1]]
  columns = cells(next(line for line in lines if line.startswith('| dist')))
  table = {}
  for line in lines:
    if line.startswith('| lognormal') or line.startswith('| uniform'):
      row = dict(zip(columns, cells(line)))
      table[row['dist'], row['schedule']] = row
  same_tokens = lambda a, b: (a['len_mean'], a['len_max']) == (b['len_mean'], b['len_max'])
  for dist in ('lognormal', 'uniform'):
    static = table[dist, 'static']
    assert all(same_tokens(static, table[dist, s]) for s in ('slots=8', 'slots=16', 'static/8'))
    assert table[dist, 'slots=8']['vs_chunked'] and not table[dist, 'slots=16']['vs_chunked']
    assert table[dist, 'slots=16']['steps'] == static['steps']   # one wave: static's steps
  assert table['uniform', 'static']['steps'] == '12'
  assert all(float(table['uniform', s]['utilization']) == 1.0
             for s in ('static', 'slots=8', 'static/8'))
  assert table['uniform', 'static/8']['steps'] == '24'   # two chunks of 12 steps
  lognormal = lambda s: float(table['lognormal', s]['utilization'])
  assert lognormal('slots=8') > lognormal('static')


def test_sums_lengths_are_the_reference_responses(tmp_path):
  """The forced lengths of the sums distribution: each prompt's running-sums response, written
  here from its operands, plus the stop token."""
  config = sums.make_config(num_train=64, num_test=8)
  (prompt_NxT, valid_NxT), lengths_N = rollout_lengths.sums_problems(str(tmp_path), 16, 0, config)
  tokenizer = tokenizer_lib.ArithmeticTokenizer()
  for row, valid, length in zip(prompt_NxT, valid_NxT, lengths_N):
    operands = [int(x) for x in tokenizer.decode(row[valid].tolist()).rstrip('=').split('+')]
    sums_so_far = np.cumsum(operands)
    response = '+'.join(f'{o}={s}' for o, s in zip(operands[1:], sums_so_far[1:]))
    assert length == len(tokenizer.encode(response)) + 1
