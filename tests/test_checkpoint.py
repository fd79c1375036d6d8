"""rljax.train.checkpoint under kill -9: a real subprocess saves checkpoints through Checkpointer in
a loop (async saves, old steps deleted as it goes) and is killed at random instants; every step left
behind must restore, and the latest must be the last one the process reported committed or a later
one. Cheap enough for many kills: no model, just arrays big enough that saving and deleting take a
while. Then two processes under jax.distributed, where only one of them reads a damaged part of a
step, must agree on the step they restore."""
import glob
import os
import random
import signal
import socket
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


_TWO_HOSTS = '''
import sys
import jax
jax.config.update('jax_cpu_collectives_implementation', 'gloo')
jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from rljax import cli
from rljax.train import checkpoint
sys.unraisablehook = cli.drop_checkpoint_io_noise   # as the CLI runs
mesh = jax.make_mesh((8,), ('x',))
def state(step):   # 'w' split between the processes: each reads only the half it holds
  w = np.random.default_rng(step).normal(size=(512, 64)).astype(np.float32)
  return {'w': jax.device_put(w, NamedSharding(mesh, PartitionSpec('x'))),
          'b': jax.device_put(np.full(5, step, np.float32), NamedSharding(mesh, PartitionSpec()))}
ckpt = checkpoint.Checkpointer(sys.argv[3], every=1, keep=3)
if sys.argv[4] == 'save':
  for step in (1, 2):
    ckpt.save(step, state(step), {'step': step})
else:
  try:
    restored, meta = ckpt.restore(state(0))
    same = all(np.array_equal(a.data, b.data) for name in ('w', 'b') for a, b in
               zip(restored[name].addressable_shards, state(meta['step'])[name].addressable_shards))
    print('RESULT restored', meta['step'], 'values', 'equal' if same else 'differ', flush=True)
  except checkpoint.Damaged as error:
    print(f'RESULT rljax: error: {error}', flush=True)
ckpt.close()
'''


def _two_processes(workdir, mode):
  """[(stdout, stderr)] of `_TWO_HOSTS` in two processes of 4 CPU devices each."""
  with socket.socket() as free:
    free.bind(('localhost', 0))
    address = f'localhost:{free.getsockname()[1]}'
  flags = f'{os.environ.get("XLA_FLAGS", "")} --xla_force_host_platform_device_count=4'
  env = dict(os.environ, PYTHONPATH=str(cli.REPO), JAX_PLATFORMS='cpu', XLA_FLAGS=flags)
  processes = [subprocess.Popen([sys.executable, '-c', _TWO_HOSTS, address, str(rank), workdir,
                                 mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for rank in (0, 1)]
  try:
    outs = [process.communicate(timeout=180) for process in processes]
  finally:
    for process in processes:
      process.kill()
  for process, (out, err) in zip(processes, outs):
    assert process.returncode == 0 and 'Traceback' not in err, err[-3000:]
  # gloo's threads say on stdout that they connected, in lines that can break into each other
  return [('\n'.join(line.split('RESULT ', 1)[1] for line in out.splitlines() if 'RESULT ' in line),
           err) for out, err in outs]


def _damage_half_of_process_1(step_dir):
  """Flips the second half of every array-data file process 1 wrote (its half of 'w')."""
  files = glob.glob(os.path.join(step_dir, 'state', 'ocdbt.process_1', 'd', '*'))
  assert files
  for path in files:
    data = bytearray(open(path, 'rb').read())
    data[len(data) // 2:] = bytes(b ^ 0xff for b in data[len(data) // 2:])
    with open(path, 'wb') as f:
      f.write(data)


@pytest.mark.e2e   # two processes joined by jax.distributed
def test_processes_agree_on_the_step_when_one_reads_it_damaged(tmp_path):
  """Process 1 alone reads step 2 damaged: both restore step 1, one warning line (process 0's)
  names process 1; with step 1 damaged too, both stop with the same error and nothing moves."""
  workdir, directory = str(tmp_path / 'run'), str(tmp_path / 'run' / 'checkpoints')
  _two_processes(workdir, 'save')
  _damage_half_of_process_1(os.path.join(directory, '2'))
  outs = _two_processes(workdir, 'restore')
  assert [out.strip() for out, _ in outs] == ['restored 1 values equal'] * 2, outs
  warnings = [[line for line in err.splitlines() if 'rljax: warning' in line] for _, err in outs]
  assert len(warnings[0]) == 1 and not warnings[1], warnings
  assert warnings[0][0].startswith('rljax: warning: checkpoint step 2 is damaged (on process 1: ')
  assert checkpoint._steps(directory) == [1] and os.listdir(f'{directory}/damaged') == ['2']

  _damage_half_of_process_1(os.path.join(directory, '1'))
  outs = _two_processes(workdir, 'restore')
  assert outs[0][0] == outs[1][0] and outs[0][0].startswith(
      'rljax: error: no checkpoint in'), outs
  assert 'step 1: on process 1: ' in outs[0][0]
  assert checkpoint._steps(directory) == [1]
