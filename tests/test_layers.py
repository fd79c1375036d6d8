"""The layering of rljax/ that docs/architecture.md's table states, checked against the code: every
module is in the table, no module imports one of a higher row, and no imports go around a circle.
Imports are read with `ast` from every file (function-level imports included); nothing is run."""
import ast
import os
import re

ROOT = os.path.join(os.path.dirname(__file__), '..')
TABLE_HEADER = '| layer | package | modules |'


def layer_table(markdown):
  """{module: level} from the table; level 0 is the top row, rows with one layer name share one."""
  lines = markdown[markdown.index(TABLE_HEADER):].splitlines()[2:]
  levels, names = {}, []
  for line in lines:
    if not line.startswith('|'):
      break
    layer, package, modules = (cell.strip() for cell in line.strip('|').split('|'))
    if not names or names[-1] != layer:
      names.append(layer)
    package = package.strip('`')
    levels[package] = levels.get(package, len(names) - 1)   # the package itself (__init__)
    for module in re.findall(r'`(\w+)`', re.sub(r'\([^)]*\)', '', modules)):
      levels[f'{package}.{module}'] = len(names) - 1
  return levels


def modules_of(package_dir):
  """{dotted name: path} of every .py file under rljax/."""
  found = {}
  for folder, _, files in os.walk(package_dir):
    for name in files:
      if name.endswith('.py'):
        path = os.path.join(folder, name)
        dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
        found[dotted.removesuffix('.__init__')] = path
  return found


def imports_of(source, self_name, known):
  """The rljax modules `source` imports (a name imported from a package counts as the module of
  that name where there is one, else as the package)."""
  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.split('.')[0] == 'rljax':
      for alias in node.names:
        name = f'{node.module}.{alias.name}'
        found.add(name if name in known else node.module)
    elif isinstance(node, ast.Import):
      found.update(a.name for a in node.names if a.name.split('.')[0] == 'rljax')
  return found - {self_name}


def violations(graph, levels):
  """Lines naming each unlisted module, each import up a row and each cycle of `graph`."""
  problems = [f'{m} is not in the table' for m in sorted(graph) if m not in levels]
  for module, targets in sorted(graph.items()):
    for target in sorted(targets):
      if module in levels and target in levels and levels[target] < levels[module]:
        problems.append(f'{module} imports {target}, a higher row')
  problems += [f'an import cycle among {", ".join(c)}' for c in cycles(graph)]
  return problems


def cycles(graph):
  """One circle per strongly connected component of more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for target in graph.get(node, ()):
      if target not in index:
        visit(target)
        low[node] = min(low[node], low[target])
      elif target in on_stack:
        low[node] = min(low[node], index[target])
    if low[node] == index[node]:
      component = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for node in sorted(graph):
    if node not in index:
      visit(node)
  return found


def test_the_code_keeps_the_documented_layers():
  with open(os.path.join(ROOT, 'docs', 'architecture.md')) as f:
    levels = layer_table(f.read())
  files = modules_of(os.path.join(ROOT, 'rljax'))
  files.pop('rljax')   # the package's own empty __init__
  graph = {}
  for name, path in files.items():
    with open(path) as f:
      graph[name] = imports_of(f.read(), name, files)
  assert not violations(graph, levels), '\n'.join(violations(graph, levels))
  assert not set(levels) - set(files) - {'rljax'}, 'the table names modules that do not exist'


def test_the_checker_finds_each_kind_of_violation():
  levels = layer_table(f'{TABLE_HEADER}\n| --- | --- | --- |\n'
                       '| top | `p` | `a` (`not_a_module`) |\n'
                       '| bottom | `p` | `b`, `c` |\n')
  assert levels == {'p': 0, 'p.a': 0, 'p.b': 1, 'p.c': 1}
  assert not violations({'p.a': {'p.b'}, 'p.b': {'p.c'}, 'p.c': set()}, levels)
  assert violations({'p.b': {'p.a'}}, levels) == ['p.b imports p.a, a higher row']
  assert violations({'p.b': {'p.c'}, 'p.c': {'p.b'}}, levels) == ['an import cycle among p.b, p.c']
  assert violations({'p.d': set()}, levels) == ['p.d is not in the table']
  known = {'rljax.x', 'rljax.y.z'}
  source = 'from rljax import x\nfrom rljax.y import z, w\ndef f():\n  import rljax.q\n'
  assert imports_of(source, 'rljax.m', known) == {'rljax.x', 'rljax.y.z', 'rljax.y', 'rljax.q'}
