"""rljax.plan against XLA's own TPU compiler (libtpu as a compile-only backend, no TPU needed):
a Qwen3-30B-A3B-wide MoE (real widths, one layer) compiles and fits a v5e-8 and a v5p-8, its
decode loop moves activations only (no weights, no partial sums of the experts), and bad input
is one clear error."""
import dataclasses
import functools
import importlib
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo as grpo_config
from configs import ppo as ppo_config
from rljax import algos
from rljax.aot import hlo
from rljax.aot import planner
from rljax.aot import costs as compiled
from rljax.aot import table
from rljax.aot import targets
from rljax.model import transformer as model_lib
from rljax import sharding
from rljax import tasks
from rljax.train import programs as programs_lib
from rljax.train import run as run_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 2 ** 30


def mid_size_config():
  """Qwen3-30B-A3B's widths (d 2048, 32/4 heads, 128 experts top-8 x 768, vocab 151936), one
  layer, GRPO at P=8, G=8 on 32 + 32 tokens, micro-batches of 16."""
  config = grpo_config.get_config('P=8,G=8,model=qwen3-30b-a3b')
  config.model.num_layers = 1
  config.data.update(name='gsm8k', max_prompt_len=32, max_response_len=32)
  config.train.micro_batch = 16
  return config


@pytest.mark.parametrize('text, topology, chips', [
    ('tpu:v5e-8', 'v5e:2x4', 8), ('tpu:v5p-8', 'v5:2x2x1', 4), ('tpu:v5p-128', 'v5:4x4x4', 64),
    ('tpu:v6e-256', 'v6e:16x16', 256), ('tpu:2xv5p-16', 'v5:2x2x2', 16),
    ('tpu:v5p:4x4x8', 'v5:4x4x8', 128), ('gpu:h100-8', '1x1x8', 8), ('gpu:h200-16', '1x2x8', 16)])
def test_targets_name_cloud_slices(text, topology, chips):
  target = targets.parse_target(text)
  assert (target.topology, target.num_chips) == (topology, chips)


@pytest.mark.parametrize('text', ['tpu:v9-8', 'tpu:v5p-7', 'tpu:v5e-12', 'gpu:h100-12', 'cpu',
                                  'tpu:v5e:2x2x2'])
def test_bad_targets_are_rejected(text):
  with pytest.raises(ValueError, match=r'--target|slice'):
    targets.parse_target(text)


def test_compile_only_devices_are_the_slice():
  devices = targets.parse_target('tpu:v5p-16').devices()
  assert len(devices) == 8 and devices[0].device_kind == 'TPU v5'
  mesh = sharding.make_mesh(dict(fsdp=-1), devices)
  assert sharding.compile_only(mesh) and not sharding.compile_only(
      sharding.make_mesh(dict(data=-1), jax.devices()))


def test_collectives_are_counted_per_loop_iteration():
  """An all-gather of a [1024, 256] float32 array split 8 ways, in a loop of 5 iterations, and
  an all-reduce of a [64] float32 sum outside it: sizes as numpy counts them."""
  mesh = sharding.make_mesh(dict(fsdp=8), targets.parse_target('tpu:v5e-8').devices())
  split = jax.NamedSharding(mesh, jax.P('fsdp'))

  def program(x_NxD, y_N):
    def body(i, acc_NxD):
      whole = jax.lax.with_sharding_constraint(acc_NxD * 1.5, jax.NamedSharding(mesh, jax.P()))
      return jax.lax.with_sharding_constraint(whole + jnp.roll(whole, i, 0), split)
    return jax.lax.fori_loop(0, 5, body, x_NxD), jnp.sum(y_N)

  x = jax.ShapeDtypeStruct((1024, 256), jnp.float32, sharding=split)
  y = jax.ShapeDtypeStruct((64,), jnp.float32, sharding=split)
  text = jax.jit(program).lower(x, y).compile().as_text()
  found = hlo.loop_collectives(text)
  assert found['loop']['ops']['all-gather'] == dict(count=1, bytes=np.prod((1024, 256)) * 4)
  assert found['outside']['ops'] == {'all-reduce': dict(count=1, bytes=4)}


