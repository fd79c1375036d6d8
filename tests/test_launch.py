"""launch/: dry runs build the expected jobs without any cloud; bad input fails with one line."""

import argparse
import os
import pathlib
import shlex
import subprocess
import sys
import textwrap
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the launchers are scripts in launch/, not part of the package
from launch import slurm, sweep, xm_launch  # pylint: disable=wrong-import-position

CONFIG = 'configs/grpo.py:runlocal'


def run(script, *args, env=None):
  """Runs a launcher the way a user does, as a script; returns the CompletedProcess."""
  env = {**os.environ, **(env or {})}
  return subprocess.run([sys.executable, str(REPO / 'launch' / script), *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=60, check=False)


def flags(**overrides):
  """Flags as build_jobs / build_scripts / build_commands get them from argparse."""
  values = dict(config=CONFIG, workdir='/runs/grpo', batches='128,256,1024', sweep_key='',
                extra_args='', executor='local', accelerator='', num_hosts=1, nodes=2,
                gpus_per_node=8, tasks_per_node=1, time='1:00:00', partition='', account='',
                sbatch_args='', setup='', python='python', tpu='slice', zone='us-west4-a',
                project='', repo_dir='~/rljax')
  values.update(overrides)
  return argparse.Namespace(**values)


def fake_bin(tmp_path, name, body):
  """An executable `name` in tmp_path/bin that runs the bash `body`."""
  path = tmp_path / 'bin' / name
  path.parent.mkdir(exist_ok=True)
  path.write_text('#!/bin/bash\n' + textwrap.dedent(body))
  path.chmod(0o755)
  return path.parent


# ----- the sweep shared by all launchers -----


def test_points_one_run_per_batch():
  points = sweep.points(CONFIG, '/runs/grpo/', '128, 256', '--config.optimizer.lr_rule=constant')
  assert [p.name for p in points] == ['rljax-P128', 'rljax-P256']
  assert [p.workdir for p in points] == ['/runs/grpo/P128', '/runs/grpo/P256']
  assert points[0].args == ('--config=configs/grpo.py:P=128,runlocal',
                            '--workdir=/runs/grpo/P128', '--config.optimizer.lr_rule=constant')


def test_sweep_key_follows_the_config():
  [ppo] = sweep.points('configs/ppo.py', 'w', '64')
  assert ppo.args == ('--config=configs/ppo.py:B=64', '--workdir=w/B64')
  [other] = sweep.points('configs/protocol.py:runlocal', 'w', '8', key='P')
  assert other.args[0] == '--config=configs/protocol.py:P=8,runlocal'


def test_every_algorithms_batch_arg_is_read_without_importing_jax():
  from rljax import algos   # pylint: disable=g-import-not-at-top
  for name in algos.names():
    assert sweep.batch_arg(name) == algos.get(name).BATCH_ARG, name
  code = ('import sys; from launch import sweep; '
          'assert sweep.points("configs/rloo.py", "w", "8")[0].name == "rljax-P8"; '
          'assert "jax" not in sys.modules, "the launcher imported jax"')
  result = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
  assert result.returncode == 0, result.stderr


@pytest.mark.parametrize('config,batches,key,message', [
    (CONFIG, '', '', 'empty'),
    (CONFIG, ' , ', '', 'empty'),
    (CONFIG, '128,abc', '', 'integers'),
    (CONFIG, '0', '', 'positive'),
    (CONFIG, '8,8', '', 'repeated'),
    ('configs/grpo.py:P=8,runlocal', '16', '', 'already sets P'),
    ('configs/protocol.py', '16', '', '--sweep_key'),
])
def test_sweep_errors(config, batches, key, message):
  with pytest.raises(sweep.LaunchError, match=message):
    sweep.points(config, 'w', batches, key=key)


# ----- xm_launch: the pure part -----


def test_xm_build_jobs_vertex_gpu():
  specs = xm_launch.build_jobs(flags(executor='vertex', accelerator='a100:8', workdir='/gcs/b/x',
                                     extra_args='--seed=3'))
  assert [s.name for s in specs] == ['rljax-P128', 'rljax-P256', 'rljax-P1024']
  assert {(s.executor, s.accelerator, s.per_host, s.num_hosts) for s in specs} == {
      ('vertex', 'a100', 8, 1)}
  assert specs[2].args == ('--config=configs/grpo.py:P=1024,runlocal', '--workdir=/gcs/b/x/P1024',
                           '--seed=3')
  assert xm_launch.xm_resources(specs[0]) == {'a100': 8}


@pytest.mark.parametrize('executor,accelerator,resources', [
    ('local', 'tpu-v5e:8', {'tpu_v5e': 8}),
    ('local', 'h100:8', {'h100': 8}),
    ('gke', 't4:2', {'t4': 2}),
    ('gke', '', {}),
    ('vertex', 'cpu', {}),
])
def test_xm_resources(executor, accelerator, resources):
  [spec] = xm_launch.build_jobs(flags(executor=executor, accelerator=accelerator, batches='8'))
  assert xm_launch.xm_resources(spec) == resources


@pytest.mark.parametrize('overrides,message', [
    (dict(executor='borg'), 'unknown'),
    (dict(accelerator='h100'), 'KIND:COUNT'),
    (dict(accelerator='h100:'), 'KIND:COUNT'),
    (dict(accelerator='h100:x'), 'KIND:COUNT'),
    (dict(accelerator='h100:0'), 'KIND:COUNT'),
    (dict(accelerator='x100:8'), 'unknown kind'),
    (dict(accelerator='tpu-v5e:6', num_hosts=4), 'evenly'),
    (dict(num_hosts=0), 'at least 1'),
    (dict(executor='gke', accelerator='tpu-v5e:16', num_hosts=4), 'tpu_vm.py'),
    (dict(executor='vertex', accelerator='h100:8'), 'cannot run'),
    (dict(executor='vertex', accelerator='a100:8', num_hosts=2), 'single-host'),
    (dict(executor='local', accelerator='tpu-v5e:16', num_hosts=4), 'single-host'),
])
def test_xm_build_jobs_errors(overrides, message):
  with pytest.raises(sweep.LaunchError, match=message):
    xm_launch.build_jobs(flags(**overrides))


def test_xm_dry_run_needs_no_xmanager(tmp_path):
  # A broken `xmanager` ahead on the path: the dry run must not import it; a real launch must
  # stop with a clear message.
  (tmp_path / 'xmanager').mkdir()
  (tmp_path / 'xmanager' / '__init__.py').write_text('raise ImportError("blocked by test")')
  env = {'PYTHONPATH': str(tmp_path)}
  args = ['--executor=vertex', '--accelerator=a100:8', f'--config={CONFIG}',
          '--workdir=/gcs/b/grpo', '--batches=128,256,1024']
  result = run('xm_launch.py', *args, '--dry_run', env=env)
  assert result.returncode == 0, result.stderr
  for b in (128, 256, 1024):
    assert (f'python -m rljax.main --config=configs/grpo.py:P={b},runlocal '
            f'--workdir=/gcs/b/grpo/P{b}\n') in result.stdout
  assert result.stdout.count('executor:     vertex (xm_local.Vertex)') == 3
  assert result.stdout.count('requirements: xm.JobRequirements(a100=8)') == 3
  result = run('xm_launch.py', *args, env=env)
  assert result.returncode == 1
  assert result.stderr.startswith('error: xmanager is not installed')


# ----- every launcher: bad input -> one line, exit 1 -----


@pytest.mark.parametrize('script,args', [
    ('xm_launch.py', ['--executor=borg']),
    ('xm_launch.py', ['--accelerator=h100']),
    ('xm_launch.py', ['--accelerator=tpu-v5e']),
    ('xm_launch.py', ['--batches=']),
    ('slurm.py', ['--batches=']),
    ('slurm.py', ['--nodes=0']),
    ('slurm.py', ['--tasks_per_node=2']),   # with GPUs: one process owns a node's GPUs
    ('slurm.py', ['--workdir=gs://bucket/x']),
    ('tpu_vm.py', ['--batches=1,x', '--tpu=s', '--zone=z']),
    ('tpu_vm.py', ['--tpu=', '--zone=z']),
])
def test_bad_input_fails_with_one_line(script, args):
  base = [f'--config={CONFIG}', '--workdir=/runs/x', '--batches=8', '--tpu=s', '--zone=z']
  base = [a for a in base if script == 'tpu_vm.py' or not a.startswith(('--tpu', '--zone'))]
  result = run(script, *base, *args, '--dry_run')
  assert result.returncode == 1
  assert result.stderr.startswith('error: ') and result.stderr.count('\n') == 1, result.stderr
  assert not result.stdout


# ----- slurm -----


def test_slurm_scripts():
  scripts = slurm.build_scripts(flags(batches='128,256', partition='gpu',
                                      sbatch_args='--exclusive'))
  assert [path for path, _ in scripts] == ['/runs/grpo/P128/sbatch.sh', '/runs/grpo/P256/sbatch.sh']
  text = scripts[1][1]
  for line in ['#SBATCH --job-name=rljax-P256', '#SBATCH --nodes=2', '#SBATCH --ntasks-per-node=1',
               '#SBATCH --gpus-per-node=8', '#SBATCH --partition=gpu', '#SBATCH --exclusive',
               f'#SBATCH --chdir={REPO}', '#SBATCH --output=/runs/grpo/P256/slurm-%j.out',
               '  python -m rljax.main --config=configs/grpo.py:P=256,runlocal '
               '--workdir=/runs/grpo/P256']:
    assert line in text.splitlines()
  assert '#SBATCH --account' not in text
  assert subprocess.run(['bash', '-n'], input=text, text=True, check=False).returncode == 0


def test_slurm_dry_run_prints_and_writes_nothing(tmp_path):
  result = run('slurm.py', f'--config={CONFIG}', f'--workdir={tmp_path}/w', '--batches=128,256',
               '--nodes=4', '--dry_run')
  assert result.returncode == 0, result.stderr
  assert result.stdout.count('#!/bin/bash') == 2
  assert '#SBATCH --nodes=4' in result.stdout
  assert not (tmp_path / 'w').exists()


def test_slurm_script_gives_each_node_one_process_with_all_gpus(tmp_path):
  # Run the written script with stand-ins for scontrol, srun (two nodes) and python.
  dump = tmp_path / 'dump'
  bin_dir = fake_bin(tmp_path, 'scontrol', 'printf "gpu7\\ngpu8\\n"\n')
  fake_bin(tmp_path, 'srun', '''\
      while [[ "$1" == -* ]]; do shift; done
      for id in 0 1; do SLURM_PROCID=$id SLURM_LOCALID=0 "$@" || exit 1; done
      ''')
  rljax_env = '$RLJAX_COORDINATOR_ADDRESS $RLJAX_NUM_PROCESSES $RLJAX_PROCESS_ID'
  python = fake_bin(tmp_path, 'python',
                    f'echo "{rljax_env} local=${{SLURM_LOCALID-unset}} $*" >> {dump}\n') / 'python'
  result = run('slurm.py', f'--config={CONFIG}', f'--workdir={tmp_path}/w', '--batches=64',
               f'--python={python}')
  assert result.returncode == 0, result.stderr
  script = tmp_path / 'w' / 'P64' / 'sbatch.sh'
  env = {**os.environ, 'PATH': f'{bin_dir}:{os.environ["PATH"]}', 'SLURM_JOB_ID': '4101',
         'SLURM_JOB_NODELIST': 'gpu[7-8]', 'SLURM_NNODES': '2', 'SLURM_NTASKS': '2'}
  subprocess.run(['bash', str(script)], env=env, check=True, timeout=30)
  args = f'-m rljax.main --config=configs/grpo.py:P=64,runlocal --workdir={tmp_path}/w/P64'
  assert dump.read_text().splitlines() == [f'gpu7:61445 2 0 local=unset {args}',
                                           f'gpu7:61445 2 1 local=unset {args}']


def test_slurm_submit_needs_sbatch(tmp_path):
  args = [f'--config={CONFIG}', f'--workdir={tmp_path}/w', '--batches=8,16', '--submit']
  result = run('slurm.py', *args, env={'PATH': str(tmp_path / 'empty')})
  assert result.returncode == 1 and 'sbatch not found' in result.stderr


def _wait_for_job(job, env, timeout_s=900):
  """Until SLURM no longer lists job `job`."""
  deadline = time.time() + timeout_s
  while time.time() < deadline:
    queued = subprocess.run(['squeue', '-h', '-j', job], env=env, capture_output=True, text=True,
                            check=False)
    if not queued.stdout.strip():
      return
    time.sleep(1)
  subprocess.run(['scancel', job], env=env, check=False)
  raise AssertionError(f'SLURM job {job} still queued or running after {timeout_s} s')


@pytest.mark.e2e
def test_a_two_process_job_submitted_to_slurm_trains_as_one_process(slurm_env, tmp_path):
  """launch/slurm.py --submit to a real one-node SLURM: one job of two tasks, each a JAX process
  with 4 CPU devices that finds the coordinator and its rank in SLURM's environment, trains the
  tiny GRPO run of tests/test_multihost.py on one 8-device mesh and logs what one process with 8
  devices logs."""
  import test_multihost as multihost  # pylint: disable=g-import-not-at-top
  data_dir, warm_dir = tmp_path / 'data', tmp_path / 'warm'
  multihost.finish(multihost.launch(tmp_path / 'one', data_dir, warm_dir, devices=8))
  devices = f'{os.environ["XLA_FLAGS"]} --xla_force_host_platform_device_count=4'
  setup = f'export JAX_PLATFORMS=cpu PYTHONPATH={REPO} XLA_FLAGS={shlex.quote(devices)}'
  config, *tiny = multihost.TINY
  extra = shlex.join([*tiny, f'--config.data.dir={data_dir}', f'--config.warmstart.dir={warm_dir}'])
  result = run('slurm.py', config.replace(',P=8', ''), f'--workdir={tmp_path}/slurm',
               '--batches=8', '--nodes=1', '--tasks_per_node=2', '--gpus_per_node=0',
               '--time=15:00', f'--setup={setup}', f'--extra_args={extra}', '--submit',
               env=slurm_env)
  assert result.returncode == 0, result.stderr
  job = result.stdout.split()[-1]
  _wait_for_job(job, slurm_env)
  workdir = tmp_path / 'slurm' / 'P8'
  log = (workdir / f'slurm-{job}.out').read_text()
  assert log.count('parameters on 8 cpu device(s)') == 1, log[-3000:]   # process 0's pre-flight
  one, two = multihost.rows(tmp_path / 'one'), multihost.rows(workdir)
  assert len(one) == len(two) == 5, log[-3000:]
  for a, b in zip(one, two):
    assert a['step'] == b['step']
    for key in multihost.COMPARED:
      if key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a['step'], key)
  assert multihost.rows(workdir, 'prompts.jsonl') == multihost.rows(tmp_path / 'one',
                                                                     'prompts.jsonl')


