"""Whether a training config fits a TPU slice or GPU host, and how fast it can run, without one:

  python -m rljax.plan --config=configs/grpo.py:P=1024,model=qwen3-30b-a3b --target=tpu:v5p-128

Builds the run's state abstractly (jax.eval_shape), lays it out with rljax.sharding's rules on the
target's compile-only devices (rljax.targets) and compiles the programs a run executes (the
rollout sampler at the config's lengths, the update with its micro-batches) plus one decode step
and one micro-batch on their own (rljax.compiled). Reports per chip what must be resident
together against HBM, compile times, collectives and kernels per decode step, collectives per
update, and roofline lower bounds for a decode step (also at other batches: --decode_batches),
the update and the RL step; as a table and as JSON (--json).
Without --mesh it proposes a mesh: the first of fsdp over every chip, then fsdp x expert splits,
that fits. A config that fits nowhere is one `rljax: error: ... does not fit` line with the
memory per chip.
"""
import dataclasses
import functools
import json
import math

from rljax import targets

GiB = targets.GiB


@dataclasses.dataclass
class Setup:
  """One config on one mesh: the model, its abstract state, the lengths of a step."""
  config: object
  model: object
  mesh: object
  algo: object
  prompt_len: int
  new_tokens: int
  batch: int
  micro: int


def lengths(config):
  """(prompt tokens, response tokens) a step of `config` runs at: the arithmetic task's own, or
  data.max_prompt_len and (rollout.max_new_tokens or data.max_response_len) for text tasks (the
  tokenizer is not needed to plan)."""
  from rljax import tasks   # pylint: disable=g-import-not-at-top
  if config.data.get('name', 'arithmetic') == 'arithmetic':
    prompt_len, new_tokens = tasks.arithmetic_lengths(config.data)
  else:
    prompt_len, new_tokens = config.data.max_prompt_len, config.data.max_response_len
  return prompt_len, config.rollout.max_new_tokens or new_tokens


def check_covered(config):
  """Raises ValueError for what the plan does not model: an algorithm with a critic."""
  if 'critic_optimizer' in config:
    raise ValueError(f'rljax.plan plans critic-free algorithms (grpo, rloo); {config.algo} has a '
                     'critic')


def setup(config, mesh):
  """The abstract state of `config` on `mesh` (rljax.sharding on compile-only devices)."""
  import jax   # pylint: disable=g-import-not-at-top
  from rljax import algos, model as model_lib, sharding   # pylint: disable=g-import-not-at-top
  check_covered(config)
  model_cfg = model_lib.ModelConfig.from_config(config.model)
  model = model_lib.Transformer(model_cfg)
  params, _ = sharding.init_params(functools.partial(model_lib.init_params, model_cfg),
                                   jax.random.PRNGKey(0), mesh)
  batch = config.rollout.P * config.rollout.G
  minibatch = batch // config.train.num_minibatches
  micro = config.train.micro_batch or minibatch
  algo = algos.get(config.algo).make(config, model, params, mesh, jax.random.PRNGKey(1))
  return Setup(config, model, mesh, algo, *lengths(config), batch, micro)


def decode_rows(s):
  """Rows the sampler decodes at once: P x G, or its decode slots with continuous batching."""
  from rljax import sampler   # pylint: disable=g-import-not-at-top
  return sampler.cache_rows(s.batch, s.config.rollout.slots)


def resident_bytes(s):
  """Bytes per chip of the state every phase holds: params, optimizer state, KV cache (one row per
  response, or per decode slot with continuous batching)."""
  from rljax import sharding   # pylint: disable=g-import-not-at-top
  cfg = s.model.cfg
  kv_heads = cfg.num_kv_heads // (s.mesh.shape['tensor'] if cfg.num_kv_heads % s.mesh.shape[
      'tensor'] == 0 else 1)
  rows = decode_rows(s) // sharding.data_parallel_size(s.mesh)
  kv_cache = (2 * cfg.num_layers * rows * kv_heads * (s.prompt_len + s.new_tokens) * cfg.head_dim
              * _itemsize(cfg.dtype))
  return dict(params=sharding.bytes_per_device(s.algo.state['params']),
              optimizer=sharding.bytes_per_device(s.algo.state['opt_state']), kv_cache=kv_cache)


