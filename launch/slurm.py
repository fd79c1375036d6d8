"""Writes (and with --submit, sbatch-es) one SLURM script per batch size, for multi-node GPU runs.

  python launch/slurm.py --nodes=4 --gpus_per_node=8 --partition=gpu \\
      --config=configs/grpo.py:runlocal --workdir=/shared/grpo --batches=128,256,1024 --submit
  python launch/slurm.py ... --dry_run   # prints the scripts; writes and submits nothing
  python launch/slurm.py --gpus_per_node=0 --tasks_per_node=2 ...   # CPU processes, 2 a node

Each script lands in its run's workdir (<workdir>/P128/sbatch.sh, log slurm-<jobid>.out beside it)
and is self-contained: re-submitting it resumes the run from its checkpoints.
"""

import os
import shlex
import shutil
import subprocess
import sys

if __package__ in (None, ''):  # run as a file: make the `launch` package importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launch import sweep  # pylint: disable=g-import-not-at-top

# Each SLURM task is one JAX process: with GPUs one per node, owning all that node's GPUs; on CPUs
# any number per node. JAX's own SLURM detection would pin each process to GPU $SLURM_LOCALID (one
# GPU per process), so the task hides SLURM_LOCALID from it and gets the coordinator from the
# RLJAX_* variables that rljax.main reads instead. The port is derived from the job id, as JAX
# does, so two jobs sharing a first node do not collide.
TEMPLATE = """\
#!/bin/bash
{directives}
set -eo pipefail
{setup}
first_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
export RLJAX_COORDINATOR_ADDRESS="$first_node:$((61440 + SLURM_JOB_ID % 4096))"
export RLJAX_NUM_PROCESSES="$SLURM_NTASKS"
srun --ntasks-per-node={tasks} --kill-on-bad-exit=1 \\
  bash -c 'unset SLURM_LOCALID; export RLJAX_PROCESS_ID="$SLURM_PROCID"; exec "$@"' rljax \\
  {command}
"""


def render(point, args):
  """The sbatch script of one sweep point."""
  directives = [
      f'--job-name={point.name}',
      f'--nodes={args.nodes}',
      f'--ntasks-per-node={args.tasks_per_node}',
      f'--time={args.time}',
      f'--chdir={sweep.REPO}',
      f'--output={point.workdir}/slurm-%j.out',
  ]
  directives += [f'--gpus-per-node={args.gpus_per_node}'] * bool(args.gpus_per_node)
  directives += [f'--partition={args.partition}'] * bool(args.partition)
  directives += [f'--account={args.account}'] * bool(args.account)
  directives += shlex.split(args.sbatch_args)
  return TEMPLATE.format(
      directives='\n'.join(f'#SBATCH {d}' for d in directives),
      setup=args.setup, tasks=args.tasks_per_node,
      command=shlex.join([args.python, *sweep.ENTRY, *point.args]))


def build_scripts(args):
  """Flags -> [(script path, script text)], one per batch size."""
  if args.nodes < 1 or args.tasks_per_node < 1 or args.gpus_per_node < 0:
    raise sweep.LaunchError(f'--nodes={args.nodes} and --tasks_per_node={args.tasks_per_node} '
                            f'must be at least 1, --gpus_per_node={args.gpus_per_node} at least 0')
  if args.gpus_per_node and args.tasks_per_node > 1:
    raise sweep.LaunchError(f'--tasks_per_node={args.tasks_per_node} with GPUs: one process owns '
                            'a node\'s GPUs; several processes a node are for --gpus_per_node=0')
  if '://' in args.workdir:
    raise sweep.LaunchError(f'--workdir={args.workdir!r}: SLURM runs need a shared filesystem path')
  points = sweep.points(args.config, os.path.abspath(args.workdir), args.batches, args.extra_args,
                        args.sweep_key)
  return [(os.path.join(p.workdir, 'sbatch.sh'), render(p, args)) for p in points]


def main():
  parser = sweep.parser(__doc__)
  sweep.add_flags(parser)
  parser.add_argument('--nodes', type=int, default=1, help='nodes per run (one JAX process each)')
  parser.add_argument('--gpus_per_node', type=int, default=8, help='0: CPU processes')
  parser.add_argument('--tasks_per_node', type=int, default=1,
                      help='JAX processes per node (more than 1 only with --gpus_per_node=0)')
  parser.add_argument('--time', default='24:00:00', help='wall-clock limit per run')
  parser.add_argument('--partition', default='')
  parser.add_argument('--account', default='')
  parser.add_argument('--sbatch_args', default='', help='more #SBATCH options, e.g. "--exclusive"')
  parser.add_argument('--setup', default='', help='shell lines run first, e.g. "module load cuda"')
  parser.add_argument('--python', default=sys.executable, help='python on the compute nodes')
  parser.add_argument('--submit', action='store_true', help='sbatch the scripts after writing them')
  args = parser.parse_args()
  scripts = build_scripts(args)
  if args.dry_run:
    for path, text in scripts:
      print(f'# ----- {path}\n{text}')
    return
  if args.submit and not shutil.which('sbatch'):
    raise sweep.LaunchError('sbatch not found: run on a SLURM login node, or drop --submit')
  for path, text in scripts:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      f.write(text)
    if not args.submit:
      print(f'wrote {path}  (submit: sbatch {path})')
      continue
    result = subprocess.run(['sbatch', path], capture_output=True, text=True, check=False)
    if result.returncode:
      raise sweep.LaunchError(f'sbatch {path} failed: {result.stderr.strip()}')
    print(f'{path}: {result.stdout.strip()}')


if __name__ == '__main__':
  sweep.run(main)
