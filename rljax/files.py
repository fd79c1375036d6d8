"""JSON files every layer reads and writes, on the ground floor: run logs (JSON lines), records
(one JSON value), written so that a kill leaves the old file or the new one."""
import json
import os


def read_json(path):
  """A JSON file's content, or None when there is no such file."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def write_json_atomic(path, value):
  """Writes then renames, so a kill leaves the old file or the new one, never half of one."""
  with open(path + '.tmp', 'w') as f:
    json.dump(value, f, indent=1, sort_keys=True)
  os.replace(path + '.tmp', path)


def read_jsonl(path):
  """The rows of a JSON-lines file; a torn last line (its writer was killed mid-line) is dropped."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  rows = []
  for index, line in enumerate(lines):
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError as error:
      if index < len(lines) - 1:
        raise json.JSONDecodeError(f'{path}: line {index + 1} is not JSON: {error.msg}',
                                   error.doc, error.pos) from None
  return rows
