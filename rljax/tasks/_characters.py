"""What the character-tokenized tasks (arithmetic, sums, tool_sums) share."""
from rljax.data import sources
from rljax import tasks


def check_no_hf_tokenizer(config):
  if config.init.hf_path:
    raise ValueError(f'init.hf_path brings its own tokenizer, which the {tasks.name_of(config)} '
                     'task does not use: pick data.name=gsm8k or math')


def tfds_splits(builder_cls, builder_config, data_dir):
  """(train, test) sources of a local TFDS builder (rljax.data.builders), built on first use."""
  return tuple(sources.load_tfds_split(builder_cls, builder_config, data_dir, split)
               for split in ('train', 'test'))
