"""The benchmarks' own claims: the jitted sampler and train step compile once and never again
across steps, and the roofline arithmetic counts the parameters the model really has."""
import argparse
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench import common
from bench import presets
from bench import train_step as train_bench
from rljax.model import transformer as model_lib
from rljax.rollout import sampler as sampler_lib
from rljax import sharding

TINY = dict(vocab_size=16, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
            num_experts=4, experts_per_token=2, expert_hidden=16, moe_impl='ragged')


def tiny_setup():
  cfg = model_lib.ModelConfig(**TINY)
  mesh = sharding.make_mesh(dict(data=1), devices=jax.devices()[:1])
  params, _ = sharding.init_params(functools.partial(model_lib.init_params, cfg),
                                   jax.random.PRNGKey(0), mesh)
  return cfg, model_lib.Transformer(cfg), params, mesh


@pytest.mark.e2e   # the benchmark's programs (the product's: tests/test_continuous.py)
def test_sampler_compiles_once_across_steps():
  cfg, model, params, mesh = tiny_setup()
  sample = sharding.on_mesh(sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
      max_new_tokens=6, eos_id=1)), mesh)
  prompts = sharding.put_batch((np.full((4, 5), 3, np.int32), np.ones((4, 5), bool)), mesh)
  with common.count_compiles() as first:
    jax.block_until_ready(sample(params, *prompts, jax.random.PRNGKey(0)))
  assert first['count'] >= 1 and first['seconds'] > 0
  with common.count_compiles() as later:
    for step in range(1, 4):   # new keys and new prompt values, same shapes: no new executable
      prompts = sharding.put_batch((np.full((4, 5), 2 + step, np.int32), np.ones((4, 5), bool)),
                                   mesh)
      jax.block_until_ready(sample(params, *prompts, jax.random.PRNGKey(step)))
  assert later['count'] == 0
  with common.count_compiles() as other_shape:   # the counter does see a real recompilation
    prompts = sharding.put_batch((np.full((8, 5), 3, np.int32), np.ones((8, 5), bool)), mesh)
    jax.block_until_ready(sample(params, *prompts, jax.random.PRNGKey(0)))
  assert other_shape['count'] >= 1


@pytest.mark.e2e
def test_train_step_compiles_once_across_steps():
  cfg, model, params, mesh = tiny_setup()
  step, _, optimizer = train_bench.make_update_step(model, num_micro=2, batch_size=8, mesh=mesh)
  opt_state = sharding.init_optimizer(optimizer, params, mesh)
  with common.count_compiles() as first:
    params, opt_state, _ = step(params, opt_state,
                                train_bench.random_batch(cfg, 8, 4, 6, mesh, seed=0), None)
  assert first['count'] >= 1
  with common.count_compiles() as later:
    for seed in range(1, 4):
      params, opt_state, metrics = step(params, opt_state,
                                        train_bench.random_batch(cfg, 8, 4, 6, mesh, seed), None)
      assert np.isfinite(float(metrics['loss']))
  assert later['count'] == 0


@pytest.mark.parametrize('preset', sorted(presets.PRESETS))
def test_param_counts_match_the_model(preset):
  cfg = presets.get(preset)
  shapes = nn.unbox(jax.eval_shape(functools.partial(model_lib.init_params, cfg),
                                   jax.random.PRNGKey(0)))
  counts = common.param_counts(cfg)
  assert counts['total'] == sum(x.size for x in jax.tree.leaves(shapes))
  expert = sum(shapes['blocks']['moe'][w].size for w in ('w_gate', 'w_up', 'w_down'))
  assert counts['expert'] * cfg.num_layers * cfg.num_experts == expert


def test_decode_step_cost_by_hand():
  """Batch 1: every non-expert weight but the embedding table, k experts per layer, the KV cache."""
  cfg = model_lib.ModelConfig(**TINY)
  d, h, kv, hd, f, v, layers = 32, 4, 2, 8, 16, 16, 2
  attention = d * hd * (2 * h + 2 * kv) + 2 * hd
  shared = layers * (attention + 2 * d + d * 4) + d * v + d    # + router, lm_head, final norm
  weights = shared + layers * 2 * 3 * d * f
  slots = 10
  kv_bytes = 2 * layers * kv * hd * 4 * (slots + 1)
  nbytes, flops = common.decode_step_cost(cfg, 1, slots, 4)
  assert nbytes == pytest.approx(4 * weights + kv_bytes)
  assert flops == pytest.approx(2 * weights + 4 * layers * h * hd * slots)
  # At a large batch every expert is in use.
  many, _ = common.decode_step_cost(cfg, 10_000, slots, 4)
  assert many == pytest.approx(4 * (shared + layers * 4 * 3 * d * f) + 10_000 * kv_bytes)


