"""The size rules of rljax/ that docs/architecture.md states: no function over 60 lines, no file
over 450. Read with `ast` from every file; a function counts from its first decorator to its last
line, nested functions inside it included."""
import ast
import os

ROOT = os.path.join(os.path.dirname(__file__), '..')
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 450


def too_long(source, where):
  """Lines naming the file when it is over MAX_FILE_LINES and each function over
  MAX_FUNCTION_LINES."""
  problems = []
  lines = len(source.splitlines())
  if lines > MAX_FILE_LINES:
    problems.append(f'{where}: {lines} lines')
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      first = min([node.lineno] + [d.lineno for d in node.decorator_list])
      length = node.end_lineno - first + 1
      if length > MAX_FUNCTION_LINES:
        problems.append(f'{where}:{first} {node.name}: {length} lines')
  return problems


def python_files(package_dir):
  for folder, _, files in os.walk(package_dir):
    for name in sorted(files):
      if name.endswith('.py'):
        yield os.path.join(folder, name)


def test_no_long_function_or_file_in_rljax():
  problems = []
  for path in python_files(os.path.join(ROOT, 'rljax')):
    with open(path) as f:
      problems += too_long(f.read(), os.path.relpath(path, ROOT))
  assert not problems, '\n'.join(problems)


def test_the_size_check_finds_what_it_must():
  body = '\n'.join(f'  x{i} = {i}' for i in range(MAX_FUNCTION_LINES - 1))
  fits = f'def f():\n{body}\n'                       # exactly MAX_FUNCTION_LINES lines
  assert too_long(fits, 'ok.py') == []
  decorated = f'@staticmethod\ndef f():\n{body}\n'   # the decorator makes it one line too long
  assert too_long(decorated, 'a.py') == [f'a.py:1 f: {MAX_FUNCTION_LINES + 1} lines']
  nested = f'class C:\n  def g(self):\n  {body.replace(chr(10), chr(10) + "  ")}\n    y = 0\n'
  assert too_long(nested, 'b.py') == [f'b.py:2 g: {MAX_FUNCTION_LINES + 1} lines']
  long_file = '\n'.join('x = 0' for _ in range(MAX_FILE_LINES + 1))
  assert too_long(long_file, 'c.py') == [f'c.py: {MAX_FILE_LINES + 1} lines']
