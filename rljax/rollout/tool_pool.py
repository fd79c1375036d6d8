"""A bounded pool of worker processes that runs a task's tool (rljax.rollout.tool_worker), so
that no call can cost the run more than one error result.

A call runs in a process of its own, not a thread of the host: a worker past its deadline is
killed (SIGKILL to its process group, whatever it runs, C code holding the GIL included) and
replaced, so a hanging tool holds no thread and no process beyond the pool's `size`, and a
timed-out call has no side effect after its error. A crash (os._exit, a segfault) ends only its
worker; an allocation past the memory bound raises MemoryError there; a result is checked in
the worker and only text of at most `max_chars` comes back. The host itself starts no thread.

The pool is started once and reused for every chunk of calls: a worker is a fresh interpreter
(`python -I -S`, started by subprocess, not multiprocessing: fork after JAX started its threads is
unsafe, and spawn would import the host's __main__, JAX and all) that loads only the tool's
module, tens of milliseconds that a call of microseconds should not pay each time. A call's
deadline starts when it is sent to a ready worker, so a replacement's start-up is not charged to
the call after it.
"""
import atexit
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import time

from rljax.rollout import tool_worker

STARTUP_S = 60.0   # a fresh worker's start-up, on a loaded host; past it the pool raises
WORKER = tool_worker.__file__


class ToolStartupError(RuntimeError):
  """The tool cannot be loaded in a worker (e.g. its module does not import there): no call
  could run, so the run stops instead of giving every call the error result."""