# ----- tpu_vm -----


def test_tpu_vm_dry_run():
  result = run('tpu_vm.py', '--tpu=my-v5e-16', '--zone=us-west4-a', '--project=proj',
               f'--config={CONFIG}', '--workdir=gs://b/grpo', '--batches=128,256',
               '--setup=source .venv/bin/activate', '--extra_args=--note="a b"', '--dry_run')
  assert result.returncode == 0, result.stderr
  commands = [shlex.split(line) for line in result.stdout.splitlines()]
  assert commands == [
      ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 'my-v5e-16', '--zone=us-west4-a',
       '--project=proj', '--worker=all', '--command',
       f'cd ~/rljax && source .venv/bin/activate && python3 -m rljax.main '
       f'--config=configs/grpo.py:P={b},runlocal --workdir=gs://b/grpo/P{b} \'--note=a b\'']
      for b in (128, 256)]


def test_tpu_vm_runs_points_in_turn_and_stops_on_failure(tmp_path):
  log = tmp_path / 'gcloud.log'
  bin_dir = fake_bin(tmp_path, 'gcloud', f'echo "$5 ${{@: -1}}" >> {log}; [[ "$*" != *P256* ]]\n')
  env = {'PATH': f'{bin_dir}:{os.environ["PATH"]}'}
  result = run('tpu_vm.py', '--tpu=s', '--zone=z', f'--config={CONFIG}', '--workdir=gs://b/g',
               '--batches=128,256,1024', env=env)
  assert result.returncode == 1
  assert result.stderr == 'error: rljax-P256 failed on s (exit 1)\n'
  calls = log.read_text().splitlines()
  assert len(calls) == 2 and calls[0].startswith('s cd ~/rljax && python3 -m rljax.main')
  assert calls[0].endswith('--workdir=gs://b/g/P128') and calls[1].endswith('P256')


