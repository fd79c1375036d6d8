"""GRPO step benchmark: one full step split into rollout / reward / update, vs P (prompts per step),
and the memory of each jitted part, to show that micro-batching keeps the update's memory flat.

  PYTHONPATH=. python bench/rl_step.py --preset=tiny --P=8,16,32,64 --G=8 --micro=64

The step is the body of rljax.train.loop's loop, built from the same library functions (sampler,
group_batch, policy_update): prompts (3-digit addition) -> sample -> decode and verify on the host
-> advantages -> one accumulated Adam update. The first step compiles; the next `steps` are timed.
"""
import argparse
import concurrent.futures
import dataclasses
import sys
import time

import jax
import numpy as np

from bench import common
from bench import presets
from bench import sampler as sampler_bench
from bench import train_step as train_bench
from rljax.algos import grpo
from rljax.data import rewards
from rljax.data import sources as data
from rljax.data import tokenizer as tokenizer_lib
from rljax.model import moe
from rljax.rollout import sampler as sampler_lib
from rljax import sharding
from rljax.train import evaluation


def arithmetic_prompts(num, seed):
  rng = np.random.default_rng(seed)
  a, b = rng.integers(0, 1000, num), rng.integers(0, 1000, num)
  return [f'{x:03d}+{y:03d}=' for x, y in zip(a, b)], [str(x + y) for x, y in zip(a, b)]


