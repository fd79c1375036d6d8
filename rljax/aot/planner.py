"""Whether a training config fits a TPU slice or GPU host, and how fast it can run, without one:

  python -m rljax.plan --config=configs/grpo.py:P=1024,model=qwen3-30b-a3b --target=tpu:v5p-128

Builds the run's state abstractly (jax.eval_shape), lays it out with rljax.sharding's rules on the
target's compile-only devices (rljax.aot.targets) and compiles the programs a run executes, from
the same function the trainer takes them from (rljax.train.programs: the rollout schedule's
sampler or partial pool, the update, make_batch and the evaluator), plus one decode step and one
micro-batch (and PPO's critic's) on their own (rljax.aot.costs). Reports per chip what must
be resident together against HBM, compile times, collectives and kernels per decode step,
collectives per update, and roofline lower bounds for a decode step (also at other batches:
--decode_batches), the update and the RL step; as a table (rljax.aot.table) and as JSON (--json).
Without --mesh it proposes a mesh: the first of fsdp over every chip, then fsdp x expert splits,
that fits. A config that fits nowhere is one `rljax: error: ... does not fit` line with the
memory per chip.
"""
import dataclasses
import functools
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from rljax import algos
from rljax import optim
from rljax.auto_batch import state as auto_state
from rljax.aot import costs as compiled
from rljax.aot import table
from rljax.aot import targets
from rljax.model import lora
from rljax.model import router
from rljax.model import transformer as model_lib
from rljax.rollout import sampler
from rljax import sharding
from rljax import tasks
from rljax.train import config_checks
from rljax.train import programs as programs_lib
from rljax.train import run as run_lib
from rljax.train import schedules

GiB = targets.GiB


def decode_rows(s):
  """Rows the sampler decodes at once: P x G, or its decode slots with continuous batching."""
  return sampler.cache_rows(s.batch, s.sampling.slots)


