"""Fault injection on real orbax checkpoints: damaged files (bit flips, truncation, deletion) in
each kind of file of a step, and a checkpoints/ folder that cannot be written (a read-only bind
mount, a file where the folder was, a full tmpfs). A damaged step is never restored: the newest
intact one is, with one warning line; a write that fails ends the run with one line and exit 4.

The first half runs rljax.train.checkpoint in this process on small states; the second (e2e) runs
`python -m rljax.main` on the tiny run of tests/rljax_cli.py and compares each continuation with
the uninterrupted reference run. Mounts need root (CAP_SYS_ADMIN); without it those cases skip.
"""
import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

import rljax_cli as cli
from rljax.train import checkpoint
from rljax.train import workdir as workdir_lib

STORAGE = 4   # rljax.main.EXIT_STORAGE, spelled out: the documented contract
BAD_INPUT = 2


FLIPS = {'flip-start': 0, 'flip': 0.5, 'flip-end': 1}   # where 4 KiB of flipped bytes go


def damage(path, how):
  """Flips 4 KiB of bytes at the start, middle or end of `path`, truncates it to half, or
  deletes it."""
  data = bytearray(open(path, 'rb').read())
  if how in FLIPS:
    start = max(0, min(int(len(data) * FLIPS[how]), len(data) - 4096))
    data[start:start + 4096] = bytes(b ^ 0xff for b in data[start:start + 4096])
  if how == 'delete':
    os.remove(path)
    return
  with open(path, 'wb') as f:
    f.write(data[:len(data) // 2] if how == 'truncate' else data)


def largest(step_dir, pattern):
  return max(glob.glob(os.path.join(step_dir, pattern)), key=os.path.getsize)


@contextlib.contextmanager
def mounted(*commands):
  """Runs the mount commands, then undoes them (the last argument of each is its mount point). A
  mount may be retried for 5 s: remounting read-only is refused (EBUSY) while the run has a file
  open for writing there. The unmount is lazy, as the run may still hold files in it."""
  done = []
  try:
    for command in commands:
      if not _mount(command):
        pytest.skip(f'mount {" ".join(command)} is not permitted here')
      done += [command[-1]] if command[-1] not in done else []   # a remount is not a mount
    yield
  finally:
    for point in reversed(done):
      subprocess.run(['umount', '-l', point], check=True)


def _mount(command, seconds=5.0):
  deadline = time.monotonic() + seconds
  while subprocess.run(['mount', *command], capture_output=True, check=False).returncode:
    if time.monotonic() > deadline:
      return False
    time.sleep(0.05)
  return True


def read_only(folder):
  return mounted(['--bind', folder, folder], ['-o', 'remount,bind,ro', folder])


# ---------------------------------------------------------------- in process, small states


def _state(step):
  return {'w': jnp.full((64, 96), step, jnp.float32), 'b': jnp.full((5,), step, jnp.bfloat16),
          'n': jnp.int32(step), 'ok': jnp.bool_(step % 2)}


def _saved(tmp_path, steps=(1, 2)):
  workdir = str(tmp_path / 'run')
  ckpt = checkpoint.Checkpointer(workdir, every=1, keep=3)
  for step in steps:
    ckpt.save(step, _state(step), {'step': step})
  ckpt.close()
  return workdir, os.path.join(workdir, 'checkpoints')


def _restore(workdir):
  ckpt = checkpoint.Checkpointer(workdir, every=1, keep=3)
  try:
    return ckpt.restore(_state(0))
  finally:
    ckpt.close()


# (file of step 2, damage, what the warning names)
DAMAGE_CASES = [
    ('state/d/*', 'flip-start', r'state/d/\w+: .*'),       # array data
    ('state/d/*', 'flip', r'state/d/\w+: .*'),
    ('state/d/*', 'flip-end', r'state/d/\w+: .*'),
    ('state/d/*', 'truncate', r'state/d/\w+: .*'),
    ('state/manifest.ocdbt', 'flip', r'state/manifest.ocdbt: .*'),   # the arrays' index
    ('state/manifest.ocdbt', 'delete', r'state: .*'),
    ('state/array_metadatas/*', 'flip', r'state/array_metadatas/process_0: not valid JSON'),
    ('meta/metadata', 'flip', r'meta/metadata: not valid JSON'),   # the run's meta
    ('meta/metadata', 'delete', r'meta/metadata: not found.*'),
    ('manifest/metadata', 'flip', r'manifest/metadata: not valid JSON'),   # the checksums
]


@pytest.mark.parametrize('pattern, how, reason', DAMAGE_CASES,
                         ids=[f'{how}-{pattern.split("/*")[0]}'
                              for pattern, how, _ in DAMAGE_CASES])
def test_a_damaged_step_is_set_aside_and_the_one_before_restored(tmp_path, capfd, pattern, how,
                                                                  reason):
  workdir, directory = _saved(tmp_path)
  damage(largest(os.path.join(directory, '2'), pattern), how)
  state, meta = _restore(workdir)
  assert meta == {'step': 1} and cli.same_arrays(state, _state(1))
  warnings = [line for line in capfd.readouterr().err.splitlines() if 'rljax: warning' in line]
  assert len(warnings) == 1, warnings
  prefix = 'rljax: warning: checkpoint step 2 is damaged ('
  assert warnings[0].startswith(prefix), warnings[0]
  assert warnings[0].endswith(f'); moved to {directory}/damaged/2')
  assert re.fullmatch(reason, warnings[0][len(prefix):-len(f'); moved to {directory}/damaged/2')])
  assert checkpoint._steps(directory) == [1] and os.listdir(f'{directory}/damaged') == ['2']
  ckpt = checkpoint.Checkpointer(workdir, every=1, keep=3)   # step 2 can be saved again
  ckpt.save(2, _state(2), {'step': 2})
  ckpt.close()
  assert _restore(workdir)[1] == {'step': 2}


def test_values_that_differ_from_the_manifest_are_not_restored(tmp_path, capfd):
  """Arrays orbax reads without error (its own checks pass) but that are not the ones saved: step
  2's arrays under step 1's manifest; then a meta that is valid JSON but altered."""
  workdir, directory = _saved(tmp_path, steps=(1, 2, 3))
  shutil.rmtree(os.path.join(directory, '3', 'manifest'))
  shutil.copytree(os.path.join(directory, '1', 'manifest'),
                  os.path.join(directory, '3', 'manifest'))
  meta_file = os.path.join(directory, '2', 'meta', 'metadata')
  with open(meta_file, 'w') as f:
    json.dump({'step': 1}, f)
  state, meta = _restore(workdir)
  assert meta == {'step': 1} and cli.same_arrays(state, _state(1))
  err = capfd.readouterr().err
  assert 'step 3 is damaged (3 array(s) differ from the manifest, first b)' in err, err
  assert 'step 2 is damaged (meta differs from its manifest)' in err, err


def test_steps_saved_before_manifests_restore_with_one_warning(tmp_path, capfd):
  """Steps without a manifest (an rljax before manifests) restore unchecked, saying so once; the
  next save has one, and from then on a step that lacks its manifest is damaged."""
  workdir, directory = _saved(tmp_path)
  for step in ('1', '2'):
    shutil.rmtree(os.path.join(directory, step, 'manifest'))
  state, meta = _restore(workdir)
  assert meta == {'step': 2} and cli.same_arrays(state, _state(2))
  warnings = [line for line in capfd.readouterr().err.splitlines() if 'rljax: warning' in line]
  assert warnings == ['rljax: warning: checkpoint step 2 has no manifest (saved by an rljax before '
                      'manifests); restored unchecked; the checkpoints saved from now on have one']
  ckpt = checkpoint.Checkpointer(workdir, every=1, keep=4)
  for step in (3, 4):
    ckpt.save(step, _state(step), {'step': step})
  ckpt.close()
  assert os.path.isdir(os.path.join(directory, '3', 'manifest'))
  shutil.rmtree(os.path.join(directory, '4', 'manifest'))   # lost after step 3 had one
  state, meta = _restore(workdir)
  assert meta == {'step': 3} and cli.same_arrays(state, _state(3))
  assert 'rljax: warning: checkpoint step 4 is damaged (' in capfd.readouterr().err


def test_no_intact_step_is_an_error_naming_each(tmp_path):
  workdir, directory = _saved(tmp_path)
  for step in ('1', '2'):
    damage(largest(os.path.join(directory, step), 'state/d/*'), 'flip')
  for _ in range(2):   # and again: nothing was moved, so a re-run does not start afresh
    with pytest.raises(checkpoint.Damaged, match=r'no checkpoint in .* is intact \(step 2: state/'
                       r'd/\w+: .*; step 1: state/d/\w+: .*\); move that folder away'):
      _restore(workdir)
  assert checkpoint._steps(directory) == [2, 1]


def test_a_garbled_latest_meta_is_skipped_when_reading_the_config(tmp_path):
  workdir, directory = _saved(tmp_path)
  damage(os.path.join(directory, '2', 'meta', 'metadata'), 'flip')
  assert checkpoint.read_latest_meta(workdir) == {'step': 1}
  damage(os.path.join(directory, '1', 'meta', 'metadata'), 'flip')
  with pytest.raises(checkpoint.Damaged, match=r'has a readable meta \(steps 2, 1\)'):
    checkpoint.read_latest_meta(workdir)


@pytest.mark.parametrize('bad', [jnp.nan, jnp.inf])
def test_a_state_that_is_not_finite_is_never_saved(tmp_path, bad):
  workdir, directory = _saved(tmp_path, steps=(1,))
  ckpt = checkpoint.Checkpointer(workdir, every=1, keep=1)
  state = dict(_state(2), w=_state(2)['w'].at[3, 4].set(bad))
  with pytest.raises(FloatingPointError, match=r'state after step 2 is not finite; not saved. The '
                     r'last good checkpoint is step 1'):
    ckpt.save(2, state, {'step': 2}, force=True)
  ckpt.close()
  assert ocp.CheckpointManager(directory).all_steps() == [1]   # keep=1 kept the good one


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16, jnp.int32, jnp.bool_])
def test_the_checksum_sees_one_flipped_bit_and_not_the_sharding(dtype):
  x = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (8, 16)).astype(dtype))
  flipped = x.reshape(-1).view(np.uint8).copy()
  flipped[37] ^= 1   # one bit of one element (a bool's only bit)
  flipped = flipped.view(x.dtype).reshape(x.shape)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ('a', 'b'))
  sharded = jax.device_put(
      x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('a', 'b')))
  sums = lambda tree: int(checkpoint.fingerprint(tree)[0])
  assert sums(sharded) == sums(x) != sums(flipped)


