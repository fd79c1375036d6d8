"""One device mesh for sampling and training, and where every array lives on it.

Mesh axes (config.mesh; one size may be -1 to take the remaining devices):
  data    pure data parallelism: batch split, parameters replicated;
  fsdp    batch split AND parameters split along their 'embed' dimension (gathered per layer);
  expert  batch split for attention, experts split for the MoE (rljax.model.moe, under shard_map);
  tensor  attention heads, FFN width and vocabulary split (Megatron style).
Parameters carry logical axis names (rljax.model.transformer); LOGICAL_RULES maps each name to mesh
axes. A dimension that a rule's mesh axes do not divide stays replicated (said at start-up), so any
model runs on any mesh, only less sharded.
"""
import math

import flax.linen as nn
import jax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec
import numpy as np

MESH_AXES = ('data', 'fsdp', 'expert', 'tensor')
BATCH_AXES = ('data', 'fsdp', 'expert')

LOGICAL_RULES = {
    'batch': BATCH_AXES,
    'embed': ('fsdp',),
    'vocab': ('tensor',),
    'heads': ('tensor',),
    'kv_heads': ('tensor',),
    'mlp': ('tensor',),
    'expert': ('expert',),
    'decoding_mlp': ('tensor', 'fsdp'),   # the sampler's experts (rljax.model.moe.DECODING_NAMES)
}  # names not listed ('layers', 'head_dim', 'norm', 'length') are replicated


def mesh_shape(mesh_cfg, num_devices):
  """Axis sizes from config; -1 takes what is left. Raises ValueError on a mismatch."""
  unknown = set(mesh_cfg.keys()) - set(MESH_AXES)
  if unknown:
    raise ValueError(f'unknown mesh axes {sorted(unknown)}; the axes are {MESH_AXES}')
  sizes = {axis: mesh_cfg.get(axis, 1) for axis in MESH_AXES}
  for axis, size in sizes.items():
    if not isinstance(size, int) or (size < 1 and size != -1):
      raise ValueError(f'mesh.{axis} must be a positive size or -1 (the rest), got {size!r}')
  free = [axis for axis, size in sizes.items() if size == -1]
  if len(free) > 1:
    raise ValueError(f'only one mesh axis may be -1, got {", ".join(free)}')
  fixed = math.prod(size for size in sizes.values() if size != -1)
  if free:
    if num_devices % fixed:
      raise ValueError(f'mesh {sizes}: {num_devices} devices are not divisible by {fixed}')
    sizes[free[0]] = num_devices // fixed
  if math.prod(sizes.values()) != num_devices:
    raise ValueError(f'mesh {sizes} needs {math.prod(sizes.values())} devices, '
                     f'but {num_devices} are available')
  return sizes


def check_mesh(mesh_cfg, device_count, batches, num_experts):
  """ValueError unless `mesh_cfg` lays out `device_count` devices, every (name, size) of `batches`
  splits over its data-parallel axes and its expert axis divides `num_experts`."""
  sizes = mesh_shape(mesh_cfg, device_count)
  data_parallel = math.prod(sizes[axis] for axis in BATCH_AXES)
  for name, size in batches:
    if size % data_parallel:
      raise ValueError(f'{name} ({size}) is not divisible by the data-parallel size '
                       f'{" * ".join(BATCH_AXES)} = {data_parallel} (mesh {sizes})')
  if num_experts and num_experts % sizes['expert']:
    raise ValueError(f'model.num_experts ({num_experts}) is not divisible by '
                     f'mesh.expert = {sizes["expert"]}')


def make_mesh(mesh_cfg, devices=None, physical=True):
  """The mesh of `mesh_cfg` over `devices`: laid out along the chips' physical links
  (jax.make_mesh), or with `physical` False in the devices' order."""
  devices = jax.devices() if devices is None else devices
  shape = tuple(mesh_shape(mesh_cfg, len(devices)).values())
  axis_types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  if not physical:
    return jax.sharding.Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=axis_types)
  return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)


