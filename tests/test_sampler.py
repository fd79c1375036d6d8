"""rljax.rollout.sampler: log-probs equal the trainer's, greedy == step-by-step argmax of
the full forward, stop tokens and early exit, top-k / top-p filters vs numpy, sampling
frequencies, one compile.

Compiles dominate the run time on CPU, so a few samplers are built once per module and shared."""

import dataclasses
import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.model import transformer as model_lib
from rljax import policy_loss
from rljax.rollout import sampler as sampler_lib

import random_params as random_params_lib
import tolerance

V, EOS, PAD = 16, 1, 0
PROMPT_LEN, MAX_NEW = 6, 6
LENGTHS = [6, 3, 1, 5, 2, 6, 4, 1]   # real prompt tokens per row (left padded to PROMPT_LEN)
CFG = model_lib.ModelConfig(vocab_size=V, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2,
                            head_dim=8, num_experts=4, experts_per_token=2, expert_hidden=24,
                            moe_impl='dense')
MODEL = model_lib.Transformer(CFG)


def random_params(seed):
  return random_params_lib.for_model(CFG, seed)


def prompts(seed, lengths=LENGTHS):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(2, V, size=(len(lengths), PROMPT_LEN)).astype(np.int32)
  valid = np.zeros(tokens.shape, bool)
  for b, n in enumerate(lengths):
    valid[b, PROMPT_LEN - n:] = True
  tokens[~valid] = PAD
  return jnp.asarray(tokens), jnp.asarray(valid)


