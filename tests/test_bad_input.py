"""Bad input: exactly one clear message, and nothing built. In process, each case raises the one
ValueError that rljax.main prints as its `rljax: error: ...` line (tests/test_main.py: flags and
config files); a few real subprocesses (marked e2e) check the contract as a shell sees it: exit
code 2, one line, no traceback, no workdir."""
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import rljax_cli as cli
from configs import grpo
from configs import ppo
from rljax.hf import checkpoint as hf
from rljax import main
from rljax import tasks
from rljax.train import config_checks

CONFIG = 'configs/grpo.py:runlocal,P=4,G=4'
VALID = ['--config.train.micro_batch=8']   # with CONFIG, a valid command (as config_with({}))
TESTDATA = pathlib.Path(__file__).parent / 'testdata'


def config_with(overrides, make=grpo.get_config, arg='runlocal,P=4,G=4'):
  """CONFIG with --config.a.b=value overrides (a valid config when there are none)."""
  config = make(arg)
  config.train.micro_batch = 8
  for path, value in overrides.items():
    *parents, name = path.split('.')
    node = config
    for parent in parents:
      node = node[parent]
    node[name] = value
  return config


# (id, overrides, device count, the whole message as a regex)
CHECK_CASES = [
    ('G-below-2', {'rollout.G': 1}, 1,
     r'rollout.G must be >= 2 for GRPO \(a group baseline needs 2 responses\), got 1'),
    ('unknown-moe-impl', {'model.moe_impl': 'sparse'}, 1,
     r"model.moe_impl must be one of \['bucketed', 'dense', 'ragged'\], got 'sparse'"),
    ('lr-zero', {'optimizer.lr': 0.0}, 1, r'optimizer.lr must be a positive number, got 0.0'),
    ('lr-nan', {'optimizer.lr': float('nan')}, 1,
     r'optimizer.lr must be a positive number, got nan'),
    ('mesh-not-device-count', {'mesh.data': 3}, 1,
     r"mesh \{.*'data': 3.*\} needs 3 devices, but 1 are available"),
    ('mesh-two-free-axes', {'mesh.fsdp': -1}, 1, r'only one mesh axis may be -1, got data, fsdp'),
    ('batch-not-divisible-by-data-parallel',
     {'rollout.P': 3, 'rollout.G': 2, 'train.micro_batch': 0}, 4,
     r'the batch P\*G \(6\) is not divisible by the data-parallel size '
     r'data \* fsdp \* expert = 4 .*'),
    ('empty-dataset', {'data.num_train': 0}, 1,
     r'data.num_train \(0\) is smaller than one batch of P = 4 prompts'),
    ('extra-test-on-another-task', {'data.name': 'sums', 'data.extra_test': 100}, 1,
     r'data.extra_test \(100\): only the arithmetic task draws extra held-out problems, not sums'),
    ('eval-set-beyond-test-split', {'train.eval_size': 2000}, 1,
     r'train.eval_size \(2000\) must be in \[1, data.num_test \+ data.extra_test = 1000\]'),
    ('micro-batch-not-dividing', {'train.micro_batch': 5}, 1,
     r'train.micro_batch \(5\) must divide the minibatch of 16 responses'),
    ('temperature-zero', {'rollout.temperature': 0.0}, 1,
     r'rollout.temperature must be a positive number, got 0.0'),
    ('unknown-reward', {'reward': 'fuzzy'}, 1, r"reward must be 'auto' .*got 'fuzzy'"),
    ('unknown-lr-decay', {'optimizer.decay': 'step'}, 1,
     r"optimizer.decay must be one of \['constant', 'cosine', 'linear'\], got 'step'"),
    ('unknown-algo', {'algo': 'dqn'}, 1,
     r"algo must be one of \['grpo', 'ppo', 'rloo'\], got 'dqn'"),
    ('unknown-loss-agg', {'grpo.loss_agg': 'token-sum'}, 1,
     r"grpo.loss_agg 'token-sum' is not one of \('token-mean', .*\)"),
    ('kl-k1-as-a-loss', {'grpo.kl_coef': 0.01, 'grpo.kl_estimator': 'k1'}, 1,
     r"grpo.kl_estimator 'k1' with kl_coef > 0: k1's expected gradient is 0, so it does not "
     r"regularise; use 'k3' .*"),
    ('dual-clip-below-1', {'grpo.clip_ratio_c': 0.5}, 1,
     r'grpo.clip_ratio_c \(dual-clip\) must be > 1, or 0 for off, got 0.5'),
    ('negative-slots', {'rollout.slots': -1}, 1,
     r'rollout.slots must be >= 0 \(0: static batching\), got -1'),
    ('negative-adv-eps', {'grpo.adv_eps': -1e-6}, 1, r'grpo.adv_eps must be >= 0, got -1e-06'),
    ('unknown-off-policy', {'grpo.off_policy': 'ppo'}, 1,
     r"grpo.off_policy 'ppo' is not one of \('none', 'tis', 'mis'\)"),
    ('tis-cap-below-1', {'grpo.off_policy': 'tis', 'grpo.is_high': 0.9}, 1,
     r"grpo.is_high \(the 'tis' cap\) must be >= 1, got 0.9"),
    ('unknown-policy-loss', {'grpo.policy_loss': 'dapo'}, 1,
     r"grpo.policy_loss 'dapo' is not one of \('clip', 'gspo', 'cispo'\)"),
    ('gspo-over-tokens', {'grpo.policy_loss': 'gspo'}, 1,
     r"grpo.policy_loss 'gspo' averages its sequences' objectives: set "
     r"grpo.loss_agg='seq-mean-token-mean' \(got 'token-mean'\)"),
    ('cispo-with-dual-clip', {'grpo.policy_loss': 'cispo', 'grpo.clip_ratio_c': 3.0}, 1,
     r"grpo.clip_ratio_c \(dual-clip\) bounds the clipped surrogate; policy_loss 'cispo' bounds "
     r"its weights by clip_low and clip_high: set 0"),
    ('lora-negative-rank', {'model.lora.rank': -1}, 1,
     r'model.lora.rank must be an integer >= 0 \(0: off\), got -1'),
    ('lora-alpha-zero', {'model.lora.rank': 8, 'model.lora.alpha': 0.0}, 1,
     r'model.lora.alpha must be a positive number, got 0.0'),
    ('lora-unknown-target', {'model.lora.rank': 8, 'model.lora.targets': ('q', 'qkv')}, 1,
     r"model.lora.targets: unknown target 'qkv'; the targets are \('q', 'k', 'v', 'o', 'gate', "
     r"'up', 'down'\)"),
    ('lora-no-targets', {'model.lora.rank': 8, 'model.lora.targets': ()}, 1,
     r"model.lora.targets must be a non-empty list of \('q', .*\), got \(\)"),
]