def kv_cache_bytes(s, group):
  """Bytes per sampler chip of the KV cache at `group` responses per prefilled prompt: a row per
  response, or per decode slot with continuous batching, next to one prompt-only row per prompt
  there when a group shares it."""
  cfg, mesh = s.model.cfg, s.rollout_mesh
  kv_heads = cfg.num_kv_heads // (mesh.shape['tensor'] if cfg.num_kv_heads % mesh.shape[
      'tensor'] == 0 else 1)
  rows, prompts = (n // sharding.data_parallel_size(mesh) for n in (
      decode_rows(s), sampler.prompt_cache_rows(s.batch // group, group, s.sampling.slots)))
  return (2 * cfg.num_layers * kv_heads * cfg.head_dim * _itemsize(cfg.dtype)
          * (rows * (s.prompt_len + s.new_tokens) + prompts * (s.prompt_len - 1)))


def router_ids_bytes(s):
  """Bytes of the experts the sampler records for a MoE (one [layers, k] row of ids per response
  token, rljax.model.router.route_dtype): router replay's buffer, and its mismatch metric's. In all
  for one rollout batch, and per chip as held: split like the batch, or with the partial schedule
  the pool's two batches of groups on every chip (the pool is replicated). Inside the compiled
  programs' memory (the rollout's outputs, the update's inputs, the pool); stated apart here."""
  cfg = s.model.cfg
  if not cfg.num_experts:
    return dict(per_step=0, per_chip=0)
  per_response = (s.new_tokens * cfg.num_layers * cfg.experts_per_token
                  * _itemsize(router.route_dtype(cfg.num_experts)))
  per_step = s.batch * per_response
  if schedules.kind(s.config).PROGRAMS == 'pool':
    return dict(per_step=per_step, per_chip=2 * per_step)
  return dict(per_step=per_step, per_chip=per_step // sharding.data_parallel_size(s.mesh))


def sampler_apart(s):
  """Whether the sampler has chips of its own (rollout.devices)."""
  return s.rollout_mesh is not s.mesh


def resident_bytes(s):
  """Bytes per training chip of the state every phase holds: params (with LoRA the frozen base,
  and its adapters), optimizer state, the critic where the algorithm has one, and the KV cache
  (`kv_cache_bytes` of the sampler a run builds) when the sampler shares the chips."""
  state = s.algo.state
  memory = dict(params=sharding.bytes_per_device(s.params))
  if 'adapters' in state:
    memory['adapters'] = sharding.bytes_per_device(state['adapters'])
  memory['optimizer'] = sharding.bytes_per_device([v for k, v in state.items()
                                                   if k.endswith('opt_state')])
  if 'critic_params' in state:
    memory['critic'] = sharding.bytes_per_device(state['critic_params'])
  return memory if sampler_apart(s) else dict(memory, kv_cache=sampler_kv_bytes(s))


def lora_saving(s):
  """With LoRA, per training chip: the parameters and optimizer state it holds (the base, the
  adapters and their Adam moments) against what full fine-tuning of the same model would hold
  (every weight and its moments, the same optimizer); None without LoRA."""
  cfg = lora.config_of(s.config.model)
  if cfg is None:
    return None
  optimizer, _ = optim.make_optimizer(s.config.optimizer, s.batch,
                                      optim.planned_updates(s.config.train, s.batch))
  full_moments = sharding.init_optimizer(optimizer, s.params, s.mesh)   # abstract
  held = resident_bytes(s)
  lora_bytes = held['params'] + held['adapters'] + held['optimizer']
  full_bytes = held['params'] + sharding.bytes_per_device(full_moments)
  return dict(rank=cfg.rank, alpha=cfg.alpha, targets=list(cfg.targets),
              trainable_params=lora.count(s.algo.state['adapters']),
              params_and_optimizer=lora_bytes, full_finetune_params_and_optimizer=full_bytes,
              saved=full_bytes - lora_bytes)


def sampler_kv_bytes(s):
  return kv_cache_bytes(s, s.sampling.group)


def sampler_resident_bytes(s):
  """Bytes per sampler chip held throughout when the sampler has chips of its own: its copy of
  the params and the KV cache."""
  return dict(params=sharding.bytes_per_device(s.sampler_params), kv_cache=sampler_kv_bytes(s))


def _itemsize(dtype):
  return np.dtype(jnp.dtype(dtype)).itemsize


def check_resident(s, chip, target_name):
  """What stays resident per chip ({'resident': ...} and, with a sampler on chips of its own,
  'sampler_resident'); ValueError('... does not fit ...') when params + optimizer state + KV
  cache alone exceed HBM: no compile needed to know."""
  phases = dict(resident=resident_bytes(s))
  if sampler_apart(s):
    phases['sampler_resident'] = sampler_resident_bytes(s)
  for phase, memory in phases.items():
    if sum(memory.values()) > chip.hbm_bytes:
      where = 'the sampler chips hold ' if phase == 'sampler_resident' else ''
      raise ValueError(f'{_model_name(s)} does not fit {target_name} on mesh {_mesh_text(s)}: '
                       f'{where}{table.memory_line(memory, chip.hbm_bytes)}')
  return phases


def _mesh_text(s):
  text = table.sizes_text(s.mesh.shape)
  return f'{text} + sampler {table.sizes_text(s.rollout_mesh.shape)}' if sampler_apart(s) else text


def _model_name(s):
  cfg = s.model.cfg
  return (f'the model (d_model {cfg.d_model}, {cfg.num_layers} layers'
          + (f', {cfg.num_experts} experts' if cfg.num_experts else '') + ')')


def compile_programs(s, chip, target_name):
  """Compiles every program of the run (rljax.train.programs: its rollout schedule's, 'update',
  'make_batch', 'evaluate'); returns their reports ('sampler': the schedule's decoding program)
  and the memory breakdown of each phase (what is resident together), raising ValueError('does
  not fit') past HBM. A sampler on chips of its own holds its params, not the optimizer state."""
  phases = check_resident(s, chip, target_name)
  programs = {}
  run_programs = programs_lib.programs(s)
  rollout = 'advance' if 'advance' in run_programs else 'sample'
  for name, key in (('sampler', rollout), ('update', 'update'), ('make_batch', 'make_batch'),
                    ('evaluate', 'evaluate')):
    program = run_programs[key]
    graphs = sampler.GPU_GRAPHS if key in ('sample', 'evaluate') else None
    try:
      programs[name] = compiled.compile_lowered(program.fn.lower(*program.args), graphs)
    except MemoryError as error:
      resident = table.memory_line(phases['resident'], chip.hbm_bytes)
      raise ValueError(f'{_model_name(s)} does not fit {target_name} on mesh '
                       f'{_mesh_text(s)}: the {name} runs out of device memory ({error}); '
                       f'resident {resident}') from None
  phases.update(program_phases(s, phases, programs))
  for phase in ('rollout', 'update', 'make_batch', 'evaluate'):
    if sum(phases[phase].values()) > chip.hbm_bytes:
      raise ValueError(f'{_model_name(s)} does not fit {target_name} on mesh '
                       f'{_mesh_text(s)}: the {phase} holds '
                       f'{table.memory_line(phases[phase], chip.hbm_bytes)}')
  return programs, phases


def program_phases(s, phases, programs):
  """Per chip, what each compiled program holds while it runs, beside the state resident then:
  the rollout (on the sampler's chips), the update, make_batch and the evaluator."""
  resident = phases['resident']
  state = {k: v for k, v in resident.items() if k != 'kv_cache'}   # params, optimizer, critic
  held = phases.get('sampler_resident', resident)
  sampler_mem = programs['sampler']['memory']
  out = dict(rollout=dict(dict(params=held['params']) if sampler_apart(s) else state,
                          kv_cache_and_temporaries=sampler_mem['temporaries'],
                          rollout_inputs_and_outputs=sampler_mem['arguments'] - held['params']
                          + sampler_mem['outputs']))
  for name, inputs_held in (('update', sum(state.values())), ('make_batch', sum(state.values())),
                            ('evaluate', resident['params'])):
    mem = programs[name]['memory']
    out[name] = dict(state, temporaries=mem['temporaries'],
                     inputs_and_outputs=max(mem['arguments'] - inputs_held, 0) + mem['outputs']
                     - mem['aliased'])
  if s.algo.adapts:   # the sampler and evaluator read merge(base, adapters): a copy the size of
    for name in ('rollout', 'evaluate'):   # the base, made once per call (rljax.algos._lora)
      out[name]['merged_policy'] = resident['params']
  return out


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
  bounds = dict(decode_step=decode, micro_batch=micro, update=update,
                mfu_ceiling=model_flops / (chip.peak_flops * update['bound_s']),
                rollout_s=rollout_s, rl_step_s=rollout_s + update['bound_s'],
                decode_rows_per_chip=rows // sharding.data_parallel_size(s.rollout_mesh))
  if sampler_apart(s):   # the next rollout runs during this update, after the weights move
    bounds['transfer_s'] = weight_transfer(s)['per_sampler_chip'] / chip.ici_bandwidth
    bounds['rl_step_s'] = max(bounds['transfer_s'] + rollout_s, update['bound_s'])
  return bounds


def weight_transfer(s):
  """Bytes of the policy moved once per step onto a sampler with chips of its own: in all, and
  received by each sampler chip (its shard in the sampler's layout)."""
  params = s.sampler_params
  return dict(total=sum(math.prod(x.shape) * _itemsize(x.dtype) for x in jax.tree.leaves(params)),
              per_sampler_chip=sharding.bytes_per_device(params))


def check_decode_batches(batches, mesh):
  """ValueError unless the mesh splits each of `batches` rows evenly (before any compile)."""
  split = sharding.data_parallel_size(mesh)
  if any(batch % split for batch in batches):
    raise ValueError(f'decode batches {[b for b in batches if b % split]} do not divide over the '
                     f'{split} devices the mesh splits a batch over')


def decode_bounds(model_cfg, mesh, chip, batches, slots):
  """Roofline lower bounds of one decode step at each of `batches` rows (a cache of `slots`
  tokens), as `roofline` bounds the config's own, from rljax.aot.costs.decode_costs.
  Returns [dict(batch, compute_s, memory_s, collectives_s, bound_s, kernels)]."""
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
  config = _with_mesh(config, mesh_cfg)
  config_checks.check(config, device_count=len(devices), process_count=1)
  start = time.perf_counter()
  mesh, rollout_mesh = sharding.make_meshes(config.mesh, config.rollout.devices, devices)
  check_decode_batches(decode_batches, rollout_mesh)
  s = run_lib.abstract_setup(config, mesh, rollout_mesh)
  report = dict(target=target.name, chip=target.chip.name, chips=len(devices),
                mesh=dict(mesh.shape), batch=s.batch, micro_batch=s.micro,
                prompt_len=s.prompt_len, new_tokens=s.new_tokens,
                params=int(sum(math.prod(x.shape) for x in jax.tree.leaves(s.params))),
                active_params=active_params(s.model.cfg), hbm=target.chip.hbm_bytes,
                sampling=dataclasses.asdict(s.sampling), router_ids=router_ids_bytes(s))
  if sampler_apart(s):
    report.update(sampler_mesh=dict(rollout_mesh.shape), weight_transfer=weight_transfer(s))
  if s.algo.adapts:
    report['lora'] = lora_saving(s)
  if not compile_programs_too:
    report['memory'] = check_resident(s, target.chip, target.name)
    report['peak'] = max(sum(memory.values()) for memory in report['memory'].values())
    report['headroom'] = target.chip.hbm_bytes - report['peak']
    return report
  programs, memory = compile_programs(s, target.chip, target.name)
  report.update(memory=memory, programs=programs,
                peak=max(sum(memory[phase].values()) for phase in
                         ('rollout', 'update', 'make_batch', 'evaluate')))
  report['headroom'] = target.chip.hbm_bytes - report['peak']
  if costs:
    per_step = compiled.per_step_costs(
        s.model, lambda cfg: _abstract_params(cfg, mesh), mesh, config[config.algo],
        decode_rows(s), s.prompt_len + s.new_tokens, s.micro, s.prompt_len, s.new_tokens,
        decode_mesh=rollout_mesh, critic='critic_params' in s.algo.state)
    report['per_step'] = per_step
    report['roofline'] = roofline(s, target.chip, programs, per_step)
  if decode_batches:
    report['decode_bounds'] = decode_bounds(s.model.cfg, rollout_mesh, target.chip,
                                            decode_batches, s.prompt_len + s.new_tokens)
  report['wall_s'] = time.perf_counter() - start
  return report


def _abstract_params(cfg, mesh):
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
  then tensor parallelism. With a sampler on chips of its own (rollout.devices), counted over the
  training chips, and fsdp takes what is left on each of the two meshes."""
  apart = config.rollout.devices
  chips -= apart
  meshes = [dict(fsdp=chips)]
  experts = config.model.num_experts
  split = 2
  while experts and split <= chips and experts % split == 0:
    meshes.append(dict(fsdp=chips // split, expert=split))
    split *= 2
  for tensor in (2, 4, 8):
    if chips % tensor == 0 and config.model.num_kv_heads % tensor == 0:
      meshes.append(dict(fsdp=chips // tensor, tensor=tensor))
  meshes = [{k: v for k, v in mesh.items() if v > 1} or dict(fsdp=1) for mesh in meshes]
  return [dict(mesh, fsdp=-1) for mesh in meshes] if apart else meshes


def at_top_batch(config):
  """A P=auto config at the largest batch it may run (auto_batch.max): what has to fit, since the
  run compiles that batch beside its first step; any other config as it is."""
  if not config.auto_batch.enabled:
    return config
  return auto_state.config_at(config, config.auto_batch.max)


def plan(config, target, mesh_cfg=None, costs=True, compile_programs_too=True,
         decode_batches=()):
  """`plan_mesh` on the given mesh, or on the first candidate mesh that fits; a P=auto config at
  its top batch (`auto_batch` in the report names it)."""
  tasks.lengths(config)   # a bad task is not a failure of every mesh: said once, as itself
  report = _plan(at_top_batch(config), target, mesh_cfg, costs, compile_programs_too,
                 decode_batches)
  if config.auto_batch.enabled:
    report['auto_batch'] = dict(arg=algos.get(config.algo).BATCH_ARG, start=config.rollout.P,
                                min=config.auto_batch.min, planned=config.auto_batch.max)
  return report


def _plan(config, target, mesh_cfg, costs, compile_programs_too, decode_batches):
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
  if len(set(failures)) == 1 and 'does not fit' not in failures[0]:
    raise ValueError(failures[0])   # the same on every mesh: the config's own, not a mesh's
  fit = [f for f in failures if 'does not fit' in f]
  raise ValueError(f'no mesh fits {target.name}; the first tried: {(fit or failures)[0]}')


def preflight(s, devices=None):
  """What `python -m rljax.main` is about to run, from the run's checked Shape `s`
  (run.checked_shape; nothing is allocated or compiled): model size, devices, and per device the
  parameters, optimizer state and KV cache. ValueError ('does not fit') when those alone exceed a
  device's memory."""
  devices = jax.devices() if devices is None else devices
  if s.config.auto_batch.enabled:   # sized at the largest batch it may run
    s = run_lib.abstract_setup(at_top_batch(s.config), s.mesh, s.rollout_mesh)
  memory = resident_bytes(s)
  if sampler_apart(s):   # the larger of a training and a sampler device's
    memory = max(memory, sampler_resident_bytes(s), key=lambda m: sum(m.values()))
  local = [d for d in devices if d.process_index == jax.process_index()] or devices
  limit = _device_memory(local[0])   # memory stats exist only for this process's devices
  count = sum(math.prod(x.shape) for x in jax.tree.leaves(s.params))
  line = (f'rljax: {count / 1e6:,.1f}M parameters on {len(devices)} {devices[0].device_kind} '
          f'device(s), mesh {_mesh_text(s)}; '
          f'{table.memory_line(memory, limit, "per device, device memory")}')
  if sum(memory.values()) > limit:
    raise ValueError(f'{_model_name(s)} does not fit: {line[len("rljax: "):]}')
  if devices[0].platform == 'cpu' and active_params(s.model.cfg) > 1e8:
    flops = 6 * active_params(s.model.cfg) * s.batch * (s.prompt_len + s.new_tokens)
    line += (f'; {flops:.1e} FLOPs per update on CPU devices (the CPU demo: '
             'configs/grpo.py:runlocal)')
  return line


def _device_memory(device):
  """Bytes a device can hold: its allocator's limit, or this host's memory for CPU devices."""
  stats = device.memory_stats() or {}
  if stats.get('bytes_limit'):
    return stats['bytes_limit']
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def to_json(report):
  """The report with numbers only (no numpy scalars): what --json writes."""
  return json.loads(json.dumps(report, default=float))