def make_meshes(mesh_cfg, rollout_devices=0, devices=None):
  """(training mesh, sampler's mesh): one mesh for both, or with `rollout_devices` > 0 that many
  devices for the sampler and the rest for training, each laid out by `mesh_cfg`. The sampler's
  are the last devices; over several processes (not on TPU) the last of each process's in equal
  numbers, so each process feeds its own rows to both meshes (docs/design/split_sampler.md)."""
  devices = jax.devices() if devices is None else devices
  if not rollout_devices:
    mesh = make_mesh(mesh_cfg, devices)
    return mesh, mesh
  processes = sorted({device.process_index for device in devices})
  if len(processes) == 1 or devices[0].platform == 'tpu':
    # A TPU slice's last hosts: a box of its torus, which jax.make_mesh lays out (a share of every
    # host is none, and XLA:TPU does not compile for it).
    split = len(devices) - rollout_devices
    return make_mesh(mesh_cfg, devices[:split]), make_mesh(mesh_cfg, devices[split:])
  per_process = rollout_devices // len(processes)
  train, sample = [], []
  for process in processes:
    own = [device for device in devices if device.process_index == process]
    train += own[:len(own) - per_process]
    sample += own[len(own) - per_process:]
  return make_mesh(mesh_cfg, train, physical=False), make_mesh(mesh_cfg, sample, physical=False)


def data_parallel_size(mesh):
  return math.prod(mesh.shape[axis] for axis in BATCH_AXES)


def spec_for(shape, names, mesh):
  """PartitionSpec of an array with logical dimension `names` on `mesh` (see module doc)."""
  used, spec = set(), []
  for size, name in zip(shape, names):
    axes = tuple(a for a in LOGICAL_RULES.get(name, ()) if a not in used and mesh.shape[a] > 1)
    if axes and size % math.prod(mesh.shape[a] for a in axes) == 0:
      used.update(axes)
      spec.append(axes[0] if len(axes) == 1 else axes)
    else:
      spec.append(None)
  return PartitionSpec(*spec)


def constrain(x, names):
  """Pins an activation's layout when a mesh is set (else a no-op): without it the compiler may
  carry a parameter's layout (e.g. embed over fsdp) into the activations."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  return jax.lax.with_sharding_constraint(x, spec_for(x.shape, names, mesh))


def param_shardings(boxed_params, mesh):
  """NamedShardings for a pytree of nn.Partitioned (abstract or concrete) parameters."""
  def sharding(leaf):
    if isinstance(leaf, nn.Partitioned):
      return NamedSharding(mesh, spec_for(leaf.value.shape, leaf.names, mesh))
    return NamedSharding(mesh, PartitionSpec())
  return jax.tree.map(sharding, boxed_params, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def compile_only(mesh):
  """Whether `mesh` is made of compile-only devices (a TPU or GPU topology described on a host
  that lacks it, rljax.aot.targets): programs can be lowered and compiled for it, never run."""
  return mesh.devices.flat[0] not in jax.devices()


def abstract(tree, shardings):
  """ShapeDtypeStructs of `tree`'s leaves that carry `shardings`: arguments to lower with."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree,
                      shardings)


def is_abstract(tree):
  """Whether any leaf of `tree` is a ShapeDtypeStruct (shapes only, nothing allocated)."""
  return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(tree))


def init_params(init_fn, rng, mesh, abstract_only=False):
  """Runs `init_fn(rng) -> boxed params` so each parameter is created already on its shards
  (no host ever materialises the full model). Returns (params, shardings); on a compile-only
  mesh, or with `abstract_only`, the params are ShapeDtypeStructs that carry their shardings."""
  boxed = jax.eval_shape(init_fn, rng)
  shardings = param_shardings(boxed, mesh)
  if abstract_only or compile_only(mesh):
    return abstract(nn.unbox(boxed), shardings), shardings
  params = jax.jit(lambda r: nn.unbox(init_fn(r)), out_shardings=shardings)(rng)
  return params, shardings


def optimizer_shardings(optimizer, params):
  """Shardings of `optimizer.init(params)`: a state leaf mirrors the parameter whose key path ends
  its own and whose shape it has (Adam's mu['blocks']['w_q'] mirrors params['blocks']['w_q'];
  under optax.multi_transform the moments of params['policy'] sit at mu['policy']...); anything
  else (counts, scalars) is replicated. `params` may be ShapeDtypeStructs with shardings."""
  by_path = {tuple(path): p for path, p in jax.tree_util.tree_flatten_with_path(params)[0]}
  mesh = jax.tree.leaves(params)[0].sharding.mesh

  def sharding_of(path, leaf):
    for start in range(len(path)):
      param = by_path.get(tuple(path[start:]))
      if param is not None and param.shape == leaf.shape:
        return param.sharding
    return replicated(mesh)
  return jax.tree_util.tree_map_with_path(sharding_of, jax.eval_shape(optimizer.init, params))


