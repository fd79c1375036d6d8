"""rljax vs Tunix, side by side in one run: the same tiny Qwen3-MoE (bench/presets.py 'peer'), the
same lengths, batches, dtype and devices; sampler tokens/s at several batches and GRPO step time.

  PYTHONPATH=. python bench/peers.py --batches=1,8,64 --repeats=5

Tunix (google-tunix, pinned below) brings its own jax/flax, so it runs in its own virtual
environment (created here on first use) as a long-lived worker process (bench/peers_tunix.py);
this process sends it one measurement at a time and takes rljax's between them, so both see the
same machine load. Both sample at temperature 1 from the full distribution with log-probs, with a
stop id that is never drawn (every row decodes every step), and both timings cover the whole call
from host prompts to host tokens and log-probs.
"""
import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

import jax
import numpy as np

from bench import common
from bench import presets
from bench import sampler as sampler_bench
from bench import train_step as train_bench
from rljax.algos import grpo
from rljax.model import moe
from rljax.rollout import sampler as sampler_lib
from rljax import sharding

TUNIX = 'google-tunix==0.1.7'
VENV = os.path.join(os.path.dirname(os.path.abspath(__file__)), '.venv-tunix')


def tunix_python(venv=VENV):
  """The Tunix venv's interpreter, creating the venv (pinned Tunix) if it does not exist yet."""
  python = os.path.join(venv, 'bin', 'python')
  if not os.path.exists(python):
    subprocess.run([sys.executable, '-m', 'venv', venv], check=True)
    subprocess.run([python, '-m', 'pip', 'install', '-q', TUNIX], check=True)
  return python


class TunixWorker:
  """bench/peers_tunix.py in Tunix's venv, spoken to with one JSON line each way."""

  def __init__(self, spec, python):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS='cpu')
    self.proc = subprocess.Popen([python, '-m', 'bench.peers_tunix'], cwd=root, env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    self.info = self.ask(spec)

  def ask(self, request):
    self.proc.stdin.write(json.dumps(request) + '\n')
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f'the Tunix worker exited (code {self.proc.wait()})')
    reply = json.loads(line)
    if 'error' in reply:
      raise RuntimeError(f"Tunix: {reply['error']}\n{reply.get('traceback', '')}")
    return reply

  def close(self):
    if self.proc.poll() is None:
      self.proc.stdin.write(json.dumps(dict(cmd='quit')) + '\n')
      self.proc.stdin.close()
      self.proc.wait(timeout=60)


# ------------------------------------------------------------------ rljax side


def host_prompts(vocab_size, batch, prompt_len, seed):
  """The same prompts Tunix gets: BOS (id 1) then prompt_len - 1 random ids."""
  ids = np.random.default_rng(seed).integers(2, vocab_size, (batch, prompt_len - 1))
  prompt_BxT = np.concatenate([np.ones((batch, 1), np.int64), ids], axis=1).astype(np.int32)
  return prompt_BxT, np.ones_like(prompt_BxT, bool)


def rljax_sampler(model, params, mesh, max_new_tokens, prompt_len):
  """`sample(batch, seed)`: host prompts -> device -> sample -> host tokens and log-probs."""
  sample = sharding.on_mesh(sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
      max_new_tokens=max_new_tokens, eos_id=-1, pad_id=0, temperature=1.0)), mesh)

  def run(batch, seed):
    prompt_BxT, valid_BxT = sharding.put_batch(
        host_prompts(model.cfg.vocab_size, batch, prompt_len, seed), mesh)
    rollout = sample(params, prompt_BxT, valid_BxT, jax.random.PRNGKey(seed))
    tokens, logp = jax.device_get((rollout.tokens_BxL, rollout.logp_BxL))
    assert tokens.shape == (batch, max_new_tokens) and np.isfinite(logp).all()
    return tokens
  return run


def token_reward(tokens_BxL):
  """Share of even token ids per response (the same reward as peers_tunix_grpo.token_reward)."""
  return np.mean(tokens_BxL % 2 == 0, axis=-1).astype(np.float32)


def rljax_grpo(model, params, mesh, P, G, max_new_tokens, prompt_len):
  """`step(n) -> seconds`: the body of rljax.train.loop's loop on this reward, with Adam(1e-5)."""
  config = train_bench.grpo_defaults()
  config.optimizer.lr, config.optimizer.max_grad_norm = 1e-5, 0.0
  batch_size = P * G
  sample = sharding.on_mesh(sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
      max_new_tokens=max_new_tokens, eos_id=-1, pad_id=0, temperature=1.0)), mesh)
  make_batch = sharding.on_mesh(jax.jit(lambda r, rw, p, v: grpo.group_batch(
      r, rw, p, v, G=G, grpo_cfg=config.grpo)), mesh)
  update, _, optimizer = train_bench.make_update_step(model, 1, batch_size, mesh)
  state = dict(params=jax.tree.map(lambda x: x.copy(), params))
  state['opt_state'] = sharding.init_optimizer(optimizer, state['params'], mesh)

  def step(n):
    start = time.perf_counter()
    prompt_PxT, valid_PxT = host_prompts(model.cfg.vocab_size, P, prompt_len, n)
    prompt_BxT, valid_BxT = sharding.put_batch((np.repeat(prompt_PxT, G, 0),
                                                np.repeat(valid_PxT, G, 0)), mesh)
    rollout = sample(state['params'], prompt_BxT, valid_BxT, jax.random.PRNGKey(n))
    rewards_B = sharding.put_batch(token_reward(np.asarray(rollout.tokens_BxL)), mesh)
    batch, _ = make_batch(rollout, rewards_B, prompt_BxT, valid_BxT)
    state['params'], state['opt_state'], metrics = update(state['params'], state['opt_state'],
                                                          batch, None)
    assert np.isfinite(float(jax.device_get(metrics['loss'])))
    return time.perf_counter() - start
  return step


