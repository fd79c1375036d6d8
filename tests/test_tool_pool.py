"""The environment pool (rljax.envs.pool) contains its steps, here a tool's calls (a
sample_tools.TextEnv): over hundreds of hostile calls (hanging, spinning in C with the GIL held,
allocating without bound, exiting, segfaulting) each costs one error result of its kind, the
host's threads stay at what they were and its child processes at the pool's size; a timed-out
call has no side effect later; an environment that cannot load in a worker stops the run with a
clear error, as does one that cannot be pickled."""
import collections
import os
import sys
import threading
import time
import types

import pytest

from rljax.envs import pool as pool_lib

import sample_tools

CALLS = ['1+1', 'hang', 'spin', 'alloc', 'exit', 'segv', 'raise', '2+3']
ANSWER = 256   # bytes of a step's JSON
KIND = {'1+1': ('ok', '2'), '2+3': ('ok', '5'), 'hang': ('timeout', ''), 'spin': ('timeout', ''),
        'alloc': ('memory', ''), 'exit': ('crash', ''), 'segv': ('crash', ''),
        'raise': ('raised', 'ZeroDivisionError')}


def run(pool, calls, timeout_s):
  """The pool's (kind, text or value, seconds) of each call text."""
  messages = [dict(turns=[list(map(ord, call))], state=None) for call in calls]
  return [(kind, ''.join(map(chr, value[0])) if kind == 'ok' else value, seconds)
          for kind, value, seconds in pool.run(messages, timeout_s)]


def child_processes():
  """The pids whose parent is this process (Linux /proc)."""
  children = []
  for entry in os.listdir('/proc'):
    if entry.isdigit():
      try:
        with open(f'/proc/{entry}/stat') as f:
          stat = f.read()
      except OSError:
        continue
      if int(stat.rsplit(')', 1)[1].split()[1]) == os.getpid():
        children.append(int(entry))
  return children


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='counts children in /proc')
def test_hundreds_of_hostile_calls_cost_one_error_each_and_no_thread_or_process():
  pool = pool_lib.Pool(sample_tools.TextEnv(sample_tools.hostile), 4, ANSWER, memory_mb=16)
  try:
    threads, before = threading.active_count(), set(child_processes())
    counts = collections.Counter()
    start = time.perf_counter()
    for _ in range(16):   # 16 chunks of 16 calls: 256 calls, 160 of them hostile
      results = run(pool, CALLS * 2, timeout_s=0.5)   # generous: a loaded host
      assert [r[:2] for r in results] == [KIND[call] for call in CALLS * 2]
      counts.update(kind for kind, _, _ in results)
      assert threading.active_count() == threads
      assert len(set(child_processes()) - before) <= 4
    elapsed = time.perf_counter() - start
    assert counts == {'ok': 64, 'timeout': 64, 'memory': 32, 'crash': 64, 'raised': 32}
    assert elapsed < 60
  finally:
    pool.close()
  assert not set(child_processes()) - before   # closed: every worker reaped


def test_a_call_spinning_in_c_with_the_gil_held_ends_at_its_timeout():
  pool = pool_lib.Pool(sample_tools.TextEnv(sample_tools.spin_in_c), 4, ANSWER, memory_mb=64)
  try:
    pool.wait_ready()
    start = time.perf_counter()
    results = run(pool, ['a'] * 4, timeout_s=0.1)
    elapsed = time.perf_counter() - start
  finally:
    pool.close()
  assert [r[0] for r in results] == ['timeout'] * 4
  assert all(0.1 <= seconds < 1.0 for _, _, seconds in results) and elapsed < 2.0   # not 5 s+


def test_a_timed_out_call_has_no_side_effect_later(tmp_path):
  path = str(tmp_path / 'late')
  pool = pool_lib.Pool(sample_tools.TextEnv(sample_tools.sleep_then_write), 1, ANSWER, memory_mb=64)
  try:
    assert run(pool, [path], timeout_s=0.1)[0][0] == 'timeout'
    time.sleep(1.0)   # twice what the call would have slept before writing
    assert not os.path.exists(path)
    assert run(pool, [path], timeout_s=5.0)[0][:2] == ('ok', '1')   # the same call, given time
    assert os.path.exists(path)
  finally:
    pool.close()


def test_the_pool_is_started_once_and_reused():
  env = sample_tools.TextEnv(sample_tools.plain)
  pool = pool_lib.pool_for(env, 2, ANSWER, 64)
  pids = [w.proc.pid for w in pool.workers]
  results = run(pool, ['1+2', '3+4', '5+6'], 1.0)   # 3 calls on 2 workers: one queued
  assert [r[:2] for r in results] == [('ok', '3'), ('ok', '7'), ('ok', '11')]
  assert pool_lib.pool_for(sample_tools.TextEnv(sample_tools.plain), 2, ANSWER, 64) is pool
  assert [w.proc.pid for w in pool.workers] == pids


def test_a_tool_that_cannot_load_in_a_worker_or_be_pickled_is_a_clear_error():
  ghost = types.ModuleType('ghost_module_of_no_file')   # importable here, not in a worker
  exec('def tool(call):\n  return call', ghost.__dict__)   # pylint: disable=exec-used
  sys.modules[ghost.__name__] = ghost
  try:
    pool = pool_lib.Pool(sample_tools.TextEnv(ghost.tool), 1, ANSWER, memory_mb=64)
    with pytest.raises(pool_lib.StartupError, match='ghost_module_of_no_file'):
      run(pool, ['1'], 1.0)
    pool.close()
  finally:
    del sys.modules[ghost.__name__]
  with pytest.raises(ValueError, match='picklable by reference'):
    pool_lib.Pool(sample_tools.TextEnv(lambda call: call), 1, ANSWER, memory_mb=64)
