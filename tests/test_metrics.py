"""rljax.train.metrics: metrics.jsonl, TensorBoard events read back with TensorBoard's own reader,
resume purging, the progress bar and the optional W&B sink."""
import json
import os
import re

import pytest
from tensorboard.backend.event_processing import event_accumulator

from rljax import files
from rljax.train import metrics
import rljax_cli


def train_row(step, reward):
  return dict(step=step, samples=16 * step, tokens=50 * step, reward_mean=reward, lr=1e-4,
              grad_norm=0.5 + step, samples_per_s=100.0, step_time_s=0.2, note='text is skipped')


def read_tensorboard(directory):
  accumulator = event_accumulator.EventAccumulator(directory)
  accumulator.Reload()
  return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
          for tag in accumulator.Tags()['scalars']}


def test_tensorboard_events_match_metrics_jsonl(tmp_path):
  writer = metrics.MetricsWriter(str(tmp_path), tensorboard=True)
  for step in (1, 2, 3):
    writer.train(train_row(step, 0.1 * step), console=False)
  writer.eval(3, 48, 0.75, [True, False], 1.5, 0.25)
  writer.close()
  rows = files.read_jsonl(str(tmp_path / 'metrics.jsonl'))
  scalars = read_tensorboard(str(tmp_path / 'tensorboard'))
  assert [v for _, v in scalars['train/reward_mean']] == pytest.approx(
      [r['reward_mean'] for r in rows if 'reward_mean' in r])
  assert [s for s, _ in scalars['train/grad_norm']] == [1, 2, 3]
  assert scalars['eval/eval_accuracy'] == [(3, 0.75)]
  assert 'train/note' not in scalars and 'train/step' not in scalars


def test_resume_purges_events_after_the_checkpoint(tmp_path):
  writer = metrics.MetricsWriter(str(tmp_path), tensorboard=True)
  for step in (1, 2, 3, 4):
    writer.train(train_row(step, 0.1), console=False)
  writer.close()
  resumed = metrics.MetricsWriter(str(tmp_path), tensorboard=True)
  resumed.truncate_after(2)
  resumed.train(train_row(3, 0.9), console=False)
  resumed.close()
  assert [r['step'] for r in files.read_jsonl(str(tmp_path / 'metrics.jsonl'))] == [1, 2, 3]
  rewards = read_tensorboard(str(tmp_path / 'tensorboard'))['train/reward_mean']
  assert rewards == [(1, pytest.approx(0.1)), (2, pytest.approx(0.1)), (3, pytest.approx(0.9))]


def test_progress_bar_shows_steps_reward_throughput_and_eta(tmp_path, capsys):
  writer = metrics.MetricsWriter(str(tmp_path), progress=dict(samples=64, step=0), bar=True)
  writer.train(train_row(1, 0.25), console=False)
  writer.train(train_row(2, 0.5), console=True)
  writer.close()
  err = capsys.readouterr().err
  assert '32/64' in err and 'step=2' in err and 'reward=0.500' in err and 'samples_per_s=100' in err
  assert '<' in err   # tqdm's elapsed<remaining (ETA)
  assert 'step 2 | samples 32 | reward 0.500' in err   # console lines go around the bar


def test_console_lines_without_a_bar(tmp_path, capsys):
  writer = metrics.MetricsWriter(str(tmp_path))
  writer.train(train_row(1, 0.25))
  assert 'step 1 | samples 16 | reward 0.250' in capsys.readouterr().out
  assert not os.path.exists(tmp_path / 'tensorboard')


def test_without_a_terminal_plain_lines_carry_the_eta_and_no_bar(tmp_path, capsys, monkeypatch):
  """Output to a file (pytest's capture is no terminal): no carriage return, one line per row
  asked for, each after the first with an ETA at the rate since the first row."""
  clock = iter(range(0, 1000, 10))   # 10 s and 16 samples per row
  monkeypatch.setattr(metrics.time, 'monotonic', lambda: float(next(clock)))
  writer = metrics.MetricsWriter(str(tmp_path), progress=dict(samples=160, step=100))
  for step in range(1, 7):
    writer.train(train_row(step, 0.25), console=step % 2 == 0)
  writer.eval(6, 96, 0.5, [True], 1.0, 0.25)
  writer.close()
  out, err = capsys.readouterr()
  assert '\r' not in out + err and err == ''
  lines = out.splitlines()
  assert len(lines) == 4, out
  # at step 6: 80 samples in 50 s since step 1; 64 left: 40 s
  etas = [re.search(r'ETA (\S+)$', line).group(1) for line in lines[:3]]
  assert etas == ['1m20s', '1m00s', '40s']
  assert lines[3] == 'step 6 | samples 96 | eval accuracy 0.500'


