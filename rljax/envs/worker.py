"""One worker process of an environment pool (rljax.envs.pool): runs an environment's steps
(rljax.envs) sent by the host, one at a time, and answers each with its kind and value.

Run as a script (`python -I -S worker.py`), not as a module of rljax, so that a fresh worker
imports nothing but the environment's own modules: a replacement after a timeout starts in tens
of milliseconds. Frames are a 4-byte big-endian length and a body. The host's first frame is a
pickle of its sys.path, the second one of (the environment, the longest answer in bytes, the
memory it may add in bytes); every later one is a step as JSON, `{"turns": [[ids], ...],
"state": state}`, or with "record" in place of "state" for an episode's first step, which
resets it first. The worker answers JSON `[kind, value]`, never pickle, so that nothing an
environment returns is run by the host: 'ready' once the environment is loaded (or 'startup'
with the reason it could not be), then per step 'ok' (the Step as a JSON list), 'raised',
'memory', 'not_data' (a value JSON cannot hold) or 'oversize' (an answer past the bound).
"""
import json
import os
import pickle
import resource
import signal
import struct
import sys

HEADER = struct.Struct('>I')


def read_frame(stream):
  """The next frame's body, or None at the end of the stream."""
  header = stream.read(HEADER.size)
  if len(header) < HEADER.size:
    return None
  body = stream.read(HEADER.unpack(header)[0])
  return body if len(body) == HEADER.unpack(header)[0] else None


def write_frame(stream, body):
  stream.write(HEADER.pack(len(body)) + body)
  stream.flush()


def answer(stream, kind, text=''):
  write_frame(stream, json.dumps([kind, text]).encode())


def die_with_parent():
  """SIGKILL when the host dies (Linux prctl PR_SET_PDEATHSIG); elsewhere the worker ends at
  its next read, when the host's end of the pipe closes."""
  try:
    import ctypes   # pylint: disable=import-outside-toplevel
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
  except (OSError, AttributeError):
    pass


def virtual_bytes():
  """This process's address space now (Linux /proc), 0 where unknown."""
  try:
    with open('/proc/self/status') as status:
      for line in status:
        if line.startswith('VmSize:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


def limit_memory(extra_bytes):
  """The address space capped at what the loaded environment uses plus `extra_bytes`: an
  allocation past it raises MemoryError in its step (or kills the worker) instead of swapping
  the host. No core files either: a crashing step writes nothing."""
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  limit = virtual_bytes() + extra_bytes
  _, hard = resource.getrlimit(resource.RLIMIT_AS)
  if hard != resource.RLIM_INFINITY:
    limit = min(limit, hard)
  resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def plain(value):
  """JSON's fallback for what an environment may return besides JSON data: numpy arrays and
  scalars (without importing numpy)."""
  if hasattr(value, 'tolist'):
    return value.tolist()
  raise TypeError(f'{type(value).__name__} is not JSON data')


def as_json(value):
  """(the JSON of `value`, '') or ('', why JSON cannot hold it)."""
  try:
    return json.dumps(value, default=plain), ''
  except (TypeError, ValueError, RecursionError) as error:
    return '', f'{type(error).__name__}: {error}'[:200]


def run_one(env, message, limit):
  """[kind, value] of one step: the Step as JSON data (tuples become lists) when its JSON is at
  most `limit` bytes. A fresh episode's state goes through JSON before its first step too, so a
  step always reads its state as the host holds it."""
  try:
    if 'record' in message:
      body, error = as_json(env.reset(message['record']))
      if error:
        return 'not_data', error
      message['state'] = json.loads(body)
    value = env.step(message['state'], message['turns'])
  except MemoryError:
    return 'memory', ''
  except BaseException as error:  # pylint: disable=broad-except  (untrusted input, any env)
    return 'raised', type(error).__name__
  body, error = as_json(value)
  if error:
    return 'not_data', error
  if len(body) > limit:
    return 'oversize', str(len(body))
  return 'ok', json.loads(body)


def serve(calls, answers):
  """Loads the environment, then answers steps until the host closes the pipe."""
  try:
    env, limit, extra_bytes = pickle.loads(read_frame(calls))
  except Exception as error:  # pylint: disable=broad-except  (told to the host, which raises)
    answer(answers, 'startup', f'{type(error).__name__}: {error}'[:500])
    return
  limit_memory(extra_bytes)
  answer(answers, 'ready')
  while (body := read_frame(calls)) is not None:
    kind, value = run_one(env, json.loads(body), limit)
    answer(answers, kind, value)
    if kind == 'memory':   # a fresh worker, not one whose heap may be half-broken
      return


def main():
  die_with_parent()
  calls, answers = sys.stdin.buffer, os.fdopen(os.dup(1), 'wb')
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 1)   # an environment's prints go nowhere, never into the answers
  os.dup2(devnull, 2)
  first = read_frame(calls)
  if first is None:
    return
  sys.path[:] = pickle.loads(first)   # the host's, so the environment's modules import as there
  serve(calls, answers)


if __name__ == '__main__':
  main()
