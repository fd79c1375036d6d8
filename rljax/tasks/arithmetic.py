"""The built-in synthetic task (the default): 'a+b=' with a character tokenizer."""
from rljax.data.builders import arithmetic
from rljax.data import tokenizer as tokenizer_lib
from rljax.tasks import _characters

REWARD = 'exact_numeric'


check = _characters.check


def lengths(config):
  dcfg = config.data
  answer_len = 2 * dcfg.digits if '*' in dcfg.ops else dcfg.digits + 1
  return _characters.lengths((2 * dcfg.digits + 2, answer_len + ('-' in dcfg.ops)),
                             tokenizer_lib.ArithmeticTokenizer)


def make(config, data_dir):
  dcfg = config.data
  builder_config = arithmetic.make_config(dcfg.digits, dcfg.ops, dcfg.zero_pad, dcfg.num_train,
                                          dcfg.num_test, dcfg.seed, dcfg.extra_test)
  return _characters.make(config, arithmetic.Arithmetic, builder_config,
                          tokenizer_lib.ArithmeticTokenizer(), data_dir)
