"""How often the trainer routes a sampled token otherwise than the sampler did, for a model preset
at initialisation: one batch sampled, then the policy loss's forward over it without and with
router replay (docs/guide/router_replay.md).

  PYTHONPATH=. python bench/router_mismatch.py --preset=gpu1b --dtype=bfloat16 --moe_impl=bucketed

Prints one JSON line per replay setting: the fraction of (response token, layer) routing decisions
whose top-k differs from the sampler's (`router_mismatch`, as training logs it) and the mean and
largest |trainer - sampler| log-prob of the response tokens. Random prompts, no stop token (every
response runs to --new_tokens), temperature 1.
"""
import argparse
import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bench import common
from bench import presets
from rljax.model import moe
from rljax.model import transformer as model_lib
from rljax import policy_loss
from rljax.rollout import sampler as sampler_lib


def measure(cfg, responses, prompt_len, new_tokens, seed):
  """{replay: row} for one batch of `responses` sampled from `cfg`'s model at initialisation."""
  params = nn.unbox(model_lib.init_params(cfg, jax.random.PRNGKey(seed)))
  rng = np.random.default_rng(seed)
  prompt = jnp.asarray(rng.integers(2, cfg.vocab_size, (responses, prompt_len)), jnp.int32)
  valid = jnp.ones(prompt.shape, bool)
  sampling = sampler_lib.SamplingConfig(new_tokens, eos_id=-1)
  rollout = sampler_lib.make_sampler(model_lib.Transformer(cfg), sampling)(
      params, prompt, valid, jax.random.PRNGKey(seed))
  decisions = int(jnp.sum(rollout.experts_BxLxYxK[..., 0] >= 0))
  rows = {}
  for replay in (False, True):
    model = model_lib.Transformer(dataclasses.replace(cfg, router_replay=replay))
    logp, _, _, mismatch = jax.jit(lambda p, t, e, model=model: policy_loss.response_logprobs(
        model, p, prompt, valid, t, 1.0, 0, e))(params, rollout.tokens_BxL,
                                                rollout.experts_BxLxYxK)
    diff = np.abs(np.asarray(logp) - np.asarray(rollout.logp_BxL))
    rows[replay] = dict(router_mismatch=int(mismatch) / decisions,
                        logprob_mismatch=float(diff.mean()), logprob_mismatch_max=float(diff.max()))
  return rows


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--preset', default='tiny', choices=sorted(presets.PRESETS))
  parser.add_argument('--dtype', default='bfloat16', choices=['bfloat16', 'float32'])
  parser.add_argument('--moe_impl', default='bucketed', choices=sorted(moe.EXPERT_IMPLS))
  parser.add_argument('--responses', type=common.positive_int, default=64)
  parser.add_argument('--prompt_len', type=common.positive_int, default=8)
  parser.add_argument('--new_tokens', type=common.positive_int, default=16)
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args(argv)
  cfg = presets.get(args.preset, dtype=args.dtype, moe_impl=args.moe_impl)
  rows = measure(cfg, args.responses, args.prompt_len, args.new_tokens, args.seed)
  for replay, row in rows.items():
    print(json.dumps(dict(preset=args.preset, dtype=args.dtype, router_replay=replay,
                          responses=args.responses, new_tokens=args.new_tokens, **row,
                          load_1min=common.load_average())), flush=True)


if __name__ == '__main__':
  main()