@pytest.mark.parametrize('overrides, device_count, message', [case[1:] for case in CHECK_CASES],
                         ids=[case[0] for case in CHECK_CASES])
def test_config_check_names_the_bad_field(overrides, device_count, message):
  config_checks.check(config_with({}), device_count=device_count, process_count=1)   # valid
  with pytest.raises(ValueError) as raised:
    config_checks.check(config_with(overrides), device_count=device_count, process_count=1)
  assert re.fullmatch(message, str(raised.value)), str(raised.value)


def test_ppo_refuses_k1_as_a_loss_term_but_not_in_the_reward():
  make = lambda overrides: config_with(overrides, ppo.get_config, 'runlocal,B=8')
  config_checks.check(make({'ppo.kl_reward_coef': 0.1, 'ppo.kl_reward_estimator': 'k1'}),
                      device_count=1, process_count=1)
  with pytest.raises(ValueError, match="ppo.kl_estimator 'k1' with kl_coef > 0"):
    config_checks.check(make({'ppo.kl_coef': 0.1, 'ppo.kl_estimator': 'k1'}), device_count=1,
                        process_count=1)


def test_ppo_refuses_lora():
  make = lambda rank: config_with({'model.lora.rank': rank}, ppo.get_config, 'runlocal,B=8')
  config_checks.check(make(0), device_count=1, process_count=1)
  with pytest.raises(ValueError) as raised:
    config_checks.check(make(8), device_count=1, process_count=1)
  assert str(raised.value) == ('model.lora trains adapters with grpo or rloo; ppo trains the '
                               'policy and its critic as full weights: set model.lora.rank=0 '
                               'for ppo')