class _Worker:
  """One worker process and what the host knows of it."""

  def __init__(self, payload):
    self.proc = subprocess.Popen([sys.executable, '-I', '-S', WORKER], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 start_new_session=True, bufsize=0)
    self.buffer = b''
    self.ready = False
    self.started = time.perf_counter()
    self.call = None          # (index, sent at) of the call it runs
    for body in payload:
      self.send(body)

  def fileno(self):
    return self.proc.stdout.fileno()

  def send(self, body):
    self.proc.stdin.write(tool_worker.HEADER.pack(len(body)) + body)

  def frames(self, limit):
    """The complete answers read so far; ValueError on one longer than `limit` bytes."""
    out = []
    while len(self.buffer) >= tool_worker.HEADER.size:
      size = tool_worker.HEADER.unpack(self.buffer[:tool_worker.HEADER.size])[0]
      if size > limit:
        raise ValueError(f'an answer of {size} bytes')
      end = tool_worker.HEADER.size + size
      if len(self.buffer) < end:
        break
      out.append(json.loads(self.buffer[tool_worker.HEADER.size:end]))
      self.buffer = self.buffer[end:]
    return out

  def kill(self):
    """SIGKILL to the worker and anything it started, then reap it. Only before it is reaped:
    until then its pid, its process group's id, cannot name another process."""
    if self.proc.returncode is None:
      try:
        os.killpg(self.proc.pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
    for stream in (self.proc.stdin, self.proc.stdout):
      stream.close()
    try:
      self.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
      pass   # unkillable for now (uninterruptible sleep); its pid is reaped at the next kill


class ToolPool:
  """`size` workers running `fn` (picklable by reference: a module-level function), results of
  at most `max_chars` characters, each worker allowed `memory_mb` MiB above its loaded self."""

  def __init__(self, fn, size, max_chars, memory_mb):
    if size < 1:
      raise ValueError(f'a tool pool needs at least one worker, got {size}')
    try:
      tool = pickle.dumps((fn, max_chars, memory_mb << 20))
    except (pickle.PicklingError, AttributeError, TypeError) as error:
      raise ValueError(f'a tool runs in worker processes, so its function must be picklable by '
                       f'reference (a module-level function), got {fn!r}: {error}') from None
    self.payload = (pickle.dumps(list(sys.path)), tool)
    self.max_answer = 16 * max_chars + 1024   # JSON of max_chars characters, escapes and all
    self.workers = [_Worker(self.payload) for _ in range(size)]

  def run(self, texts, timeout_s):
    """[(kind, text, seconds)] of each call text: a worker's answer (tool_worker), or 'timeout'
    past `timeout_s` seconds, 'crash' when its worker died or broke the protocol."""
    if not self.workers:
      raise RuntimeError('the tool pool is closed')
    results, queue = [None] * len(texts), list(range(len(texts)))[::-1]
    while queue or any(w.call for w in self.workers):
      for slot, worker in enumerate(self.workers):
        if worker.ready and not worker.call and worker.proc.poll() is not None:   # died idle
          worker.kill()
          self.workers[slot] = worker = _Worker(self.payload)
        if worker.ready and not worker.call and queue:
          self._send(slot, queue.pop(), texts, results)
      self._wait(timeout_s, results)
    return results

  def wait_ready(self):
    """Returns once every worker has loaded the tool (start-up is not charged to calls anyway:
    this only makes the next calls start at once)."""
    while not all(w.ready for w in self.workers):
      self._wait(STARTUP_S, [])

  def _send(self, slot, index, texts, results):
    worker = self.workers[slot]
    worker.call = (index, time.perf_counter())
    try:
      worker.send(texts[index].encode('utf-8', 'surrogatepass'))
    except (BrokenPipeError, OSError):
      self._end(slot, 'crash', '', results)

  def _wait(self, timeout_s, results):
    """Reads what the workers answered within the next deadline; kills those past it."""
    now = time.perf_counter()
    deadlines = [w.call[1] + timeout_s for w in self.workers if w.call]
    deadlines += [w.started + STARTUP_S for w in self.workers if not w.ready]
    readable, _, _ = select.select(self.workers, [], [], max(0.0, min(deadlines) - now)
                                   if deadlines else 0.0)
    for worker in readable:
      self._read(self.workers.index(worker), results)
    now = time.perf_counter()
    for slot, worker in enumerate(self.workers):
      if worker.call and now >= worker.call[1] + timeout_s:
        self._end(slot, 'timeout', '', results)
      elif not worker.ready and now >= worker.started + STARTUP_S:
        raise ToolStartupError(f'a tool worker did not start within {STARTUP_S:.0f} s')

  def _read(self, slot, results):
    worker = self.workers[slot]
    chunk = os.read(worker.fileno(), 65536)
    worker.buffer += chunk
    try:
      frames = worker.frames(self.max_answer)
    except ValueError:
      frames = None
    if frames is None or (not chunk and not frames):   # died, or broke the protocol
      if not worker.ready and frames is not None:
        raise ToolStartupError('a tool worker exited before loading the tool')
      self._end(slot, 'crash', '', results)
      return
    for kind, text in frames:
      if kind == 'startup':
        raise ToolStartupError(f'the tool cannot be loaded in a worker: {text}')
      if kind == 'ready':
        worker.ready = True
      elif worker.call:
        self._end(slot, kind, text, results, replace=kind == 'memory')

  def _end(self, slot, kind, text, results, replace=None):
    """Records the answer of the slot's call; a worker that timed out, crashed or ran out of
    memory is killed and replaced."""
    worker = self.workers[slot]
    index, sent = worker.call
    results[index] = (kind, text, time.perf_counter() - sent)
    worker.call = None
    if replace or kind in ('timeout', 'crash'):
      worker.kill()
      self.workers[slot] = _Worker(self.payload)

  def close(self):
    for worker in self.workers:
      worker.kill()
    self.workers = []


MAX_POOLS = 2   # pools kept alive at once (one per tool the process runs); the oldest closes
_POOLS = {}


def pool_for(fn, size, max_chars, memory_mb):
  """The running pool of these settings, started on first use and reused by every later call,
  so a run starts its workers once."""
  key = (pickle.dumps(fn), size, max_chars, memory_mb) if _picklable(fn) else None
  if key in _POOLS:
    _POOLS[key] = _POOLS.pop(key)   # the most recently used, last
    return _POOLS[key]
  pool = ToolPool(fn, size, max_chars, memory_mb)   # raises the clear error for a lambda
  while len(_POOLS) >= MAX_POOLS:
    _POOLS.pop(next(iter(_POOLS))).close()
  _POOLS[key] = pool
  return pool


def _picklable(fn):
  try:
    pickle.dumps(fn)
    return True
  except (pickle.PicklingError, AttributeError, TypeError):
    return False


@atexit.register
def close_all():
  """Ends every pool's workers (they also die with the host: tool_worker.die_with_parent)."""
  while _POOLS:
    _POOLS.popitem()[1].close()
