"""Multi-operand addition with every running sum written out (rljax.data.builders.sums): responses
of uneven length, 4 to 35 tokens by default, character tokenizer."""
from rljax.data.builders import sums
from rljax.data import tokenizer as tokenizer_lib
from rljax.tasks import _characters

REWARD = 'running_sums'


check = _characters.check


def lengths(config):
  dcfg = config.data
  sums.make_config(dcfg.max_operands, dcfg.digits)   # ValueError on bad knobs, first
  return _characters.lengths(sums.lengths(dcfg.max_operands, dcfg.digits),
                             tokenizer_lib.ArithmeticTokenizer)


def make(config, data_dir):
  dcfg = config.data
  builder_config = sums.make_config(dcfg.max_operands, dcfg.digits, dcfg.num_train,
                                    dcfg.num_test, dcfg.seed)
  return _characters.make(config, sums.Sums, builder_config, tokenizer_lib.ArithmeticTokenizer(),
                          data_dir)