# A decode loop as XLA:GPU writes it: per step, one fusion and a GEMM call before a loop over 3
# layers (2 fusions each, its condition 1), then a conditional (branches of 2 and 1 kernels);
# the loop's condition 1. Counted by hand: 1 + 1 + 3 * (2 + 1) + 2 + 1 = 14 per step.
DECODE_LOOP_HLO = """HloModule m

%layer_cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]) parameter(0)
  ROOT %lt = pred[] fusion(%p), kind=kLoop, calls=%f
}

%layer_body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]) parameter(0)
  %a = f32[8] fusion(%p), kind=kLoop, calls=%f
  %b = f32[8] fusion(%a), kind=kInput, calls=%f
  ROOT %t = (s32[], f32[8]) tuple(%b, %b)
}

%yes (p: f32[8]) -> f32[8] {
  %p = f32[8] parameter(0)
  %c = f32[8] fusion(%p), kind=kLoop, calls=%f
  ROOT %d = f32[8] fusion(%c), kind=kLoop, calls=%f
}

%no (p: f32[8]) -> f32[8] {
  %p = f32[8] parameter(0)
  ROOT %e = f32[8] fusion(%p), kind=kLoop, calls=%f
}

%step_cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]) parameter(0)
  ROOT %lt = pred[] fusion(%p), kind=kLoop, calls=%f
}

%step (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]) parameter(0)
  %x = f32[8] get-tuple-element(%p), index=1
  %y = f32[8] fusion(%x), kind=kLoop, calls=%f
  %g = f32[8] custom-call(%y), custom_call_target="__cublas$gemm"
  %w = (s32[], f32[8]) while(%p), condition=%layer_cond, body=%layer_body, backend_config={"known_trip_count":{"n":"3"}}
  %k = pred[] constant(true)
  %c = f32[8] conditional(%k, %g, %g), true_computation=%yes, false_computation=%no
  ROOT %t = (s32[], f32[8]) tuple(%c, %c)
}

ENTRY %main (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]) parameter(0)
  %once = f32[8] fusion(%p), kind=kLoop, calls=%f
  ROOT %w = (s32[], f32[8]) while(%p), condition=%step_cond, body=%step
}
"""  # noqa: E501  (HLO text, as XLA prints it: one instruction per line)


def test_kernels_per_decode_step_are_counted_from_the_hlo():
  assert hlo.loop_kernels(DECODE_LOOP_HLO) == 14
  # Without a loop: the whole program (a program of one step).
  assert hlo.loop_kernels(DECODE_LOOP_HLO.split('ENTRY')[0] + 'ENTRY %main (p: f32[8]) -> '
                          'f32[8] {\n  %p = f32[8] parameter(0)\n  ROOT %c = f32[8] '
                          'call(%p), to_apply=%yes\n}\n') == 2


@pytest.mark.e2e   # TPU compiles
def test_decode_bounds_at_several_batches():
  """One decode step of a dense model at 64 and 512 rows on a v5e-8 (8 and 64 rows per chip): the
  FLOPs per chip of the compiled steps against the matmuls counted by hand (XLA also counts the
  elementwise work), and the bounds are FLOPs / peak, bytes / HBM bandwidth, the largest of the
  three."""
  cfg = model_lib.ModelConfig(vocab_size=2048, d_model=512, num_layers=4, num_heads=8,
                              num_kv_heads=2, head_dim=64, num_experts=0, dense_hidden=1536,
                              dtype='bfloat16')
  target = targets.parse_target('tpu:v5e-8')
  mesh = sharding.make_mesh(dict(data=8), target.devices())
  slots = 256
  rows = planner.decode_bounds(cfg, mesh, target.chip, [64, 512], slots)
  assert [r['batch'] for r in rows] == [64, 512]
  D, H, N, K, F, V = 512, 64, 8, 2, 1536, 2048
  per_token = 2 * (4 * (D * H * (2 * N + 2 * K) + 3 * D * F + 2 * N * H * slots) + D * V)
  for row in rows:
    matmul_flops = row['batch'] // 8 * per_token
    assert matmul_flops <= row['compute_s'] * target.chip.peak_flops < 1.1 * matmul_flops
    assert row['bound_s'] == max(row['compute_s'], row['memory_s'], row['collectives_s'])
    assert row['collectives_s'] == 0 and row['kernels'] > 4 * 5
  # Weights are read once per step whatever the batch; the KV cache read grows with it.
  weights = 2 * (4 * (D * H * (2 * N + 2 * K) + 3 * D * F) + 2 * V * D)
  cache = lambda batch: 4 * 2 * batch // 8 * K * slots * H * 2
  for row in rows:
    hbm_bytes = row['memory_s'] * target.chip.hbm_bandwidth
    assert weights + cache(row['batch']) <= hbm_bytes


@pytest.fixture(scope='module')
def v5e_8():
  """The whole plan (sampler and update) on a v5e-8, 16 GiB per chip: the tight fit."""
  target = targets.parse_target('tpu:v5e-8')
  return target, planner.plan(mid_size_config(), target, dict(fsdp=8), costs=False)


@pytest.fixture(scope='module')
def v5p_8_sampler():
  """The rollout sampler alone on a v5p-8 (4 chips; the update compiles as on the v5e-8)."""
  mesh = sharding.make_mesh(dict(fsdp=4), targets.parse_target('tpu:v5p-8').devices())
  s = run_lib.abstract_setup(mid_size_config(), mesh)
  return compiled.sampler(s.model, s.algo.state['params'], mesh,
                          dataclasses.replace(s.sampling, slots=0, group=1), s.batch, s.prompt_len)


