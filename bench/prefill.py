"""Each GRPO prompt prefilled once: the sampler with every prompt repeated G times (old: P x G
prompt rows, group 1) vs each prompt prefilled once for its G responses (new: P rows, group G),
side by side in one run; optionally the same samplers compiled for a TPU slice (compile only).

  PYTHONPATH=. python bench/prefill.py --preset=cpu --P=4 --G=8 --prompt_len=128 \
      --tpu=tpu:v5e-8 --tpu_slots=0 --out=bench/results/cpu/prefill.json

CPU: after checking that old and new build the same cache (tests/tolerance.py's
ACROSS_PROGRAMS), the wall seconds of the prefill (the jitted `sampler.prefill`, new: with the
repeat of the cache rows) and of the whole sampler (static, and continuous over `--slots`; no row
stops), medians of calls alternated one each per round so machine load hits all alike; and the
sampler's compiled temporaries (XLA's `memory_analysis()`, the KV cache among them).

TPU (`--tpu`): configs/grpo.py's default model at --tpu_P prompts x G on the target's
compile-only devices, at the task's lengths and at --tpu_lengths, static and (`--tpu_slots` > 0)
continuous: the compiled temporaries (past HBM: what libtpu says they need) and the KV cache per
chip (rljax.aot.planner.kv_cache_bytes).
"""
import argparse
import dataclasses
import re
import sys

import jax
import numpy as np

from bench import common
from bench import presets
from bench import sampler as sampler_bench
from configs import grpo as grpo_config
from rljax.aot import planner
from rljax.aot import costs
from rljax.aot import targets
from rljax.rollout import sampler as sampler_lib
from rljax import sharding
from rljax.train import run as run_lib

ACROSS_PROGRAMS = dict(rtol=2e-5, atol=2e-5)   # tests/tolerance.py: two compiled programs


def variants(P, G):
  """{name: (prompt rows, responses per row)}: the old and the new way to get P x G responses."""
  return dict(old=(P * G, 1), new=(P, G))


def prompt_rows(prompt_PxT, valid_PxT, repeats, mesh):
  """Each prompt's row `repeats` times in a row (group-major), on the mesh."""
  return sharding.put_batch((np.repeat(prompt_PxT, repeats, 0), np.repeat(valid_PxT, repeats, 0)),
                            mesh)


def temporaries(sample, *args):
  """Bytes of the compiled program's temporaries (XLA's memory analysis)."""
  return sample.lower(*args).compile().memory_analysis().temp_size_in_bytes


def cpu_record(preset, P, G, prompt_len, new_tokens, slots, repeats):
  """Prefill seconds and compiled sampler temporaries, old and new, and their ratios."""
  model, params, mesh = sampler_bench.setup(presets.get(preset))
  prompt_PxT, valid_PxT = (np.asarray(x) for x in sampler_bench.random_prompts(
      model.cfg, P, prompt_len, mesh))
  inputs = {name: prompt_rows(prompt_PxT, valid_PxT, G // group, mesh)
            for name, (_, group) in variants(P, G).items()}
  prefills = {name: sharding.on_mesh(jax.jit(lambda p, x, v, group=group: sampler_lib.prefill(
      model, p, x, v, new_tokens, group)[2]), mesh) for name, (_, group) in variants(P, G).items()}
  caches = {name: jax.device_get(prefills[name](params, *inputs[name])) for name in prefills}
  jax.tree.map(lambda old, new: np.testing.assert_allclose(
      np.asarray(new, np.float32), np.asarray(old, np.float32), **ACROSS_PROGRAMS),
      caches['old'], caches['new'])
  key = jax.random.PRNGKey(0)
  calls, row = {}, dict(P=P, G=G, prompt_len=prompt_len, new_tokens=new_tokens, slots=slots)
  for name, prefill in prefills.items():
    calls[f'prefill_{name}'] = lambda prefill=prefill, name=name: prefill(params, *inputs[name])
  for schedule, num_slots in (('static', 0), ('continuous', slots)):
    for name, (_, group) in variants(P, G).items():
      sample = sharding.on_mesh(sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
          new_tokens, eos_id=-1, slots=num_slots, group=group)), mesh)
      row[f'{schedule}_temp_{name}_MiB'] = temporaries(sample, params, *inputs[name], key) / 2**20
      calls[f'{schedule}_sampler_{name}'] = lambda sample=sample, name=name: sample(
          params, *inputs[name], key)
  for call, seconds in common.alternated(calls, repeats).items():
    row[f'{call}_s'] = float(np.median(seconds))
  return ratios(row), dict(machine=common.machine(), preset=preset, params=common.param_counts(
      model.cfg), load_1min=common.load_average())


