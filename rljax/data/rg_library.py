"""The reasoning-gym package (procedural problem generators, each with its own scorer) as rljax
reads it: a dataset by name and config fields, its entries by index, and a response's score by the
dataset's own `score_answer`.

A record's answer is a reference to the library's entry (`reference`: dataset, config, seed,
index and the entry's answer), not the entry itself: the verifier generates the entry again, so
the scorer reads exactly what the library made (metadata included, no JSON round trip), and a
library that now makes another entry is caught, not scored. reasoning-gym is optional: it is
imported on first use, and without it a reasoning_gym task stops with one line saying how to
install it.
"""
import dataclasses
import functools
import json

INSTALL = "pip install 'reasoning-gym>=0.1.25,<0.2' (or pip install -e '.[reasoning_gym]')"


def library():
  """The reasoning_gym package; ValueError saying how to install it when it is missing."""
  try:
    import reasoning_gym  # pylint: disable=import-outside-toplevel  (optional; ~1 s to import)
  except ImportError:
    raise ValueError(
        f'data.name=reasoning_gym needs the reasoning-gym package: {INSTALL}') from None
  return reasoning_gym


def version():
  """The installed library's version: built datasets are named after it (another version may
  make other entries)."""
  import importlib.metadata  # pylint: disable=import-outside-toplevel
  library()
  return importlib.metadata.version('reasoning-gym')


def names():
  """Every dataset the library registers."""
  return sorted(library().factory.DATASETS)


def parse_args(text):
  """data.dataset_args, a JSON object of the dataset's config fields, as canonical JSON (one
  dataset, one text: the cache keys and built-dataset names rely on it)."""
  try:
    args = json.loads(text or '{}')
  except json.JSONDecodeError as error:
    raise ValueError(
        f'data.dataset_args must be a JSON object, got {text!r} ({error.msg})') from None
  if not isinstance(args, dict):
    raise ValueError(f'data.dataset_args must be a JSON object, got {text!r}')
  if {'seed', 'size'} & set(args):
    raise ValueError('data.dataset_args: the seed is data.seed and the size comes from '
                     'data.num_train and data.num_test; leave both out')
  return json.dumps(args, sort_keys=True)


def _config_class(name):
  datasets = library().factory.DATASETS
  if name not in datasets:
    raise ValueError(f'data.dataset must name a reasoning-gym dataset, got {name!r}; the '
                     f'datasets: {", ".join(names())}')
  return datasets[name][1]


@functools.lru_cache(maxsize=64)
def dataset(name, args, seed, size):
  """The library's dataset `name` with config fields `args` (canonical JSON), `seed` and `size`
  (cached: the verifier asks for it at every score). ValueError for an unknown name or field, or a
  config the library's own checks refuse."""
  fields = [field.name for field in dataclasses.fields(_config_class(name))]
  config = json.loads(args)
  unknown = sorted(set(config) - set(fields))
  if unknown:
    raise ValueError(f'data.dataset_args: {name} has no field {", ".join(unknown)}; its fields: '
                     f'{", ".join(f for f in fields if f not in ("seed", "size"))}')
  try:
    return library().factory.create_dataset(name, **config, seed=seed, size=size)
  except (AssertionError, TypeError, ValueError) as error:   # the library's validate() asserts
    raise ValueError(f'data.dataset_args {args} is not a valid {name} config: '
                     f'{error or type(error).__name__}') from None


def reference(name, args, seed, size, index, answer) -> str:
  """A record's answer: what names entry `index` (whose answer is `answer`) of a dataset."""
  return json.dumps(dict(dataset=name, args=json.loads(args), seed=seed, size=size, index=index,
                         answer=answer), sort_keys=True)


def demonstration(reference_text) -> str:
  """What the warm start imitates for a reference: the library's answer to its entry."""
  return json.loads(reference_text)['answer']


@functools.lru_cache(maxsize=1 << 16)
def _entry(reference_text):
  ref = json.loads(reference_text)
  data = dataset(ref['dataset'], json.dumps(ref['args'], sort_keys=True), ref['seed'], ref['size'])
  entry = data[ref['index']]
  if entry['answer'] != ref['answer']:
    raise ValueError(f'{ref["dataset"]} entry {ref["index"]} now answers {entry["answer"]!r}, not '
                     f'{ref["answer"]!r}: built by another reasoning-gym version?')
  return data, entry


def score(response: str, reference_text: str) -> float:
  """The library's own score of `response` for the entry `reference_text` names:
  dataset.score_answer(response, entry), the entry generated again from its dataset and index."""
  data, entry = _entry(reference_text)
  return float(data.score_answer(response, entry))
