"""End-to-end reliability of `python -m rljax.main`, in real subprocesses with real orbax
checkpoints: kill -9 at random moments (and during a save), SIGTERM / SIGINT, NaN injection, and
multi-host agreement on the stop step. A resumed run must equal the uninterrupted one bit for bit:
every metric but the timings, the checkpoint meta, and the final training state.

`python tests/test_reliability.py --trials N` runs N random kill trials and prints the counts that
docs/reference/reliability.md quotes.
"""
import argparse
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import rljax_cli as cli

pytestmark = pytest.mark.e2e   # real `python -m rljax.main` processes, killed and resumed

STOPPED = 75   # rljax.preemption.EXIT_CODE, spelled out: the documented contract


def _kill_when(process, moment, timeout=900):
  """SIGKILLs `process` as soon as moment() holds; returns whether the kill is what ended it."""
  deadline = time.monotonic() + timeout
  while not moment():
    if process.poll() is not None:
      return False
    if time.monotonic() > deadline:
      process.kill()
      raise TimeoutError('the kill moment never came')
    time.sleep(0.002)
  process.kill()
  return process.wait() == -signal.SIGKILL


def _moment(kind, workdir, rng):
  """When to kill: 'step' after a random later step plus a random fraction of a step, 'save' while
  an orbax save is in flight, 'startup' at a random instant of start-up (import, compile, eval)."""
  start, launched = cli.last_step(workdir), time.monotonic()
  if kind == 'save':
    return lambda: cli.last_step(workdir) > start and cli.saving(workdir)
  if kind == 'startup':
    delay = rng.uniform(0.5, 6.0)
    return lambda: time.monotonic() - launched > delay
  target, delay = rng.randint(start + 1, cli.MAX_STEPS - 1), rng.uniform(0.0, 0.3)
  reached = []

  def moment():
    if not reached and cli.last_step(workdir) >= target:
      reached.append(time.monotonic())
    return bool(reached) and time.monotonic() - reached[0] >= delay
  return moment


def kill_trial(tiny, workdir, kinds, rng, overrides=()):
  """Kills the tiny run at one moment per kind (restarting it after each kill), checks every
  checkpoint left behind, then lets it finish. Returns counts."""
  counts = dict(kills=0, during_save=0, unreadable=0, why=[])
  for kind in kinds:
    if kind == 'step' and cli.last_step(workdir) >= cli.MAX_STEPS - 1:
      continue
    left_before = cli.temporary(workdir)   # by an earlier kill; the next start removes them
    process = cli.launch(tiny, workdir, *overrides)
    if _kill_when(process, _moment(kind, workdir, rng)):
      counts['kills'] += 1
      counts['during_save'] += bool(cli.temporary(workdir) - left_before)
    unreadable = cli.checkpoints(workdir)[1]
    counts['unreadable'] += len(unreadable)
    counts['why'] += [f'after a {kind} kill: step {step}: {why}'
                      for step, why in unreadable.items()]
  code, text = cli.run(tiny, workdir, *overrides)
  assert code == 0, text[-3000:]
  return counts