# ----- xm_launch: the xmanager objects (only where xmanager is installed) -----


@pytest.mark.parametrize('executor,accelerator,cls,resource,count', [
    ('vertex', 'a100:8', 'Vertex', 'A100', 8),
    ('gke', 't4:2', 'Kubernetes', 'T4', 2),
    ('local', 'tpu-v5e:8', 'Local', 'TPU_V5E', 8),
    ('local', '', 'Local', None, None),
])
def test_xm_executor(executor, accelerator, cls, resource, count):
  pytest.importorskip('xmanager')
  from xmanager import xm, xm_local  # pylint: disable=g-import-not-at-top
  [spec] = xm_launch.build_jobs(flags(executor=executor, accelerator=accelerator, batches='8'))
  executor = xm_launch.xm_executor(spec)
  assert type(executor) is getattr(xm_local, cls)
  requirements = executor.requirements
  assert requirements.replicas == 1
  if resource is None:
    assert requirements.accelerator is None and not requirements.task_requirements
  else:
    assert requirements.accelerator == xm.ResourceType[resource]
    assert requirements.task_requirements[xm.ResourceType[resource]] == count
    assert requirements.topology.chip_count == count


def test_xm_packageable():
  pytest.importorskip('xmanager')
  from xmanager import xm  # pylint: disable=g-import-not-at-top
  [cloud] = xm_launch.build_jobs(flags(executor='vertex', accelerator='a100:8', batches='8'))
  container = xm_launch.xm_packageable(cloud).executable_spec
  assert isinstance(container, xm.PythonContainer)
  assert container.path == str(REPO) and container.entrypoint == xm.ModuleName('rljax.main')
  assert 'jax[cuda12]' in container.docker_instructions[-1]
  [local] = xm_launch.build_jobs(flags(batches='8'))
  packageable = xm_launch.xm_packageable(local)
  assert isinstance(packageable.executable_spec, xm.Binary)
  assert packageable.executable_spec.path == sys.executable