def test_config_arg_lora_takes_a_rank():
  assert grpo.get_config('runlocal,lora=8').model.lora.rank == 8
  with pytest.raises(ValueError, match=r'config arg lora=-2: expected a rank >= 0'):
    grpo.get_config('lora=-2')


@pytest.mark.parametrize('overrides, message', [
    ({'model.max_seq_len': 8},
     r'prompt \(8\) \+ response \(5\) = 13 tokens exceed the model context model.max_seq_len = 8'),
    ({'model.vocab_size': 8}, r"model.vocab_size \(8\) is smaller than the tokenizer's 16 ids"),
], ids=['beyond-model-context', 'vocabulary-too-small'])
def test_task_that_does_not_fit_the_model(overrides, message):
  config = config_with(overrides)
  prompt_len, new_tokens, vocab_size = tasks.lengths(config)
  with pytest.raises(ValueError) as raised:
    config_checks.check_lengths(prompt_len, new_tokens, hf.policy_config(config), vocab_size)
  assert re.fullmatch(message, str(raised.value)), str(raised.value)


def run_line(capsys, config, workdir):
  """main.run(config, workdir): the one `rljax: error:` line; exit code 2."""
  with pytest.raises(SystemExit) as stopped:
    main.run(config, str(workdir))
  stderr = capsys.readouterr().err
  errors = [line for line in stderr.splitlines() if line.startswith('rljax: error: ')]
  assert stopped.value.code == 2 and len(errors) == 1, stderr
  return errors[0][len('rljax: error: '):]


def test_workdir_that_is_a_file(capsys, tmp_path):
  (tmp_path / 'run').write_text('')
  config = config_with({'data.dir': str(tmp_path / 'data')})
  assert run_line(capsys, config, tmp_path / 'run') == (
      f'workdir {tmp_path}/run exists and is not a directory')
  assert not (tmp_path / 'data').exists()


def test_data_dir_that_is_a_file(capsys, tmp_path):
  (tmp_path / 'data').write_text('')
  config = config_with({'data.dir': str(tmp_path / 'data')})
  assert run_line(capsys, config, tmp_path / 'run') == (
      f'data.dir {tmp_path}/data exists and is not a directory')
  assert not (tmp_path / 'run').exists()


