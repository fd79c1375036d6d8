"""rljax.metrics: a torn last line (a writer killed mid-line) is dropped; resume truncation."""
import json

import pytest

from rljax import metrics


def _write(path, text):
  path.write_text(text)
  return str(path)


def test_torn_last_line_is_dropped(tmp_path):
  path = _write(tmp_path / 'm.jsonl', '{"step": 1}\n{"step": 2}\n{"step": 3, "rew')
  assert metrics.read_jsonl(path) == [{'step': 1}, {'step': 2}]


def test_torn_line_in_the_middle_is_an_error(tmp_path):
  path = _write(tmp_path / 'm.jsonl', '{"step": 1}\n{"step": 2, "rew\n{"step": 3}\n')
  with pytest.raises(json.JSONDecodeError):
    metrics.read_jsonl(path)


def test_truncate_after_keeps_rows_up_to_the_checkpoint(tmp_path):
  rows = [dict(step=s, samples=s * 16, value=0.1 * s) for s in range(5)]
  for name in ('metrics.jsonl', 'eval_correct.jsonl'):
    _write(tmp_path / name, ''.join(json.dumps(r) + '\n' for r in rows) + '{"step": 5, "sam')
  writer = metrics.MetricsWriter(str(tmp_path))
  writer.truncate_after(2)
  assert metrics.read_jsonl(writer.path) == rows[:3]
  assert metrics.read_jsonl(writer.eval_path) == rows[:3]
  writer.truncate_after(-1)
  assert metrics.read_jsonl(writer.path) == [] and not list(tmp_path.glob('*.tmp'))