def test_xm_executor_table_matches_xmanager():
  # EXECUTORS claims which GPUs each cloud executor gets right: check against xmanager itself.
  pytest.importorskip('xmanager')
  from xmanager import xm  # pylint: disable=g-import-not-at-top
  from xmanager.cloud import kubernetes, vertex  # pylint: disable=g-import-not-at-top
  machines = {}
  for kind, count in [('a100', 8), ('l4', 1), ('h100', 8)]:
    spec = xm_launch.JobSpec('j', 'vertex', kind, count, 1, 'w', ())
    job = xm.Job(executable=None, executor=xm_launch.xm_executor(spec), args={})
    machines[kind] = vertex.get_machine_spec(job)['machine_type']
  assert machines['a100'] == 'a2-highgpu-8g' and machines['l4'] == 'g2-standard-4'
  assert machines['h100'].startswith('n1-')  # why vertex refuses H100
  allowed = xm_launch.EXECUTORS['gke']['accelerators'] - {''}
  for kind in allowed:
    spec = xm_launch.JobSpec('j', 'gke', kind, 1, 1, 'w', ())
    selector = kubernetes.node_selector_from_executor(xm_launch.xm_executor(spec))
    assert selector == {'cloud.google.com/gke-accelerator': f'nvidia-tesla-{kind}'}


