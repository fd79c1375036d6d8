"""Launches one rljax job per batch size with XManager (xmanager is an optional extra).

  python launch/xm_launch.py --executor=vertex --accelerator=a100:8 \\
      --config=configs/grpo.py:runlocal --workdir=/gcs/BUCKET/grpo --batches=128,256,1024
  python launch/xm_launch.py ... --dry_run   # prints the jobs; needs neither xmanager nor a cloud

--accelerator is KIND:COUNT. GPU counts are per host (an 8-GPU node is h100:8); TPU counts are
chips in the whole slice, as Cloud names v5e/v6e slices (v5litepod-16 is tpu-v5e:16). Flags
starting with --xm_ go to xmanager itself (e.g. --xm_build_image_locally=false).
"""

import asyncio
import dataclasses
import os
import shlex
import sys

if __package__ in (None, ''):  # run as a file: make the `launch` package importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launch import sweep  # pylint: disable=g-import-not-at-top

# --accelerator KIND -> xm.ResourceType name.
GPUS = {'a100': 'A100', 'a100-80gb': 'A100_80GIB', 'h100': 'H100', 'h200': 'H200',
        'b200': 'B200', 'l4': 'L4_24TH', 't4': 'T4', 'v100': 'V100', 'p100': 'P100'}
TPUS = {'tpu-v4': 'TPU_V4', 'tpu-v5e': 'TPU_V5E', 'tpu-v5p': 'TPU_V5P', 'tpu-v6e': 'TPU_V6E'}

# What xmanager 0.8's open-source executors run correctly (read from its source, see
# docs/reference/launch.md): Vertex picks a valid machine only for A100 (a2-*), L4 (g2-*) and
# T4/V100/P100 (n1-*); H100/H200/B200 get an n1 machine Vertex rejects, and only legacy
# TPU v2/v3 map at all.
# GKE selects nodes by 'nvidia-tesla-<gpu>' (exists for A100/T4/V100/P100) and requests no TPUs.
# Neither tells JAX where its coordinator is when a job has several replicas, so multi-host runs
# go through launch/tpu_vm.py (TPU slices) and launch/slurm.py (GPU clusters). '' is CPU only.
EXECUTORS = {  # --executor -> its xm_local class and what it can run
    'local': dict(xm='Local', accelerators=None, max_hosts=1),  # this machine, whatever it has
    'vertex': dict(xm='Vertex', accelerators={'', 'a100', 'l4', 't4', 'v100', 'p100'}, max_hosts=1),
    'gke': dict(xm='Kubernetes', accelerators={'', 'a100', 't4', 'v100', 'p100'}, max_hosts=1),
}

# Cloud executors run a container built from this repo.
BASE_IMAGE = 'python:3.11'
JAX_PACKAGE = {'gpu': 'jax[cuda12]', 'cpu': 'jax'}


@dataclasses.dataclass(frozen=True)
class JobSpec:
  """Everything one job needs, as plain data: what the dry run prints and the launch uses."""
  name: str
  executor: str
  accelerator: str  # a key of GPUS or TPUS; '' for CPU only
  per_host: int  # accelerators on each host
  num_hosts: int
  workdir: str
  args: tuple[str, ...]  # of `python -m rljax.main`


def parse_accelerator(text, num_hosts):
  """'h100:8' -> ('h100', 8 per host); 'tpu-v5e:16' on 4 hosts -> ('tpu-v5e', 4 per host)."""
  if text in ('', 'cpu'):
    return '', 0
  kind, sep, count = text.partition(':')
  if not sep or not count.isdigit() or int(count) == 0:
    raise sweep.LaunchError(f'--accelerator={text!r}: expected KIND:COUNT, e.g. h100:8 or '
                            f'tpu-v5e:16')
  if kind not in GPUS and kind not in TPUS:
    raise sweep.LaunchError(f'--accelerator={text!r}: unknown kind {kind!r} (known: '
                            f'{", ".join([*GPUS, *TPUS])}, or cpu)')
  count = int(count)
  if kind in GPUS:
    return kind, count
  if count % num_hosts:
    raise sweep.LaunchError(f'--accelerator={text!r}: {count} TPU chips do not split evenly '
                            f'over --num_hosts={num_hosts}')
  return kind, count // num_hosts


def build_jobs(args):
  """Flags (any object with the flag names as attributes) -> one JobSpec per batch size."""
  if args.executor not in EXECUTORS:
    raise sweep.LaunchError(f'--executor={args.executor!r}: unknown (choose from '
                            f'{", ".join(EXECUTORS)})')
  if args.num_hosts < 1:
    raise sweep.LaunchError(f'--num_hosts={args.num_hosts}: must be at least 1')
  kind, per_host = parse_accelerator(args.accelerator, args.num_hosts)
  supported = EXECUTORS[args.executor]
  if supported['accelerators'] is not None and kind not in supported['accelerators']:
    raise sweep.LaunchError(
        f'--executor={args.executor} cannot run --accelerator={args.accelerator} with xmanager '
        f'(it can: {", ".join(sorted(a or "cpu" for a in supported["accelerators"]))}); use '
        f'launch/tpu_vm.py for TPU slices or launch/slurm.py for GPU clusters')
  if args.num_hosts > supported['max_hosts']:
    raise sweep.LaunchError(
        f'--executor={args.executor} runs single-host jobs only (xmanager gives JAX no '
        f'coordinator); use launch/tpu_vm.py for TPU slices or launch/slurm.py for GPU clusters')
  return [JobSpec(name=p.name, executor=args.executor, accelerator=kind, per_host=per_host,
                  num_hosts=args.num_hosts, workdir=p.workdir, args=p.args)
          for p in sweep.points(args.config, args.workdir, args.batches, args.extra_args,
                                args.sweep_key)]


