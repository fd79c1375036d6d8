"""What the character-tokenized tasks (arithmetic, sums) share."""
from rljax import tasks


def check_no_hf_tokenizer(config):
  if config.init.hf_path:
    raise ValueError(f'init.hf_path brings its own tokenizer, which the {tasks.name_of(config)} '
                     'task does not use: pick data.name=gsm8k or math')
