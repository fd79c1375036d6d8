"""Run logs: WORKDIR/metrics.jsonl (the contract other tools read), WORKDIR/eval_correct.jsonl
(per-prompt eval correctness, for bootstrap confidence intervals), WORKDIR/prompts.jsonl (the
stream indices of the prompts each step trained and of the malformed records it skipped, so every
prompt can be accounted for across resumes), TensorBoard event files in
WORKDIR/tensorboard (`tensorboard --logdir WORKDIR`), optionally Weights & Biases, and the console:
a progress bar (steps, reward, samples/s, ETA) on an interactive terminal only, since its
carriage-return redraws become thousands of partial lines in a file (a cluster's log, nohup, CI);
elsewhere the plain line of every `train.log_every`-th step carries the ETA instead.

Only the process that owns logging (process 0) writes. On resume, rows logged after the restored
checkpoint are dropped (TensorBoard events too, via purge_step), so the logs read as one
uninterrupted run.
"""
import hashlib
import json
import os
import sys
import time

import numpy as np
import tqdm

from rljax import files


def _plain(value):
  """numpy / jax scalars -> JSON-native numbers (in lists too)."""
  if isinstance(value, (bool, int, float, str)) or value is None:
    return value
  if isinstance(value, list):
    return [_plain(item) for item in value]
  return np.asarray(value).item()


def interactive():
  """Whether a person watches the console (both streams a terminal), not a file."""
  return sys.stdout.isatty() and sys.stderr.isatty()


def duration(seconds):
  """'1h02m', '4m05s', '9s': an ETA a person reads at a glance."""
  seconds = int(round(seconds))
  if seconds >= 3600:
    return f'{seconds // 3600}h{seconds % 3600 // 60:02d}m'
  return f'{seconds // 60}m{seconds % 60:02d}s' if seconds >= 60 else f'{seconds}s'


