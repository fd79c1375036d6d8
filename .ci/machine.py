"""One line naming the machine the tests ran on, so a failure elsewhere is recognisable."""
import os
import platform

import jax
import jaxlib
import numpy


def cpu_model():
  try:
    with open('/proc/cpuinfo') as f:
      return next(line.split(':', 1)[1].strip() for line in f if line.startswith('model name'))
  except (OSError, StopIteration):
    return platform.processor() or platform.machine()


blas = numpy.__config__.CONFIG['Build Dependencies']['blas']
print(f'machine: {cpu_model()}, {os.cpu_count()} cores, {platform.machine()}; '
      f'numpy {numpy.__version__} ({blas["name"]} {blas.get("version", "?")}); '
      f'jax {jax.__version__}, jaxlib {jaxlib.__version__}; '
      f'XLA_FLAGS={os.environ.get("XLA_FLAGS", "")!r}')