def broken_checkpoint(tmp_path, how):
  """A copy of a tiny HF checkpoint with one file broken: (directory, the broken file)."""
  if how == 'config-not-json':
    directory = pathlib.Path(shutil.copytree(TESTDATA / 'tiny_qwen3', tmp_path / 'hf'))
    broken = directory / 'config.json'
    broken.write_text(broken.read_text()[:100])
  elif how == 'truncated':
    directory = pathlib.Path(shutil.copytree(TESTDATA / 'tiny_qwen3', tmp_path / 'hf'))
    broken = directory / 'model.safetensors'
    broken.write_bytes(broken.read_bytes()[:-1])
  else:
    directory = pathlib.Path(shutil.copytree(TESTDATA / 'tiny_qwen3_moe', tmp_path / 'hf'))
    broken = directory / 'model-00002-of-00002.safetensors'
    if how == 'shard-missing':
      broken.unlink()
    else:
      broken.write_bytes(broken.read_bytes()[:len(broken.read_bytes()) // 2])
  return directory, broken


@pytest.mark.parametrize('how, message', [
    ('truncated', r'is not a readable safetensors file \(.*incomplete metadata.*\)'),
    ('shard-truncated', r'is not a readable safetensors file \(.*\)'),
    ('shard-missing', r'is missing \(listed in .*/model.safetensors.index.json\)'),
    ('config-not-json', r'is not valid JSON \(.*\)'),
])
def test_unreadable_hf_checkpoint(capsys, tmp_path, how, message):
  """Named in one line before the dataset, the model or any compilation."""
  directory, broken = broken_checkpoint(tmp_path, how)
  config = config_with({'init.hf_path': str(directory), 'data.dir': str(tmp_path / 'data')})
  line = run_line(capsys, config, tmp_path / 'run')
  assert re.fullmatch(re.escape(str(broken)) + ' ' + message, line), line
  assert not (tmp_path / 'run').exists() and not (tmp_path / 'data').exists()


# ------------------------------------------------------------------ real subprocesses


def _run(args, extra_env=None):
  env = dict(os.environ, PYTHONPATH=str(cli.REPO), JAX_PLATFORMS='cpu')
  env.update(extra_env or {})
  result = subprocess.run([sys.executable, '-m', 'rljax.main', *args], cwd=cli.REPO, env=env,
                          capture_output=True, text=True, timeout=300)
  return result.returncode, result.stderr


def _assert_one_clear_error(code, stderr, message):
  errors = [line for line in stderr.splitlines() if line.startswith('rljax: error: ')]
  assert code == 2 and len(errors) == 1 and 'Traceback' not in stderr, stderr
  assert re.fullmatch(message, errors[0][len('rljax: error: '):]), errors[0]


@pytest.mark.e2e
@pytest.mark.parametrize('config, flags, message', [
    ('configs/nonexistent.py', [], r'no config file configs/nonexistent\.py'),
    (CONFIG, ['--config.train.max_stepz=3'],
     r'unknown config field train\.max_stepz \(did you mean train\.max_steps\?\)'),
    (CONFIG, ['--config.rollout.G=1'],
     r'rollout.G must be >= 2 for GRPO \(a group baseline needs 2 responses\), got 1'),
    (CONFIG, ['--config.rollout.slots=-1'],
     r'rollout.slots must be >= 0 \(0: static batching\), got -1'),
    (CONFIG + ',task=tools', ['--config.tools.timeout_s=inf'],
     r'tools.timeout_s must be a number in \[0.01, 3600\], got inf'),
], ids=['missing-config-file', 'misspelled-field', 'config-check', 'negative-slots',
        'tool-timeout-inf'])
def test_cli_exits_2_with_one_line(tmp_path, config, flags, message):
  workdir = tmp_path / 'run'
  _assert_one_clear_error(*_run([f'--config={config}', f'--workdir={workdir}',
                                 f'--config.data.dir={tmp_path}/data', *VALID, *flags]), message)
  assert not workdir.exists() and not (tmp_path / 'data').exists()   # nothing was built


@pytest.mark.e2e
def test_cli_truncated_hf_checkpoint(tmp_path):
  directory, broken = broken_checkpoint(tmp_path, 'truncated')
  workdir = tmp_path / 'run'
  _assert_one_clear_error(*_run([f'--config={CONFIG}', f'--workdir={workdir}',
                                 f'--config.data.dir={tmp_path}/data', *VALID,
                                 f'--config.init.hf_path={directory}']),
                          re.escape(str(broken)) + r' is not a readable safetensors file \(.*\)')
  assert not workdir.exists() and not (tmp_path / 'data').exists()


@pytest.mark.e2e
def test_workdir_of_another_run_is_refused_unless_overwrite(tiny, tmp_path):
  """The reference run (its checkpoints carry its config; it must stay untouched) and a run killed
  before its first checkpoint (only config.json): another config is refused."""
  reference = tiny / 'reference'
  before = (reference / 'metrics.jsonl').read_text()
  code, stderr = _run(cli.args(tiny, reference, '--config.seed=1')[3:])
  _assert_one_clear_error(code, stderr, r'.*holds another run, with a different config '
                          r'\(seed: 0 -> 1\)\. .*--config.train.overwrite=True.*')
  assert (reference / 'metrics.jsonl').read_text() == before

  workdir = tmp_path / 'run'
  workdir.mkdir()
  shutil.copy(reference / 'config.json', workdir)
  code, stderr = _run(cli.args(tiny, workdir, '--config.train.eval_every=4')[3:])
  _assert_one_clear_error(code, stderr, r'.*\(train.eval_every: 3 -> 4\).*')
  # overwrite=True then clears the workdir: tests/test_workdir.py.