# ------------------------------------------------------------------ side by side


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--batches', type=common.positive_ints, default='1,8,64')
  parser.add_argument('--prompt_len', type=common.positive_int, default=16)
  parser.add_argument('--max_new_tokens', type=common.positive_int, default=32)
  parser.add_argument('--repeats', type=common.positive_int, default=5)
  parser.add_argument('--P', type=common.positive_int, default=4)
  parser.add_argument('--G', type=common.positive_int, default=4)
  parser.add_argument('--grpo_steps', type=common.positive_int, default=4)
  parser.add_argument('--skip_grpo', action='store_true')
  parser.add_argument('--moe_impl', default='', choices=sorted(moe.EXPERT_IMPLS),
                      help="rljax's MoE implementation (default: the preset's)")
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  batches = args.batches

  cfg = presets.get('peer', **({'moe_impl': args.moe_impl} if args.moe_impl else {}))
  spec = dict(model=dataclasses.asdict(cfg), prompt_len=args.prompt_len,
              max_new_tokens=args.max_new_tokens)
  tunix = TunixWorker(spec, tunix_python())
  print(f'Tunix worker: {TUNIX}, jax {tunix.info["jax"]}, {tunix.info["devices"]}', flush=True)
  model, params, mesh = sampler_bench.setup(cfg)
  record = dict(machine=common.machine(), tunix=TUNIX, tunix_jax=tunix.info['jax'],
                model=spec['model'], params=common.param_counts(cfg), sampler=[], grpo=None,
                command='python bench/peers.py ' + ' '.join(argv))
  try:
    # ---------------------------------------------------------------- sampler
    sample = rljax_sampler(model, params, mesh, args.max_new_tokens, args.prompt_len)
    times = {b: dict(rljax=[], tunix=[], load=[]) for b in batches}
    compile_s = {}
    for b in batches:
      start = time.perf_counter()
      sample(b, 0)
      compile_s[b] = dict(rljax=time.perf_counter() - start,
                          tunix=tunix.ask(dict(cmd='sample', batch=b, repeats=0))['compile_s'])
    for r in range(args.repeats):       # interleaved: rljax, Tunix, rljax, Tunix, ...
      for b in batches:
        start = time.perf_counter()
        sample(b, 1 + r)
        times[b]['rljax'].append(time.perf_counter() - start)
        times[b]['tunix'] += tunix.ask(dict(cmd='sample', batch=b, repeats=1, seed=1 + r))['times']
        times[b]['load'].append(common.load_average())
    for b in batches:
      rl, rl_spread = common.median_spread(times[b]['rljax'])
      tx, tx_spread = common.median_spread(times[b]['tunix'])
      tokens = b * args.max_new_tokens
      row = dict(batch=b, rljax_tok_s=tokens / rl, tunix_tok_s=tokens / tx, ratio=tx / rl,
                 rljax_s=rl, tunix_s=tx, rljax_spread=rl_spread, tunix_spread=tx_spread,
                 rljax_compile_s=compile_s[b]['rljax'], tunix_compile_s=compile_s[b]['tunix'],
                 load_1min=float(np.median(times[b]['load'])))
      record['sampler'].append(row)
    print(common.table(record['sampler'], ['batch', 'rljax_tok_s', 'tunix_tok_s', 'ratio',
                                           'rljax_spread', 'tunix_spread', 'rljax_compile_s',
                                           'tunix_compile_s', 'load_1min']), flush=True)

    # ---------------------------------------------------------------- GRPO step
    if not args.skip_grpo:
      step = rljax_grpo(model, params, mesh, args.P, args.G, args.max_new_tokens, args.prompt_len)
      start = time.perf_counter()
      step(0)
      rljax_first = time.perf_counter() - start
      rljax_times = [step(n) for n in range(1, args.grpo_steps + 1)]      # A
      load = [common.load_average()]
      try:
        tx = tunix.ask(dict(cmd='grpo', P=args.P, G=args.G, steps=args.grpo_steps))   # B
        tunix_times, tunix_first, tunix_error = tx['times'], tx['first_s'], None
      except RuntimeError as e:
        tunix_times, tunix_first, tunix_error = [], None, str(e)
      load.append(common.load_average())
      rljax_times += [step(n) for n in range(100, 100 + args.grpo_steps)]  # A again
      rl, rl_spread = common.median_spread(rljax_times)
      grpo = dict(P=args.P, G=args.G, responses=args.P * args.G, max_new_tokens=args.max_new_tokens,
                  rljax_step_s=rl, rljax_spread=rl_spread, rljax_first_step_s=rljax_first,
                  load_1min=float(np.median(load)))
      if tunix_times:
        tx_med, tx_spread = common.median_spread(tunix_times)
        grpo.update(tunix_step_s=tx_med, tunix_spread=tx_spread, tunix_first_step_s=tunix_first,
                    ratio=tx_med / rl)
      else:
        grpo['tunix_error'] = tunix_error
      record['grpo'] = grpo
      print(common.table([grpo], [k for k in grpo if k != 'tunix_error']), flush=True)
      if tunix_error:
        print('Tunix GRPO failed:', tunix_error)
  finally:
    tunix.close()
  print(record['machine'])
  common.write_json(args.out, record)


if __name__ == '__main__':
  main(sys.argv[1:])