def test_start_up_refuses_checkpoints_that_cannot_be_written(tmp_path):
  workdir = tmp_path / 'run'
  (workdir / 'checkpoints').mkdir(parents=True)
  with read_only(str(workdir / 'checkpoints')):
    with pytest.raises(ValueError, match=r'.*/run/checkpoints is not writable \(Read-only file '
                       r'system\)'):
      workdir_lib.check_writable(str(workdir / 'checkpoints'))
  (workdir / 'checkpoints').rmdir()
  (workdir / 'tensorboard').write_text('')
  with pytest.raises(ValueError, match=r'.*/run/tensorboard exists and is not a directory'):
    workdir_lib.check_writable(str(workdir / 'tensorboard'))


# ---------------------------------------------------------------- real runs


def _one_error_line(text, code):
  errors = [line for line in text.splitlines() if 'rljax: error: ' in line]
  assert len(errors) == 1 and 'Traceback' not in text, text[-3000:]
  return errors[0].split('rljax: error: ', 1)[1]


def _copy_of_reference(tiny, tmp_path):
  workdir = tmp_path / 'run'
  shutil.copytree(tiny / 'reference', workdir)
  (tmp_path / 'run.log').write_text('')
  return workdir


@pytest.mark.e2e
def test_damaged_latest_steps_resume_from_the_last_intact_one_identically(tiny, tmp_path):
  """Steps 8 (array data flipped) and 7 (meta truncated) are set aside; the run continues from 6
  and ends exactly as the uninterrupted run did."""
  from test_reliability import differences_from_reference  # pylint: disable=g-import-not-at-top
  workdir = _copy_of_reference(tiny, tmp_path)
  damage(largest(str(workdir / 'checkpoints' / '8'), 'state/d/*'), 'flip')
  damage(str(workdir / 'checkpoints' / '7' / 'meta' / 'metadata'), 'truncate')
  code, text = cli.run(tiny, workdir)
  assert code == 0 and 'Traceback' not in text, text[-3000:]
  warnings = [line for line in text.splitlines() if 'rljax: warning: checkpoint step' in line]
  assert [line.split(' is damaged')[0][-6:] for line in warnings] == ['step 8', 'step 7'], warnings
  assert not differences_from_reference(tiny, workdir)
  assert sorted(os.listdir(workdir / 'checkpoints' / 'damaged')) == ['7', '8']


