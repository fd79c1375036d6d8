"""TFDS builders for rljax tasks; importing this package registers them."""

from rljax.datasets.arithmetic import Arithmetic
from rljax.datasets.arithmetic import ArithmeticConfig
from rljax.datasets.arithmetic import make_config
from rljax.datasets.math_jsonl import MathJsonl
from rljax.datasets.math_jsonl import MathJsonlConfig
from rljax.datasets.sums import Sums
from rljax.datasets.sums import SumsConfig
