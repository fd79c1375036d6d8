"""rljax.preemption.StopRequest in this process (SIGUSR1 stands in for SIGTERM so a stray signal
cannot stop the test runner); the CLI's SIGTERM / SIGINT path is in tests/test_reliability.py."""
import os
import signal

import pytest

from rljax import preemption


def test_first_signal_is_a_request_the_second_goes_through():
  seen = []
  previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
  try:
    with preemption.StopRequest(signals=(signal.SIGUSR1,)) as stop:
      assert stop.received is None and not stop.agreed()
      os.kill(os.getpid(), signal.SIGUSR1)
      assert stop.received == signal.SIGUSR1 and stop.agreed() and not seen
      os.kill(os.getpid(), signal.SIGUSR1)   # asked twice: the previous handler acts
      assert seen == [signal.SIGUSR1]
    os.kill(os.getpid(), signal.SIGUSR1)
    assert seen == [signal.SIGUSR1] * 2
  finally:
    signal.signal(signal.SIGUSR1, previous)


def test_handlers_are_restored_on_exit():
  previous = signal.getsignal(signal.SIGTERM)
  with preemption.StopRequest():
    assert signal.getsignal(signal.SIGTERM) is not previous
  assert signal.getsignal(signal.SIGTERM) is previous


def test_preempted_names_the_step():
  with pytest.raises(preemption.Preempted, match='at step 7 .*run the same command again'):
    raise preemption.Preempted(7)