class MetricsWriter:
  """Writes each row to every enabled sink. `progress`: dict(samples=budget, step=budget), 0 for
  none, for the console's bar and ETA, or None for plain lines without ETA; `bar`: draw the bar
  (default: on an interactive terminal); `wandb`: dict(project=..., config=...) or None."""

  def __init__(self, workdir, enabled=True, *, tensorboard=False, progress=None, wandb=None,
               bar=None):
    self.enabled = enabled
    self.workdir = workdir
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self.eval_path = os.path.join(workdir, 'eval_correct.jsonl')
    self.prompts_path = os.path.join(workdir, 'prompts.jsonl')
    self.tensorboard_dir = os.path.join(workdir, 'tensorboard') if tensorboard else None
    self._progress, self._wandb_args = progress, wandb
    self._resume_step, self._tb, self._bar, self._wandb = 0, None, None, None
    self._draw_bar = interactive() if bar is None else bar
    self._since = None   # (time, row) of this process's first row: the ETA's rate

  def _append(self, path, row):
    if self.enabled:
      with open(path, 'a') as f:
        f.write(json.dumps({k: _plain(v) for k, v in row.items()}) + '\n')

  def truncate_after(self, step):
    """Drops rows with step > `step` (logged after the checkpoint we resume from; -1: all rows).

    Rewrites into a temporary file and renames it, so a kill here loses no row.
    """
    self._resume_step = step
    if not self.enabled:
      return
    for path in (self.path, self.eval_path, self.prompts_path):
      rows = [row for row in files.read_jsonl(path) if row['step'] <= step]
      with open(path + '.tmp', 'w') as f:
        f.writelines(json.dumps(row) + '\n' for row in rows)
      os.replace(path + '.tmp', path)

  # ---------------------------------------------------------------- sinks, opened on first use

  def _scalars(self, row, prefix):
    """Numeric fields of a row, by TensorBoard tag."""
    return {f'{prefix}/{k}': float(_plain(v)) for k, v in row.items()
            if k not in ('step', 'eval') and isinstance(_plain(v), (int, float))}

  def _log_tensorboard(self, row, prefix):
    if self.tensorboard_dir is None:
      return
    if self._tb is None:
      import tensorboardX  # pylint: disable=import-outside-toplevel
      self._tb = tensorboardX.SummaryWriter(  # a resumed run's file must not reuse the old name
          self.tensorboard_dir, flush_secs=10, purge_step=self._resume_step + 1,
          filename_suffix=f'.{os.getpid()}.from{self._resume_step}')
    for tag, value in self._scalars(row, prefix).items():
      self._tb.add_scalar(tag, value, global_step=row['step'])

  def _log_wandb(self, row, prefix):
    if self._wandb_args is None:
      return
    if self._wandb is None:
      try:
        import wandb  # pylint: disable=import-outside-toplevel
      except ImportError:
        raise ValueError('metrics.wandb=True needs the wandb package: pip install wandb') from None
      run_id = hashlib.sha256(os.path.abspath(self.workdir).encode()).hexdigest()[:16]
      self._wandb = wandb.init(project=self._wandb_args['project'], dir=self.workdir, id=run_id,
                               resume='allow', config=self._wandb_args.get('config'))
    self._wandb.log(self._scalars(row, prefix), step=row['step'])

  def _print(self, line):
    if self._bar is not None:
      self._bar.write(line, file=sys.stderr)
    else:
      print(line, flush=True)

  def _eta(self, row):
    """' | ETA 4m05s' at this process's rate so far, to the first budget spent ('' before a
    rate or without a budget)."""
    budgets = {unit: total for unit, total in (self._progress or {}).items() if total}
    now = time.monotonic()
    if self._since is None:
      self._since = (now, row)
    seconds = [(total - row[unit]) * (now - self._since[0]) / (row[unit] - self._since[1][unit])
               for unit, total in budgets.items() if row[unit] > self._since[1][unit]]
    return f' | ETA {duration(max(min(seconds), 0))}' if seconds and now > self._since[0] else ''

  def _advance_bar(self, row):
    if not (self._progress and self._draw_bar):
      return
    unit = 'samples' if self._progress.get('samples') else 'step'
    if self._bar is None:
      self._bar = tqdm.tqdm(total=self._progress[unit] or None, unit=unit, dynamic_ncols=True,
                            initial=row[unit], file=sys.stderr, smoothing=0.1)
    batch = dict(batch=row['batch']) if 'batch' in row else {}   # auto_batch changes it
    self._bar.set_postfix(step=row['step'], reward=f"{row['reward_mean']:.3f}",
                          samples_per_s=f"{row['samples_per_s']:.0f}", **batch, refresh=False)
    self._bar.update(row[unit] - self._bar.n)

  # ---------------------------------------------------------------- rows

  def train(self, row, console=True):
    self._append(self.path, row)
    if not self.enabled:
      return
    self._log_tensorboard(row, 'train')
    self._log_wandb(row, 'train')
    self._advance_bar(row)
    eta = self._eta(row)
    if console:
      self._print(f"step {row['step']} | samples {row['samples']} | reward {row['reward_mean']:.3f}"
                  f" | lr {row['lr']:.2e} | grad norm {row['grad_norm']:.3f} | "
                  f"{row['samples_per_s']:.0f} samples/s" +
                  (f" | batch {row['batch']} responses" if 'batch' in row else '') + eta)

  def prompts(self, step, trained, skipped):
    """The step's prompts.jsonl rows: {step, trained: [stream index, ...]}, then one {step,
    skipped: [stream index, ...], reason} per reason of the malformed records it passed over
    (`skipped`: [(stream index, reason)])."""
    self._append(self.prompts_path, dict(step=step, trained=trained))
    by_reason = {}
    for index, reason in skipped:
      by_reason.setdefault(reason, []).append(index)
    for reason, indices in by_reason.items():
      self._append(self.prompts_path, dict(step=step, skipped=indices, reason=reason))

  def say(self, line):
    """A line on the console (process 0), beside the progress bar when there is one."""
    if self.enabled:
      self._print(line)

  def eval(self, step, samples, accuracy, correct_N, wallclock_s, eval_time_s):
    row = dict(step=step, samples=samples, eval=True, eval_accuracy=accuracy,
               wallclock_s=wallclock_s, eval_time_s=eval_time_s)
    self._append(self.path, row)
    self._append(self.eval_path, dict(step=step, samples=samples,
                                      correct=''.join('1' if c else '0' for c in correct_N)))
    if self.enabled:
      self._log_tensorboard(row, 'eval')
      self._log_wandb(row, 'eval')
      self._print(f'step {step} | samples {samples} | eval accuracy {accuracy:.3f}')

  def close(self):
    """Flushes and closes the sinks (the jsonl files are complete after every row)."""
    if self._tb is not None:
      self._tb.close()
    if self._bar is not None:
      self._bar.close()
    if self._wandb is not None:
      self._wandb.finish()
    self._tb = self._bar = self._wandb = None


def writer_from_config(config, workdir, enabled):
  """The writer a training config asks for (config.metrics)."""
  mcfg = config.metrics
  wandb = dict(project=mcfg.wandb_project, config=config.to_dict()) if mcfg.wandb else None
  return MetricsWriter(
      workdir, enabled=enabled, tensorboard=mcfg.tensorboard,
      progress=dict(samples=config.train.max_samples, step=config.train.max_steps)
      if mcfg.progress else None, wandb=wandb)
