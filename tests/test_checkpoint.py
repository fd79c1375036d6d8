"""rljax.train.checkpoint under kill -9: a real subprocess saves checkpoints through Checkpointer in a
loop (async saves, old steps deleted as it goes) and is killed at random instants; every step
left behind must restore, and the latest must be the last one the process reported committed or a
later one. Cheap enough for many kills: no model, just arrays big enough that saving and deleting
take a while."""
import os
import random
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest

import rljax_cli as cli
from rljax.train import checkpoint

KILLS = int(os.environ.get("RLJAX_CHECKPOINT_KILLS", 12))
_SAVER = '''
import sys
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from rljax.train import checkpoint
ckpt = checkpoint.Checkpointer(sys.argv[1], every=1, keep=2)
start = (ckpt.latest_step() or 0) + 1
for step in range(start, start + 10_000):
  state = {'w': jnp.full((512, 1024), step, jnp.float32), 'step': jnp.int32(step)}
  ckpt.save(step, state, {'step': step})
  print(f'saving {step}', flush=True)
'''


def _restore_all(workdir):
  """{step: why} for every step that does not restore to its own values."""
  ckpt = checkpoint.Checkpointer(workdir, every=1, keep=2)
  template = {'w': jnp.zeros((512, 1024), jnp.float32), 'step': jnp.int32(0)}
  bad, latest = {}, ckpt.latest_step()
  for step in ckpt.manager.all_steps():
    restored = ckpt.restore_step(step, jax.tree.map(ocp.utils.to_shape_dtype_struct, template))
    if isinstance(restored, str):
      bad[step] = (latest, restored)
    elif not (restored[1]['step'] == step and int(restored[0]['step']) == step and
              (restored[0]['w'] == step).all()):
      bad[step] = (latest, f'holds other values: {restored[1]}')
  ckpt.close()
  return latest, bad


@pytest.mark.e2e
def test_kill9_while_saving_and_deleting_never_leaves_an_unreadable_step(tmp_path):
  rng = random.Random(0)
  workdir = str(tmp_path / 'run')
  env = dict(os.environ, PYTHONPATH=str(cli.REPO), JAX_PLATFORMS='cpu')
  kills, bad, progress = 0, {}, []
  for _ in range(KILLS):
    process = subprocess.Popen([sys.executable, '-c', _SAVER, workdir], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    first = process.stdout.readline()   # it saves; now let it run a random while
    assert first.startswith('saving'), first
    time.sleep(rng.uniform(0.0, 0.6))
    process.send_signal(signal.SIGKILL)
    lines = [first] + process.stdout.read().splitlines()
    kills += process.wait() == -signal.SIGKILL
    latest, unreadable = _restore_all(workdir)
    bad.update(unreadable)
    saved_before = int(lines[-1].split()[1]) - 2   # two saves back has surely committed
    assert latest is not None and latest >= min(saved_before, int(first.split()[1]))
    progress.append(latest)
  assert kills == KILLS and not bad, bad
  assert progress == sorted(progress) and progress[-1] > progress[0]