@pytest.mark.e2e   # whole programs of a 30B-wide layer through XLA's TPU compiler
def test_mid_size_moe_compiles_and_fits_a_v5e_8_with_headroom(v5e_8):
  target, report = v5e_8
  print(table.format_report(report))
  V, D, H, N, K, E, F = 151936, 2048, 128, 32, 4, 128, 768
  assert report['params'] == 2 * V * D + D + (D * H * (2 * N + 2 * K) + 3 * E * D * F + D * E
                                              + 2 * H + 2 * D)
  # f32 params and two Adam moments, split over the 8 chips.
  resident = report['memory']['resident']
  assert resident['params'] == pytest.approx(report['params'] * 4 / 8, rel=0.01)
  assert resident['optimizer'] == pytest.approx(2 * resident['params'], rel=0.01)
  assert report['peak'] == max(sum(report['memory'][p].values())
                               for p in ('rollout', 'update', 'make_batch', 'evaluate'))
  assert 2 * GiB < report['headroom'] < target.chip.hbm_bytes - resident['params'] * 3


@pytest.mark.e2e
def test_mid_size_moe_sampler_fits_a_v5p_8(v5p_8_sampler):
  memory = v5p_8_sampler['memory']
  assert 1.245e9 * 4 / 4 < memory['peak'] < 0.1 * targets.CHIPS['v5p'].hbm_bytes


@pytest.mark.e2e
@pytest.mark.parametrize('fixture', ['v5e_8', 'v5p_8_sampler'])
def test_mid_size_moe_decode_loop_moves_activations_only(fixture, request):
  """Per decode step no weight moves (the embedding table alone is 594 MiB in bf16, each layer's
  attention weights 36 MiB: gathered once per call), and the experts, split over their hidden
  dimension, need only the layer's input tokens gathered and its combined output reduce-scattered:
  [64 rows, 2048] bf16 each, where partial sums over a split model dimension were 3.5 MiB."""
  found = request.getfixturevalue(fixture)
  sampler = found[1]['programs']['sampler'] if fixture == 'v5e_8' else found
  collectives = sampler['collectives']
  table_bytes = 151936 * 2048 * 2
  activations = 64 * 2048 * 2
  assert collectives['loop']['ops']['all-gather'] == dict(count=1, bytes=activations)
  assert collectives['loop']['ops']['reduce-scatter'] == dict(count=1, bytes=activations)
  assert collectives['loop']['bytes'] <= 2 * activations + 2 ** 16
  assert collectives['outside']['ops']['all-gather']['bytes'] > 2 * table_bytes


def test_oversize_config_does_not_fit_with_breakdown():
  config = grpo_config.get_config('P=8,G=8,model=qwen3-235b-a22b')
  target = targets.parse_target('tpu:v5e-8')
  with pytest.raises(ValueError, match=r'does not fit tpu:v5e-8 on mesh fsdp=8: params 109\.\d '
                                       r'\+ optimizer 219\.\d \+ kv cache .* GiB per chip, HBM '
                                       r'15\.75 GiB'):
    planner.plan(config, target, dict(fsdp=8), costs=False)
  with pytest.raises(ValueError, match=r'no mesh fits tpu:v5e-8; .* does not fit'):
    planner.plan(config, target, costs=False)


def test_a_bad_config_is_its_own_error_not_a_mesh_that_does_not_fit():
  """Every candidate mesh refuses it alike: the plan says the config's error as it is."""
  config = grpo_config.get_config('runlocal')
  config.model.d_model = 0
  with pytest.raises(ValueError, match=r'^model.d_model must be an integer >= 1, got 0$'):
    planner.plan(config, targets.parse_target('tpu:v5e-8'), costs=False)


def test_a_lora_plan_states_the_memory_it_saves():
  """Parameters + optimizer state with LoRA adapters against full fine-tuning of the same model:
  the latter is what the full fine-tuning plan holds; the adapters count as the formula says."""
  target, mesh = targets.parse_target('tpu:v5e-8'), dict(fsdp=8)
  plan = lambda arg: planner.plan(grpo_config.get_config(arg), target, mesh, costs=False,
                                  compile_programs_too=False)
  full, adapted = plan('P=8,G=8'), plan('P=8,G=8,lora=16')
  saving, held = adapted['lora'], full['memory']['resident']
  assert saving['full_finetune_params_and_optimizer'] == held['params'] + held['optimizer']
  resident = adapted['memory']['resident']
  assert resident['params'] == held['params'] and adapted['params'] == full['params']
  assert saving['params_and_optimizer'] == (resident['params'] + resident['adapters']
                                            + resident['optimizer'])
  cfg, r = model_lib.ModelConfig.from_config(
      {k: v for k, v in grpo_config.get_config('').model.items() if k != 'lora'}), 16
  D, N, K, H, E, F = (cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                      cfg.num_experts, cfg.expert_hidden)
  per_layer = (2 * (D * r + r * N * H) + 2 * (D * r + r * K * H)
               + E * (2 * (D * r + r * F) + (F * r + r * D)))
  assert saving['trainable_params'] == cfg.num_layers * per_layer
  # Adam's two float32 moments of every adapter, split over the 8 chips as the adapters are
  assert resident['optimizer'] <= 2 * resident['adapters'] + 1024
  assert saving['saved'] > 0.6 * held['optimizer']
  assert 'LoRA' in table.format_report(adapted)