def _itemsize(dtype):
  import numpy as np   # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp   # pylint: disable=g-import-not-at-top
  return np.dtype(jnp.dtype(dtype)).itemsize


def memory_line(memory, hbm, where='per chip, HBM'):
  """'params 7.1 + optimizer 14.2 + ... = 40.3 GiB per chip, HBM 95.74 GiB' for a breakdown."""
  parts = ' + '.join(f'{k.replace("_", " ")} {v / GiB:.1f}' for k, v in memory.items())
  return f'{parts} = {sum(memory.values()) / GiB:.1f} GiB {where} {hbm / GiB:.2f} GiB'


def check_resident(s, chip, target_name):
  """ValueError('... does not fit ...') when params + optimizer state + KV cache alone exceed
  HBM: no compile needed to know."""
  resident = resident_bytes(s)
  if sum(resident.values()) > chip.hbm_bytes:
    raise ValueError(f'{_model_name(s)} does not fit {target_name} on mesh {_mesh_text(s.mesh)}: '
                     f'{memory_line(resident, chip.hbm_bytes)}')
  return resident


def _mesh_text(mesh):
  sizes = {k: v for k, v in mesh.shape.items() if v > 1}
  return ','.join(f'{k}={v}' for k, v in sizes.items()) or 'one device'


def _model_name(s):
  cfg = s.model.cfg
  return (f'the model (d_model {cfg.d_model}, {cfg.num_layers} layers'
          + (f', {cfg.num_experts} experts' if cfg.num_experts else '') + ')')


def compile_programs(s, chip, target_name):
  """Compiles the sampler and the update; returns their reports and the memory breakdown of each
  phase (what is resident together), raising ValueError('does not fit') past HBM."""
  from rljax import compiled   # pylint: disable=g-import-not-at-top
  resident = check_resident(s, chip, target_name)
  programs = {}
  for name, build in (('sampler', lambda: compiled.sampler(
      s.model, s.algo.state['params'], s.mesh, s.batch, s.prompt_len, s.new_tokens,
      slots=s.config.rollout.slots)),
                      ('update', lambda: compiled.update(s.algo, s.mesh, s.batch, s.prompt_len,
                                                         s.new_tokens))):
    try:
      programs[name] = build()
    except MemoryError as error:
      raise ValueError(f'{_model_name(s)} does not fit {target_name} on mesh '
                       f'{_mesh_text(s.mesh)}: the {name} runs out of device memory ({error}); '
                       f'resident {memory_line(resident, chip.hbm_bytes)}') from None
  sampler_mem, update_mem = programs['sampler']['memory'], programs['update']['memory']
  rollout = dict(params=resident['params'], optimizer=resident['optimizer'],
                 kv_cache_and_temporaries=sampler_mem['temporaries'],
                 rollout_inputs_and_outputs=sampler_mem['arguments'] - resident['params']
                 + sampler_mem['outputs'])
  update = dict(params=resident['params'], optimizer=resident['optimizer'],
                gradients_and_temporaries=update_mem['temporaries'],
                batch=update_mem['arguments'] - resident['params'] - resident['optimizer'])
  for phase, memory in (('rollout', rollout), ('update', update)):
    if sum(memory.values()) > chip.hbm_bytes:
      raise ValueError(f'{_model_name(s)} does not fit {target_name} on mesh '
                       f'{_mesh_text(s.mesh)}: the {phase} holds '
                       f'{memory_line(memory, chip.hbm_bytes)}')
  return programs, dict(resident=resident, rollout=rollout, update=update)


def active_params(cfg):
  """Parameters one token's forward multiplies by (its k experts of E; no embedding lookup)."""
  attention = cfg.d_model * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
  if cfg.num_experts:
    ffn = (3 * cfg.d_model * cfg.expert_hidden * cfg.experts_per_token
           + cfg.d_model * cfg.num_experts)
  else:
    ffn = 3 * cfg.d_model * cfg.dense_hidden
  return cfg.num_layers * (attention + ffn) + cfg.d_model * cfg.vocab_size