def ratios(row):
  """The row with new / old of each measured pair."""
  for old_key in [k for k in row if '_old_' in k]:
    row[old_key.replace('_old_', '_new/old_').rsplit('_', 1)[0]] = (
        row[old_key.replace('_old_', '_new_')] / row[old_key])
  return row


def tpu_rows(target_name, P, G, slots, lengths):
  """configs/grpo.py's default model on `target_name`, compiled only: per chip, the sampler's
  temporaries and KV cache, old and new, static and continuous, at each (prompt, new) length."""
  target = targets.parse_target(target_name)
  config = grpo_config.get_config(f'P={P},G={G}')
  mesh = sharding.make_mesh(config.mesh, target.devices())
  rows = []
  for num_slots in sorted({0, slots}):   # static, and continuous unless slots is 0
    config.rollout.slots = num_slots
    s = run_lib.abstract_setup(config, mesh)
    for prompt_len, new_tokens in [(s.prompt_len, s.new_tokens)] + lengths:
      at = s._replace(prompt_len=prompt_len, new_tokens=new_tokens)
      row = dict(target=target_name, P=P, G=G, prompt_len=prompt_len, new_tokens=new_tokens,
                 slots=num_slots)
      for name, (prompts, group) in variants(P, G).items():
        row[f'kv_{name}_MiB'] = planner.kv_cache_bytes(at, group) / 2**20
        row[f'temp_{name}_MiB'] = tpu_temporaries(s, mesh, prompts, prompt_len, new_tokens,
                                                  num_slots, group) / 2**20
      rows.append(ratios(row))
      print(common.table([row], list(row)), flush=True)
  return rows


def tpu_temporaries(s, mesh, prompts, prompt_len, new_tokens, slots, group):
  """The compiled sampler's temporaries per chip, or past HBM the bytes libtpu says it needs."""
  try:
    sampling = dataclasses.replace(s.sampling, max_new_tokens=new_tokens, slots=slots, group=group)
    return costs.sampler(s.model, s.algo.state['params'], mesh, sampling, prompts,
                         prompt_len)['memory']['temporaries']
  except MemoryError as error:   # '... required for HLO temporaries (43.23G) exceeds ...'
    return float(re.search(r'temporaries \(([\d.]+)G\)', str(error)).group(1)) * 2**30


def length_pairs(text):
  """'512:128,1024:256' -> [(512, 128), (1024, 256)] (prompt, new tokens)."""
  pairs = [tuple(common.positive_int(n) for n in item.split(':')) for item in text.split(',')
           if item]
  if any(len(pair) != 2 for pair in pairs):
    raise argparse.ArgumentTypeError(f'expected prompt:new pairs, got {text!r}')
  return pairs


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--preset', default='cpu', choices=sorted(presets.PRESETS))
  parser.add_argument('--P', type=common.positive_int, default=4)
  parser.add_argument('--G', type=common.positive_int, default=8)
  parser.add_argument('--prompt_len', type=common.positive_int, default=128)
  parser.add_argument('--new_tokens', type=common.positive_int, default=16)
  parser.add_argument('--slots', type=common.positive_int, default=16)
  parser.add_argument('--repeats', type=common.positive_int, default=5)
  parser.add_argument('--tpu', default='', help='a target of rljax.aot.targets, e.g. tpu:v5e-8')
  parser.add_argument('--tpu_P', type=common.positive_int, default=1024)
  parser.add_argument('--tpu_slots', type=int, default=256, help='0: static batching only')
  parser.add_argument('--tpu_lengths', type=length_pairs, default='128:32')
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  row, record = cpu_record(args.preset, args.P, args.G, args.prompt_len, args.new_tokens,
                           args.slots, args.repeats)
  print(f"{record['machine']}\npreset {args.preset}: {record['params']['total'] / 1e6:.1f}M params")
  print(common.table([row], list(row)), flush=True)
  record['cpu'] = row
  if args.tpu:
    record['tpu'] = tpu_rows(args.tpu, args.tpu_P, args.G, args.tpu_slots, args.tpu_lengths)
  common.write_json(args.out, record)


if __name__ == '__main__':
  main(sys.argv[1:])