def np_log_softmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(axis=-1, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


# What the product compiles with, where a test reads the compiled program (tests/conftest.py's
# FAST_COMPILE turns XLA:CPU's new fusion emitters off, which also changes the fusions).
PRODUCT_CODEGEN = {'xla_cpu_use_fusion_emitters': True}


@functools.lru_cache(maxsize=None)
def full_forward():
  return jax.jit(MODEL.apply)


@functools.lru_cache(maxsize=None)
def trainer_logprobs():
  """policy_loss.response_logprobs, jitted once (the temperature is traced)."""
  return jax.jit(functools.partial(policy_loss.response_logprobs, MODEL))


def full_logits(params, prompt, valid, response):
  """Full-sequence forward logits predicting each response position: [B, L, V] (numpy)."""
  tokens = jnp.concatenate([prompt, jnp.asarray(response, jnp.int32)], axis=1)
  kv_valid = jnp.concatenate([valid, jnp.ones(np.shape(response), bool)], axis=1)
  logits = np.asarray(full_forward()({'params': params}, tokens, kv_valid)[0])
  width = prompt.shape[1]
  return logits[:, width - 1:width - 1 + np.shape(response)[1]]


# ------------------------------------------------------------------ shared, instrumented samplers

BODY_RUNS = [0]        # executed while-loop bodies (a debug callback per sample_token call)
TRACES = {}            # sample_token traces per sampling config


@pytest.fixture(scope='module')
def samplers():
  """Samplers whose `sample_token` counts its traces and its executions (one per loop iteration)."""
  original = sampler_lib.sample_token

  def counted(logits_BxV, key, cfg):
    TRACES[cfg] = TRACES.get(cfg, 0) + 1
    jax.debug.callback(lambda: BODY_RUNS.__setitem__(0, BODY_RUNS[0] + 1))
    return original(logits_BxV, key, cfg)

  configs = dict(
      t1=sampler_lib.SamplingConfig(MAX_NEW, EOS, PAD, temperature=1.0),
      t07=sampler_lib.SamplingConfig(MAX_NEW, EOS, PAD, temperature=0.7),
      greedy=sampler_lib.SamplingConfig(MAX_NEW, EOS, PAD, greedy=True),
      top1=sampler_lib.SamplingConfig(MAX_NEW, EOS, PAD, temperature=1.0, top_k=1))
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(sampler_lib, 'sample_token', counted)
    built = {name: (sampler_lib.make_sampler(MODEL, cfg), cfg) for name, cfg in configs.items()}
    yield built


def run(sampler, params, prompt, valid, seed):
  out = sampler(params, prompt, valid, jax.random.PRNGKey(seed))
  jax.block_until_ready(out)
  jax.effects_barrier()
  return jax.tree.map(np.asarray, out)


def check_stop_structure(rollout):
  """PAD and mask False after the first EOS; lengths = index of EOS + 1, else MAX_NEW."""
  for b in range(rollout.tokens_BxL.shape[0]):
    row, mask = rollout.tokens_BxL[b], rollout.mask_BxL[b]
    eos = np.flatnonzero(row == EOS)
    n = eos[0] + 1 if len(eos) else MAX_NEW
    assert rollout.lengths_B[b] == n, (b, row, rollout.lengths_B[b])
    np.testing.assert_array_equal(mask, np.arange(MAX_NEW) < n)
    assert np.all(row[n:] == PAD) and np.all(rollout.logp_BxL[b, n:] == 0.0), (b, row)
    assert np.all(rollout.logp_BxL[b, :n] <= 0.0)


# ------------------------------------------------------------------ log-probs


@pytest.mark.parametrize('name,temperature', [('t1', 1.0), ('t07', 0.7)])
def test_sampler_logprobs_equal_trainer_logprobs(samplers, name, temperature):
  sampler, cfg = samplers[name]
  assert cfg.temperature == temperature
  params = random_params(0)
  prompt, valid = prompts(1)
  checked = 0
  for seed in range(3):
    rollout = run(sampler, params, prompt, valid, seed)
    check_stop_structure(rollout)
    mask = rollout.mask_BxL
    logp, _, _, router_mismatch = trainer_logprobs()(
        params, prompt, valid, jnp.asarray(rollout.tokens_BxL), jnp.float32(temperature),
        experts_BxLxYxK=jnp.asarray(rollout.experts_BxLxYxK))
    diff = np.abs(np.asarray(logp) - rollout.logp_BxL)[mask]
    assert diff.max() <= 1e-5, diff.max()
    # Every response token's experts recorded (and only those), the trainer's own choices.
    np.testing.assert_array_equal(rollout.experts_BxLxYxK[..., 0] >= 0, mask[..., None])
    assert int(router_mismatch) == 0
    # Independent reference: numpy log-softmax of the full-forward logits / temperature.
    ref = np_log_softmax(full_logits(params, prompt, valid, rollout.tokens_BxL) / temperature)
    ref = np.take_along_axis(ref, rollout.tokens_BxL[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(rollout.logp_BxL[mask], ref[mask], rtol=0, atol=1e-5)
    checked += mask.sum()
  assert checked >= 60


# ------------------------------------------------------------------ greedy, top-k=1, stop tokens


def np_greedy_reference(params, prompt, valid):
  """Step-by-step argmax of the full forward (fixed width: later tokens cannot affect
  earlier ones)."""
  batch = prompt.shape[0]
  response = np.full((batch, MAX_NEW), PAD, np.int32)
  mask = np.zeros((batch, MAX_NEW), bool)
  logp = np.zeros((batch, MAX_NEW))
  done = np.zeros(batch, bool)
  for t in range(MAX_NEW):
    step_logits = full_logits(params, prompt, valid, response)[:, t]
    token = np.argmax(step_logits, axis=-1)
    step_logp = np_log_softmax(step_logits)[np.arange(batch), token]
    response[:, t] = np.where(done, PAD, token)
    logp[:, t] = np.where(done, 0.0, step_logp)
    mask[:, t] = ~done
    done |= token == EOS
  return response, logp, mask


def near_tie_model(dtype, replay):
  """Two MoE layers whose router columns are one column plus 1e-7 relative noise: every top-2 of
  4 is decided at the float32 rounding of the router logits, so the sampler's decoding step and
  the trainer's full forward, two programs, choose differently wherever their activations differ
  in the last bit."""
  cfg = dataclasses.replace(CFG, num_layers=2, dtype=dtype, router_replay=replay)
  params = random_params_lib.for_model(cfg, 3)
  router_YxDxE = params['blocks']['moe']['router']
  noise = np.random.default_rng(4).normal(size=router_YxDxE.shape)
  params['blocks']['moe']['router'] = router_YxDxE[..., :1] * (1 + 1e-7 * noise)
  return model_lib.Transformer(cfg), params


@pytest.mark.parametrize('dtype, slots', [('float32', 0), ('bfloat16', 0), ('bfloat16', 5)])
def test_router_replay_gives_the_trainer_the_samplers_experts_at_near_ties(dtype, slots):
  """Near-tied routers: without replay the trainer routes some response tokens otherwise than the
  sampler did, and its log-probs of them are far off; with model.router_replay it takes the
  sampler's experts and its log-probs match the sampler's within the dtype's tolerance (static and
  continuous batching). One-token prompts: every routing decision is a decoding step's, recorded
  (prompt tokens route as the trainer computes them)."""
  tol = tolerance.ACROSS_PROGRAMS['atol'] if dtype == 'float32' else tolerance.BF16_LOGPROBS['atol']
  prompt = jnp.asarray(np.random.default_rng(5).integers(2, V, size=(16, 1)), jnp.int32)
  valid = jnp.ones(prompt.shape, bool)
  sampling = sampler_lib.SamplingConfig(8, -1, PAD, slots=slots)   # no stop token: 8 tokens each
  diffs = {}
  for replay in (False, True):
    model, params = near_tie_model(dtype, replay)
    rollout = sampler_lib.make_sampler(model, sampling)(params, prompt, valid,
                                                        jax.random.PRNGKey(6))
    logp, _, _, mismatch = jax.jit(lambda p, t, e: policy_loss.response_logprobs(
        model, p, prompt, valid, t, 1.0, 0, e))(params, rollout.tokens_BxL,
                                                rollout.experts_BxLxYxK)
    decisions = np.sum(np.asarray(rollout.experts_BxLxYxK)[..., 0] >= 0)
    assert decisions == 16 * 8 * 2 and 0 < int(mismatch) < decisions   # the near-ties flip
    diffs[replay] = np.abs(np.asarray(logp) - np.asarray(rollout.logp_BxL)).max()
  assert diffs[True] <= tol < 10 * tol < diffs[False], diffs


def test_greedy_matches_numpy_argmax_loop(samplers):
  params = random_params(11)
  prompt, valid = prompts(3)
  ref_tokens, ref_logp, ref_mask = np_greedy_reference(params, prompt, valid)
  # The setup has rows that stop on EOS at several steps and rows that never stop.
  assert MAX_NEW in ref_mask.sum(1) and len(set(ref_mask.sum(1))) >= 4, ref_tokens
  greedy = run(samplers['greedy'][0], params, prompt, valid, seed=0)
  np.testing.assert_array_equal(greedy.tokens_BxL, ref_tokens)
  np.testing.assert_array_equal(greedy.mask_BxL, ref_mask)
  np.testing.assert_array_equal(greedy.lengths_B, ref_mask.sum(1))
  np.testing.assert_allclose(greedy.logp_BxL, ref_logp, rtol=0, atol=1e-5)
  check_stop_structure(greedy)
  # Top-k = 1 sampling is greedy whatever the key (log-probs are of the FULL distribution).
  for seed in (0, 1):
    top1 = run(samplers['top1'][0], params, prompt, valid, seed=seed)
    np.testing.assert_array_equal(top1.tokens_BxL, ref_tokens)
    np.testing.assert_array_equal(top1.mask_BxL, ref_mask)
    np.testing.assert_allclose(top1.logp_BxL, ref_logp, rtol=0, atol=1e-5)


def test_one_column_prompts_skip_the_prefill():
  """Prompts of width 1: no prefill at all, the loop's first step feeds the prompt token; greedy
  tokens and log-probs still equal the numpy argmax loop over the full forward."""
  params = random_params(11)
  prompt = jnp.asarray(np.arange(2, 2 + 8).reshape(8, 1), jnp.int32)
  valid = jnp.ones((8, 1), bool)
  greedy = jax.jit(sampler_lib.make_sampler(MODEL, sampler_lib.SamplingConfig(
      MAX_NEW, EOS, PAD, greedy=True)))
  rollout = run(greedy, params, prompt, valid, seed=0)
  ref_tokens, ref_logp, ref_mask = np_greedy_reference(params, prompt, valid)
  np.testing.assert_array_equal(rollout.tokens_BxL, ref_tokens)
  np.testing.assert_array_equal(rollout.mask_BxL, ref_mask)
  np.testing.assert_allclose(rollout.logp_BxL, ref_logp, rtol=0, atol=1e-5)


def test_stop_tokens_pad_and_mask(samplers):
  sampler = samplers['t1'][0]
  params = random_params(0)
  prompt, valid = prompts(1)
  lengths = []
  for seed in range(4):
    rollout = run(sampler, params, prompt, valid, seed=10 + seed)
    check_stop_structure(rollout)
    lengths.extend(rollout.lengths_B.tolist())
  # The setup exercises early stops at several steps as well as rows that never stop.
  assert MAX_NEW in lengths and len(set(lengths)) >= 3, lengths


def forced_eos_params(seed):
  """Residual dimension 0 is a large constant, and only EOS reads it: EOS wins by a huge margin."""
  params = random_params(seed)
  params['embed']['embedding'] = params['embed']['embedding'].at[:, 0].add(30.0)
  params['lm_head'] = params['lm_head'].at[0, :].set(0.0).at[0, EOS].set(30.0)
  return params


def test_early_exit_after_one_step(samplers):
  params = forced_eos_params(4)
  prompt, valid = prompts(5)
  logits = full_logits(params, prompt, valid, np.full((len(LENGTHS), MAX_NEW), PAD))
  others = np.delete(logits, EOS, axis=-1).max(-1)
  assert np.all(logits[..., EOS] - others > 50.0)  # EOS is certain at every step
  for name in ('t1', 'greedy'):
    before = BODY_RUNS[0]
    rollout = run(samplers[name][0], params, prompt, valid, seed=0)
    assert BODY_RUNS[0] - before == 1, (name, BODY_RUNS[0] - before)  # the loop ran once
    np.testing.assert_array_equal(rollout.lengths_B, 1)
    np.testing.assert_array_equal(rollout.tokens_BxL[:, 0], EOS)
    np.testing.assert_array_equal(rollout.tokens_BxL[:, 1:], PAD)
    np.testing.assert_array_equal(rollout.mask_BxL, np.arange(MAX_NEW)[None].repeat(8, 0) < 1)
  # Control: the counter does count every iteration when nothing stops (EOS never wins).
  params = random_params(4)
  params['lm_head'] = params['lm_head'].at[:, EOS].set(0.0)
  params['embed']['embedding'] = params['embed']['embedding'].at[:, 0].add(30.0)
  params['lm_head'] = params['lm_head'].at[0, EOS].set(-30.0)
  before = BODY_RUNS[0]
  rollout = run(samplers['greedy'][0], params, prompt, valid, seed=0)
  np.testing.assert_array_equal(rollout.lengths_B, MAX_NEW)
  assert BODY_RUNS[0] - before == MAX_NEW


def test_compiles_once_per_shape(samplers):
  sampler, cfg = samplers['t1']
  prompt, valid = prompts(1)
  run(sampler, random_params(0), prompt, valid, seed=0)
  traces = TRACES[cfg]
  assert traces == 1
  for seed in (7, 8):  # new parameter values, prompts and keys of the same shapes
    new_prompt, new_valid = prompts(seed, lengths=LENGTHS[::-1])
    run(sampler, random_params(seed), new_prompt, new_valid, seed=seed)
  assert TRACES[cfg] == traces
  if hasattr(sampler, '_cache_size'):
    assert sampler._cache_size() == 1


@pytest.mark.parametrize('per_row_keys', [False, True])
def test_a_group_prefills_each_prompt_once_and_samples_what_repeated_prompts_sample(per_row_keys):
  """group G on P prompts (each prefilled once, its cache rows repeated) returns what group 1
  returns on the prompts repeated G times, rows p*G .. p*G+G-1 for prompt p, with the same key
  (split every step, or one per response): tokens and masks exactly, log-probs within
  tolerance.ACROSS_PROGRAMS (two compiled programs: a prefill of P rows and one of P x G)."""
  G, lengths = 4, [6, 2, 4]
  params = random_params(2)
  prompt_PxT, valid_PxT = prompts(6, lengths=lengths)
  rng = jax.random.PRNGKey(9)
  keys = sampler_lib.response_keys(rng, len(lengths) * G) if per_row_keys else rng
  cfg = sampler_lib.SamplingConfig(MAX_NEW, EOS, PAD)
  repeated = sampler_lib.make_sampler(MODEL, cfg)(
      params, jnp.repeat(prompt_PxT, G, axis=0), jnp.repeat(valid_PxT, G, axis=0), keys)
  grouped = sampler_lib.make_sampler(MODEL, dataclasses.replace(cfg, group=G))(
      params, prompt_PxT, valid_PxT, keys)
  repeated, grouped = jax.device_get((repeated, grouped))
  np.testing.assert_array_equal(grouped.tokens_BxL, repeated.tokens_BxL)
  np.testing.assert_array_equal(grouped.mask_BxL, repeated.mask_BxL)
  np.testing.assert_allclose(grouped.logp_BxL, repeated.logp_BxL, **tolerance.ACROSS_PROGRAMS)
  check_stop_structure(grouped)
  tokens_PxGxL = grouped.tokens_BxL.reshape(len(lengths), G, MAX_NEW)
  assert all(len({row.tobytes() for row in group}) > 1 for group in tokens_PxGxL)   # own keys


@pytest.mark.parametrize('lengths', [LENGTHS, [5]])
@pytest.mark.xla_cpu_codegen   # asserts XLA:CPU's compiled text
def test_decoding_writes_the_kv_cache_in_place(lengths):
  """No copy of any layer's KV cache in the compiled sampler: each step writes its slot in place.
  With the cache read before the write, XLA copied every layer's keys and values twice per
  decoding step, the whole cache each time; with a size-1 batch axis in the cache, at batch 1, it
  copied them four times (docs/design/kv_cache_batch1.md)."""
  cfg = dataclasses.replace(CFG, num_layers=2)
  prompt, valid = prompts(1, lengths=lengths)
  sampler = jax.jit(sampler_lib.make_sampler(model_lib.Transformer(cfg),
                                             sampler_lib.SamplingConfig(MAX_NEW, EOS, PAD)),
                    compiler_options=PRODUCT_CODEGEN)
  hlo = sampler.lower(random_params_lib.for_model(cfg, 0), prompt, valid,
                      jax.random.PRNGKey(0)).compile().as_text()
  batch = f'{len(lengths)},' if len(lengths) > 1 else '(?:1,)?'   # either form at batch 1
  cache = rf'f32\[{batch}{cfg.num_kv_heads},{PROMPT_LEN + MAX_NEW},{cfg.head_dim}\]'
  updates = re.findall(rf'= {cache}\S* fusion\(.*dynamic.update.slice', hlo)
  assert len(updates) >= 2 * cfg.num_layers   # the cache's shape is the one searched for
  assert not re.findall(rf'= {cache}\S* copy\(', hlo)


def computations_run_by(hlo, name):
  """The HLO computation `name` and every computation it calls (fusions, branches, loops)."""
  bodies = dict(re.findall(r'^(?:ENTRY )?%(\S+) .*?\{\n(.*?)\n\}', hlo, re.M | re.S))
  seen, todo = set(), [name]
  while todo:
    current = todo.pop()
    if current not in seen:
      seen.add(current)
      todo += [n for n in re.findall(r'%([\w.\-]+)', bodies[current]) if n in bodies]
  return {n: bodies[n] for n in seen}


@pytest.mark.parametrize('moe_impl', ['bucketed', pytest.param('dense', marks=pytest.mark.e2e)])
@pytest.mark.xla_cpu_codegen   # asserts XLA:CPU's compiled text
def test_decoding_loop_copies_no_weights(moe_impl):
  """The experts' gate and up matrices are joined where the MoE layer uses them
  (rljax.model.moe.gate_up): in the sampler XLA must hoist that join out of the decoding loop, or
  every step copies them, and fuse it with the per-layer slice of the stacked weights, or every call
  copies them twice (which XLA:CPU did for a concatenate of matrices this size, not for small ones).
  The attention output matrix, laid out for its product (rljax.model.transformer.Attention), and
  'dense''s experts side by side (rljax.model.moe.experts_dense) are likewise copied once per call,
  not at every step."""
  # shapes of no other array
  cfg = dataclasses.replace(CFG, moe_impl=moe_impl, num_layers=2, d_model=640, num_experts=12,
                            expert_hidden=576, num_heads=6, head_dim=40)
  prompt, valid = prompts(1)
  sampler = jax.jit(sampler_lib.make_sampler(model_lib.Transformer(cfg),
                                             sampler_lib.SamplingConfig(MAX_NEW, EOS, PAD)),
                    compiler_options=PRODUCT_CODEGEN)
  params = jax.eval_shape(lambda: random_params_lib.for_model(cfg, 0))   # shapes only
  hlo = sampler.lower(params, prompt, valid, jax.random.PRNGKey(0)).compile().as_text()
  joined = re.escape(f'f32[{cfg.num_experts},{cfg.d_model},{2 * cfg.expert_hidden}]')
  assert len(re.findall(rf'= {joined}\S* \w+\(%params\S*_w_(up|gate)_', hlo)) == cfg.num_layers
  cache = re.escape(f'f32[{len(LENGTHS)},{cfg.num_kv_heads},{PROMPT_LEN + MAX_NEW},{cfg.head_dim}]')
  [decoding_loop] = re.findall(rf'= \(.*{cache}.* while\(.*?body=%([\w.\-]+)', hlo)
  in_loop = computations_run_by(hlo, decoding_loop)
  assert len(in_loop) > 5 and any('dot(' in text for text in in_loop.values())
  one_matrix = re.escape(f'f32[{cfg.num_experts},{cfg.d_model},{cfg.expert_hidden}]')
  assert not re.findall(rf'= {one_matrix}\S* \w+\(%params\S*_w_(gate|up)_', hlo)
  weight_sizes = {cfg.num_experts * cfg.d_model * cfg.expert_hidden * n for n in (1, 2)} | {
      cfg.d_model * cfg.num_heads * cfg.head_dim,      # w_q, w_o
      cfg.d_model * cfg.num_kv_heads * cfg.head_dim}   # w_k, w_v
  made_in_loop = [dims for text in in_loop.values() for dims in re.findall(
      r'= f32\[([\d,]+)\]\S* (?:fusion|copy|transpose|concatenate)\(', text)]
  assert made_in_loop and not [dims for dims in made_in_loop
                               if math.prod(map(int, dims.split(','))) in weight_sizes]


# ------------------------------------------------------------------ filters


def np_nucleus(logits_V, p):
  """Indices of the smallest set of most likely tokens whose probability reaches p."""
  probs = np.exp(np_log_softmax(logits_V))
  order = np.argsort(-probs)
  mass = np.cumsum(probs[order])
  n = int(np.searchsorted(mass, p)) + 1  # first n with mass[n-1] >= p
  margin = min(abs(mass[n - 1] - p), abs(mass[n - 2] - p) if n >= 2 else 1.0)
  return set(order[:n].tolist()), margin


@pytest.mark.parametrize('top_p', [0.05, 0.3, 0.5, 0.8, 0.9, 0.97])
def test_top_p_keeps_smallest_nucleus(top_p):
  rng = np.random.default_rng(int(top_p * 100))
  logits = (rng.normal(size=(64, V)) * rng.uniform(0.3, 3.0, size=(64, 1))).astype(np.float32)
  filtered = np.asarray(sampler_lib.filter_logits(jnp.asarray(logits), 0, top_p))
  checked = 0
  for b in range(64):
    keep, margin = np_nucleus(logits[b], top_p)
    if margin < 1e-5:
      continue  # float32 cumsum may legitimately land on either side
    kept = set(np.flatnonzero(np.isfinite(filtered[b])).tolist())
    assert kept == keep, (b, sorted(kept), sorted(keep))
    np.testing.assert_array_equal(filtered[b, sorted(kept)], logits[b, sorted(kept)])
    assert np.all(filtered[b, ~np.isfinite(filtered[b])] == -np.inf)
    checked += 1
  assert checked >= 60


@pytest.mark.parametrize('top_k', [1, 3, 15])
def test_top_k_keeps_k(top_k):
  logits = np.random.default_rng(top_k).normal(size=(32, V)).astype(np.float32)
  filtered = np.asarray(sampler_lib.filter_logits(jnp.asarray(logits), top_k, 1.0))
  for b in range(32):
    keep = set(np.argsort(-logits[b])[:top_k].tolist())
    assert set(np.flatnonzero(np.isfinite(filtered[b])).tolist()) == keep
    np.testing.assert_array_equal(filtered[b, sorted(keep)], logits[b, sorted(keep)])


def test_no_filter_is_identity():
  logits = np.random.default_rng(0).normal(size=(4, V)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(sampler_lib.filter_logits(jnp.asarray(logits), 0, 1.0)),
                                logits)


# ------------------------------------------------------------------ sampling frequencies


def chi2_quantile(dof, z=3.29):
  """Wilson-Hilferty approximation of the chi-square quantile (z = 3.29: p ~ 0.9995)."""
  return dof * (1.0 - 2.0 / (9 * dof) + z * np.sqrt(2.0 / (9 * dof))) ** 3


def test_categorical_draws_what_jax_random_categorical_draws():
  """The same token for the same key as `jax.random.categorical`, with filtered (-inf) logits and
  ties and NaNs (which `first_argmax` resolves like numpy's argmax, by the first index)."""
  logits_BxV = np.random.default_rng(0).normal(size=(64, V)).astype(np.float32) * 3
  logits_BxV[:, [3, 7, V - 1]] = -np.inf
  for seed in range(10):
    key = jax.random.PRNGKey(seed)
    np.testing.assert_array_equal(sampler_lib.categorical(key, jnp.asarray(logits_BxV)),
                                  jax.random.categorical(key, jnp.asarray(logits_BxV), axis=-1))
  ties_BxV = np.random.default_rng(1).integers(0, 3, size=(64, V)).astype(np.float32)
  ties_BxV[:4, [5, 9]] = np.nan   # a NaN wins, the first one, as in argmax
  np.testing.assert_array_equal(sampler_lib.first_argmax(jnp.asarray(ties_BxV)),
                                np.argmax(ties_BxV, axis=-1))


@pytest.mark.parametrize('name,temperature', [('t1', 1.0), ('t07', 0.7)])
def test_first_token_frequencies_match_softmax(samplers, name, temperature):
  sampler = samplers[name][0]
  params = random_params(6)
  one_prompt, one_valid = prompts(7, lengths=[4] * len(LENGTHS))
  prompt = jnp.broadcast_to(one_prompt[:1], one_prompt.shape)   # the same prompt in every row
  valid = jnp.broadcast_to(one_valid[:1], one_valid.shape)
  logits = full_logits(params, prompt, valid, np.zeros((len(LENGTHS), MAX_NEW), np.int32))[0, 0]
  probs = np.exp(np_log_softmax(logits / temperature))
  draws = 300
  counts = np.zeros(V)
  for seed in range(draws):
    rollout = sampler(params, prompt, valid, jax.random.PRNGKey(1000 + seed))
    counts += np.bincount(np.asarray(rollout.tokens_BxL[:, 0]), minlength=V)
  total = counts.sum()
  expected = probs * total
  big = expected >= 5.0   # pool rare tokens into one bin
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  chi2 = np.sum((obs - exp) ** 2 / exp)
  assert big.sum() >= 6
  assert chi2 < chi2_quantile(big.sum()), (chi2, counts, expected)
