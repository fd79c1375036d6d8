"""rljax.plan's report as an aligned plain-text table (rljax.aot.planner builds the report)."""

from rljax.aot import targets

GiB = targets.GiB


def memory_line(memory, hbm, where='per chip, HBM'):
  """'params 7.1 + optimizer 14.2 + ... = 40.3 GiB per chip, HBM 95.74 GiB' for a breakdown."""
  parts = ' + '.join(f'{k.replace("_", " ")} {v / GiB:.1f}' for k, v in memory.items())
  return f'{parts} = {sum(memory.values()) / GiB:.1f} GiB {where} {hbm / GiB:.2f} GiB'


def sizes_text(shape):
  """'fsdp=4,expert=2' of a mesh's axis sizes (those above 1)."""
  sizes = {k: v for k, v in shape.items() if v > 1}
  return ','.join(f'{k}={v}' for k, v in sizes.items()) or 'one device'


def _gib(x):
  return f'{x / GiB:.2f} GiB'


def _collectives_text(part):
  ops = ', '.join(f'{v["count"]} {op} {v["bytes"] / 2**20:.1f} MiB' for op, v in
                  sorted(part['ops'].items()))
  return f'{part["bytes"] / 2**20:.1f} MiB ({ops or "none"})'


def format_report(r):
  """The report as an aligned plain-text table."""
  mesh = sizes_text(r['mesh'])
  rows = [('target', f'{r["target"]}: {r["chips"]} x {r["chip"]}, mesh {mesh}'
                     + (f' + sampler mesh {sizes_text(r["sampler_mesh"])} on chips of its own'
                        if 'sampler_mesh' in r else '')
                     + (' (proposed)' if r.get('proposed_mesh') else '')),
          ('model', f'{r["params"] / 1e9:.2f}B parameters, {r["active_params"] / 1e9:.2f}B '
                    'active per token'),
          ('step', f'{r["batch"]} responses x ({r["prompt_len"]} prompt + {r["new_tokens"]} new '
                   f'tokens), micro-batch {r["micro_batch"]}')]
  if 'auto_batch' in r:
    auto = r['auto_batch']
    rows.append((f'{auto["arg"]}=auto', f'planned at its top, {auto["arg"]}={auto["planned"]} '
                 f'(starts at {auto["start"]}, may run {auto["min"]} to {auto["planned"]})'))
  for phase in ('resident', 'sampler_resident', 'rollout', 'update', 'make_batch', 'evaluate'):
    if phase in r['memory']:
      rows.append((f'{phase.replace("_", " ")} memory / chip',
                   memory_line(r['memory'][phase], r['hbm'])))
  if 'lora' in r:
    saving = r['lora']
    rows.append(('LoRA', f'rank {saving["rank"]}, {saving["trainable_params"] / 1e6:.2f}M '
                 f'trainable: params + optimizer {_gib(saving["params_and_optimizer"])} per chip, '
                 f'full fine-tuning {_gib(saving["full_finetune_params_and_optimizer"])} '
                 f'(saves {_gib(saving["saved"])})'))
  if 'weight_transfer' in r:
    moved = r['weight_transfer']
    rows.append(('weights to the sampler', f'{_gib(moved["total"])} per step, '
                 f'{_gib(moved["per_sampler_chip"])} into each sampler chip'))
  if r['router_ids']['per_step']:
    ids = r['router_ids']
    mib = lambda x: f'{x / 2**20:.1f} MiB'
    rows.append(('recorded experts', f'{mib(ids["per_step"])} per step, {mib(ids["per_chip"])} '
                 'per chip (router replay\'s ids; in the programs\' memory)'))
  rows.append(('peak / headroom', f'{_gib(r["peak"])} / {_gib(r["headroom"])}'))
  if 'programs' in r:
    rows += _program_rows(r)
  return _aligned(rows)


def _program_rows(r):
  """The compiled programs' rows: compile times, collectives, kernels and the roofline bounds."""
  rows = []
  for name in ('sampler', 'update', 'make_batch', 'evaluate'):
    program = r['programs'][name]
    rows.append((f'{name} compile', f'{program["compile_s"]:.0f} s'))
  loop = {'sampler': 'per decode step', 'update': 'per micro-batch'}
  for name in ('sampler', 'update'):
    part = r['programs'][name]['collectives']
    rows.append((f'{name} collectives {loop[name]}', _collectives_text(part['loop'])))
    rows.append((f'{name} collectives once', _collectives_text(part['outside'])))
  rows.append(('sampler kernels per decode step', str(r['programs']['sampler']['loop_kernels'])))
  graphs = r['programs']['sampler'].get('graphs')
  if graphs:   # XLA:GPU: kernels inside CUDA graphs launch with their graph
    rows.append(('sampler launches', f'{graphs["launches"]} per call; decode loop '
                 + ('inside a CUDA graph: no launch per step, ' if graphs['loop_in_graph']
                    else 'launched per step, ') + f'{graphs["loop_kernels"]} kernels per step'))
  if 'roofline' in r:
    roof = r['roofline']
    for key, label in (('decode_step', 'decode step'), ('micro_batch', 'micro-batch'),
                       ('update', 'update')):
      b = roof[key]
      ms = {k: f'{v * 1e3:.2f}' for k, v in b.items()}
      rows.append((f'{label} bound', f'{ms["bound_s"]} ms (compute {ms["compute_s"]}, HBM '
                                     f'{ms["memory_s"]}, collectives {ms["collectives_s"]} ms)'))
    per_token = r['per_step']['micro']['flops'] * r['chips'] / (   # FLOPs per chip
        r['micro_batch'] * (r['prompt_len'] + r['new_tokens']))
    ratio = per_token / (6 * r['active_params'])
    rows.append(('update FLOPs per token', f'{per_token:.3g} = {ratio:.2f} x (6 x active params)'))
    rows.append(('update MFU ceiling', f'{100 * roof["mfu_ceiling"]:.0f}%'))
    rollout = f'rollout {roof["rollout_s"]:.2f} s'
    update = f'update {roof["update"]["bound_s"]:.2f} s'
    phases = (f'max(weights {roof["transfer_s"]:.2f} s + {rollout}, {update})'   # overlapped
              if 'transfer_s' in roof else f'{rollout} + {update}')
    rows.append(('RL step bound', f'{phases} = {roof["rl_step_s"]:.2f} s'))
  for b in r.get('decode_bounds', ()):
    ms = {k: f'{v * 1e3:.3f}' for k, v in b.items() if k.endswith('_s')}
    rows.append((f'decode step bound, batch {b["batch"]}',
                 f'{ms["bound_s"]} ms (compute {ms["compute_s"]}, HBM {ms["memory_s"]}, '
                 f'collectives {ms["collectives_s"]} ms), {b["kernels"]} kernels'))
  return rows


def _aligned(rows):
  width = max(len(k) for k, _ in rows)
  return '\n'.join(f'{k:<{width}}  {v}' for k, v in rows)
