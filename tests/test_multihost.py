"""Two real processes on localhost (jax.distributed, 4 fake CPU devices each) run GRPO on one global
8-device mesh and log the same metrics as one process with 8 devices: P=auto, tool turns, and the
schedules that carry a batch between steps. The plain run's two processes are submitted to a real
SLURM by tests/test_launch.py (TINY, `launch`)."""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

import rljax_cli as cli

pytestmark = pytest.mark.e2e   # two processes joined by jax.distributed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
    '--config=configs/grpo.py:runlocal,P=8,G=4',
    '--config.model.d_model=32', '--config.model.num_heads=2', '--config.model.num_kv_heads=2',
    '--config.model.head_dim=16', '--config.model.expert_hidden=32',
    '--config.data.num_train=2000', '--config.data.num_test=64', '--config.train.eval_size=64',
    '--config.train.micro_batch=16', '--config.train.max_steps=3', '--config.train.eval_every=3',
    '--config.warmstart.min_steps=1', '--config.warmstart.max_steps=40',
    '--config.warmstart.eval_every=20', '--config.warmstart.batch=32',
    '--config.mesh.data=2', '--config.mesh.expert=4',
]
COMPARED = ('samples', 'tokens', 'reward_mean', 'grad_norm', 'pg_loss', 'entropy', 'eval_accuracy')


def free_port():
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def start(workdir, devices, flags):
  """rljax.main with `flags` on `devices` fake CPU devices."""
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu', XLA_FLAGS=(
      f'{os.environ["XLA_FLAGS"]} --xla_force_host_platform_device_count={devices}'))
  return subprocess.Popen([sys.executable, '-m', 'rljax.main', f'--workdir={workdir}', *flags],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def two_processes(workdir, flags):
  """The two processes of one run, 4 devices each, joined on a free localhost port."""
  port = free_port()
  return [start(workdir, 4, (*flags, f'--coordinator_address=localhost:{port}',
                             '--num_processes=2', f'--process_id={i}'))
          for i in range(2)]


def launch(workdir, data_dir, warm_dir, devices, extra=()):
  return start(workdir, devices, (*TINY, f'--config.data.dir={data_dir}',
                                  f'--config.warmstart.dir={warm_dir}', *extra))


def finish(process):
  out, _ = process.communicate(timeout=600)
  assert process.returncode == 0, out[-3000:]
  return out


def rows(workdir, name='metrics.jsonl'):
  with open(os.path.join(workdir, name)) as f:
    return [json.loads(line) for line in f]


def assert_resumes_alike(workdir, point, flags):
  """A copy of `workdir` cut after step `point` (what a kill after that step's checkpoint leaves)
  resumes on two processes to its rows and prompts.jsonl."""
  resumed = workdir.parent / f'{workdir.name}_from{point}'
  shutil.copytree(workdir, resumed)
  for step in os.listdir(workdir / 'checkpoints'):
    if step.isdigit() and int(step) > point:
      shutil.rmtree(resumed / 'checkpoints' / step)
  for p in two_processes(resumed, flags):
    finish(p)
  assert cli.rows(resumed) == cli.rows(workdir)
  assert rows(resumed, 'prompts.jsonl') == rows(workdir, 'prompts.jsonl')


def test_p_auto_takes_the_same_decisions_on_two_processes_as_on_one(tmp_path):
  """P=auto (tests/test_auto_batch.py's tiny schedule: samples/s read from a file, so every run
  decides alike) on 2 processes x 4 devices: process 0's times reach both, both switch P from 4 to
  8 at step 7 and check it at step 9, and the rows equal one process's with 8 devices."""
  throughput = tmp_path / 'throughput.json'
  throughput.write_text(json.dumps({'4': [100, 101, 99], '8': [200, 202, 198],
                                    '16': [200, 202, 198]}))
  flags = ['--config=configs/grpo.py:runlocal,P=auto,G=4', f'--config.data.dir={tmp_path}/data',
           '--config.data.digits=1', '--config.data.num_train=200', '--config.data.num_test=20',
           '--config.warmstart.enabled=False', '--config.metrics.tensorboard=False',
           '--config.auto_batch.min=4', '--config.auto_batch.max=16',
           '--config.auto_batch.every_samples=112',
           f'--config.auto_batch.throughput_file={throughput}',
           '--config.auto_batch.compile_s=0.0', '--config.auto_batch.verify_samples=64',
           '--config.model.d_model=32', '--config.model.num_heads=2',
           '--config.model.num_kv_heads=2', '--config.model.head_dim=16',
           '--config.model.expert_hidden=32',
           '--config.rollout.P=4', '--config.train.max_samples=0', '--config.train.max_steps=9',
           '--config.train.eval_every=4', '--config.train.eval_size=8',
           '--config.train.micro_batch=8']
  finish(start(tmp_path / 'one', 8, flags))
  for p in two_processes(tmp_path / 'two', flags):
    finish(p)
  one, two = rows(tmp_path / 'one'), rows(tmp_path / 'two')
  steps = [r for r in two if not r.get('eval')]
  assert [r['batch'] for r in steps] == [16] * 7 + [32] * 2
  assert (steps[6]['auto_from'], steps[6]['auto_to']) == (4, 8) and 'auto_check_verdict' in steps[8]
  assert len(one) == len(two)
  for a, b in zip(one, two):
    assert a['step'] == b['step'] and a.get('batch') == b.get('batch')
    for key in COMPARED:
      if key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a['step'], key)


