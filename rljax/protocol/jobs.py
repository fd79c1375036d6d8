"""Where the protocol's training runs go: this process, one after another (the default), or a SLURM
cluster, each run a job of its own and a phase's jobs in parallel (protocol.scheduler='slurm').

A runner's `run(cfg, run_dir, label)` trains one run or submits it; `wait()` returns when every run
given since the last wait has finished, so a phase reads complete runs. A job is an ordinary
resumable run (`python -m rljax.job RUN_DIR`: the config the driver recorded in
RUN_DIR/config.json); re-running the driver submits only the runs without RUN_DIR/done.json. The
timed phases (throughput rounds, confirmation) stay in the driver's process: jobs sharing a node
would time each other (docs/reference/launch.md, "The protocol on a cluster").
"""
import os
import shlex
import shutil
import subprocess
import sys
import time

from rljax.protocol import runs
from rljax.train import warmstart

SCHEDULERS = ('', 'slurm')
POLL_S = 2.0


class JobFailed(OSError):
  """A job ended without finishing its run (the cluster, not the input: exit 4)."""


class InProcess:
  """Each run trained here, now."""

  def __init__(self, stop=None):
    self.stop = stop

  def run(self, cfg, run_dir, label):
    runs.run_once(cfg, run_dir, label, self.stop)

  def wait(self):
    pass


class Slurm:
  """Each run an sbatch job of one task; `wait` polls squeue until the jobs have left it."""

  def __init__(self, setup='', sbatch_args='', cache_dir=''):
    if not shutil.which('sbatch'):
      raise ValueError("protocol.scheduler='slurm': sbatch not found; run the protocol on a SLURM "
                       'login node, or leave protocol.scheduler empty')
    self.setup, self.sbatch_args, self.cache_dir = setup, sbatch_args, cache_dir
    self.pending = {}   # job id -> (run_dir, label)

  def script(self, run_dir, label):
    directives = ['--job-name=rljax-' + label.replace(' ', '-').replace(':', ''), '--ntasks=1',
                  f'--chdir={os.getcwd()}', f'--output={run_dir}/slurm-%j.out',
                  *shlex.split(self.sbatch_args)]
    command = [sys.executable, '-m', 'rljax.job', run_dir] + (
        [self.cache_dir] if self.cache_dir else [])
    return '\n'.join(['#!/bin/bash', *(f'#SBATCH {d}' for d in directives),
                      'set -eo pipefail', self.setup, 'exec ' + shlex.join(command), ''])

  def run(self, cfg, run_dir, label):
    if runs.finished(cfg, run_dir, label) is not None:   # else the job trains the recorded cfg
      return
    self._submit(run_dir, label)
    warm = cfg.warmstart
    if warm.enabled and not warmstart.is_cached(cfg, warm.dir or run_dir):
      self.wait()   # this run trains the warm start that every later run reads: none beside it

  def _submit(self, run_dir, label):
    path = os.path.join(run_dir, 'sbatch.sh')
    with open(path, 'w') as f:
      f.write(self.script(run_dir, label))
    result = subprocess.run(['sbatch', '--parsable', path], capture_output=True, text=True,
                            check=False)
    if result.returncode:
      raise JobFailed(f'sbatch {path} failed: {result.stderr.strip()}')
    job = result.stdout.strip().split(';')[0]
    self.pending[job] = (run_dir, label)
    print(f'[protocol] {label}: submitted as SLURM job {job} ({run_dir})', flush=True)

  def wait(self):
    while self.pending.keys() & _queued():
      time.sleep(POLL_S)
    failed = [(job, run_dir) for job, (run_dir, _) in self.pending.items()
              if not os.path.exists(os.path.join(run_dir, 'done.json'))]
    self.pending = {}
    if failed:
      job, run_dir = failed[0]
      raise JobFailed(f'{len(failed)} SLURM job(s) ended without finishing their run, e.g. job '
                      f'{job}: see {run_dir}/slurm-{job}.out; run the protocol again to resubmit '
                      'the unfinished runs')


def _queued():
  """The ids of the jobs SLURM still lists (pending or running)."""
  result = subprocess.run(['squeue', '-h', '-o', '%i'], capture_output=True, text=True,
                          check=False)
  if result.returncode:
    raise JobFailed(f'squeue failed: {result.stderr.strip()}')
  return set(result.stdout.split())


def runner(config, workdir, stop=None):
  """The runner protocol.scheduler names."""
  p = config.protocol
  if p.scheduler == 'slurm':
    cache = os.path.join(os.path.abspath(workdir), 'jax_cache') if p.compilation_cache else ''
    return Slurm(p.job_setup, p.job_sbatch_args, cache)
  return InProcess(stop)
