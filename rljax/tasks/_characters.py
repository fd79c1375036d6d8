"""What the character-tokenized tasks (arithmetic, sums, tool_sums) share."""
from rljax.data import sources
from rljax import tasks


def check_no_hf_tokenizer(config):
  if config.init.hf_path:
    raise ValueError(f'init.hf_path brings its own tokenizer, which the {tasks.name_of(config)} '
                     'task does not use: pick data.name=gsm8k or math')


def check(config):
  del config   # characters: no tokenizer or data file needed


def lengths(builder_lengths, tokenizer_cls):
  """(prompt, response with its end token, vocabulary) from a builder's (prompt, response)."""
  prompt_len, response_len = builder_lengths
  return prompt_len, response_len + 1, tokenizer_cls.vocab_size


def make(config, builder_cls, builder_config, tokenizer, data_dir):
  """(tokenizer, train, test) of a local character task."""
  check_no_hf_tokenizer(config)
  return (tokenizer, *tfds_splits(builder_cls, builder_config, data_dir))


def tfds_splits(builder_cls, builder_config, data_dir):
  """(train, test) sources of a local TFDS builder (rljax.data.builders), built on first use."""
  return tuple(sources.load_tfds_split(builder_cls, builder_config, data_dir, split)
               for split in ('train', 'test'))