def test_tool_turns_on_two_processes_match_one_process(tmp_path):
  """GRPO on the tool task with router replay, 2 processes x 4 devices: each process runs the
  calls of its own responses and every process appends every observation; the rows (rewards, the
  environment's counts, the replayed experts' mismatch, losses) equal one process's with 8
  devices."""
  flags = ['--config=configs/grpo.py:runlocal,P=8,G=4,task=tools', *TINY[1:],
           f'--config.data.dir={tmp_path}/data', f'--config.warmstart.dir={tmp_path}/warm',
           '--config.data.digits=2', '--config.data.demo_frac=0.5',
           '--config.warmstart.max_steps=400', '--config.warmstart.eval_every=200',
           '--config.train.max_steps=2', '--config.train.eval_every=2',
           '--config.tools.workers=2', '--config.rollout.temperature=0.3',
           '--config.model.router_replay=True']
  finish(start(tmp_path / 'one', 8, flags))
  for p in two_processes(tmp_path / 'two', flags):
    finish(p)
  one, two = rows(tmp_path / 'one'), rows(tmp_path / 'two')
  assert len(one) == len(two) == 4   # eval at 0, 2 train rows, eval at 2
  assert sum(r.get('tool_calls', 0) for r in one) > 0   # the policy called the tool
  assert one[0]['eval_accuracy'] > 0   # every process's eval rows were scored as its own
  assert min(r.get('reward_mean', 1) for r in one) > 0   # and its training rows
  for a, b in zip(one, two):
    assert a['step'] == b['step']
    for key in COMPARED + ('tool_calls', 'tool_errors', 'turns_mean', 'turn_chunks',
                           'router_mismatch', 'logprob_mismatch'):
      if key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a['step'], key)


# name: (flags, the row fields compared besides COMPARED)
SCHEDULES = {
    # 7 slots: after step 1 the pool holds groups begun but not finished
    'partial': (['--config.rollout.schedule=partial', '--config.rollout.slots=7'],
                ('staleness_mean', 'staleness_max', 'restarted')),
    # each process gives the sampler 2 of its 4 devices; both meshes span both processes
    'drawn_ahead': (['--config.rollout.schedule=drawn_ahead', '--config.rollout.devices=4',
                     '--config.rollout.slots=6', '--config.mesh.data=-1', '--config.mesh.expert=2'],
                    ()),
}


@pytest.mark.parametrize('name', sorted(SCHEDULES))
def test_schedules_on_two_processes_match_one_process_across_a_resume(tmp_path, name):
  """A schedule that carries a batch between steps, on 2 processes x 4 devices: the partial pool is
  one pool over the global mesh, every process admitting the global batch and holding every
  group's answer; the sampler on devices of its own gets the policy and hands its batch back
  through the hosts. Each process scores its own rows. The rows and prompts.jsonl equal one
  process's with 8 devices; a copy cut after step 1 (a kill after that checkpoint) resumes on two
  processes to the same rows."""
  extra, keys = SCHEDULES[name]
  flags = ['--config=configs/grpo.py:runlocal,P=8,G=4', *TINY[1:],
           f'--config.data.dir={tmp_path}/data', f'--config.warmstart.dir={tmp_path}/warm',
           '--config.data.digits=1', '--config.rollout.max_new_tokens=8',
           '--config.train.max_steps=2', '--config.train.checkpoint_every=1',
           '--config.train.keep_checkpoints=10', '--config.rollout.temperature=0.3', *extra]
  finish(start(tmp_path / 'one', 8, flags))
  for p in two_processes(tmp_path / 'two', flags):
    finish(p)
  one, two = rows(tmp_path / 'one'), rows(tmp_path / 'two')
  assert [r['step'] for r in one] == [0, 1, 2, 2] and len(two) == len(one)
  assert min(r.get('reward_mean', 1) for r in one) > 0   # answers reached the rows they score
  if name == 'partial':
    assert max(r['staleness_max'] for r in one if not r.get('eval')) > 0   # groups carried over
  for a, b in zip(one, two):
    assert a['step'] == b['step']
    for key in COMPARED + keys:
      if key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a['step'], key)
  assert rows(tmp_path / 'two', 'prompts.jsonl') == rows(tmp_path / 'one', 'prompts.jsonl')
  assert_resumes_alike(tmp_path / 'two', 1, flags)