def planned_and_trained(config, target, tmp_path, costs=True):
  """The plan of `config` on `target` (with `costs`: its roofline too), and the run `setup`
  builds of it on CPUs."""
  config.rollout.update(temperature=0.7, top_k=5, top_p=0.9)   # a sampler of the config's own
  report = planner.plan(config, targets.parse_target(target), {}, costs=costs)
  config.data.dir = str(tmp_path / 'data')
  config.warmstart.enabled = False
  config.metrics.update(tensorboard=False, progress=False)
  run, _, _ = run_lib.setup(config, str(tmp_path / 'run'))
  run.ckpt.close()
  return report, run


@pytest.mark.parametrize('name', ['grpo', 'ppo'])
def test_every_algorithm_plans_its_own_programs_with_costs(name, tmp_path):
  """GRPO and PPO (its critic: resident, updated): the plan compiles the run's programs
  (rljax.train.programs) with the sampler settings the run samples with. RLOO runs GRPO's
  programs with another advantage inside make_batch (tests/test_algos.py): a third TPU compile of
  the same programs would test nothing new. The roofline's programs compile for GRPO; PPO's
  critic in the bound is test_a_ppo_plan_bounds_its_critic_update's, on CPU devices."""
  module = importlib.import_module(f'configs.{name}')
  config = module.get_config(f'runlocal,{algos.get(name).BATCH_ARG}=8')
  config.train.micro_batch = 8   # PPO's batch is 8 responses, GRPO's and RLOO's 64
  report, run = planned_and_trained(config, 'tpu:v5e-4', tmp_path, costs=name == 'grpo')
  assert set(report['programs']) == {'sampler', 'update', 'make_batch', 'evaluate'}
  assert report['sampling'] == dataclasses.asdict(run.schedule.sampler.sampling)
  assert report['sampling']['top_p'] == 0.9 and report['sampling']['group'] == config.rollout.G
  assert ('roofline' in report) == (name == 'grpo')
  if name == 'grpo':
    assert report['roofline']['update']['bound_s'] > 0
  critic = 'critic_params' in run.algo.state
  assert ('critic' in report['memory']['resident']) == critic == (name == 'ppo')
  assert ('critic' in report['memory']['update']) == critic
  text = table.format_report(report)
  assert 'make_batch compile' in text and 'evaluate memory / chip' in text


def test_a_ppo_plan_bounds_its_critic_update():
  """The critic's gradient (a second trunk on the same micro-batch) is in PPO's per-step costs:
  at least as many FLOPs again as the policy's alone. Counted on this process's CPU devices:
  XLA's cost analysis of the same programs, where a TPU target compiles each for minutes."""
  config = ppo_config.get_config('runlocal,B=8')
  mesh = sharding.make_mesh(dict(fsdp=4), jax.devices()[:4])
  s = run_lib.abstract_setup(config, mesh)
  params_fn = lambda cfg: sharding.init_params(functools.partial(model_lib.init_params, cfg),
                                               jax.random.PRNGKey(0), mesh)[0]
  costs = [compiled.per_step_costs(s.model, params_fn, mesh, config.ppo, 8, 16, s.micro,
                                   s.prompt_len, s.new_tokens, critic=critic)['micro']['flops']
           for critic in (False, True)]
  assert costs[1] > 1.9 * costs[0]


@pytest.mark.parametrize('edit, target', [
    (dict(slots=8, schedule='partial'), 'tpu:v5e-4'),   # the partial pool's admit and advance
    (dict(slots=8, schedule='drawn_ahead', devices=4), 'tpu:v5e-8'),   # a sampler's own chips
])
def test_partial_rollouts_and_a_split_mesh_plan_what_they_run(edit, target, tmp_path):
  """Their programs compile on the target as they run (the roofline is the sampler's decode step
  and the update's micro-batch, costed with GRPO's plan above)."""
  config = grpo_config.get_config('runlocal,P=8')
  config.rollout.update(edit)
  report, run = planned_and_trained(config, target, tmp_path, costs=False)
  assert report['sampling'] == dataclasses.asdict(run.schedule.sampler.sampling)
  assert report['sampling']['slots'] == 8 and set(report['programs']) >= {'update', 'evaluate'}
  assert ('sampler_mesh' in report) == ('devices' in edit)
  s = run_lib.abstract_setup(config, sharding.make_mesh(dict(fsdp=4),
                                                        targets.parse_target(target).devices()[:4]))
  names = set(programs_lib.programs(s))
  assert names == ({'admit', 'advance'} if edit['schedule'] == 'partial' else {'sample'}) | {
      'update', 'make_batch', 'evaluate'}