def xm_resources(spec):
  """Keyword arguments of xm.JobRequirements for one job."""
  resources = {}
  if spec.accelerator in GPUS:  # xmanager counts GPUs per replica
    resources[GPUS[spec.accelerator].lower()] = spec.per_host
  elif spec.accelerator in TPUS:  # ... and TPUs per slice
    resources[TPUS[spec.accelerator].lower()] = spec.per_host * spec.num_hosts
  if spec.num_hosts > 1:
    resources['replicas'] = spec.num_hosts
  return resources


def describe(spec):
  """The dry-run text of one job."""
  requirements = ', '.join(f'{k}={v}' for k, v in xm_resources(spec).items())
  hardware = f'{spec.accelerator} x{spec.per_host} per host' if spec.accelerator else 'cpu only'
  return '\n'.join([
      f'job {spec.name}',
      f'  executor:     {spec.executor} (xm_local.{EXECUTORS[spec.executor]["xm"]})',
      f'  requirements: xm.JobRequirements({requirements})  # {hardware}, {spec.num_hosts} host(s)',
      f'  command:      {shlex.join(["python", *sweep.ENTRY, *spec.args])}',
  ])


# --- The part that talks to xmanager: imported only when launching. ---


def _xmanager():
  try:
    from xmanager import xm, xm_local  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise sweep.LaunchError(f'xmanager is not installed ({e}): pip install xmanager, or use '
                            f'--dry_run') from None
  return xm, xm_local


def xm_executor(spec):
  """The xmanager executor, with its resource requirements, for one job."""
  xm, xm_local = _xmanager()
  executor_cls = getattr(xm_local, EXECUTORS[spec.executor]['xm'])
  return executor_cls(requirements=xm.JobRequirements(**xm_resources(spec)))


def xm_packageable(spec):
  """How the code gets to the job: this python locally, else a container of this repo."""
  xm, _ = _xmanager()
  executor_spec = type(xm_executor(spec)).Spec()
  if spec.executor == 'local':  # runs in the current directory: launch from the repo root
    return xm.binary(executor_spec=executor_spec, path=sys.executable, args=list(sweep.ENTRY))
  jax = JAX_PACKAGE['gpu' if spec.accelerator else 'cpu']
  return xm.python_container(
      executor_spec=executor_spec, path=sweep.REPO, base_image=BASE_IMAGE, use_deep_module=True,
      entrypoint=xm.ModuleName(sweep.ENTRY[1]),
      docker_instructions=[f'COPY {os.path.basename(sweep.REPO)}/ /workdir', 'WORKDIR /workdir',
                           f'RUN python -m pip install --no-cache-dir . "{jax}"'])


async def launch(specs, title):
  """Adds one work unit per job; on 'local' they run one after another (one set of chips)."""
  xm, xm_local = _xmanager()
  async with xm_local.create_experiment(experiment_title=title) as experiment:
    [executable] = experiment.package([xm_packageable(specs[0])])
    for spec in specs:
      work_unit = await experiment.add(
          xm.Job(executable=executable, executor=xm_executor(spec), args=list(spec.args)))
      print(f'launched {spec.name} as work unit {work_unit.work_unit_id}', flush=True)
      if spec.executor == 'local':
        try:
          await work_unit.wait_until_complete()
        except xm.ExperimentUnitError as e:
          raise sweep.LaunchError(f'{spec.name} failed: {e}') from None


def main():
  parser = sweep.parser(__doc__)
  sweep.add_flags(parser)
  parser.add_argument('--executor', default='local', help='local | vertex | gke')
  parser.add_argument('--accelerator', default='', help='KIND:COUNT, e.g. a100:8; empty: cpu')
  parser.add_argument('--num_hosts', type=int, default=1, help='hosts per job')
  args, xm_flags = parser.parse_known_args()
  if unknown := [f for f in xm_flags if not f.startswith('--xm_')]:
    parser.error(f'unrecognized arguments: {" ".join(unknown)}')
  specs = build_jobs(args)
  if args.dry_run:
    print(f'dry run: {len(specs)} job(s), nothing launched')
    print('\n'.join(describe(s) for s in specs))
    return
  _xmanager()
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.FLAGS([sys.argv[0], *xm_flags])  # xmanager reads its own settings from absl flags
  asyncio.run(launch(specs, title=f'rljax {args.config} {args.batches}'))


if __name__ == '__main__':
  sweep.run(main)
