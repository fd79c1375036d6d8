"""Tunix side of bench/peers.py; runs inside Tunix's own virtual environment (its own jax/flax).

A long-lived worker: it builds Tunix's Qwen3-MoE with the shapes it is given (random weights), then
answers one JSON command per stdin line with one JSON line on stdout, so the driver can interleave
Tunix and rljax measurements on the same cores. Commands:
  {"cmd": "sample", "batch": B, "repeats": R, "seed": S}   -> {"times": [...], "compile_s": ...}
  {"cmd": "grpo", "P": P, "G": G, "steps": N}              -> {"times": [...], ...}
                                                              or {"error": ...}
"""
import json
import sys
import time
import traceback

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from tunix.generate import sampler as sampler_lib
from tunix.models.qwen3 import model as qwen3


class IdTokenizer:
  """Text of space-separated token ids <-> ids: the benchmark needs no real vocabulary."""

  def __init__(self, vocab_size):
    self.vocab_size = vocab_size

  def encode(self, text, **_):
    if not isinstance(text, str):   # Tunix's GRPO passes numpy arrays of strings
      text = ' '.join(str(x) for x in np.asarray(text).reshape(-1))
    return [int(t) for t in text.split()]

  def decode(self, ids, **_):
    return ' '.join(str(int(i)) for i in ids)

  def bos_id(self):
    return 1

  def eos_id(self):
    return self.vocab_size + 7     # never sampled: every row decodes every step

  def pad_id(self):
    return 0


def build_model(shapes):
  config = qwen3.ModelConfig(
      num_layers=shapes['num_layers'], vocab_size=shapes['vocab_size'],
      embed_dim=shapes['d_model'], hidden_dim=shapes['expert_hidden'],
      num_heads=shapes['num_heads'], head_dim=shapes['head_dim'],
      num_kv_heads=shapes['num_kv_heads'], rope_theta=int(shapes['rope_theta']),
      norm_eps=shapes['norm_eps'], use_tied_embedding=shapes['tie_embeddings'],
      num_experts=shapes['num_experts'], num_experts_per_tok=shapes['experts_per_token'],
      dtype=jnp.dtype(shapes['dtype']), param_dtype=jnp.dtype(shapes['param_dtype']))
  return qwen3.Qwen3(config, rngs=nnx.Rngs(0)), config


def prompts_text(batch, prompt_len, vocab_size, seed):
  # Tunix's sampler prepends BOS: prompt_len - 1 ids make prompt_len tokens.
  ids = np.random.default_rng(seed).integers(2, vocab_size, (batch, prompt_len - 1))
  return [' '.join(map(str, row)) for row in ids]


class Worker:

  def __init__(self, spec):
    self.spec = spec
    self.model, self.config = build_model(spec['model'])
    self.tokenizer = IdTokenizer(spec['model']['vocab_size'])
    s = spec['model']
    self.sampler = sampler_lib.Sampler(
        self.model, self.tokenizer,
        sampler_lib.CacheConfig(cache_size=spec['prompt_len'] + spec['max_new_tokens'],
                                num_layers=s['num_layers'], num_kv_heads=s['num_kv_heads'],
                                head_dim=s['head_dim']))
    self.compiled = set()

  def sample_once(self, batch, seed):
    out = self.sampler(prompts_text(batch, self.spec['prompt_len'],
                                    self.spec['model']['vocab_size'], seed),
                       max_generation_steps=self.spec['max_new_tokens'],
                       max_prompt_length=self.spec['prompt_len'], temperature=1.0, top_p=1.0,
                       return_logprobs=True, seed=seed)
    lengths = {len(t) for t in out.tokens}
    if lengths != {self.spec['max_new_tokens']}:
      raise RuntimeError(f'Tunix returned response lengths {lengths}')
    return out

  def sample(self, batch, repeats, seed=0):
    compile_s = None
    if batch not in self.compiled:
      start = time.perf_counter()
      self.sample_once(batch, seed)
      compile_s = time.perf_counter() - start
      self.compiled.add(batch)
    times = []
    for r in range(repeats):
      start = time.perf_counter()
      self.sample_once(batch, seed + 1 + r)
      times.append(time.perf_counter() - start)
    return dict(times=times, compile_s=compile_s)


def main():
  spec = json.loads(sys.stdin.readline())
  worker = Worker(spec)
  print(json.dumps(dict(ready=True, jax=jax.__version__, devices=str(jax.devices()))), flush=True)
  for line in sys.stdin:
    request = json.loads(line)
    try:
      if request['cmd'] == 'sample':
        reply = worker.sample(request['batch'], request['repeats'], request.get('seed', 0))
      elif request['cmd'] == 'grpo':
        from bench import peers_tunix_grpo  # pylint: disable=g-import-not-at-top
        reply = peers_tunix_grpo.run(worker, request)
      elif request['cmd'] == 'quit':
        break
      else:
        reply = dict(error=f'unknown command {request["cmd"]!r}')
    except Exception as e:  # pylint: disable=broad-except
      reply = dict(error=f'{type(e).__name__}: {e}', traceback=traceback.format_exc()[-3000:])
    print(json.dumps(reply), flush=True)


if __name__ == '__main__':
  main()