def test_preflight_states_the_run_and_refuses_what_cannot_fit():
  config = grpo_config.get_config('runlocal')
  line = planner.preflight(run_lib.checked_shape(config), jax.devices())
  assert line.startswith('rljax: 0.') and f'on {jax.device_count()} cpu device(s)' in line
  big = grpo_config.get_config('model=qwen3-235b-a22b')
  with pytest.raises(ValueError, match=r'does not fit: .* parameters on'):
    planner.preflight(run_lib.checked_shape(big), jax.devices())


@pytest.mark.parametrize('args, message', [
    (['--config=configs/grpo.py:runlocal', '--target=tpu:v9-8'], r"unknown --target 'tpu:v9-8'"),
    (['--config=configs/grpo.py:runlocal', '--target=tpu:v5e-8', '--mesh=fsdp=3'],
     r"'fsdp': 3.* needs 3 devices, but 8 are available"),
    pytest.param(['--config=configs/grpo.py:P=8,model=qwen3-235b-a22b', '--target=tpu:v5e-8'],
                 r'no mesh fits tpu:v5e-8; .* does not fit .* params 109\.\d \+ optimizer 219\.\d',
                 marks=pytest.mark.e2e),   # compiles for TPU to find that no mesh fits
    (['--config=configs/grpo.py:runlocal', '--target=tpu:v5e-8', '--decode_batches=1,x'],
     r"--decode_batches must be positive integers separated by commas, got '1,x'"),
    (['--config=configs/grpo.py:runlocal', '--target=tpu:v5e-8', '--mesh=data=8', '--nocosts',
      '--decode_batches=1,16'],
     r'decode batches \[1\] do not divide over the 8 devices the mesh splits a batch over'),
], ids=['bad-target', 'mesh-does-not-divide', 'does-not-fit', 'bad-decode-batches',
        'decode-batch-does-not-divide'])
