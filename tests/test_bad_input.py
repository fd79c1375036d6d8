"""Bad input to `python -m rljax.main`, one real subprocess per case: exit code 2, exactly one
`rljax: error: ...` line naming the problem, no traceback, and nothing built (no workdir)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

import rljax_cli as cli

CONFIG = 'configs/grpo.py:runlocal,P=4,G=4'
VALID = ['--config.train.micro_batch=8']   # with CONFIG, a valid command; each case breaks one thing
FOUR_DEVICES = {'XLA_FLAGS': '--xla_force_host_platform_device_count=4'}

# (id, config file argument, extra flags, expected message (regex), extra environment)
CASES = [
    ('unknown-config-arg', 'configs/grpo.py:runlocal,Q=3', [],
     r"unknown config arg 'Q'; known args: G, P, model, runlocal, seed", None),
    ('config-arg-type', 'configs/grpo.py:runlocal,P=four', [],
     r"config arg P='four': expected an integer", None),
    ('missing-config-file', 'configs/nope.py', [],
     r"No such file or directory: 'configs/nope.py'", None),
    ('unknown-field', CONFIG, ['--config.foo=1'],
     r"unknown config field 'foo' \(--config.foo=1\)", None),
    ('unknown-nested-field', CONFIG, ['--config.rollout.PP=4'],
     r"unknown config field 'PP' \(--config.rollout.PP=4\)", None),
    ('int-field-type', CONFIG, ['--config.rollout.P=four'],
     r"flag --config.rollout.P=four: invalid literal for int\(\)", None),
    ('float-field-type', CONFIG, ['--config.optimizer.lr=fast'],
     r"flag --config.optimizer.lr=fast: could not convert string to float", None),
    ('bool-field-type', CONFIG, ['--config.grpo.normalize_std=maybe'],
     r"flag --config.grpo.normalize_std=maybe: .*Non-boolean argument", None),
    ('unknown-flag', CONFIG, ['--bogus=1'], r"Unknown command line flag 'bogus'", None),
    ('positional-argument', CONFIG, ['extra'], r"unexpected arguments: \['extra'\]", None),
    ('G-below-2', CONFIG, ['--config.rollout.G=1'],
     r'rollout.G must be >= 2 for GRPO \(group z-scores need 2 responses\), got 1', None),
    ('unknown-moe-impl', CONFIG, ['--config.model.moe_impl=sparse'],
     r"model.moe_impl must be one of \['bucketed', 'dense', 'ragged'\], got 'sparse'", None),
    ('lr-zero', CONFIG, ['--config.optimizer.lr=0'],
     r'optimizer.lr must be a positive number, got 0', None),
    ('lr-nan', CONFIG, ['--config.optimizer.lr=nan'],
     r'optimizer.lr must be a positive number, got nan', None),
    ('mesh-not-device-count', CONFIG, ['--config.mesh.data=3'],
     r"mesh sizes \{.*'data': 3.*\} do not multiply to the 1 devices", None),
    ('mesh-two-free-axes', CONFIG, ['--config.mesh.fsdp=-1'],
     r'only one mesh axis may be -1, got data, fsdp', None),
    ('batch-not-divisible-by-data-parallel', CONFIG,
     ['--config.rollout.P=3', '--config.rollout.G=2', '--config.train.micro_batch=0'],
     r'the batch P\*G \(6\) is not divisible by the data-parallel size data \* fsdp = 4',
     FOUR_DEVICES),
    ('beyond-model-context', CONFIG, ['--config.model.max_seq_len=8'],
     r'prompt \(8\) \+ response \(5\) = 13 tokens exceed the model context model.max_seq_len = 8',
     None),
    ('vocabulary-too-small', CONFIG, ['--config.model.vocab_size=8'],
     r"model.vocab_size \(8\) is smaller than the tokenizer's 16 ids", None),
    ('empty-dataset', CONFIG, ['--config.data.num_train=0'],
     r'data.num_train \(0\) is smaller than one batch of P = 4 prompts', None),
    ('eval-set-beyond-test-split', CONFIG, ['--config.train.eval_size=2000'],
     r'train.eval_size \(2000\) must be in \[1, data.num_test = 1000\]', None),
    ('micro-batch-not-dividing', CONFIG, ['--config.train.micro_batch=5'],
     r'train.micro_batch \(5\) must divide the minibatch of 16 responses', None),
    ('temperature-zero', CONFIG, ['--config.rollout.temperature=0'],
     r'rollout.temperature must be a positive number, got 0', None),
    ('unknown-reward', CONFIG, ['--config.reward=fuzzy'], r"unknown reward 'fuzzy'", None),
    ('unknown-lr-decay', CONFIG, ['--config.optimizer.decay=step'],
     r"optimizer.decay must be one of \['constant', 'cosine', 'linear'\], got 'step'", None),
    ('unknown-algo', CONFIG, ['--config.algo=dqn'], r"algo must be 'grpo' or 'ppo', got 'dqn'",
     None),
]


def _run(args, extra_env=None):
  env = dict(os.environ, PYTHONPATH=str(cli.REPO), JAX_PLATFORMS='cpu')
  env.update(extra_env or {})
  result = subprocess.run([sys.executable, '-m', 'rljax.main', *args], cwd=cli.REPO, env=env,
                          capture_output=True, text=True, timeout=300)
  return result.returncode, result.stderr


def _assert_one_clear_error(code, stderr, message):
  errors = [line for line in stderr.splitlines() if line.startswith('rljax: error: ')]
  assert code == 2 and len(errors) == 1 and 'Traceback' not in stderr, stderr
  assert re.search(message, errors[0]), errors[0]


@pytest.mark.parametrize('config, flags, message, extra_env', [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_bad_input_exits_2_with_one_message(tmp_path, config, flags, message, extra_env):
  workdir = tmp_path / 'run'
  code, stderr = _run([f'--config={config}', f'--workdir={workdir}',
                       f'--config.data.dir={tmp_path}/data', *VALID, *flags], extra_env)
  _assert_one_clear_error(code, stderr, message)
  assert not workdir.exists() and not (tmp_path / 'data').exists()   # nothing was built


def test_missing_workdir(tmp_path):
  _assert_one_clear_error(*_run([f'--config={CONFIG}', *VALID]), r'--workdir must have a value')


def test_workdir_that_is_a_file(tmp_path):
  (tmp_path / 'run').write_text('')
  _assert_one_clear_error(*_run([f'--config={CONFIG}', f'--workdir={tmp_path}/run', *VALID]),
                          rf'workdir {tmp_path}/run exists and is not a directory')


def test_data_dir_that_is_a_file(tmp_path):
  (tmp_path / 'data').write_text('')
  _assert_one_clear_error(*_run([f'--config={CONFIG}', f'--workdir={tmp_path}/run', *VALID,
                                 f'--config.data.dir={tmp_path}/data']),
                          rf'data.dir {tmp_path}/data exists and is not a directory')


def test_workdir_of_another_run_is_refused_unless_overwrite(tiny, tmp_path):
  """The reference run (its checkpoints carry its config; it must stay untouched) and a run killed
  before its first checkpoint (only config.json): another config is refused."""
  reference = tiny / 'reference'
  before = (reference / 'metrics.jsonl').read_text()
  code, stderr = _run(cli.args(tiny, reference, '--config.seed=1')[3:])
  _assert_one_clear_error(code, stderr, r'holds another run, with a different config '
                          r'\(seed: 0 -> 1\)\. .*--config.train.overwrite=True')
  assert (reference / 'metrics.jsonl').read_text() == before

  workdir = tmp_path / 'run'
  workdir.mkdir()
  shutil.copy(reference / 'config.json', workdir)
  code, stderr = _run(cli.args(tiny, workdir, '--config.train.eval_every=4')[3:])
  _assert_one_clear_error(code, stderr, r'\(train.eval_every: 3 -> 4\)')
  # overwrite=True then clears the workdir: tests/test_workdir.py.
