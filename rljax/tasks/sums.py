"""Multi-operand addition with every running sum written out (rljax.data.builders.sums): responses
of uneven length, 4 to 35 tokens by default, character tokenizer."""
from rljax.data.builders import sums
from rljax.data import tokenizer as tokenizer_lib
from rljax.tasks import _characters

REWARD = 'running_sums'


def check(config):
  del config   # characters: no tokenizer or data file needed


def lengths(config):
  dcfg = config.data
  sums.make_config(dcfg.max_operands, dcfg.digits)   # ValueError on bad knobs, first
  prompt_len, response_len = sums.lengths(dcfg.max_operands, dcfg.digits)
  return prompt_len, response_len + 1, tokenizer_lib.ArithmeticTokenizer.vocab_size


def make(config, data_dir):
  _characters.check_no_hf_tokenizer(config)
  dcfg = config.data
  builder_config = sums.make_config(dcfg.max_operands, dcfg.digits, dcfg.num_train,
                                    dcfg.num_test, dcfg.seed)
  train, test = _characters.tfds_splits(sums.Sums, builder_config, data_dir)
  return tokenizer_lib.ArithmeticTokenizer(), train, test