def init_optimizer(optimizer, params, mesh):
  """Optimizer state created on the shards of the parameters it mirrors (Adam's moments would
  otherwise come out replicated: zeros carry no sharding of their own); ShapeDtypeStructs where
  the params are (a compile-only mesh, an abstract setup)."""
  shardings = optimizer_shardings(optimizer, params)
  if compile_only(mesh) or is_abstract(params):
    return abstract(jax.eval_shape(optimizer.init, params), shardings)
  return on_mesh(jax.jit(optimizer.init, out_shardings=shardings), mesh)(params)


def place(tree, mesh):
  """Arrays already laid out on `mesh` stay; any other (e.g. a new head or a key on one device)
  is replicated over it, so one jit can take them together and a multi-host checkpoint can save
  them (it refuses host-local arrays). Every process must pass the same values. On a compile-only
  mesh: ShapeDtypeStructs."""
  def put(x):
    if isinstance(getattr(x, 'sharding', None), NamedSharding) and x.sharding.mesh == mesh:
      return x
    if compile_only(mesh):
      return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=replicated(mesh))
    return jax.device_put(np.asarray(x), replicated(mesh))
  return jax.tree.map(put, tree)


def batch_sharding(mesh, ndim):
  """Leading (batch) dimension split over the data-parallel axes; a scalar (no batch dimension,
  e.g. a rollout's step count) is replicated."""
  if ndim == 0:
    return replicated(mesh)
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def abstract_rows(mesh, shape, dtype=np.int32):
  """An abstract batch of `shape` (a ShapeDtypeStruct) with its rows split over the batch axes of
  `mesh`: a program's batch argument, lowered without data."""
  return jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(mesh, len(shape)))


def abstract_key(mesh):
  """An abstract PRNG key replicated over `mesh`."""
  return jax.ShapeDtypeStruct((2,), np.uint32, sharding=replicated(mesh))


def put_batch(tree, mesh):
  """Host arrays holding THIS process's rows -> global arrays split over the batch axes."""
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(batch_sharding(mesh, np.ndim(x)), x), tree)


def split_rows(tree, mesh):
  """Arrays -> the same values on `mesh`, split over its batch axes as put_batch lays a batch out
  (so each process holds its own rows; a scalar stays whole)."""
  return move(tree, jax.tree.map(lambda x: batch_sharding(mesh, x.ndim), tree))


def move(tree, shardings):
  """`tree` laid out by `shardings`, which may be on other devices (the sampler's mesh). In one
  process XLA copies device to device. Multi-controller JAX moves an array only between shardings
  of the same devices, so over several processes each array goes through the hosts: gathered whole
  on every process, which then places its own shards (docs/design/split_sampler.md)."""
  if jax.process_count() == 1:
    return jax.device_put(tree, shardings)

  def put(x, target):
    whole = to_numpy(x)
    return jax.make_array_from_callback(whole.shape, target, lambda index: whole[index])
  return jax.tree.map(put, tree, shardings)


def local_rows(x):
  """The indices of the rows of `x` (a global array split over the batch axes) that this process
  holds, in order: the rows put_batch took from it. Every row for a host array."""
  if not isinstance(getattr(x, 'sharding', None), jax.sharding.Sharding):
    return np.arange(np.shape(x)[0])
  spans = {index[0].indices(x.shape[0])[:2]
           for index in x.sharding.addressable_devices_indices_map(x.shape).values()}
  return np.concatenate([np.arange(start, stop) for start, stop in sorted(spans)])


def to_numpy(x):
  """A global array, whole, as numpy on every process (gathered when it spans processes)."""
  if getattr(x, 'is_fully_addressable', True):
    return np.asarray(x)
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def on_mesh(fn, mesh):
  """`fn` called (and so traced) with `mesh` as the context mesh (rljax.model.moe reads it); a
  jitted `fn` keeps its `lower` and `trace`, under that mesh too (rljax.plan compiles for meshes it
  cannot run on)."""
  def call(*args, **kwargs):
    with jax.set_mesh(mesh):
      return fn(*args, **kwargs)
  for method in ('lower', 'trace'):
    if hasattr(fn, method):
      setattr(call, method, on_mesh(getattr(fn, method), mesh))
  return call


def replicated(mesh):
  return NamedSharding(mesh, PartitionSpec())


def bytes_per_device(tree):
  """Bytes of the largest shard of each array, summed: what one device holds of `tree`."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shard_shape = leaf.sharding.shard_shape(leaf.shape) if hasattr(leaf, 'sharding') else leaf.shape
    total += math.prod(shard_shape) * np.dtype(leaf.dtype).itemsize
  return total