@pytest.mark.e2e
def test_a_damaged_warm_start_cache_is_set_aside_and_trained_again(tiny, tmp_path):
  """The cache's array data flipped: one warning line, the warm start trained again, and the
  run's rows and final state equal the reference run's (the warm start is deterministic)."""
  cache = tmp_path / 'warmstart'
  shutil.copytree(tiny / 'warmstart', cache)
  [step_dir] = glob.glob(str(cache / 'warmstart-*' / 'checkpoints' / '[0-9]*'))
  damage(largest(step_dir, 'state/d/*'), 'flip')
  workdir = tmp_path / 'run'
  code, text = cli.run(tiny, workdir, f'--config.warmstart.dir={cache}')
  assert code == 0 and 'Traceback' not in text, text[-3000:]
  warnings = [line for line in text.splitlines() if 'rljax: warning' in line]
  assert len(warnings) == 1 and re.fullmatch(
      r'rljax: warning: checkpoint step 40 is damaged \(state/d/\w+: .*\); moved to '
      r'.*/warmstart-\w+/checkpoints/damaged/40', warnings[0]), warnings
  assert 'warm start step 40 |' in text   # trained again
  assert cli.rows(workdir) == cli.rows(tiny / 'reference')
  final = (cli.checkpoints(w)[0][cli.MAX_STEPS][0] for w in (workdir, tiny / 'reference'))
  assert cli.same_arrays(*final)


