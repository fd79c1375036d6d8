"""Runs rljax on all workers of a Cloud TPU VM slice, one batch size after another.

  python launch/tpu_vm.py --tpu=my-v5e-16 --zone=us-west4-a \\
      --config=configs/grpo.py:runlocal --workdir=gs://BUCKET/grpo --batches=128,256,1024
  python launch/tpu_vm.py ... --dry_run   # prints the gcloud commands; needs no gcloud

Every worker runs the same command (gcloud ... ssh --worker=all), and jax.distributed.initialize()
in rljax.main finds the other workers by itself. The workers need this repo at --repo_dir with its
dependencies installed, and a --workdir they all see, e.g. on GCS (docs/reference/launch.md).
"""

import os
import shlex
import shutil
import subprocess
import sys

if __package__ in (None, ''):  # run as a file: make the `launch` package importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launch import sweep  # pylint: disable=g-import-not-at-top


def gcloud_command(point, args):
  """The gcloud argv that runs one sweep point on every worker of the slice."""
  # repo_dir stays unquoted so that ~ expands on the workers.
  remote = ' && '.join(filter(None, [f'cd {args.repo_dir}', args.setup,
                                     shlex.join([args.python, *sweep.ENTRY, *point.args])]))
  project = [f'--project={args.project}'] if args.project else []
  return ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', args.tpu, f'--zone={args.zone}',
          *project, '--worker=all', '--command', remote]


def build_commands(args):
  """Flags -> [(sweep point, gcloud argv)], one per batch size, run in that order."""
  if not args.tpu or not args.zone:
    raise sweep.LaunchError('--tpu and --zone name the TPU VM slice, e.g. --tpu=my-v5e-16 '
                            '--zone=us-west4-a')
  points = sweep.points(args.config, args.workdir, args.batches, args.extra_args, args.sweep_key)
  return [(p, gcloud_command(p, args)) for p in points]


def main():
  parser = sweep.parser(__doc__)
  sweep.add_flags(parser)
  parser.add_argument('--tpu', required=True, help='name of the TPU VM slice')
  parser.add_argument('--zone', required=True)
  parser.add_argument('--project', default='', help='default: gcloud config')
  parser.add_argument('--repo_dir', default='~/rljax', help='this repo on the workers')
  parser.add_argument('--setup', default='', help='run first on each worker, e.g. '
                      '"source .venv/bin/activate"')
  parser.add_argument('--python', default='python3', help='python on the workers')
  args = parser.parse_args()
  commands = build_commands(args)
  if args.dry_run:
    for _, argv in commands:
      print(shlex.join(argv))
    return
  if not shutil.which('gcloud'):
    raise sweep.LaunchError('gcloud not found: install the Google Cloud CLI, or use --dry_run')
  for point, argv in commands:  # the slice runs one job at a time
    print(f'running {point.name} on all workers of {args.tpu}', flush=True)
    if returncode := subprocess.run(argv, check=False).returncode:
      raise sweep.LaunchError(f'{point.name} failed on {args.tpu} (exit {returncode})')


if __name__ == '__main__':
  sweep.run(main)