def prepare(model, params, mesh, P, G, micro, max_new_tokens):
  """Builds the GRPO step for this P and runs it once (compiling its three jitted parts)."""
  config = train_bench.grpo_defaults()
  tokenizer = tokenizer_lib.ArithmeticTokenizer()
  prompt_len = 8
  batch_size = P * G
  sampling = sampler_lib.SamplingConfig(max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_id,
                                        pad_id=tokenizer.pad_id, temperature=1.0)
  sample_jit = sampler_lib.make_sampler(model, sampling)
  sample = sharding.on_mesh(sample_jit, mesh)
  make_batch = sharding.on_mesh(jax.jit(lambda r, rw, p, v: grpo.group_batch(
      r, rw, p, v, G=G, grpo_cfg=config.grpo)), mesh)
  update, update_jit, optimizer = train_bench.make_update_step(
      model, batch_size // min(micro, batch_size), batch_size, mesh)
  params = jax.tree.map(lambda x: x.copy(), params)
  opt_state = sharding.init_optimizer(optimizer, params, mesh)
  reward_fn = rewards.get_reward_fn('exact_numeric')

  def grpo_step(params, opt_state, step):
    t0 = time.perf_counter()
    prompts, answers = arithmetic_prompts(P, step)
    prompts = [p for p in prompts for _ in range(G)]
    answers = [a for a in answers for _ in range(G)]
    prompt_BxT, valid_BxT = sharding.put_batch(data.encode_prompts(prompts, tokenizer, prompt_len),
                                               mesh)
    rollout = sample(params, prompt_BxT, valid_BxT, jax.random.PRNGKey(step))
    tokens = evaluation.to_host(rollout.tokens_BxL, mesh)
    t1 = time.perf_counter()
    rewards_B, _ = rewards.score_batch(reward_fn, evaluation.decode_responses(tokenizer, tokens),
                                       answers)
    batch, _ = make_batch(rollout, sharding.put_batch(rewards_B, mesh), prompt_BxT, valid_BxT)
    t2 = time.perf_counter()
    params, opt_state, metrics = update(params, opt_state, batch, None)
    metrics = jax.device_get(metrics)
    t3 = time.perf_counter()
    return params, opt_state, dict(rollout=t1 - t0, reward=t2 - t1, update=t3 - t2, total=t3 - t0,
                                   tokens=int(jax.device_get(rollout.lengths_B).sum()),
                                   loss=float(metrics['loss']))

  start = time.perf_counter()
  params, opt_state, _ = grpo_step(params, opt_state, 0)
  return dict(P=P, G=G, micro=micro, grpo_step=grpo_step, params=params, opt_state=opt_state,
              compile_s=time.perf_counter() - start, sample=sample, sample_jit=sample_jit,
              make_batch=make_batch, update_jit=update_jit, tokenizer=tokenizer,
              prompt_len=prompt_len)


def measure(state, mesh, steps):
  """Times `steps` further GRPO steps (no compilation allowed) and the memory of each part."""
  P, G, micro = state['P'], state['G'], state['micro']
  batch_size = P * G
  params, opt_state, grpo_step = state['params'], state['opt_state'], state['grpo_step']
  tokenizer, prompt_len = state['tokenizer'], state['prompt_len']
  sample, sample_jit, make_batch = state['sample'], state['sample_jit'], state['make_batch']
  update_jit = state['update_jit']
  timings = []
  with common.count_compiles() as later:
    for step in range(1, steps + 1):
      params, opt_state, t = grpo_step(params, opt_state, step)
      timings.append(t)
  assert later['count'] == 0, f'a GRPO step recompiled {later["count"]} times'
  med = {k: common.median_spread([t[k] for t in timings])[0] for k in timings[0]}
  # Memory of the jitted parts at this P (rows of the batch as traced above).
  prompt_BxT, valid_BxT = sharding.put_batch(data.encode_prompts(
      arithmetic_prompts(batch_size, 0)[0], tokenizer, prompt_len), mesh)
  with jax.set_mesh(mesh):
    sampler_mem = sample_jit.lower(params, prompt_BxT, valid_BxT,
                                   jax.random.PRNGKey(0)).compile().memory_analysis()
  rollout = sample(params, prompt_BxT, valid_BxT, jax.random.PRNGKey(0))
  batch, _ = make_batch(rollout, sharding.put_batch(np.zeros(batch_size, np.float32), mesh),
                        prompt_BxT, valid_BxT)
  update_mem = train_bench.compiled_memory(update_jit, mesh, params, opt_state, batch, None)
  return dict(P=P, G=G, responses=batch_size, micro=min(micro, batch_size),
              step_s=med['total'], rollout_s=med['rollout'], reward_s=med['reward'],
              update_s=med['update'], samples_per_s=batch_size / med['total'],
              tokens=med['tokens'], update_temp_GiB=common.gib(update_mem['temp']),
              update_peak_GiB=common.gib(update_mem['peak']),
              sampler_temp_GiB=common.gib(sampler_mem.temp_size_in_bytes),
              compile_s=state['compile_s'], recompiles=later['count'],
              load_1min=common.load_average())


COLUMNS = ['P', 'G', 'responses', 'micro', 'step_s', 'rollout_s', 'reward_s', 'update_s',
           'samples_per_s', 'update_temp_GiB', 'update_peak_GiB', 'sampler_temp_GiB', 'compile_s',
           'recompiles', 'load_1min']


def run(preset, Ps, G, micro, max_new_tokens, steps, overrides=None, log=print):
  cfg = presets.get(preset, **(overrides or {}))   # its vocab the task's (checked by main)
  model, params, mesh = sampler_bench.setup(cfg)
  record = dict(machine=common.machine(), preset=preset, model=dataclasses.asdict(cfg), rows=[])
  # The first P alone (its first step's time is the compile time to quote), the rest in parallel.
  states = [prepare(model, params, mesh, Ps[0], G, micro, max_new_tokens)]
  with concurrent.futures.ThreadPoolExecutor(max(1, len(Ps) - 1)) as pool:
    states += list(pool.map(lambda P: prepare(model, params, mesh, P, G, micro, max_new_tokens),
                            Ps[1:]))
  log(f"compiled {len(Ps)} GRPO steps; first alone {states[0]['compile_s']:.1f} s", flush=True)
  for state in states:
    row = measure(state, mesh, steps)
    record['rows'].append(row)
    log(f"P {row['P']}: step {row['step_s']:.3g} s (rollout {row['rollout_s']:.3g}, reward "
        f"{row['reward_s']:.3g}, update {row['update_s']:.3g}), update temp "
        f"{row['update_temp_GiB']:.3f} GiB, load {row['load_1min']:.1f}", flush=True)
  return record


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--preset', default='tiny', choices=sorted(presets.PRESETS))
  parser.add_argument('--P', type=common.positive_ints, default='8,16,32,64')
  parser.add_argument('--G', type=common.positive_int, default=8)
  parser.add_argument('--micro', type=common.positive_int, default=64,
                      help='micro-batch (responses)')
  parser.add_argument('--moe_impl', default='', choices=sorted(moe.EXPERT_IMPLS))
  parser.add_argument('--max_new_tokens', type=common.positive_int, default=5,
                      help='the task needs 5')
  parser.add_argument('--steps', type=common.positive_int, default=3)
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  vocab_size = presets.get(args.preset).vocab_size
  if vocab_size != tokenizer_lib.ArithmeticTokenizer.vocab_size:
    parser.error(f'--preset={args.preset} has vocab {vocab_size}; the arithmetic task needs '
                 f'{tokenizer_lib.ArithmeticTokenizer.vocab_size} (presets tiny, gpu1b)')
  record = run(args.preset, args.P, args.G, args.micro,
               args.max_new_tokens, args.steps,
               {'moe_impl': args.moe_impl} if args.moe_impl else None)
  print(f"\n{record['machine']}\npreset {args.preset}")
  print(common.table(record['rows'], COLUMNS))
  common.write_json(args.out, record)


if __name__ == '__main__':
  main(sys.argv[1:])
