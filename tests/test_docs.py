"""The documentation stands on its own: every path it names exists in the repository, and nothing
in the repository points at files that were never part of it."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOP_LEVEL = ('docs', 'rljax', 'bench', 'configs', 'tests', 'launch', 'colabs')
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
CODE = re.compile(r'`([^`\n]+)`')
OUTSIDE = re.compile(r'\.\./shared|PAPER\.md|RECIPE\.md|DESIGN\.md')
TEXT_SUFFIXES = ('.md', '.py', '.ipynb', '.sh')


def markdown_files():
  return sorted((ROOT / 'docs').rglob('*.md')) + [ROOT / 'README.md']


def named_paths(path):
  """(line number, path as written, resolved path) for each link and each backticked repo path."""
  for number, line in enumerate(path.read_text().splitlines(), 1):
    for target in LINK.findall(line):
      if re.match(r'[a-z]+:', target) or target.startswith('#'):
        continue
      yield number, target, (path.parent / target.split('#')[0]).resolve()
    for code in CODE.findall(line):
      token = re.split(r'::|:| ', code.strip())[0]
      if (token.split('/')[0] in TOP_LEVEL and '/' in token
          and not re.search(r'[*{}<>|]|\.\.\.', token) and re.search(r'\.\w+$|/$', token)):
        yield number, token, (ROOT / token).resolve()


@pytest.mark.parametrize('path', markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_path_exists(path):
  missing = [f'{path.relative_to(ROOT)}:{number}: {written}'
             for number, written, resolved in named_paths(path) if not resolved.exists()]
  assert not missing, 'paths that do not exist:\n' + '\n'.join(missing)


def test_named_paths_are_found():
  """The scanner itself: a link and a backticked path in a sample are both seen."""
  sample = ROOT / 'docs' / 'README.md'
  written = [w for _, w, _ in named_paths(sample)]
  assert 'method.md' in written and 'architecture.md' in written


def test_nothing_points_outside_the_repository():
  hits = [f'{path.relative_to(ROOT)}:{number}'
          for path in sorted(ROOT.rglob('*')) if path.suffix in TEXT_SUFFIXES
          and '.venv' not in path.parts and '.git' not in path.parts
          and path.resolve() != pathlib.Path(__file__).resolve()
          for number, line in enumerate(path.read_text(errors='replace').splitlines(), 1)
          if OUTSIDE.search(line)]
  assert not hits, 'references to files outside the repository:\n' + '\n'.join(hits)


def documented_rows(text):
  """{config field: its row's other cells} for the fields a reference page names: each table
  row's backticked names, under the sections its heading names (a dotted name is whole; 'Top
  level' has no section)."""
  rows, sections = {}, []
  for line in text.splitlines():
    if line.startswith('## '):
      sections = CODE.findall(line) or ([''] if 'Top level' in line else [])
    elif line.startswith('| `') and sections:
      first, *cells = line.strip('| ').split(' | ')
      for name in CODE.findall(first):
        rows.update((field, cells) for field in ([name] if '.' in name else
                    [f'{section}.{name}'.lstrip('.') for section in sections]))
  return rows


def config_items(tree, prefix=''):
  """(dotted field, value) of each leaf of a config's dict."""
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from config_items(value, f'{prefix}{key}.')
    else:
      yield f'{prefix}{key}', value


CONFIG_FILES = ('grpo', 'ppo', 'rloo', 'protocol')


def fields_of(name):
  """The fields of configs/<name>.py's default config; a protocol's `arm.a.b` as the training
  field `a.b` it sets for every arm."""
  import importlib   # pylint: disable=import-outside-toplevel
  config = importlib.import_module(f'configs.{name}').get_config()
  return {field.removeprefix('arm.') for field, _ in config_items(config.to_dict())}


def reference_fields():
  return set(documented_rows((ROOT / 'docs' / 'reference' / 'config.md').read_text()))


@pytest.mark.parametrize('name', CONFIG_FILES)
def test_the_config_reference_names_every_field(name):
  """Every field of each config file (the base config's through each algorithm's) has its row in
  docs/reference/config.md."""
  missing = sorted(fields_of(name) - reference_fields())
  assert not missing, 'fields docs/reference/config.md does not name: ' + ', '.join(missing)


def test_the_config_reference_names_only_fields_that_exist():
  every = set().union(*(fields_of(name) for name in CONFIG_FILES))
  stale = sorted(field for field in reference_fields()
                 if field.split('.')[0].islower() and field not in every)   # not `ModelConfig`
  assert not stale, 'docs/reference/config.md names fields no config has: ' + ', '.join(stale)