def roofline(s, chip, programs, costs):
  """Lower bounds in seconds from FLOPs, HBM bytes and collective bytes per chip (each a bound on
  its own; a step takes at least the largest) and the update's MFU ceiling."""
  from rljax import sharding   # pylint: disable=g-import-not-at-top
  bound = lambda flops, hbm, ici: dict(
      compute_s=flops / chip.peak_flops, memory_s=hbm / chip.hbm_bandwidth,
      collectives_s=ici / chip.ici_bandwidth, bound_s=max(flops / chip.peak_flops,
                                                          hbm / chip.hbm_bandwidth,
                                                          ici / chip.ici_bandwidth))
  decode = bound(costs['decode']['flops'], costs['decode']['bytes_accessed'],
                 programs['sampler']['collectives']['loop']['bytes'])
  num_micro = s.batch // s.micro
  micro = bound(costs['micro']['flops'], costs['micro']['bytes_accessed'],
                programs['update']['collectives']['loop']['bytes'])
  update = {k: v * num_micro for k, v in micro.items()}
  tokens = s.batch * (s.prompt_len + s.new_tokens) / s.mesh.size
  model_flops = 6 * active_params(s.model.cfg) * tokens
  rows = decode_rows(s)   # with continuous batching: every response at full length, in waves
  rollout_s = s.new_tokens * -(-s.batch // rows) * decode['bound_s']
  return dict(decode_step=decode, micro_batch=micro, update=update,
              mfu_ceiling=model_flops / (chip.peak_flops * update['bound_s']),
              rollout_s=rollout_s, rl_step_s=rollout_s + update['bound_s'],
              decode_rows_per_chip=rows // sharding.data_parallel_size(s.mesh))


def check_decode_batches(batches, mesh):
  """ValueError unless the mesh splits each of `batches` rows evenly (before any compile)."""
  from rljax import sharding   # pylint: disable=g-import-not-at-top
  split = sharding.data_parallel_size(mesh)
  if any(batch % split for batch in batches):
    raise ValueError(f'decode batches {[b for b in batches if b % split]} do not divide over the '
                     f'{split} devices the mesh splits a batch over')


def decode_bounds(model_cfg, mesh, chip, batches, slots):
  """Roofline lower bounds of one decode step at each of `batches` rows (a cache of `slots`
  tokens), as `roofline` bounds the config's own, from rljax.compiled.decode_costs.
  Returns [dict(batch, compute_s, memory_s, collectives_s, bound_s, kernels)]."""
  from rljax import compiled   # pylint: disable=g-import-not-at-top
  check_decode_batches(batches, mesh)
  rows = []
  for batch in batches:
    cost = compiled.decode_costs(model_cfg, mesh, batch, slots)
    times = dict(compute_s=cost['flops'] / chip.peak_flops,
                 memory_s=cost['bytes_accessed'] / chip.hbm_bandwidth,
                 collectives_s=cost['collective_bytes'] / chip.ici_bandwidth)
    rows.append(dict(batch=batch, **times, bound_s=max(times.values()), kernels=cost['kernels']))
  return rows


def plan_mesh(config, target, mesh_cfg, devices, costs=True, compile_programs_too=True,
              decode_batches=()):
  """The report for `config` on `target` with mesh `mesh_cfg` (ValueError: does not fit).
  Without `compile_programs_too`, only what is resident at full size (params, optimizer state,
  KV cache): seconds, where the compiles take minutes. `decode_batches`: also `decode_bounds` at
  those batches, the config's prompt + response tokens cached."""
  import time   # pylint: disable=g-import-not-at-top
  from rljax import compiled, config_checks, sharding   # pylint: disable=g-import-not-at-top
  config = _with_mesh(config, mesh_cfg)
  config_checks.check(config, device_count=len(devices), process_count=1)
  start = time.perf_counter()
  mesh = sharding.make_mesh(config.mesh, devices)
  check_decode_batches(decode_batches, mesh)
  s = setup(config, mesh)
  report = dict(target=target.name, chip=target.chip.name, chips=len(devices),
                mesh=dict(mesh.shape), batch=s.batch, micro_batch=s.micro,
                prompt_len=s.prompt_len, new_tokens=s.new_tokens,
                params=int(sum(math.prod(x.shape) for x in _leaves(s.algo.state['params']))),
                active_params=active_params(s.model.cfg), hbm=target.chip.hbm_bytes)
  if not compile_programs_too:
    report['memory'] = dict(resident=check_resident(s, target.chip, target.name))
    report['peak'] = sum(report['memory']['resident'].values())
    report['headroom'] = target.chip.hbm_bytes - report['peak']
    return report
  programs, memory = compile_programs(s, target.chip, target.name)
  report.update(memory=memory, programs=programs, peak=max(sum(memory['rollout'].values()),
                                                           sum(memory['update'].values())))
  report['headroom'] = target.chip.hbm_bytes - report['peak']
  if costs:
    per_step = compiled.per_step_costs(
        s.model, lambda cfg: _abstract_params(cfg, mesh), mesh, config.grpo,
        decode_rows(s), s.prompt_len + s.new_tokens, s.micro, s.prompt_len, s.new_tokens)
    report['per_step'] = per_step
    report['roofline'] = roofline(s, target.chip, programs, per_step)
  if decode_batches:
    report['decode_bounds'] = decode_bounds(s.model.cfg, mesh, target.chip, decode_batches,
                                            s.prompt_len + s.new_tokens)
  report['wall_s'] = time.perf_counter() - start
  return report


def _leaves(tree):
  import jax   # pylint: disable=g-import-not-at-top
  return jax.tree.leaves(tree)


def _abstract_params(cfg, mesh):
  import jax   # pylint: disable=g-import-not-at-top
  from rljax import model as model_lib, sharding   # pylint: disable=g-import-not-at-top
  return sharding.init_params(functools.partial(model_lib.init_params, cfg),
                              jax.random.PRNGKey(0), mesh)[0]


def _with_mesh(config, mesh_cfg):
  config = config.copy_and_resolve_references()
  config.unlock()
  if mesh_cfg:
    config.mesh = dict(dict(data=1, fsdp=1, expert=1, tensor=1), **mesh_cfg)
  return config


def candidate_meshes(config, chips):
  """Meshes to try, in order: fsdp over every chip, then ever more expert parallelism (MoE),
  then tensor parallelism."""
  meshes = [dict(fsdp=chips)]
  experts = config.model.num_experts
  split = 2
  while experts and split <= chips and experts % split == 0:
    meshes.append(dict(fsdp=chips // split, expert=split))
    split *= 2
  for tensor in (2, 4, 8):
    if chips % tensor == 0 and config.model.num_kv_heads % tensor == 0:
      meshes.append(dict(fsdp=chips // tensor, tensor=tensor))
  return [{k: v for k, v in mesh.items() if v > 1} or dict(fsdp=1) for mesh in meshes]


def plan(config, target, mesh_cfg=None, costs=True, compile_programs_too=True,
         decode_batches=()):
  """`plan_mesh` on the given mesh, or on the first candidate mesh that fits."""
  check_covered(config)   # not a failure of every mesh
  devices = target.devices()
  if mesh_cfg:
    return plan_mesh(config, target, mesh_cfg, devices, costs, compile_programs_too,
                     decode_batches)
  failures = []
  for candidate in candidate_meshes(config, len(devices)):
    try:
      report = plan_mesh(config, target, candidate, devices, costs, compile_programs_too,
                         decode_batches)
    except ValueError as error:   # too big, or a mesh the batch does not divide over
      failures.append(str(error))
      continue
    report['proposed_mesh'] = True
    return report
  fit = [f for f in failures if 'does not fit' in f]
  raise ValueError(f'no mesh fits {target.name}; the first tried: {(fit or failures)[0]}')


def _gib(x):
  return f'{x / GiB:.2f} GiB'


def _collectives_text(part):
  ops = ', '.join(f'{v["count"]} {op} {v["bytes"] / 2**20:.1f} MiB' for op, v in
                  sorted(part['ops'].items()))
  return f'{part["bytes"] / 2**20:.1f} MiB ({ops or "none"})'


def format_report(r):
  """The report as an aligned plain-text table."""
  mesh = ','.join(f'{k}={v}' for k, v in r['mesh'].items() if v > 1) or 'one device'
  rows = [('target', f'{r["target"]}: {r["chips"]} x {r["chip"]}, mesh {mesh}'
                     + (' (proposed)' if r.get('proposed_mesh') else '')),
          ('model', f'{r["params"] / 1e9:.2f}B parameters, {r["active_params"] / 1e9:.2f}B '
                    'active per token'),
          ('step', f'{r["batch"]} responses x ({r["prompt_len"]} prompt + {r["new_tokens"]} new '
                   f'tokens), micro-batch {r["micro_batch"]}')]
  for phase in ('resident', 'rollout', 'update'):
    if phase in r['memory']:
      rows.append((f'{phase} memory / chip', memory_line(r['memory'][phase], r['hbm'])))
  rows.append(('peak / headroom', f'{_gib(r["peak"])} / {_gib(r["headroom"])}'))
  if 'programs' not in r:
    return _aligned(rows)
  for name in ('sampler', 'update'):
    program = r['programs'][name]
    rows.append((f'{name} compile', f'{program["compile_s"]:.0f} s'))
  loop = {'sampler': 'per decode step', 'update': 'per micro-batch'}
  for name in ('sampler', 'update'):
    part = r['programs'][name]['collectives']
    rows.append((f'{name} collectives {loop[name]}', _collectives_text(part['loop'])))
    rows.append((f'{name} collectives once', _collectives_text(part['outside'])))
  rows.append(('sampler kernels per decode step', str(r['programs']['sampler']['loop_kernels'])))
  if 'roofline' in r:
    roof = r['roofline']
    for key, label in (('decode_step', 'decode step'), ('micro_batch', 'micro-batch'),
                       ('update', 'update')):
      b = roof[key]
      ms = {k: f'{v * 1e3:.2f}' for k, v in b.items()}
      rows.append((f'{label} bound', f'{ms["bound_s"]} ms (compute {ms["compute_s"]}, HBM '
                                     f'{ms["memory_s"]}, collectives {ms["collectives_s"]} ms)'))
    rows.append(('update MFU ceiling', f'{100 * roof["mfu_ceiling"]:.0f}%'))
    rows.append(('RL step bound', f'rollout {roof["rollout_s"]:.2f} s + update '
                                  f'{roof["update"]["bound_s"]:.2f} s = {roof["rl_step_s"]:.2f} s'))
  for b in r.get('decode_bounds', ()):
    ms = {k: f'{v * 1e3:.3f}' for k, v in b.items() if k.endswith('_s')}
    rows.append((f'decode step bound, batch {b["batch"]}',
                 f'{ms["bound_s"]} ms (compute {ms["compute_s"]}, HBM {ms["memory_s"]}, '
                 f'collectives {ms["collectives_s"]} ms), {b["kernels"]} kernels'))
  return _aligned(rows)


def _aligned(rows):
  width = max(len(k) for k, _ in rows)
  return '\n'.join(f'{k:<{width}}  {v}' for k, v in rows)


def preflight(config, devices=None):
  """What `python -m rljax.main` is about to run, from the config alone (nothing is allocated or
  compiled): model size, devices, and per device the parameters, optimizer state and KV cache.
  ValueError on a bad config, or ('does not fit') when those alone exceed a device's memory."""
  import jax   # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from rljax import config_checks, hf, model as model_lib, optim, sharding
  devices = jax.devices() if devices is None else devices
  config_checks.check(config)
  model_cfg = hf.policy_config(config)
  mesh = sharding.make_mesh(config.mesh, devices)
  boxed = jax.eval_shape(functools.partial(model_lib.init_params, model_cfg), jax.random.PRNGKey(0))
  params = sharding.abstract(_unbox(boxed), sharding.param_shardings(boxed, mesh))
  batch = config.rollout.P * config.rollout.G
  optimizer, _ = optim.make_optimizer(config.optimizer, batch,
                                      optim.planned_updates(config.train, batch))
  opt_state = jax.eval_shape(optimizer.init, params)
  opt_state = sharding.abstract(opt_state, sharding.optimizer_shardings(optimizer, params))
  s = Setup(config, model_lib.Transformer(model_cfg), mesh, _State(params, opt_state),
            *lengths(config), batch, 0)
  memory = resident_bytes(s)
  local = [d for d in devices if d.process_index == jax.process_index()] or devices
  limit = _device_memory(local[0])   # memory stats exist only for this process's devices
  count = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
  line = (f'rljax: {count / 1e6:,.1f}M parameters on {len(devices)} {devices[0].device_kind} '
          f'device(s), mesh {_mesh_text(mesh)}; '
          f'{memory_line(memory, limit, "per device, device memory")}')
  if sum(memory.values()) > limit:
    raise ValueError(f'{_model_name(s)} does not fit: {line[len("rljax: "):]}')
  if devices[0].platform == 'cpu' and active_params(model_cfg) > 1e8:
    flops = 6 * active_params(model_cfg) * batch * (s.prompt_len + s.new_tokens)
    line += (f'; {flops:.1e} FLOPs per update on CPU devices (the CPU demo: '
             'configs/grpo.py:runlocal)')
  return line


class _State:
  def __init__(self, params, opt_state):
    self.state = dict(params=params, opt_state=opt_state)


def _unbox(tree):
  import flax.linen as nn   # pylint: disable=g-import-not-at-top
  return nn.unbox(tree)


def _device_memory(device):
  """Bytes a device can hold: its allocator's limit, or this host's memory for CPU devices."""
  import os   # pylint: disable=g-import-not-at-top
  stats = device.memory_stats() or {}
  if stats.get('bytes_limit'):
    return stats['bytes_limit']
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def to_json(report):
  """The report with numbers only (no numpy scalars): what --json writes."""
  return json.loads(json.dumps(report, default=float))


def _parse_mesh(text):
  """'fsdp=4,expert=2' -> dict; ValueError naming the bad part."""
  mesh = {}
  for part in filter(None, text.split(',')):
    axis, _, size = part.partition('=')
    if not size.isdigit() or int(size) < 1:
      raise ValueError(f'--mesh {text!r}: expected axis=size pairs, e.g. fsdp=4,expert=2')
    mesh[axis.strip()] = int(size)
  return mesh


def parse_batches(text):
  """'1,16,256' -> [1, 16, 256]; ValueError with one clear line otherwise."""
  parts = [p.strip() for p in text.split(',') if p.strip()]
  if not all(p.isdigit() and int(p) > 0 for p in parts):
    raise ValueError(f'--decode_batches must be positive integers separated by commas, got '
                     f'{text!r}')
  return [int(p) for p in parts]


def main(argv):
  if len(argv) > 1:
    rljax_main.fail(f'unexpected arguments: {argv[1:]}', rljax_main.EXIT_BAD_INPUT)
  try:
    target = targets.parse_target(_TARGET.value)
    config = flags.FLAGS.config
    batches = parse_batches(_DECODE_BATCHES.value)
    report = plan(config, target, _parse_mesh(_MESH.value), costs=_COSTS.value,
                  compile_programs_too=_COMPILE.value, decode_batches=batches)
  except ValueError as error:
    rljax_main.fail(error, rljax_main.EXIT_BAD_INPUT)
  print(format_report(report), flush=True)
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump(to_json(report), f, indent=1)


if __name__ == '__main__':
  import os   # pylint: disable=g-import-not-at-top
  # Compile-only targets on a CPU host: JAX itself runs on the CPU.
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  from absl import app, flags   # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags   # pylint: disable=g-import-not-at-top
  from rljax import main as rljax_main   # pylint: disable=g-import-not-at-top  (errors)
  config_flags.DEFINE_config_file('config', None, 'Config file, e.g. configs/grpo.py:model=qwen3-8b',
                                  lock_config=True)
  _TARGET = flags.DEFINE_string('target', None, f'Hardware: {targets.TARGET_HELP}.')
  _MESH = flags.DEFINE_string('mesh', '', 'e.g. fsdp=4,expert=2; empty: propose one that fits.')
  _COSTS = flags.DEFINE_bool('costs', True, 'Also compile one decode step and one micro-batch '
                             'for per-step FLOPs, bytes and roofline bounds.')
  _COMPILE = flags.DEFINE_bool('compile', True, 'Compile the programs; --nocompile: only what is '
                               'resident (params, optimizer state, KV cache), in seconds.')
  _DECODE_BATCHES = flags.DEFINE_string(
      'decode_batches', '', 'e.g. 1,16,256: also bound one decode step at these batches.')
  _JSON = flags.DEFINE_string('json', '', 'Also write the report as JSON to this path.')
  flags.mark_flags_as_required(['config', 'target'])
  app.run(main, flags_parser=rljax_main.parse_flags)
