"""Hardware that rljax.plan compiles for without having it: TPU slices and GPU hosts as JAX
"compile-only" devices (`jax.experimental.topologies`), and each chip's published limits.

Targets (`--target`):
  tpu:v5e-8, tpu:v5p-128, tpu:v6e-16   Cloud TPU accelerator types: v5e/v6e count chips, v5p counts
                                       TensorCores (2 per chip: v5p-8 is 4 chips, 2x2x1)
  tpu:v5p:4x4x4, tpu:v5e:2x4           an explicit topology (chips per dimension)
  tpu:2xv5p-128                        several slices (data-center network between them)
  gpu:h100-8, gpu:h200-16              GPUs, 8 per host (h200-16: 2 hosts)
TPU compiles need libtpu (`pip install 'jax[tpu]==<jax version>'`), GPU compiles the
jax-cuda12-plugin; neither needs the hardware. The TPU compiler enforces the chip's HBM; for GPUs
rljax.plan compares the compiled program's memory with the card's itself.
"""
import dataclasses
import math
import os
import re

# Per chip: HBM bytes the compiler lets a program use (TPU: from libtpu's own out-of-memory
# message, e.g. `python -m rljax.plan --config=configs/grpo.py:model=qwen3-235b-a22b
# --target=tpu:v5e-8`; GPU: the card's memory), dense bf16 FLOP/s, HBM and interconnect bytes/s.
# Peak numbers: cloud.google.com/tpu/docs/v5e, /v5p, /v6e; nvidia.com H100 and H200 datasheets
# (SXM; interconnect: NVLink within a host, one direction).
GiB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  hbm_bytes: float
  peak_flops: float        # dense bf16
  hbm_bandwidth: float     # bytes/s
  ici_bandwidth: float     # bytes/s per chip, chip-to-chip within a slice / host


CHIPS = {
    'v5e': Chip('TPU v5e', 15.75 * GiB, 197e12, 819e9, 1600e9 / 8),
    'v5p': Chip('TPU v5p', 95.74 * GiB, 459e12, 2765e9, 4800e9 / 8),
    'v6e': Chip('TPU v6e', 31.25 * GiB, 918e12, 1640e9, 3584e9 / 8),
    'h100': Chip('NVIDIA H100 SXM', 84978434048, 989e12, 3.35e12, 450e9),
    'h200': Chip('NVIDIA H200 SXM', 150754820096, 989e12, 4.8e12, 450e9),
}
TOPOLOGY_PREFIX = {'v5e': 'v5e', 'v5p': 'v5', 'v6e': 'v6e'}   # libtpu's names
GPUS_PER_HOST = 8


@dataclasses.dataclass(frozen=True)
class Target:
  name: str            # as given, e.g. 'tpu:v5p-128'
  platform: str        # 'tpu' | 'cuda'
  chip: Chip
  topology: str        # e.g. 'v5:4x4x4' (TPU), '1x2x8' (GPU: slices x hosts x devices)
  num_slices: int = 1

  @property
  def num_chips(self):
    dims = self.topology.split(':')[-1].split('x')
    return math.prod(int(d) for d in dims) * self.num_slices

  def devices(self):
    """The target's compile-only devices (a mesh over them compiles, never runs)."""
    return compile_only_devices(self)


def _tpu_topology(generation, chips):
  """The slice shape of a Cloud TPU accelerator type: the most square (v5e, v6e: 2D) or cubic
  (v5p: 3D, 4 chips are 2x2x1) shape, as Cloud's types are (v5e-8: 2x4, v5p-128: 4x4x4)."""
  if chips < 1 or chips & (chips - 1):
    raise ValueError(f'a {generation} slice has a power-of-two number of chips, not {chips}')
  dims = [1] * (3 if generation == 'v5p' else 2)
  while math.prod(dims) < chips:
    dims = sorted(dims)
    dims[0] *= 2
  dims = sorted(dims)
  if len(dims) == 3 and dims[0] == 1:
    dims = dims[1:] + dims[:1]
  return 'x'.join(map(str, dims))


