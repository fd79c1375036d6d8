"""Preemption: SIGTERM or SIGINT asks a run to stop at the end of its current step, save a
checkpoint of that step and exit with EXIT_CODE; re-running the same command resumes from it.

75 is EX_TEMPFAIL of sysexits.h ("temporary failure; retry"): a launcher can requeue on it. A second
signal stops at once (nothing is lost beyond the last complete checkpoint, which a kill cannot
corrupt). On multi-host, processes may see the signal at different steps; `agreed()` ORs the request
over all processes once per step, so every process stops and saves at the same step.
"""
import signal
import sys

import jax
from jax.experimental import multihost_utils
import numpy as np

EXIT_CODE = 75
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
  """The run stopped on request after saving a checkpoint of `step`."""

  def __init__(self, step):
    super().__init__(f'stopped on request at step {step} with a checkpoint of that step; '
                     'run the same command again to resume')
    self.step = step


class StopRequest:
  """While entered, SIGTERM / SIGINT set `received` instead of killing the process."""

  def __init__(self, signals=SIGNALS):
    self.received = None
    self._signals = signals
    self._previous = {}

  def __enter__(self):
    for signum in self._signals:
      self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous.clear()

  def _handle(self, signum, frame):
    del frame
    if self.received is not None:  # asked twice: behave as if we had never caught it
      self.__exit__()
      signal.raise_signal(signum)
      return
    self.received = signum
    print(f'rljax: {signal.Signals(signum).name}: finishing this step, then saving a checkpoint '
          f'and exiting with code {EXIT_CODE}; send it again to stop at once', file=sys.stderr,
          flush=True)

  def agreed(self):
    """Whether any process received a stop signal. Collective: call once per step everywhere."""
    requested = self.received is not None
    if jax.process_count() == 1:
      return requested
    return bool(np.any(multihost_utils.process_allgather(np.asarray(requested))))
