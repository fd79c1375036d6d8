"""The built-in synthetic task (the default): 'a+b=' with a character tokenizer."""
from rljax.data import sources
from rljax.data import tokenizer as tokenizer_lib
from rljax.tasks import _characters

REWARD = 'exact_numeric'


def check(config):
  del config   # characters: no tokenizer or data file needed


def lengths(config):
  dcfg = config.data
  prompt_len = 2 * dcfg.digits + 2
  answer_len = 2 * dcfg.digits if '*' in dcfg.ops else dcfg.digits + 1
  answer_len += '-' in dcfg.ops
  return prompt_len, answer_len + 1, tokenizer_lib.ArithmeticTokenizer.vocab_size


def make(config, data_dir):
  _characters.check_no_hf_tokenizer(config)
  dcfg = config.data
  knobs = dict(digits=dcfg.digits, ops=dcfg.ops, zero_pad=dcfg.zero_pad,
               num_train=dcfg.num_train, num_test=dcfg.num_test, seed=dcfg.seed, extra_test=dcfg.extra_test)
  train, test = (sources.load_split(data_dir, split=split, **knobs) for split in ('train', 'test'))
  return tokenizer_lib.ArithmeticTokenizer(), train, test