_TPU_TYPE = re.compile(r'^(?:(\d+)x)?(v5e|v5p|v6e)-(\d+)$')
_TPU_TOPOLOGY = re.compile(r'^(?:(\d+)x)?(v5e|v5p|v6e):(\d+(?:x\d+){1,2})$')
_GPU = re.compile(r'^(h100|h200)-(\d+)$')
TARGET_HELP = ('tpu:v5e-N, tpu:v5p-N, tpu:v6e-N (Cloud TPU types), tpu:v5p:AxBxC (a topology), '
               'tpu:KxTYPE (K slices), gpu:h100-N or gpu:h200-N (8 per host)')


def parse_target(text):
  """`--target` text -> Target; ValueError saying what is accepted."""
  platform, _, rest = text.partition(':')
  bad = ValueError(f'unknown --target {text!r}; expected {TARGET_HELP}')
  if platform == 'tpu':
    typed, topo = _TPU_TYPE.match(rest), _TPU_TOPOLOGY.match(rest)
    if not typed and not topo:
      raise bad
    slices, generation, size = (typed or topo).groups()
    if typed:
      chips = int(size) // 2 if generation == 'v5p' else int(size)
      if generation == 'v5p' and int(size) % 2:
        raise ValueError(f'--target {text!r}: v5p-N counts TensorCores, 2 per chip: N is even')
      size = _tpu_topology(generation, chips)
    dims = size.split('x')
    if len(dims) != (3 if generation == 'v5p' else 2):
      raise ValueError(f'--target {text!r}: a {generation} topology has '
                       f'{3 if generation == "v5p" else 2} dimensions')
    return Target(text, 'tpu', CHIPS[generation], f'{TOPOLOGY_PREFIX[generation]}:{size}',
                  int(slices or 1))
  gpu = _GPU.match(rest) if platform == 'gpu' else None
  if not gpu:
    raise bad
  card, count = gpu.group(1), int(gpu.group(2))
  if count < 1 or (count > GPUS_PER_HOST and count % GPUS_PER_HOST):
    raise ValueError(f'--target {text!r}: 1-{GPUS_PER_HOST} GPUs, or whole hosts of '
                     f'{GPUS_PER_HOST}')
  hosts = max(count // GPUS_PER_HOST, 1)
  return Target(text, 'cuda', CHIPS[card], f'1x{hosts}x{count // hosts}')


def compile_only_devices(target):
  """Devices of `target` that XLA compiles for on this host (libtpu / the CUDA plugin loaded as
  compile-only backends); ValueError when the backend is not installed."""
  from jax.experimental import topologies   # pylint: disable=g-import-not-at-top
  # libtpu on a host without TPUs: no metadata-server queries, no exclusive lock on the library.
  os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  try:
    if target.platform == 'tpu':
      topology = topologies.get_topology_desc(topology_name=target.topology, platform='tpu',
                                              num_slices=target.num_slices)
    else:
      topology = topologies.get_topology_desc(topology_name=target.name, platform='cuda',
                                              topology=target.topology,
                                              target_config=gpu_target_config(target.chip))
  except (RuntimeError, ValueError, ImportError) as error:
    package = ("'jax[tpu]==<jax version>'" if target.platform == 'tpu'
               else "'jax-cuda12-plugin==<jax version>'")
    raise ValueError(f'cannot describe {target.name} ({target.topology}) on this host: '
                     f'{str(error).splitlines()[0]} (is {package} installed?)') from None
  return topology.devices


def gpu_target_config(chip):
  """XLA's GpuTargetConfigProto text for a Hopper card (132 SMs, compute capability 9.0), the
  fields of XLA's xla/tools/hlo_opt/gpu_specs/h100_sxm.txtpb with the card's memory size and
  bandwidth: what XLA:GPU compiles for without the card. With a CUDA 12.8 runtime and driver:
  XLA puts loops and library calls into CUDA graphs from 12.3 on (conditional nodes, stream
  capture), and without a version it assumes an older one."""
  return f"""gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: {int(chip.hbm_bandwidth)} l2_cache_size: 52428800 clock_rate_ghz: 1.98
  device_memory_size: {int(chip.hbm_bytes)} shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 }}
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
  driver_version: "12.8.0" runtime_version: "12.8.0" compile_time_toolkit_version: "12.8.0"
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 }}
device_description_str: "{chip.name}"
"""
