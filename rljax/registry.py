"""Modules chosen by a config string: `config.algo = 'grpo'` is rljax.algos.grpo and
`config.data.name = 'sums'` is rljax.tasks.sums. A new algorithm or task is one new file."""
import importlib
import pkgutil


def names(package):
  """The public modules of `package` (a module object); '_' marks what several of them share."""
  return sorted(m.name for m in pkgutil.iter_modules(package.__path__)
                if not m.name.startswith('_'))


def get(package, name, field):
  """The module `name` of `package`; ValueError naming `field` and the known names otherwise."""
  if not isinstance(name, str) or not name.isidentifier() or name.startswith('_'):
    raise ValueError(f'{field} must be one of {names(package)}, got {name!r}')
  try:
    return importlib.import_module(f'{package.__name__}.{name}')
  except ModuleNotFoundError as error:
    if error.name != f'{package.__name__}.{name}':
      raise
    raise ValueError(f'{field} must be one of {names(package)}, got {name!r}') from None
