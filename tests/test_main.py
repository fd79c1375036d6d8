"""rljax.main's command line, in process: each bad flag, config file or config field is exactly one
`rljax: error: ...` line and exit code 2. tests/test_bad_input.py runs a few of these as real
subprocesses, for the exit-code contract as a shell sees it."""
import re
import sys

from absl import flags
import pytest

from configs import grpo
from rljax import cli
from rljax import main

CONFIG = '--config=configs/grpo.py:runlocal,P=4,G=4'
WORKDIR = '--workdir=/nonexistent/run'


def parse(monkeypatch, *args):
  """cli.parse_flags on a fresh FlagValues (ml_collections reads the overrides from sys.argv)."""
  argv = ['rljax.main', *args]
  monkeypatch.setattr(sys, 'argv', argv)
  flag_values = flags.FlagValues()
  main.define_flags(flag_values)
  return main.parse_flags(argv, flag_values), flag_values


def error_line(capsys, call, *args):
  """The message of the one `rljax: error:` line that call(*args) prints before exiting 2."""
  with pytest.raises(SystemExit) as stopped:
    call(*args)
  stderr = capsys.readouterr().err
  lines = stderr.splitlines()
  assert stopped.value.code == cli.EXIT_BAD_INPUT, stderr
  assert len(lines) == 1 and lines[0].startswith('rljax: error: '), stderr
  return lines[0][len('rljax: error: '):]


# (id, command line, the whole message as a regex)
FLAG_CASES = [
    ('missing-config-file', ['--config=configs/nonexistent.py', WORKDIR],
     r'no config file configs/nonexistent\.py'),
    ('missing-config-file-with-args', ['--config', 'configs/nope.py:runlocal', WORKDIR],
     r'no config file configs/nope\.py'),
    ('misspelled-field', [CONFIG, WORKDIR, '--config.train.max_stepz=3'],
     r'unknown config field train\.max_stepz \(did you mean train\.max_steps\?\)'),
    ('misspelled-section', [CONFIG, WORKDIR, '--config.trian.max_steps=3'],
     r'unknown config field trian\.max_steps \(did you mean train\.max_steps\?\)'),
    ('unknown-field', [CONFIG, WORKDIR, '--config.foo=1'], r'unknown config field foo'),
    ('unknown-nested-field', [CONFIG, WORKDIR, '--config.rollout.PP=4'],
     r'unknown config field rollout\.PP'),
    ('renamed-field', [CONFIG, WORKDIR, '--config.rollout.partial=True'],
     r'config field rollout\.partial is gone: pass --config\.rollout\.schedule=partial '
     r'\(or each_step\)'),
    ('unknown-config-arg', ['--config=configs/grpo.py:runlocal,Q=3', WORKDIR],
     r"unknown config arg 'Q'; known args: G, P, lora, loss, model, runlocal, seed, task"),
    ('config-arg-type', ['--config=configs/grpo.py:runlocal,P=four', WORKDIR],
     r"config arg P='four': expected an integer.*"),
    ('int-field-type', [CONFIG, WORKDIR, '--config.rollout.P=four'],
     r"flag --config\.rollout\.P=four: invalid literal for int\(\) with base 10: 'four'"),
    ('float-field-type', [CONFIG, WORKDIR, '--config.optimizer.lr=fast'],
     r"flag --config\.optimizer\.lr=fast: could not convert string to float: 'fast'"),
    ('bool-field-type', [CONFIG, WORKDIR, '--config.grpo.normalize_std=maybe'],
     r'flag --config\.grpo\.normalize_std=maybe: .*Non-boolean argument.*'),
    ('unknown-flag', [CONFIG, WORKDIR, '--bogus=1'], r"Unknown command line flag 'bogus'"),
    ('missing-workdir', [CONFIG], r'flag --workdir=None: Flag --workdir must have a value .*'),
    ('missing-config', [WORKDIR], r'flag --config=None: Flag --config must have a value .*'),
]


@pytest.mark.parametrize('args, message', [case[1:] for case in FLAG_CASES],
                         ids=[case[0] for case in FLAG_CASES])
def test_bad_flag_is_one_clean_line(monkeypatch, capsys, args, message):
  line = error_line(capsys, parse, monkeypatch, *args)
  assert re.fullmatch(message, line), line
  assert '\\' not in line   # no escaped quotes or newlines from a repr


def test_good_flags_parse(monkeypatch):
  remaining, flag_values = parse(monkeypatch, CONFIG, WORKDIR, '--config.train.max_steps=3')
  assert remaining == ['rljax.main']
  assert flag_values.config.train.max_steps == 3 and flag_values.workdir == '/nonexistent/run'
  assert flag_values.config.rollout.P == 4


def test_positional_arguments_are_refused(capsys):
  assert error_line(capsys, main.main, ['rljax.main', 'extra']) == "unexpected arguments: ['extra']"


def test_bad_input_from_the_run_is_one_line(capsys, tmp_path):
  """main.run turns the library's ValueError into the line and exit code 2, before building."""
  config = grpo.get_config('runlocal,P=4,G=4')
  config.rollout.G = 1
  workdir = tmp_path / 'run'
  assert error_line(capsys, main.run, config, str(workdir)) == (
      'rollout.G must be >= 2 for GRPO (a group baseline needs 2 responses), got 1')
  assert not workdir.exists()


def test_a_multi_line_message_is_printed_on_one_line(capsys):
  assert error_line(capsys, cli.fail, 'first\nsecond', cli.EXIT_BAD_INPUT) == 'first second'