def differences_from_reference(tiny, workdir):
  """What differs between `workdir` and the reference run (metrics, prompts trained, final meta,
  final state); empty when it holds exactly the reference run."""
  reference = tiny / 'reference'
  (state, meta), (ref_state, ref_meta) = (cli.checkpoints(w)[0][cli.MAX_STEPS]
                                          for w in (workdir, reference))
  meta, ref_meta = ({k: v for k, v in m.items() if k != 'wallclock_s'} for m in (meta, ref_meta))
  rows, ref_rows = cli.rows(workdir), cli.rows(reference)
  differences = [f'metrics row {i} (step {b["step"]}): ' + ', '.join(
      f'{k} {a.get(k)} != {b.get(k)}' for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
                 for i, (a, b) in enumerate(zip(rows, ref_rows)) if a != b][:2]
  if len(rows) != len(ref_rows):
    differences.append(f'{len(rows)} metrics rows, reference {len(ref_rows)}')
  if cli.prompt_rows(workdir) != cli.prompt_rows(reference):
    differences.append('prompts.jsonl differs: a prompt trained twice, or not at all')
  if meta != ref_meta:
    differences.append(f'meta {meta} != {ref_meta}')
  if not cli.same_arrays(state, ref_state):
    differences.append('final state differs')
  return differences


def test_reference_run_is_complete(tiny):
  rows = cli.rows(tiny / 'reference')
  train_rows = [row for row in rows if not row.get('eval')]
  assert [row['step'] for row in train_rows] == list(range(1, cli.MAX_STEPS + 1))
  assert [row['step'] for row in rows if row.get('eval')] == [0, 3, 6, 8]
  assert 0 < sum(row['reward_mean'] for row in train_rows) < cli.MAX_STEPS  # rewards vary
  # runlocal anneals lr 1e-4 * sqrt(P*G / 128) linearly to 0 at the run's last update.
  peak = 1e-4 * (16 / 128) ** 0.5
  assert [row['lr'] for row in train_rows] == pytest.approx(
      [peak * (1 - i / cli.MAX_STEPS) for i in range(cli.MAX_STEPS)], rel=1e-6)
  readable, unreadable = cli.checkpoints(tiny / 'reference')
  assert sorted(readable) == [6, 7, 8] and not unreadable   # keep_checkpoints=3


def test_kill9_at_random_moments_then_resume_equals_uninterrupted(tiny, tmp_path):
  rng = random.Random(0)
  totals = dict(kills=0, during_save=0, unreadable=0, why=[])
  for trial, kinds in enumerate((['step', 'step'], ['save'])):
    workdir = tmp_path / f'trial{trial}'
    counts = kill_trial(tiny, workdir, kinds, rng)
    for key, value in counts.items():
      totals[key] += value
    differences = differences_from_reference(tiny, workdir)
    assert not differences, (differences, cli.log(workdir)[-3000:])
  assert totals['unreadable'] == 0, totals['why']
  assert totals['kills'] >= 2 and totals['during_save'] >= 1, totals


def test_sigterm_then_sigint_stop_at_a_checkpoint_of_the_current_step(tiny, tmp_path):
  """Each signal: exit 75 with a readable checkpoint of the last logged step (forced: no periodic
  checkpoint is due); the rows logged after the first resume equal the uninterrupted run's."""
  workdir = tmp_path / 'run'
  for signum, after_step in ((signal.SIGTERM, 2), (signal.SIGINT, 5)):
    process = cli.launch(tiny, workdir, '--config.train.checkpoint_every=100')
    while cli.last_step(workdir) < after_step and process.poll() is None:
      time.sleep(0.002)
    process.send_signal(signum)
    assert process.wait(600) == STOPPED, cli.log(workdir)[-3000:]
    stopped = cli.last_step(workdir)
    readable, unreadable = cli.checkpoints(workdir)
    assert not unreadable and max(readable) == stopped and after_step <= stopped < cli.MAX_STEPS
    assert f'{signal.Signals(signum).name}: finishing this step' in cli.log(workdir)
    assert f'stopped on request at step {stopped}' in cli.log(workdir)
  rows, reference = cli.rows(workdir), cli.rows(tiny / 'reference')
  assert [row['step'] for row in rows if not row.get('eval')] == list(range(1, stopped + 1))
  assert rows == reference[:len(rows)]   # eval rows included


def test_nan_updates_are_skipped_and_counted_then_k_in_a_row_stop_the_run(tiny, tmp_path):
  # NaN advantages at step 2 (one skipped update), then from step 5 on: 2 in a row stop the run.
  workdir = tmp_path / 'run'
  code, text = cli.run(tiny, workdir, '--config.debug.nan_steps=2,5-100',
                       '--config.optimizer.max_bad_steps=2', '--config.train.keep_checkpoints=10')
  assert code == 3, text[-3000:]
  assert 'rljax: error: 2 non-finite updates in a row at step 6' in text
  assert 'The last good checkpoint is step 5' in text
  train_rows = [row for row in cli.rows(workdir) if not row.get('eval')]
  assert [row['skipped_updates'] for row in train_rows] == [0, 1, 0, 0, 1, 1]
  reference_rows = [row for row in cli.rows(tiny / 'reference') if not row.get('eval')]
  assert train_rows[0] == reference_rows[0]   # before the first fault: the reference run
  readable, unreadable = cli.checkpoints(workdir)
  assert sorted(readable) == [1, 2, 3, 4, 5] and not unreadable
  params = {step: readable[step][0]['algo']['params'] for step in readable}
  assert cli.same_arrays(params[2], params[1])       # skipped: unchanged
  assert not cli.same_arrays(params[3], params[2])   # a good step after it: updated
  assert cli.same_arrays(params[5], params[4])


_AGREE = '''
import sys, time
import jax
jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
from rljax import preemption
with preemption.StopRequest() as stop:
  print('ready', flush=True)
  for step in range(1, 100_000):
    time.sleep(0.005)
    if stop.agreed():
      print('stopped at', step, 'received', stop.received, flush=True)
      break
'''


def test_all_processes_stop_at_the_same_step():
  """Two CPU processes joined by jax.distributed; only one receives SIGTERM."""
  with socket.socket() as free:
    free.bind(('localhost', 0))
    address = f'localhost:{free.getsockname()[1]}'
  processes = [subprocess.Popen([sys.executable, '-c', _AGREE, address, str(rank)], cwd=cli.REPO,
                                env=dict(os.environ, PYTHONPATH=str(cli.REPO), JAX_PLATFORMS='cpu'),
                                stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True) for rank in (0, 1)]
  for process in processes:
    assert process.stdout.readline().strip() == 'ready'
  time.sleep(0.3)
  processes[1].send_signal(signal.SIGTERM)
  lines = [process.communicate(timeout=120)[0].strip().splitlines()[-1] for process in processes]
  steps = {line.split()[2] for line in lines}
  assert len(steps) == 1, lines
  assert lines[0].endswith('received None') and lines[1].endswith(f'received {int(signal.SIGTERM)}')


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--trials', type=int, default=10)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--override', action='append', default=[],
                      help='a flag for every run, e.g. --override=--config.grpo.kl_coef=0.01')
  flags = parser.parse_args()
  rng = random.Random(flags.seed)
  root = pathlib.Path(tempfile.mkdtemp(prefix='rljax_kill_trials_'))
  start = time.monotonic()
  cli.shared_reference(root, flags.override)
  print(f'reference run on {cli.env(root)["JAX_PLATFORMS"]}: {time.monotonic() - start:.0f} s',
        flush=True)
  totals = dict(trials=0, kills=0, during_save=0, unreadable=0, identical=0, why=[])
  for trial in range(flags.trials):
    kinds = rng.choices(['step', 'save', 'startup'], weights=[2, 1, 1], k=rng.randint(1, 3))
    workdir = root / f'trial{trial}'
    counts = kill_trial(root, workdir, kinds, rng, flags.override)
    identical = not differences_from_reference(root, workdir)
    for key, value in counts.items():
      totals[key] += value
    totals['trials'] += 1
    totals['identical'] += identical
    print(f'trial {trial}: kinds {kinds} {counts} identical={identical}', flush=True)
  print('totals', totals)
  sys.exit(0 if totals['identical'] == totals['trials'] and not totals['unreadable'] else 1)
