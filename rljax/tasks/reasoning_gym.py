"""Any procedural dataset of the third-party reasoning-gym library, by name (data.dataset; its
config fields in data.dataset_args, JSON): its entries built into TFDS
(rljax.data.builders.reasoning_gym), prompts its own questions or their compact form (data.render:
rljax.data.rg_prompts), every response scored by the dataset's own score_answer
(rljax.data.rg_library). docs/guide/environments.md.

Without init.hf_path prompts and answers are characters (rljax.data.tokenizer.TextTokenizer): at
most data.max_prompt_len of them, answers at most data.max_response_len - 1 (longer entries are
passed over when the dataset is built). With it, the model's tokenizer and chat template read the
prompts, as gsm8k's do (longer prompts are left out and counted).
"""
from rljax.data.builders import reasoning_gym as builder
from rljax.data import rg_library
from rljax.data import tokenizer as tokenizer_lib
from rljax.hf import tokenizer as hf_tokenizer
from rljax.tasks import _characters
from rljax.tasks import _jsonl_math

REWARD = 'reasoning_gym'
TOKENIZER = tokenizer_lib.TextTokenizer
demonstration = rg_library.demonstration   # the warm start imitates the library's answer


def check(config):
  """The dataset, its fields and its render style (with the library's own checks), the lengths,
  and, for the character tokenizer, a model vocabulary of exactly its ids: every id sampled
  decodes."""
  _builder_config(config)
  dcfg = config.data
  if dcfg.max_prompt_len < 1 or dcfg.max_response_len < 2:
    raise ValueError(f'data.max_prompt_len ({dcfg.max_prompt_len}) must be >= 1 and '
                     f'data.max_response_len ({dcfg.max_response_len}) >= 2')
  if not config.init.hf_path and config.model.vocab_size != TOKENIZER.vocab_size:
    raise ValueError(f'model.vocab_size ({config.model.vocab_size}) must equal the reasoning_gym '
                     f'character tokenizer\'s {TOKENIZER.vocab_size} ids')


def lengths(config):
  """The configured lengths; the vocabulary is the character tokenizer's, or the model's file's."""
  return (config.data.max_prompt_len, config.data.max_response_len,
          0 if config.init.hf_path else TOKENIZER.vocab_size)


def _builder_config(config):
  dcfg, chars = config.data, not config.init.hf_path
  return builder.make_config(
      dcfg.dataset, dcfg.dataset_args, dcfg.render, dcfg.num_train, dcfg.num_test, dcfg.seed,
      max_prompt_chars=dcfg.max_prompt_len if chars else 0,
      max_answer_chars=dcfg.max_response_len - 1 if chars else 0,   # and the end token
      charset=TOKENIZER.symbols if chars else '')


def make(config, data_dir):
  dcfg = config.data
  train, test = _characters.tfds_splits(builder.ReasoningGym, _builder_config(config), data_dir)
  if not config.init.hf_path:
    return TOKENIZER(), train, test
  tokenizer = hf_tokenizer.HFTokenizer(config.init.hf_path)
  return tokenizer, *(_jsonl_math.PromptSource(source, tokenizer, dcfg.max_prompt_len,
                                               dcfg.instruction, dcfg.chat_template)
                      for source in (train, test))
