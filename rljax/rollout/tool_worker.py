"""One worker process of a tool pool (rljax.rollout.tool_pool): runs a task's tool on call texts
sent by the host, one at a time, and answers each with its kind and text.

Run as a script (`python -I -S tool_worker.py`), not as a module of rljax, so that a fresh worker
imports nothing but the tool's own module: a replacement after a timeout starts in tens of
milliseconds. Frames are a 4-byte big-endian length and a body. The host's first frame is a
pickle of its sys.path, the second one of (the tool, the longest result in characters, the memory
it may add in bytes); every later one is a call's text in UTF-8. The worker answers JSON `[kind, text]`, never
pickle, so that nothing a tool returns is run by the host: 'ready' once the tool is loaded (or
'startup' with the reason it could not be), then
per call 'ok' (the result), 'raised', 'memory', 'not_text' or 'oversize'. Only the checked
result crosses the pipe, so an answer is at most a few times the longest result.
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
  """The address space capped at what the loaded tool uses plus `extra_bytes`: an allocation
  past it raises MemoryError in the tool (or kills the worker) instead of swapping the host. No
  core files either: a crashing tool writes nothing."""
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  limit = virtual_bytes() + extra_bytes
  _, hard = resource.getrlimit(resource.RLIMIT_AS)
  if hard != resource.RLIM_INFINITY:
    limit = min(limit, hard)
  resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def run_one(fn, text, max_chars):
  """[kind, text] of one call: the tool's result when it is text of at most `max_chars`."""
  try:
    value = fn(text)
  except MemoryError:
    return 'memory', ''
  except BaseException as error:  # pylint: disable=broad-except  (untrusted input, any tool)
    return 'raised', type(error).__name__
  if not isinstance(value, str):
    return 'not_text', type(value).__name__
  if len(value) > max_chars:
    return 'oversize', str(len(value))
  return 'ok', value


def serve(calls, answers):
  """Loads the tool, then answers calls until the host closes the pipe."""
  try:
    fn, max_chars, extra_bytes = pickle.loads(read_frame(calls))
  except Exception as error:  # pylint: disable=broad-except  (told to the host, which raises)
    answer(answers, 'startup', f'{type(error).__name__}: {error}'[:500])
    return
  limit_memory(extra_bytes)
  answer(answers, 'ready')
  while (body := read_frame(calls)) is not None:
    kind, text = run_one(fn, body.decode('utf-8', 'surrogatepass'), max_chars)
    answer(answers, kind, text)
    if kind == 'memory':   # a fresh worker, not one whose heap may be half-broken
      return


def main():
  die_with_parent()
  calls, answers = sys.stdin.buffer, os.fdopen(os.dup(1), 'wb')
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 1)   # a tool's prints go nowhere, never into the answers
  os.dup2(devnull, 2)
  first = read_frame(calls)
  if first is None:
    return
  sys.path[:] = pickle.loads(first)   # the host's, so the tool's module imports as it does there
  serve(calls, answers)


if __name__ == '__main__':
  main()
