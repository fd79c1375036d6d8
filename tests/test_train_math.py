"""End to end: GRPO from a Hugging Face checkpoint on a GSM8K-format file, scored by the math
verifier, logging metrics.jsonl and TensorBoard events; then the CLI's clear errors."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from configs import grpo
from rljax import files
from rljax.hf import architecture
from rljax.hf import checkpoint as hf
from rljax import hf_export
from rljax.train import loop as train

pytestmark = pytest.mark.e2e   # GSM8K-format runs end to end, and the command line

TESTDATA = os.path.join(os.path.dirname(__file__), 'testdata')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gsm8k_config(data_dir):
  config = grpo.get_config('runlocal,P=4,G=4')
  config.data.update(name='gsm8k', path=os.path.join(TESTDATA, 'gsm8k_sample.jsonl'), num_test=8,
                     dir=str(data_dir), max_prompt_len=64, max_response_len=8)
  config.init.hf_path = os.path.join(TESTDATA, 'tiny_qwen3_moe')
  config.train.update(max_samples=0, max_steps=3, eval_every=3, eval_size=8, micro_batch=0)
  config.metrics.progress = False
  return config


def test_gsm8k_file_trains_end_to_end_with_the_math_verifier(tmp_path):
  workdir = str(tmp_path / 'run')
  accuracy = train.train(gsm8k_config(tmp_path / 'data'), workdir)
  rows = files.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  train_rows = [r for r in rows if 'reward_mean' in r]
  eval_rows = [r for r in rows if r.get('eval')]
  assert [r['step'] for r in train_rows] == [1, 2, 3]
  assert [r['samples'] for r in train_rows] == [16, 32, 48]
  assert all(r['reward_failures'] == 0 and 0 <= r['reward_mean'] <= 1 for r in train_rows)
  assert all(np.isfinite(r['grad_norm']) and r['grad_norm'] > 0 for r in train_rows)
  assert all(1 <= r['response_len_mean'] <= 8 for r in train_rows)
  assert [r['step'] for r in eval_rows] == [0, 3] and eval_rows[-1]['eval_accuracy'] == accuracy
  accumulator = event_accumulator.EventAccumulator(os.path.join(workdir, 'tensorboard'))
  accumulator.Reload()
  logged = [e.value for e in accumulator.Scalars('train/reward_mean')]
  np.testing.assert_allclose(logged, [r['reward_mean'] for r in train_rows], rtol=1e-6)
  assert [e.step for e in accumulator.Scalars('eval/eval_accuracy')] == [0, 3]

  # Export the trained policy back to the HF layout: it reloads to exactly the trained weights.
  base = os.path.join(TESTDATA, 'tiny_qwen3_moe')
  out = str(tmp_path / 'exported')
  assert hf_export.export(workdir, base, out) == 3
  trained, _ = hf_export.run_params(workdir)
  cfg = architecture.model_config(architecture.read_config(out))
  reloaded = hf.load_params(out, cfg)
  for a, b in zip(jax.tree.leaves(reloaded), jax.tree.leaves(trained)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  moved = [np.abs(np.asarray(a) - np.asarray(b)).max() for a, b in
           zip(jax.tree.leaves(reloaded), jax.tree.leaves(hf.load_params(base, cfg)))]
  assert max(moved) > 0   # RL changed the policy


def test_cli_rejects_a_math_task_without_a_tokenizer(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'rljax.main', '--config=configs/grpo.py:runlocal',
       f'--workdir={tmp_path}', '--config.data.name=gsm8k',
       f'--config.data.path={TESTDATA}/gsm8k_sample.jsonl', f'--config.data.dir={tmp_path}'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
      timeout=300, check=False)
  assert result.returncode == 2
  assert 'set --config.init.hf_path=DIR' in result.stderr


def test_export_cli_without_checkpoints_is_one_clear_error(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'rljax.hf_export', f'--workdir={tmp_path}',
       f'--base={TESTDATA}/tiny_qwen3', f'--out={tmp_path}/out'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
      timeout=300, check=False)
  assert result.returncode == 2 and 'has no checkpoints/ directory' in result.stderr


def test_export_rejects_params_of_another_model(tmp_path):
  moe = architecture.model_config(
      architecture.read_config(os.path.join(TESTDATA, 'tiny_qwen3_moe')))
  dense = architecture.model_config(architecture.read_config(os.path.join(TESTDATA, 'tiny_qwen3')))
  params = hf.load_params(os.path.join(TESTDATA, 'tiny_qwen3'), dense)
  with pytest.raises(ValueError, match='do not fit the model config'):
    hf.save_params(params, moe, str(tmp_path))
