"""End to end: configs/ppo.py:runlocal, shrunk to 2-digit addition, warm-starts a policy, then PPO
with its critic raises held-out accuracy and the critic explains part of the return variance.

The real pieces run, through the command line on one CPU device: the TFDS dataset is built in a
temporary directory, the supervised warm start trains to its threshold, the sampler, verifier,
critic and both optimizers do the RL, orbax writes the final checkpoint. About a minute of CPU.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from rljax import files

pytestmark = pytest.mark.e2e   # a whole PPO training run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, STEPS = 64, 150


def test_ppo_raises_held_out_accuracy_and_the_critic_learns(tmp_path):
  workdir = tmp_path / 'run'
  flags = dict(data=dict(dir=tmp_path / 'data', digits=2, num_train=20_000, num_test=300),
               warmstart=dict(threshold=0.3, min_steps=100, eval_every=20),
               optimizer=dict(lr=2e-4), critic_optimizer=dict(lr=1e-3), ppo=dict(lam=1.0),
               train=dict(max_samples=B * STEPS, micro_batch=0, eval_every=STEPS, eval_size=300,
                          checkpoint_every=0, log_every=1000),
               metrics=dict(progress=False, tensorboard=False))
  command = [sys.executable, '-m', 'rljax.main', f'--config=configs/ppo.py:runlocal,B={B}',
             f'--workdir={workdir}']
  command += [f'--config.{group}.{key}={value}' for group, fields in flags.items()
              for key, value in fields.items()]
  # XLA's default flags: 470 training steps run longer at tests/conftest.py's FAST_COMPILE than
  # they save in compile time (docs/design/test_speed.md). One device.
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  result = subprocess.run(command, cwd=ROOT, env=dict(env, PYTHONPATH=ROOT), capture_output=True,
                          text=True, timeout=900, check=False)
  assert result.returncode == 0, result.stderr[-3000:]

  rows = files.read_jsonl(f'{workdir}/metrics.jsonl')
  evals = [row for row in rows if row.get('eval')]
  steps = [row for row in rows if not row.get('eval')]
  assert [row['step'] for row in evals] == [0, STEPS]
  start, final = evals[0]['eval_accuracy'], evals[-1]['eval_accuracy']
  assert start >= 0.3   # the warm start's threshold
  assert final >= start + 0.08, (start, final)
  assert np.mean([row['explained_variance'] for row in steps[-50:]]) > 0.0
  for key in ('value_loss', 'critic_grad_norm', 'explained_variance', 'value_mean', 'clipfrac',
              'approx_kl', 'grad_norm', 'critic_lr', 'lr'):
    assert all(np.isfinite(row[key]) for row in steps), key
  assert steps[-1]['samples'] == B * STEPS   # and the critic's lr is its rule's, in float32:
  assert steps[-1]['critic_lr'] == pytest.approx(1e-3 * (B / 256) ** 0.5, rel=1e-7)
