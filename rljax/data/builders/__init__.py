"""TFDS builders for rljax tasks; importing this package registers them."""
__all__ = ['Arithmetic', 'ArithmeticConfig', 'make_config', 'MathJsonl', 'MathJsonlConfig',
           'ReasoningGym', 'ReasoningGymConfig', 'Sums', 'SumsConfig', 'ToolSums', 'ToolSumsConfig']

from rljax.data.builders.arithmetic import Arithmetic
from rljax.data.builders.arithmetic import ArithmeticConfig
from rljax.data.builders.arithmetic import make_config
from rljax.data.builders.math_jsonl import MathJsonl
from rljax.data.builders.math_jsonl import MathJsonlConfig
from rljax.data.builders.reasoning_gym import ReasoningGym
from rljax.data.builders.reasoning_gym import ReasoningGymConfig
from rljax.data.builders.sums import Sums
from rljax.data.builders.sums import SumsConfig
from rljax.data.builders.tool_sums import ToolSums
from rljax.data.builders.tool_sums import ToolSumsConfig
