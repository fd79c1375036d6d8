"""A bounded pool of worker processes that runs an environment's steps (rljax.envs.worker), so
that no step can cost the run more than one error result.

A step runs in a process of its own, not a thread of the host: a worker past its deadline is
killed (SIGKILL to its process group, whatever it runs, C code holding the GIL included) and
replaced, so a hanging step holds no thread and no process beyond the pool's `size`, and a
timed-out step has no side effect after its error. A crash (os._exit, a segfault) ends only its
worker; an allocation past the memory bound raises MemoryError there; an answer is checked in
the worker and only JSON data of at most `max_answer` bytes comes back. The host itself starts
no thread.

The pool is started once and reused for every chunk of steps: a worker is a fresh interpreter
(`python -I -S`, started by subprocess, not multiprocessing: fork after JAX started its threads is
unsafe, and spawn would import the host's __main__, JAX and all) that loads only the
environment's modules, tens of milliseconds that a step of microseconds should not pay each
time. A step's deadline starts when it is sent to a ready worker, so a replacement's start-up is
not charged to the step after it.
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

from rljax.envs import worker as worker_lib

STARTUP_S = 60.0   # a fresh worker's start-up, on a loaded host; past it the pool raises
WORKER = worker_lib.__file__


class StartupError(RuntimeError):
  """The environment cannot be loaded in a worker (e.g. its module does not import there): no
  step could run, so the run stops instead of giving every step the error result."""


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
    self.proc.stdin.write(worker_lib.HEADER.pack(len(body)) + body)

  def frames(self, limit):
    """The complete answers read so far; ValueError on one longer than `limit` bytes."""
    out = []
    while len(self.buffer) >= worker_lib.HEADER.size:
      size = worker_lib.HEADER.unpack(self.buffer[:worker_lib.HEADER.size])[0]
      if size > limit:
        raise ValueError(f'an answer of {size} bytes')
      end = worker_lib.HEADER.size + size
      if len(self.buffer) < end:
        break
      out.append(json.loads(self.buffer[worker_lib.HEADER.size:end]))
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


class Pool:
  """`size` workers running the steps of `env` (picklable: an instance of a module-level class
  whose functions are module-level ones), answers of at most `max_answer` bytes of JSON, each
  worker allowed `memory_mb` MiB above its loaded self."""

  def __init__(self, env, size, max_answer, memory_mb):
    if size < 1:
      raise ValueError(f'an environment pool needs at least one worker, got {size}')
    try:
      loaded = pickle.dumps((env, max_answer, memory_mb << 20))
    except (pickle.PicklingError, AttributeError, TypeError) as error:
      raise ValueError(f'an environment runs in worker processes, so it must be picklable by '
                       f'reference (an instance of a module-level class, its functions '
                       f'module-level ones), got {env!r}: {error}') from None
    self.payload = (pickle.dumps(list(sys.path)), loaded)
    self.max_answer = max_answer + 64   # the answer's [kind, ...] around it
    self.workers = [_Worker(self.payload) for _ in range(size)]

  def run(self, messages, timeout_s):
    """[(kind, value, seconds)] of each step message (rljax.envs.worker): a worker's answer, or
    'timeout' past `timeout_s` seconds, 'crash' when its worker died or broke the protocol."""
    if not self.workers:
      raise RuntimeError('the environment pool is closed')
    bodies = [json.dumps(message).encode() for message in messages]
    results, queue = [None] * len(bodies), list(range(len(bodies)))[::-1]
    while queue or any(w.call for w in self.workers):
      for slot, worker in enumerate(self.workers):
        if worker.ready and not worker.call and worker.proc.poll() is not None:   # died idle
          worker.kill()
          self.workers[slot] = worker = _Worker(self.payload)
        if worker.ready and not worker.call and queue:
          self._send(slot, queue.pop(), bodies, results)
      self._wait(timeout_s, results)
    return results

  def wait_ready(self):
    """Returns once every worker has loaded the environment (start-up is not charged to steps
    anyway: this only makes the next steps start at once)."""
    while not all(w.ready for w in self.workers):
      self._wait(STARTUP_S, [])

  def _send(self, slot, index, bodies, results):
    worker = self.workers[slot]
    worker.call = (index, time.perf_counter())
    try:
      worker.send(bodies[index])
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
        raise StartupError(f'an environment worker did not start within {STARTUP_S:.0f} s')

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
        raise StartupError('an environment worker exited before loading the environment')
      self._end(slot, 'crash', '', results)
      return
    for kind, value in frames:
      if kind == 'startup':
        raise StartupError(f'the environment cannot be loaded in a worker: {value}')
      if kind == 'ready':
        worker.ready = True
      elif worker.call:
        self._end(slot, kind, value, results, replace=kind == 'memory')

  def _end(self, slot, kind, value, results, replace=None):
    """Records the answer of the slot's step; a worker that timed out, crashed or ran out of
    memory is killed and replaced."""
    worker = self.workers[slot]
    index, sent = worker.call
    results[index] = (kind, value, time.perf_counter() - sent)
    worker.call = None
    if replace or kind in ('timeout', 'crash'):
      worker.kill()
      self.workers[slot] = _Worker(self.payload)

  def close(self):
    for worker in self.workers:
      worker.kill()
    self.workers = []


MAX_POOLS = 2   # pools kept alive at once (one per environment the process runs); the oldest closes
_POOLS = {}


def pool_for(env, size, max_answer, memory_mb):
  """The running pool of these settings, started on first use and reused by every later step,
  so a run starts its workers once."""
  key = (pickle.dumps(env), size, max_answer, memory_mb) if _picklable(env) else None
  if key in _POOLS:
    _POOLS[key] = _POOLS.pop(key)   # the most recently used, last
    return _POOLS[key]
  pool = Pool(env, size, max_answer, memory_mb)   # raises the clear error for a lambda
  while len(_POOLS) >= MAX_POOLS:
    _POOLS.pop(next(iter(_POOLS))).close()
  _POOLS[key] = pool
  return pool


def _picklable(env):
  try:
    pickle.dumps(env)
    return True
  except (pickle.PicklingError, AttributeError, TypeError):
    return False


@atexit.register
def close_all():
  """Ends every pool's workers (they also die with the host: worker.die_with_parent)."""
  while _POOLS:
    _POOLS.popitem()[1].close()