def test_cli_bad_input_is_one_clear_error(args, message):
  result = subprocess.run([sys.executable, '-m', 'rljax.plan', *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu'))
  errors = [line for line in result.stderr.splitlines() if line.startswith('rljax: error: ')]
  assert result.returncode == 2 and len(errors) == 1, result.stderr
  assert 'Traceback' not in result.stderr
  import re   # pylint: disable=g-import-not-at-top
  assert re.search(message, errors[0]), errors[0]


def test_h200_plan_beside_measured_from_the_records():
  """docs/performance.md's H200 tables from the checked-in records: the measured program's decode
  loop (the batch-1 HLO the H200 ran) launches 742 kernels per step, 16 layers of 44 (a loop,
  its condition one more each) and 22 around them, at 1.94 ms / 742 each."""
  from bench import plan_vs_measured   # pylint: disable=g-import-not-at-top
  measured = os.path.join(REPO, 'bench', 'results', 'h200')
  prefix = os.path.join(REPO, 'bench', 'results', 'plan', 'gpu1b_h200-1')
  with open(os.path.join(measured, 'sampler.json')) as f:
    rows = json.load(f)['rows']
  per_kernel_s, kernels = plan_vs_measured.launch_seconds(measured, rows)
  assert kernels == 742 and per_kernel_s == pytest.approx(1.9427e-3 / 742, rel=1e-3)
  with open(prefix + '_decode.json') as f:
    table = plan_vs_measured.decode_table(measured, json.load(f)).splitlines()
  assert [line.split(' | ')[0] for line in table[2:8]] == [
      f'| {b}' for b in (1, 4, 16, 64, 256, 1024)]


@pytest.mark.e2e
def test_continuous_batching_sizes_the_kv_cache_by_its_slots():
  """rollout.slots: the plan holds a KV cache of `slots` rows, not P x G, next to one prompt-only
  row per prompt (each prefilled once for its G = 8 responses), and the compiled continuous
  sampler's temporaries grow with the responses by no more than those prompt rows and a tenth of a
  KV-cache row per response (its per-response outputs, recorded experts included): from 256 to
  1024 responses."""
  target = targets.parse_target('tpu:v5e-8')
  mesh = sharding.make_mesh(dict(data=8), target.devices())
  temporaries = {}
  for P, slots in ((32, 0), (128, 0), (32, 64), (128, 64)):   # 256, 1024 responses; 64 slots
    config = grpo_config.get_config(f'runlocal,P={P}')
    config.rollout.slots = slots
    s = run_lib.abstract_setup(config, mesh)
    m = s.model.cfg
    token_bytes = 2 * m.num_layers * m.num_kv_heads * m.head_dim * (
        np.dtype(jnp.dtype(m.dtype)).itemsize)
    row_bytes, prompt_bytes = (token_bytes * n for n in (s.prompt_len + s.new_tokens,
                                                         s.prompt_len - 1))
    assert planner.decode_rows(s) == (slots or P * 8)
    assert planner.resident_bytes(s)['kv_cache'] == (
        (slots or P * 8) * row_bytes + bool(slots) * P * prompt_bytes) // 8
    if slots:
      temporaries[P] = compiled.sampler(
          s.model, s.algo.state['params'], mesh,
          dataclasses.replace(s.sampling, slots=slots, group=8), P, s.prompt_len)[
              'memory']['temporaries']
  # An upper bound: XLA's buffer assignment moves these temporaries by a few hundred KiB either
  # way with any change to the program (here P = 128's came out below P = 32's).
  assert temporaries[128] - temporaries[32] < (
      (1024 - 256) * row_bytes / 10 + (128 - 32) * prompt_bytes)


@pytest.mark.parametrize('slots, waves', [(0, 1), (64, 4)])
def test_roofline_rollout_decodes_every_wave_of_slots(slots, waves):
  """The rollout bound is max_new_tokens decode steps per wave of rows: one wave of P x G rows
  (static), or P x G / slots waves of `slots` rows (continuous, every response at full length)."""
  target = targets.parse_target('tpu:v5e-8')
  config = grpo_config.get_config('runlocal,P=32')   # 256 responses
  config.rollout.slots = slots
  s = run_lib.abstract_setup(config, sharding.make_mesh(dict(data=8), target.devices()))
  chip = target.chip
  costs = dict(decode=dict(flops=3e9, bytes_accessed=4e6), micro=dict(flops=1e12, bytes_accessed=0))
  no_collectives = dict(collectives=dict(loop=dict(bytes=0)))
  roof = planner.roofline(s, chip, dict(sampler=no_collectives, update=no_collectives), costs)
  step_s = max(3e9 / chip.peak_flops, 4e6 / chip.hbm_bandwidth)
  assert roof['decode_step']['bound_s'] == pytest.approx(step_s)
  assert roof['rollout_s'] == pytest.approx(s.new_tokens * waves * step_s)
  assert roof['decode_rows_per_chip'] == (slots or 256) // 8


def test_the_plan_and_the_preflight_size_the_task_that_trains():
  """The sums task's own lengths (16 prompt + 35 new tokens by default), not the text tasks'
  data.max_prompt_len / max_response_len: the planner, the pre-flight and training share
  run.abstract_setup, and it reads the lengths from the task's module."""
  config = grpo_config.get_config('runlocal,task=sums')
  prompt_len, new_tokens, _ = tasks.get('sums').lengths(config)
  assert (prompt_len, new_tokens) != (config.data.max_prompt_len, config.data.max_response_len)
  report = planner.plan(config, targets.parse_target('tpu:v5e-4'), {}, compile_programs_too=False)
  assert (report['prompt_len'], report['new_tokens']) == (prompt_len, new_tokens)
  s = run_lib.abstract_setup(config, sharding.make_mesh(config.mesh, jax.devices()[:1]))
  assert (s.prompt_len, s.new_tokens, s.batch) == (prompt_len, new_tokens, 128)
  kv_row = 2 * s.model.cfg.num_layers * s.model.cfg.num_kv_heads * s.model.cfg.head_dim * 4
  prompts = config.rollout.P   # continuous batching: each prompt prefilled once, T - 1 columns
  assert planner.resident_bytes(s)['kv_cache'] == kv_row * (
      planner.decode_rows(s) * (prompt_len + new_tokens) + prompts * (prompt_len - 1))


@pytest.mark.parametrize('name', ['grpo', 'ppo'])
def test_a_p_auto_plan_sizes_the_top_batch_the_run_compiles_beside_its_first_step(name):
  """P=auto starts at auto_batch.min but compiles auto_batch.max beside its first step: the plan
  (like the pre-flight) is of the top, and says so."""
  module = importlib.import_module(f'configs.{name}')
  config = module.get_config(f'runlocal,{algos.get(name).BATCH_ARG}=auto')
  auto, G = config.auto_batch, config.rollout.G
  target = targets.parse_target('tpu:v5e-4')
  report = planner.plan(config, target, {}, compile_programs_too=False)
  # as the run compiles it (auto_batch.hook): as many micro-batches as at the start
  micro = auto.max * G // algos.micro_batches(config)
  fixed = module.get_config(f'runlocal,{algos.get(name).BATCH_ARG}={auto.max}')
  fixed.train.micro_batch = micro
  at_top = planner.plan(fixed, target, {}, compile_programs_too=False)
  assert auto.min < auto.max and report['batch'] == auto.max * G == at_top['batch']
  assert report['memory'] == at_top['memory'] and report['micro_batch'] == micro
  assert report['auto_batch'] == dict(arg=algos.get(name).BATCH_ARG, start=auto.min,
                                      min=auto.min, planned=auto.max)
  assert (f'planned at its top, {algos.get(name).BATCH_ARG}={auto.max}'
          in table.format_report(report))


@pytest.mark.parametrize('partial', [False, True])
def test_the_plan_states_the_recorded_experts_of_qwen3_30b_a3b(partial):
  """Router replay's buffer for Qwen3-30B-A3B (48 layers, 8 of 128 experts: int8 ids) at P=1024, G=8
  with 512-token responses: 8192 x 512 x 48 x 8 bytes a step, split over the 64 chips of a v5p-128,
  or held whole on every chip twice over by the partial pool; a dense model records none."""
  config = grpo_config.get_config('P=1024,G=8,model=qwen3-30b-a3b')
  config.data.name = 'gsm8k'   # its lengths: 256 prompt + 512 response tokens
  if partial:
    config.rollout.update(schedule='partial', slots=1024)
  report = planner.plan(config, targets.parse_target('tpu:v5p-128'), {},
                        compile_programs_too=False)
  per_step = 8192 * 512 * 48 * 8
  assert report['new_tokens'] == 512 and report['mesh']['fsdp'] == 64
  assert report['router_ids'] == dict(per_step=per_step,
                                      per_chip=2 * per_step if partial else per_step // 64)
  assert re.search(r'recorded experts +1536.0 MiB per step, '
                   + ('3072.0' if partial else '24.0'), table.format_report(report))
  config.model.num_experts = 0
  dense = planner.plan(config, targets.parse_target('tpu:v5p-128'), {},
                       compile_programs_too=False)
  assert dense['router_ids']['per_step'] == 0
  assert 'recorded experts' not in table.format_report(dense)


def test_a_sampler_on_chips_of_its_own_is_planned_on_them():
  """rollout.devices=4 of a v5e-8: the training chips hold the params and optimizer state, the
  sampler's chips their own copy of the params and the KV cache of a 4-chip mesh; each step moves
  the whole policy (its bytes summed here in numpy), and the step is bound by the longer of
  (weights + rollout) and the update, not by their sum."""
  target = targets.parse_target('tpu:v5e-8')
  config = grpo_config.get_config('runlocal,P=32')
  config.rollout.update(schedule='drawn_ahead', devices=4)
  report = planner.plan(config, target, {}, compile_programs_too=False)
  assert report['mesh']['fsdp'] == report['sampler_mesh']['fsdp'] == 4
  memory = report['memory']
  assert set(memory['resident']) == {'params', 'optimizer'}
  assert set(memory['sampler_resident']) == {'params', 'kv_cache'}
  together = run_lib.abstract_setup(config, sharding.make_mesh(dict(fsdp=4), target.devices()[:4]))
  assert memory['sampler_resident']['kv_cache'] == planner.resident_bytes(together)['kv_cache']
  shapes = jax.eval_shape(lambda: model_lib.init_params(together.model.cfg,
                                                        jax.random.PRNGKey(0)))
  total = sum(int(np.prod(x.value.shape if hasattr(x, 'value') else x.shape))
              * np.dtype(x.value.dtype if hasattr(x, 'value') else x.dtype).itemsize
              for x in jax.tree.leaves(shapes, is_leaf=lambda x: hasattr(x, 'value')))
  assert report['weight_transfer']['total'] == total
  assert total / 4 <= report['weight_transfer']['per_sampler_chip'] <= total
  assert 'sampler mesh fsdp=4 on chips of its own' in table.format_report(report)

  s = run_lib.abstract_setup(config, *sharding.make_meshes(dict(fsdp=-1), 4, target.devices()))
  costs = dict(decode=dict(flops=3e9, bytes_accessed=4e6), micro=dict(flops=1e12, bytes_accessed=0))
  no_collectives = dict(collectives=dict(loop=dict(bytes=0)))
  roof = planner.roofline(s, target.chip, dict(sampler=no_collectives, update=no_collectives),
                          costs)
  transfer_s = report['weight_transfer']['per_sampler_chip'] / target.chip.ici_bandwidth
  assert roof['transfer_s'] == pytest.approx(transfer_s)
  assert roof['rl_step_s'] == pytest.approx(max(transfer_s + roof['rollout_s'],
                                                roof['update']['bound_s']))


def test_a_bad_task_name_is_its_own_error_not_no_mesh_fits():
  config = grpo_config.get_config('runlocal')
  config.data.name = 'bogus'
  with pytest.raises(ValueError, match=r"^data.name must be one of \["):
    planner.plan(config, targets.parse_target('tpu:v5e-4'), compile_programs_too=False)


@pytest.mark.e2e   # a TPU compile
def test_tpu_decode_step_writes_the_kv_cache_in_place():
  """Compiled for a TPU v5e-8 (compile only), one decoding step writes each layer's keys and
  values in place: every cache output aliases its donated input, a dynamic-update-slice writes
  straight into each cache parameter, and nothing copies a cache. The cache (256 MiB a layer
  per chip) is larger than the chip's on-chip memory: a small one is copied there and back (memory
  space assignment), which is no copy of the cache in HBM."""
  mesh = sharding.make_mesh(dict(data=8), targets.parse_target('tpu:v5e-8').devices())
  cfg = run_lib.abstract_setup(grpo_config.get_config('runlocal,P=8'), mesh).model.cfg
  batch, slots = 512, 16384
  hlo = compiled.decode_step_lowered(cfg, mesh, batch, slots).compile().as_text()
  [module] = [line for line in hlo.splitlines() if line.startswith('HloModule')]
  aliased = {int(n) for n in re.findall(r'\{(\d+)\}: \(\d+, \{\}, may-alias\)', module)}
  caches = 2 * cfg.num_layers   # outputs 1.. after the logits: keys and values of each layer
  assert aliased == set(range(1, 1 + caches)), module
  dtype = {'float32': 'f32', 'bfloat16': 'bf16'}[jnp.dtype(cfg.dtype).name]
  cache = re.escape(f'{dtype}[{batch // 8},{cfg.num_kv_heads},{slots},{cfg.head_dim}]')
  params = re.findall(rf'%(\S+) = {cache}\S* parameter\(\d+\).*op_name="cache\.[kv]\[', hlo)
  assert len(params) == caches   # the cache's shape is the one searched for
  written = re.findall(rf'= {cache}\S* dynamic-update-slice\(%([^,]+),', hlo)
  assert sorted(written) == sorted(params)
  assert not [line for line in hlo.splitlines() if re.search(cache, line) and re.search(
      r' copy(-start|-done)?\(', line)]


def h200_mesh():
  """One compile-only H200 (the jax-cuda12-plugin; skipped without it)."""
  try:
    devices = targets.parse_target('gpu:h200-1').devices()
  except ValueError as error:
    pytest.skip(str(error))
  return sharding.make_mesh(dict(fsdp=1), devices)


@pytest.mark.e2e   # a GPU compile
def test_h200_trains_the_experts_at_their_routed_flops():
  """configs/grpo.py's default model compiled for one H200: a layer's forward and backward on a
  micro-batch of 64 x 256 tokens executes at most 1.6 x 6 x its active parameters per token (the
  experts in tiles, rljax.model.moe.tiled_matmul; the matmuls' outputs kept, remat 'dots'), where
  `ragged_dot` ran 21x. One layer, not the update: the update's FLOPs are 16 such layers plus an
  embedding and a head over 16 tokens of vocabulary (rljax.aot.costs.per_step_costs), and one
  layer compiles in seconds."""
  mesh = h200_mesh()
  cfg = model_lib.ModelConfig.from_config(grpo_config.get_config('').model)
  assert (cfg.moe_impl, cfg.remat, cfg.num_experts) == ('ragged', 'dots', 32)
  micro, length = 64, 256
  layer = compiled.layer_gradient(cfg, mesh, micro, length)
  per_layer_active = (planner.active_params(cfg) - cfg.d_model * cfg.vocab_size) / cfg.num_layers
  ratio = layer['flops'] / (micro * length) / (6 * per_layer_active)
  assert 1.0 < ratio <= 1.6, ratio


# A thunk sequence as XLA:GPU dumps it (*.thunk_sequence_after_thunk_passes.txt): one CUDA graph
# holding two copies and a while loop (its condition 1 kernel; its body a kernel, a GEMM and a
# conditional of 1 kernel), then a kernel outside the graph. Counted by hand: 2 launches per call;
# per iteration 1 + 1 + 1 + 1 = 4 kernels, all inside the graph.
THUNKS = """000: kCommandBuffer [source | sink]
    001: kCopy  [source       | next=003 (2)] kCopy
    002: kCopy  [source       | next=003 (1)] kCopy
    003: kWhile [prev=002 (1) | sink        ]
condition:
        004: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1]
      body:
        005: kCustomKernel [source       | next=006 (1)] gemm_fusion_dot grid: [32, 1, 1]
        006: kGemm [prev=005 (1) | next=007 (1)] cublas
        007: kConditional [prev=006 (1) | sink]
            008: kKernel [source | sink] loop_add_fusion grid: [1, 1, 1]
009: kCustomKernel [source | sink] loop_convert_fusion grid: [8, 1, 1]
"""


def test_graph_launches_are_counted_from_the_thunks():
  assert hlo.graph_launches(THUNKS) == dict(launches=2, loop_in_graph=True, loop_kernels=4)
  outside = THUNKS.replace('000: kCommandBuffer', '000: kSequential')
  assert hlo.graph_launches(outside)['loop_in_graph'] is False


@pytest.mark.e2e   # a GPU compile
def test_h200_samples_in_one_graph_launch_per_call():
  """configs/grpo.py's default model's sampler compiled for one H200 runs as one CUDA graph: one
  launch per call, the decoding loop inside it (conditional nodes: no launch per token), at most
  60 kernels per layer in a step. Two layers, not 16: every layer's kernels are the same, and
  two compile in seconds."""
  mesh = h200_mesh()
  config = grpo_config.get_config('P=16,G=1')
  config.model.num_layers = 2
  config.data.update(name='gsm8k', max_prompt_len=16, max_response_len=64)
  s = run_lib.abstract_setup(config, mesh)
  program = compiled.sampler(s.model, s.algo.state['params'], mesh, s.sampling, 16,
                             s.prompt_len)   # the run's own settings: G = 1, static
  graphs = program['graphs']
  assert graphs['launches'] == 1 and graphs['loop_in_graph'], graphs
  assert 2 * 10 < graphs['loop_kernels'] <= 2 * 60, graphs
