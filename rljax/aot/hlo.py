"""What a compiled program communicates, read from its optimized HLO text (`compiled.as_text()`).

XLA's cost analysis gives no per-collective breakdown and does not multiply loop bodies by their
trip counts, so the collectives are counted here: every all-gather, all-reduce, reduce-scatter,
all-to-all and collective-permute (sync, or the `-start` of an async pair), with its size, split
into those inside a while loop's body (run once per iteration: a decode step, a micro-batch) and
those outside.
"""
import collections
import re

import numpy as np

COLLECTIVES = ('all-gather', 'all-reduce', 'reduce-scatter', 'all-to-all', 'collective-permute',
               'ragged-all-to-all')
_DTYPE_BYTES = {'pred': 1, 's4': 0.5, 'u4': 0.5, 's8': 1, 'u8': 1, 'f8e4m3fn': 1, 'f8e5m2': 1,
                's16': 2, 'u16': 2, 'f16': 2, 'bf16': 2, 's32': 4, 'u32': 4, 'f32': 4, 's64': 8,
                'u64': 8, 'f64': 8, 'c64': 8, 'c128': 16}
_SHAPE = re.compile(r'\b(' + '|'.join(_DTYPE_BYTES) + r')\[([\d,]*)\]')
_COMPUTATION = re.compile(r'^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$')
_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%?([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$')
_CALLS = re.compile(r'(?:calls|to_apply|body|condition|branch_computations|called_computations'
                    r'|true_computation|false_computation)=\{?([%\w.\-, ]+)\}?')


def shape_bytes(text):
  """Bytes of every array shape written in `text` (a result shape, a tuple of them)."""
  return sum(np.prod([int(d) for d in dims.split(',') if d], dtype=np.int64) * _DTYPE_BYTES[dtype]
             for dtype, dims in _SHAPE.findall(text))


def computations(hlo_text):
  """{computation name: [instruction lines]}, and the entry computation's name."""
  bodies, entry, current = {}, None, None
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header and not line.startswith(' '):
      current = header.group(1)
      bodies[current] = []
      entry = current if line.startswith('ENTRY') else entry
    elif current is not None and line.strip() and line.strip() != '}':
      bodies[current].append(line)
  return bodies, entry


def _reachable(bodies, root):
  """Computations that `root` runs, itself included (fusions, calls, nested loops)."""
  seen, todo = set(), [root]
  while todo:
    name = todo.pop()
    if name in seen or name not in bodies:
      continue
    seen.add(name)
    for line in bodies[name]:
      for group in _CALLS.findall(line):
        todo.extend(n.strip().lstrip('%') for n in group.split(','))
  return seen


def collectives_in(bodies, names):
  """[(op, bytes)] of the collectives in computations `names`: an op's size is the largest of its
  result and its operands (the gathered array of an all-gather, the input of a reduce-scatter)."""
  found = []
  for name in names:
    shapes = {}   # instruction -> its result shape: operands are written by name only
    for line in bodies[name]:
      match = _INSTRUCTION.match(line)
      if not match:
        continue
      shapes[match.group(1)] = match.group(2)
      op = match.group(3)
      base = op[:-len('-start')] if op.endswith('-start') else op
      if base in COLLECTIVES:
        operands = match.group(4).split('), ')[0]
        operand_bytes = shape_bytes(operands) or sum(
            shape_bytes(shapes.get(n, '')) for n in re.findall(r'%([\w.\-]+)', operands))
        found.append((base, max(shape_bytes(match.group(2)), operand_bytes)))
  return found


def while_bodies(bodies, entry):
  """Names of the while-loop bodies that the entry computation runs directly."""
  names = []
  for line in bodies[entry]:
    match = _INSTRUCTION.match(line)
    if match and match.group(3) == 'while':
      names.extend(re.findall(r'body=%?([\w.\-]+)', line))
  return names


def summarize(found):
  """{op: {'count', 'bytes'}} and the total bytes of a list of (op, bytes)."""
  by_op = collections.defaultdict(lambda: dict(count=0, bytes=0))
  for op, size in found:
    by_op[op]['count'] += 1
    by_op[op]['bytes'] += int(size)
  return dict(by_op), int(sum(size for _, size in found))


def loop_collectives(hlo_text):
  """Collectives per iteration of the entry computation's largest while loop (the decode loop of
  a sampler, the micro-batch loop of an update) and those of the whole program outside it.

  Returns dict(loop=..., outside=...), each {'ops': {op: {'count', 'bytes'}}, 'bytes': total}.
  """
  bodies, entry = computations(hlo_text)
  loops = [(len(_reachable(bodies, body)), body) for body in while_bodies(bodies, entry)]
  inside = _reachable(bodies, max(loops)[1]) if loops else set()
  outside = _reachable(bodies, entry) - inside
  result = {}
  for key, names in (('loop', inside), ('outside', outside)):
    ops, total = summarize(collectives_in(bodies, names))
    result[key] = dict(ops=ops, bytes=total)
  return result


# Instructions that launch no kernel of their own on XLA:GPU: values, views and control flow (a
# while, conditional or call runs the kernels of the computations it calls).
_NO_KERNEL = ('parameter', 'constant', 'get-tuple-element', 'tuple', 'bitcast', 'while',
              'conditional', 'call', 'opt-barrier', 'after-all', 'partition-id', 'replica-id',
              'add-dependency', 'copy-done', 'send-done', 'recv-done') + tuple(
                  f'{op}-done' for op in COLLECTIVES)
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _called(line, key):
  match = re.search(key + r'=\{?([%\w.\-, ]+)\}?', line)
  return [n.strip().lstrip('%') for n in match.group(1).split(',')] if match else []


def kernels_in(bodies, name):
  """Kernels that one run of computation `name` launches on XLA:GPU: each fusion, library call
  (a cuBLAS GEMM) or unfused op at least one; a nested loop's body and condition times its
  known trip count (once where XLA knows none), a conditional's largest branch."""
  count = 0
  for line in bodies.get(name, ()):
    match = _INSTRUCTION.match(line)
    op = match.group(3) if match else None
    if op == 'while':
      trips = _TRIP_COUNT.search(line)
      count += (int(trips.group(1)) if trips else 1) * sum(
          kernels_in(bodies, c) for c in _called(line, 'body') + _called(line, 'condition'))
    elif op == 'conditional':
      branches = (_called(line, 'branch_computations') + _called(line, 'true_computation')
                  + _called(line, 'false_computation'))
      count += max(kernels_in(bodies, c) for c in branches)
    elif op == 'call':
      count += sum(kernels_in(bodies, c) for c in _called(line, 'to_apply'))
    elif op is not None and op not in _NO_KERNEL:
      count += 1
  return count


def loop_kernels(hlo_text):
  """Kernels per iteration of the entry computation's busiest while loop, its condition included:
  a sampler's decode loop (its prefill may run a loop over layers); those of the whole program
  without a loop (a program of one step)."""
  bodies, entry = computations(hlo_text)
  whiles = [line for line in bodies[entry] if re.search(r' while\(', line)]
  if not whiles:
    return kernels_in(bodies, entry)
  return max(sum(kernels_in(bodies, c) for c in _called(line, 'body') + _called(line, 'condition'))
             for line in whiles)


# XLA:GPU's thunks (its executable's steps, as `--xla_dump_to` writes them to
# *.thunk_sequence_after_thunk_passes.txt): those that hold others, those that launch no kernel.
_CONTAINERS = ('kCommandBuffer', 'kSequential', 'kWhile', 'kConditional')
_NO_LAUNCH = ('kAsyncDone', 'kWaitForStreams')
_THUNK = re.compile(r'^( *)\d+: (k\w+)')


def thunk_tree(thunk_text):
  """[(kind, parent index or None)] of a thunk sequence, parents from the indentation (a thunk's
  children are indented 4 more, a while's condition and body alike)."""
  nodes, stack = [], []   # stack: (indent, index)
  for line in thunk_text.splitlines():
    match = _THUNK.match(line)
    if not match:
      continue
    indent = len(match.group(1))
    while stack and stack[-1][0] >= indent:
      stack.pop()
    nodes.append((match.group(2), stack[-1][1] if stack else None))
    stack.append((indent, len(nodes) - 1))
  return nodes


def graph_launches(thunk_text):
  """How the host launches an XLA:GPU program: dict(launches, the top-level thunks of one call (a
  CUDA graph, `kCommandBuffer`, is one launch); loop_in_graph, whether the busiest while loop
  runs inside a graph (on the device: no launch per iteration); loop_kernels, the kernels
  (device copies included) of one of its iterations, its condition too (a nested loop's body
  once))."""
  nodes = thunk_tree(thunk_text)
  children = collections.defaultdict(list)
  for index, (_, parent) in enumerate(nodes):
    children[parent].append(index)

  def kernels(index):
    kind = nodes[index][0]
    own = 0 if kind in _CONTAINERS + _NO_LAUNCH else 1
    return own + sum(kernels(child) for child in children[index])

  def in_graph(index):
    parent = nodes[index][1]
    return parent is not None and (nodes[parent][0] == 'kCommandBuffer' or in_graph(parent))

  loops = [(kernels(i), i) for i, (kind, _) in enumerate(nodes) if kind == 'kWhile']
  busiest = max(loops)[1] if loops else None
  return dict(launches=len(children[None]), loop_in_graph=busiest is not None and in_graph(busiest),
              loop_kernels=kernels(busiest) if loops else 0)
