"""End to end: configs/ppo.py:runlocal, shrunk to 2-digit addition, warm-starts a policy, then PPO
with its critic raises held-out accuracy and the critic explains part of the return variance.

The real pieces run: the TFDS dataset is built in a temporary directory, the supervised warm start
trains to its threshold, the sampler, verifier, critic and both optimizers do the RL, orbax writes
the final checkpoint. About 40 s of CPU on an idle 2-core machine.
"""
import numpy as np

from configs import ppo as ppo_config_file
from rljax import metrics
from rljax import train


def test_ppo_raises_held_out_accuracy_and_the_critic_learns(tmp_path):
  config = ppo_config_file.get_config('runlocal,B=64')
  config.data.update(dir=str(tmp_path / 'data'), digits=2, num_train=20_000, num_test=300)
  config.warmstart.update(threshold=0.3, min_steps=100, eval_every=20)
  config.optimizer.lr = 2e-4
  config.critic_optimizer.lr = 1e-3
  config.ppo.lam = 1.0
  config.train.update(max_samples=64 * 150, micro_batch=0, eval_every=150, eval_size=300,
                      checkpoint_every=0, log_every=1000)
  workdir = str(tmp_path / 'run')
  final = train.train(config, workdir)

  rows = metrics.read_jsonl(f'{workdir}/metrics.jsonl')
  evals = [row for row in rows if row.get('eval')]
  steps = [row for row in rows if not row.get('eval')]
  assert [row['step'] for row in evals] == [0, 150]
  start = evals[0]['eval_accuracy']
  assert start >= 0.3   # the warm start's threshold
  assert final == evals[-1]['eval_accuracy'] >= start + 0.08, (start, final)
  assert np.mean([row['explained_variance'] for row in steps[-50:]]) > 0.0
  for key in ('value_loss', 'critic_grad_norm', 'explained_variance', 'value_mean', 'clipfrac',
              'approx_kl', 'grad_norm', 'critic_lr', 'lr'):
    assert all(np.isfinite(row[key]) for row in steps), key
  assert steps[-1]['samples'] == 64 * 150 and steps[-1]['critic_lr'] == 1e-3 * (64 / 256) ** 0.5
