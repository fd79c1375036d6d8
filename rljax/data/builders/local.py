"""What every rljax TFDS builder shares: text records made on this machine (no download), a train
and a test split, records kept in the order they were made, configs named after their knobs.

A task subclasses `LocalBuilder` and says only how to make its problems (`_splits`) and how one
problem reads as a record (`_records`).
"""

import abc

import tensorflow_datasets as tfds


def check_split_knobs(num_train, num_test, seed):
  """ValueError unless both splits are non-empty and the seed is valid."""
  if num_train < 1 or num_test < 1 or seed < 0:
    raise ValueError('num_train and num_test must be positive and seed non-negative, got '
                     f'{num_train}, {num_test}, {seed}')


def predefined_or(builder_class, config):
  """The predefined config of `config`'s name if there is one, else `config`: TFDS rejects a
  second config object that reuses a predefined name."""
  return builder_class.builder_configs.get(config.name, config)


class LocalBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A dataset of text records whose problems are made from the builder config alone."""

  # Bump in a task when its generation changes: built datasets are cached by name + version.
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}
  FEATURES = ('prompt', 'answer')   # every one a text field

  @abc.abstractmethod
  def _splits(self):
    """(test, train): the problems of each split, from self.builder_config."""

  def _records(self, problems):
    """The records ({feature: text}) of `problems`, in order; by default the problems are."""
    return problems

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({name: tfds.features.Text() for name in self.FEATURES}),
        # Records keep the order they are made in (already random, or the file's: eval sets take
        # the first n test records); this also skips TFDS's shuffling pass.
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    test, train = self._splits()
    return {'train': self._generate_examples(train), 'test': self._generate_examples(test)}

  def _generate_examples(self, problems):
    yield from enumerate(self._records(problems))