def test_xm_local_launch_runs_the_points_in_turn(tmp_path):
  # A real xmanager launch on this machine, with a stand-in for rljax.main that records its args.
  pytest.importorskip('xmanager')
  code = textwrap.dedent(f'''\
      import asyncio, sys, types
      sys.path.insert(0, {str(REPO)!r})
      from absl import flags
      from launch import sweep, xm_launch
      sweep.ENTRY = ('-c', 'import os, sys, time; d = sys.argv[2].split("=", 1)[1]; '
                     't = time.time(); time.sleep(0.2); os.makedirs(d); '
                     'open(d + "/args", "w").write(f"{{t}} {{time.time()}} {{sys.argv[1:]}}")')
      specs = xm_launch.build_jobs(types.SimpleNamespace(
          executor='local', accelerator='', num_hosts=1, config={CONFIG!r},
          workdir={str(tmp_path / "w")!r}, batches='8,16', extra_args='', sweep_key=''))
      flags.FLAGS(['test'])
      asyncio.run(xm_launch.launch(specs, 'test'))
      ''')
  env = {**os.environ, 'HOME': str(tmp_path)}  # xmanager keeps its sqlite database in ~/.xmanager
  result = subprocess.run([sys.executable, '-c', code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
  assert result.returncode == 0, result.stderr
  times = []
  for b in (8, 16):
    start, end, args = (tmp_path / 'w' / f'P{b}' / 'args').read_text().split(' ', 2)
    times.append((float(start), float(end)))
    assert args == str([f'--config=configs/grpo.py:P={b},runlocal', f'--workdir={tmp_path}/w/P{b}'])
  assert times[0][1] <= times[1][0]  # one set of chips: the second run starts after the first