def test_ceilings_are_measured():
  ceilings = common.Ceilings(on_gpu=False, dtype=jnp.float32, probe_bytes=64 << 20,
                             matmul_n=256)
  bandwidth, details = ceilings.bandwidth()
  assert 1e8 < bandwidth < 1e13 and details['copy_GBps'] > 0 and details['reduce_GBps'] > 0
  assert 1e8 < ceilings.flops() < 1e15


@pytest.mark.parametrize('forward_only', [False, True])
def test_moe_bench_checks_and_times_every_implementation(forward_only):
  from bench import moe as moe_bench   # pylint: disable=import-outside-toplevel
  ms = moe_bench.run(tokens=40, d=8, f=8, experts=4, k=2, impls=['ragged', 'dense', 'bucketed'],
                     rounds=2, forward_only=forward_only)
  assert set(ms) == {'ragged', 'dense', 'bucketed'} and all(t > 0 for t in ms.values())


def test_moe_bench_refuses_to_time_a_wrong_implementation(monkeypatch):
  from bench import moe as moe_bench   # pylint: disable=import-outside-toplevel
  from rljax.model import moe   # pylint: disable=import-outside-toplevel
  off_by_one_percent = lambda *args: 1.01 * moe.experts_ragged(*args)
  monkeypatch.setitem(moe.EXPERT_IMPLS, 'dense', off_by_one_percent)
  with pytest.raises(AssertionError, match='dense differs from ragged'):
    moe_bench.run(tokens=40, d=8, f=8, experts=4, k=2, impls=['ragged', 'dense'], rounds=1)


def test_router_mismatch_bench_measures_what_training_logs():
  """bench/router_mismatch.py on the tiny preset in float32: no routing decision differs and
  the log-probs agree to float32 rounding, with or without replay (tests/tolerance.py)."""
  from bench import router_mismatch   # pylint: disable=import-outside-toplevel
  cfg = presets.get('tiny', dtype='float32')
  rows = router_mismatch.measure(cfg, responses=8, prompt_len=4, new_tokens=4, seed=0)
  assert set(rows) == {False, True}
  for row in rows.values():
    assert row['router_mismatch'] == 0 and row['logprob_mismatch_max'] <= 2e-5


def test_sampling_bench_checks_and_times_both_draws():
  from bench import sampling   # pylint: disable=import-outside-toplevel
  ms = sampling.run(rows=4, vocab=32, rounds=2)
  assert len(ms) == 2 and all(t > 0 for t in ms.values())


def test_sampling_bench_refuses_to_time_a_wrong_draw(monkeypatch):
  from bench import sampling   # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(sampler_lib, 'categorical', lambda key, x: sampler_lib.first_argmax(x))
  with pytest.raises(AssertionError, match='draws other tokens'):
    sampling.run(rows=4, vocab=32, rounds=1)


def test_prefill_bench_checks_and_measures_both_ways():
  from bench import prefill   # pylint: disable=import-outside-toplevel
  row, _ = prefill.cpu_record('tiny', P=8, G=2, prompt_len=6, new_tokens=3, slots=8, repeats=1)
  for measured in ('prefill', 'static_sampler', 'continuous_sampler'):
    assert row[f'{measured}_old_s'] > 0 and row[f'{measured}_new_s'] > 0
    assert row[f'{measured}_new/old'] == row[f'{measured}_new_s'] / row[f'{measured}_old_s']
  assert row['static_temp_new_MiB'] < row['static_temp_old_MiB']   # prefill activations of P rows


def test_prefill_bench_refuses_to_time_a_wrong_cache(monkeypatch):
  """Rows in the wrong order (tiled, not repeated): the new cache differs from the old."""
  from bench import prefill   # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(sampler_lib, 'repeat_rows',
                      lambda x, group: jnp.tile(x, (group,) + (1,) * (x.ndim - 1)))
  with pytest.raises(AssertionError, match='Not equal to tolerance'):
    prefill.cpu_record('tiny', P=8, G=2, prompt_len=6, new_tokens=3, slots=8, repeats=1)