@pytest.mark.e2e
def test_no_intact_checkpoint_stops_with_exit_4(tiny, tmp_path):
  workdir = _copy_of_reference(tiny, tmp_path)
  for step in (6, 7, 8):
    damage(largest(str(workdir / 'checkpoints' / str(step)), 'state/d/*'), 'truncate')
  for _ in range(2):   # the second run too: the damaged steps stay in place
    (tmp_path / 'run.log').write_text('')
    start = time.monotonic()
    code, text = cli.run(tiny, workdir)
    assert code == STORAGE and time.monotonic() - start < 30, text[-3000:]
    line = _one_error_line(text, code)
    assert line.startswith(f'no checkpoint in {workdir}/checkpoints is intact (step 8: state/d/')


@pytest.mark.e2e
def test_rerunning_a_complete_run_says_so(tiny, tmp_path):
  workdir = _copy_of_reference(tiny, tmp_path)
  code, text = cli.run(tiny, workdir)
  assert code == 0, text[-3000:]
  assert (f'rljax: the run in {workdir} is already complete (step {cli.MAX_STEPS}, 128 samples); '
          'nothing to do') in text
  assert cli.rows(workdir) == cli.rows(tiny / 'reference')


@pytest.mark.e2e
def test_read_only_checkpoints_at_start_up_is_refused_before_compiling(tiny, tmp_path):
  workdir = _copy_of_reference(tiny, tmp_path)
  with read_only(str(workdir / 'checkpoints')):
    code, text = cli.run(tiny, workdir)
  assert code == BAD_INPUT, text[-3000:]
  assert _one_error_line(text, code) == (f'{workdir}/checkpoints is not writable (Read-only file '
                                         'system)')


def _break_while_running(tiny, workdir, fault):
  """Starts the tiny run, applies `fault` once step 3 is logged; (exit code, seconds, log)."""
  process = cli.launch(tiny, workdir)
  while cli.last_step(workdir) < 3 and process.poll() is None:
    time.sleep(0.01)
  start = time.monotonic()
  with fault():
    code = process.wait(60)
    seconds = time.monotonic() - start
  return code, seconds, cli.log(workdir)


@pytest.mark.e2e
@pytest.mark.parametrize('fault', ['read-only', 'vanished'])
def test_checkpoints_that_stop_being_writable_end_the_run_with_one_line(tiny, tmp_path, fault):
  workdir = tmp_path / 'run'
  folder = str(workdir / 'checkpoints')

  @contextlib.contextmanager
  def vanished():   # the mount went away and something else took the path
    os.rename(folder, folder + '.gone')
    with open(folder, 'w'):
      pass
    yield

  code, seconds, text = _break_while_running(
      tiny, workdir, (lambda: read_only(folder)) if fault == 'read-only' else vanished)
  assert code == STORAGE and seconds < 30, text[-3000:]
  assert _one_error_line(text, code).startswith(f'cannot write checkpoints in {folder}: ')


@pytest.mark.e2e
def test_a_full_disk_ends_the_run_then_it_resumes_identically_once_there_is_room(tiny, tmp_path):
  """checkpoints/ on a 14 MiB tmpfs: two steps of 5.5 MB fit, the third does not."""
  from test_reliability import differences_from_reference  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'run'
  folder = str(workdir / 'checkpoints')
  os.makedirs(folder)
  with mounted(['-t', 'tmpfs', '-o', 'size=14m', 'tmpfs', folder]):
    code, seconds, text = _break_while_running(tiny, workdir, contextlib.nullcontext)
    assert code == STORAGE and seconds < 30, text[-3000:]
    line = _one_error_line(text, code)
    # tensorstore says RESOURCE_EXHAUSTED, Python's own writes ENOSPC: whichever fills it first
    assert re.fullmatch(rf'cannot write checkpoints in {re.escape(folder)}: '
                        r'(RESOURCE_EXHAUSTED|\[Errno 28\] No space left on device).*', line), line
    subprocess.run(['mount', '-o', 'remount,size=64m', folder], check=True)
    code, text = cli.run(tiny, workdir)
    assert code == 0, text[-3000:]
    assert not differences_from_reference(tiny, workdir)