@pytest.mark.e2e   # the tiny CLI run (tests/rljax_cli.py), shared with the reliability tests
def test_a_run_logged_to_a_file_reads_line_by_line(tiny):
  """stdout and stderr of `python -m rljax.main` to a file, as on a cluster: no carriage return
  (no bar, no dataset-build bars) and one line per evaluation and per train.log_every = 3 steps."""
  text = rljax_cli.log(tiny / 'reference')
  assert '\r' not in text
  lines = text.splitlines()
  progress = [line for line in lines if re.fullmatch(
      r'step \d+ \| samples \d+ \| reward [\d.]+ \| .* samples/s \| ETA \w+', line)]
  evals = [line for line in lines
           if re.fullmatch(r'step \d+ \| samples \d+ \| eval accuracy [\d.]+', line)]
  assert [line.split()[1] for line in progress] == ['3', '6'], text
  assert [line.split()[1] for line in evals] == ['0', '3', '6', '8'], text
  # the rest: the pre-flight, the dataset built (2), the warm start's eval and its warning
  assert len(lines) - len(progress) - len(evals) <= 5, text


@pytest.mark.parametrize('seconds, text', [(9.4, '9s'), (245, '4m05s'), (3725, '1h02m')])
def test_duration_reads_at_a_glance(seconds, text):
  assert metrics.duration(seconds) == text


def test_disabled_writer_writes_nothing(tmp_path):
  writer = metrics.MetricsWriter(str(tmp_path), enabled=False, tensorboard=True)
  writer.train(train_row(1, 0.25))
  writer.close()
  assert os.listdir(tmp_path) == []


def test_wandb_without_the_package_is_one_clear_error(tmp_path):
  try:
    import wandb  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    pytest.skip('wandb is installed')
  except ImportError:
    pass
  writer = metrics.MetricsWriter(str(tmp_path), wandb=dict(project='p'))
  with pytest.raises(ValueError, match='pip install wandb'):
    writer.train(train_row(1, 0.25), console=False)
  row = json.loads((tmp_path / 'metrics.jsonl').read_text())
  assert row['step'] == 1   # the contract file is written before any optional sink


# ----- crash safety of metrics.jsonl -----


def _write(path, text):
  path.write_text(text)
  return str(path)


def test_torn_last_line_is_dropped(tmp_path):
  path = _write(tmp_path / 'm.jsonl', '{"step": 1}\n{"step": 2}\n{"step": 3, "rew')
  assert files.read_jsonl(path) == [{'step': 1}, {'step': 2}]


def test_torn_line_in_the_middle_is_an_error(tmp_path):
  path = _write(tmp_path / 'm.jsonl', '{"step": 1}\n{"step": 2, "rew\n{"step": 3}\n')
  with pytest.raises(json.JSONDecodeError):
    files.read_jsonl(path)


def test_truncate_after_keeps_rows_up_to_the_checkpoint(tmp_path):
  rows = [dict(step=s, samples=s * 16, value=0.1 * s) for s in range(5)]
  for name in ('metrics.jsonl', 'eval_correct.jsonl', 'prompts.jsonl'):
    _write(tmp_path / name, ''.join(json.dumps(r) + '\n' for r in rows) + '{"step": 5, "sam')
  writer = metrics.MetricsWriter(str(tmp_path))
  writer.truncate_after(2)
  for path in (writer.path, writer.eval_path, writer.prompts_path):
    assert files.read_jsonl(path) == rows[:3]
  writer.truncate_after(-1)
  assert files.read_jsonl(writer.path) == [] and not list(tmp_path.glob('*.tmp'))


def test_prompts_rows_list_the_trained_indices_then_the_skipped_ones_by_reason(tmp_path):
  writer = metrics.MetricsWriter(str(tmp_path))
  writer.prompts(1, [7, 3], [])
  writer.prompts(2, [5, 9], [(11, 'KeyError'), (2, 'empty'), (4, 'KeyError')])
  assert files.read_jsonl(writer.prompts_path) == [
      dict(step=1, trained=[7, 3]), dict(step=2, trained=[5, 9]),
      dict(step=2, skipped=[11, 4], reason='KeyError'), dict(step=2, skipped=[2], reason='empty')]