@pytest.mark.parametrize('text', ['64x', '64x2x3', '0x8', 'ax8'])
def test_sampling_bench_rejects_bad_shapes(text, capsys):
  from bench import sampling   # pylint: disable=import-outside-toplevel
  with pytest.raises(SystemExit) as exit_info:
    sampling.main([f'--shapes={text}'])
  assert exit_info.value.code == 2 and '--shapes' in capsys.readouterr().err


@pytest.mark.e2e   # the whole a/b benchmark, both parts, for two trees
def test_ab_imports_a_revision_apart_and_times_both_alternately(tmp_path):
  """bench/ab.py: the revision's modules come from its exported files, this tree's stay loaded,
  and one round of each part times both."""
  from bench import ab   # pylint: disable=import-outside-toplevel
  ab.export_revision('HEAD', str(tmp_path))
  rev, this = ab.import_tree(str(tmp_path)), ab.import_tree(ab.ROOT)
  assert rev['sampler'].__file__.startswith(str(tmp_path))
  assert this['sampler'].__file__.startswith(ab.ROOT) and rev['sampler'] is not this['sampler']
  # the test's own, untouched
  assert sampler_lib is __import__('sys').modules['rljax.rollout.sampler']
  for part, flags in (('sampler', ['--moe_impl=dense']), ('update', [])):
    result = ab.main([f'--part={part}', '--rev=HEAD', '--preset=tiny', '--batch=8', '--length=4',
                      '--rounds=2', *flags])
    assert result['this_ms'] > 0 and result['rev_ms'] > 0 and result['ratio'] > 0


@pytest.mark.parametrize('args', [['--rev=no-such-revision'], ['--rev=HEAD', '--preset=huge'],
                                  ['--rev=HEAD', '--batch=0'], ['--rev=HEAD', '--moe_impl=nope']])
def test_ab_rejects_bad_arguments(args, capsys):
  from bench import ab   # pylint: disable=import-outside-toplevel
  with pytest.raises(SystemExit) as exit_info:
    ab.main(args)
  assert exit_info.value.code == 2 and 'error' in capsys.readouterr().err


@pytest.mark.parametrize('script,args', [
    ('sampler', ['--batches=1,0']), ('sampler', ['--lengths=16,x']), ('sampler', ['--repeats=0']),
    ('train_step', ['--batch=64', '--micro=24']), ('train_step', ['--micro=']),
    ('rl_step', ['--preset=peer']), ('rl_step', ['--P=8,-1']), ('peers', ['--batches=1,,8']),
    ('prefill', ['--G=0']), ('prefill', ['--tpu_lengths=512']),
    ('router_mismatch', ['--responses=0']), ('router_mismatch', ['--dtype=float16'])])
def test_benchmarks_reject_bad_arguments_in_one_line(script, args, capsys):
  """Each benchmark's command line: bad input is one argparse error and exit 2, before any model
  is built (no traceback from deep inside a run)."""
  module = __import__(f'bench.{script}', fromlist=['main'])
  with pytest.raises(SystemExit) as exit_info:
    module.main(args)
  last_line = capsys.readouterr().err.strip().splitlines()[-1]
  assert exit_info.value.code == 2 and ': error: ' in last_line


def test_positive_ints():
  assert common.positive_ints('1,8,64') == [1, 8, 64]
  for text in ('', '0', '1,-2', '1.5', '8,'):
    with pytest.raises(argparse.ArgumentTypeError):
      common.positive_ints(text)


@pytest.mark.parametrize('n', [3, 5, 7, 9, 15])
def test_median_interval_covers_the_median_as_often_as_it_says(n):
  """Exact coverage from the binomial pmf (numpy convolution), and the empirical rate over
  log-normal samples whose median is 1."""
  pmf = np.array([1.0])
  for _ in range(n):
    pmf = np.convolve(pmf, [0.5, 0.5])
  rng = np.random.default_rng(n)
  samples = np.exp(rng.standard_normal((4000, n)))
  results = [common.median_interval(xs) for xs in samples]
  median, low, high, coverage = results[0]
  xs = np.sort(samples[0])
  j = int(np.flatnonzero(xs == low)[0]) + 1
  assert median == np.median(xs) and high == xs[n - j]
  assert np.isclose(coverage, 1 - 2 * pmf[:j].sum())
  assert coverage >= 0.9 or j == 1                 # the target, or as wide as n allows
  assert j == n // 2 or 1 - 2 * pmf[:j + 1].sum() < 0.9   # and no wider than it needs
  hits = np.mean([lo <= 1.0 <= hi for _, lo, hi, _ in results])
  assert abs(hits - coverage) < 0.02
