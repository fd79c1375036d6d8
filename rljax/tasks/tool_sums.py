"""Long additions with a calculator tool (rljax.data.builders.tool_sums): a response may call
'[52817+90412]', gets '{143229}' back from rljax.envs.calculator, and answers '143229'. The
calculator is the environment (rljax.envs.tools.Tool: it gives no reward, and the verifier,
final_answer, scores what follows the last result); the character tokenizer with the tool's
symbols (rljax.data.tokenizer.ToolTokenizer)."""
from rljax.data.builders import tool_sums
from rljax.data import tokenizer as tokenizer_lib
from rljax.envs import calculator
from rljax.envs import tools
from rljax.tasks import _characters

REWARD = 'final_answer'
MARKERS = ('[', ']', '{', '}')   # call open, call close (the stop), result open, result close


check = _characters.check


def lengths(config):
  dcfg = config.data
  tool_sums.make_config(dcfg.max_operands, dcfg.digits, dcfg.demo_frac)   # bad knobs, first
  return _characters.lengths(tool_sums.lengths(dcfg.max_operands, dcfg.digits),
                             tokenizer_lib.ToolTokenizer)


def make(config, data_dir):
  dcfg = config.data
  builder_config = tool_sums.make_config(dcfg.max_operands, dcfg.digits, dcfg.demo_frac,
                                         dcfg.num_train, dcfg.num_test, dcfg.seed)
  return _characters.make(config, tool_sums.ToolSums, builder_config,
                          tokenizer_lib.ToolTokenizer(), data_dir)


def env(config):
  """The calculator; with tools.enabled False every call gets the error result '{?}'."""
  return tools.Tool(calculator.calculate if config.tools.enabled else None,
                    tokenizer_lib.ToolTokenizer(), MARKERS, error='?',
                    max_chars=calculator.RESULT_CHARS, max_calls=config.tools.max_calls)
