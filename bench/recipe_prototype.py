"""RECIPE.md's plain-JAX GRPO prototype, rebuilt, to tell the model apart from the pipeline.

One small loop (no rljax training code): 3-digit addition, supervised warm start to a greedy
accuracy threshold, then GRPO (G=8, group z-scores, token-mean policy gradient, one Adam step per
rollout batch, no KL, no clipping). The policy is either RECIPE.md's prototype architecture
(learned positions, LayerNorm, multi-head attention and GELU MLP with biases, Flax default init)
or rljax's runlocal model (configs/grpo.py). Warm-start and RL seeds are separate, so one can ask
whether the warm-start checkpoint or the RL sampling decides a run.

  PYTHONPATH=. python bench/recipe_prototype.py --model prototype --seeds 0,1,2,3
  PYTHONPATH=. python bench/recipe_prototype.py --model rljax --seeds 1 --rl_seeds 0,1,2,3
"""
import argparse
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bench import common
from configs import grpo as grpo_config
from rljax import model as model_lib
from rljax import tokenizer as tokenizer_lib

TOKENIZER = tokenizer_lib.ArithmeticTokenizer()
PAD, EOS = TOKENIZER.pad_id, TOKENIZER.eos_id
PROMPT_LEN, ANSWER_LEN = 8, 5      # '037+048=' and up to 4 digits + EOS


def problems(rng, n):
  a, b = rng.integers(0, 1000, n), rng.integers(0, 1000, n)
  prompts = np.array([TOKENIZER.encode(f'{x:03d}+{y:03d}=') for x, y in zip(a, b)], np.int32)
  return prompts, a + b


def answer_tokens(total):
  ids = TOKENIZER.encode(str(total)) + [EOS]
  return ids + [PAD] * (ANSWER_LEN - len(ids))


class Prototype(nn.Module):
  """RECIPE.md's model: d=128, 2 pre-LN layers, 4 heads, GELU MLP 512, learned positions."""

  @nn.compact
  def __call__(self, tokens_BxT):
    length = tokens_BxT.shape[1]
    positions = self.param('pos', nn.initializers.normal(0.02), (PROMPT_LEN + ANSWER_LEN, 128))
    h = nn.Embed(16, 128)(tokens_BxT) + positions[:length]
    mask = nn.make_causal_mask(tokens_BxT)
    for _ in range(2):
      y = nn.LayerNorm()(h)
      h = h + nn.MultiHeadDotProductAttention(4)(y, y, mask=mask)
      y = nn.LayerNorm()(h)
      h = h + nn.Dense(128)(nn.gelu(nn.Dense(512)(y)))
    return nn.Dense(16)(nn.LayerNorm()(h))


def build(kind, seed):
  """(params, apply(params, tokens_BxT) -> logits_BxTxV) for 'prototype' or 'rljax'."""
  key = jax.random.PRNGKey(seed)
  if kind == 'prototype':
    module = Prototype()
    params = module.init(key, jnp.zeros((1, PROMPT_LEN + ANSWER_LEN), jnp.int32))['params']
    return params, lambda p, x: module.apply({'params': p}, x)
  preset = dict(grpo_config.model_preset(runlocal=True))
  cfg = model_lib.ModelConfig.from_config(preset)
  module = model_lib.Transformer(cfg)
  params = nn.meta.unbox(model_lib.init_params(cfg, key))
  return params, lambda p, x: module.apply({'params': p}, x, jnp.ones(x.shape, bool))[0]


def run(kind, seed, rl_seed, args):
  rng = np.random.default_rng(seed)
  test_prompts, test_totals = problems(np.random.default_rng(12345), 500)
  params, apply = build(kind, seed)

  @jax.jit
  def generate(params, prompts_BxT, key, greedy):
    """No KV cache (13 tokens): the full forward again for each of the 5 answer tokens."""
    seq = jnp.concatenate([prompts_BxT, jnp.zeros((prompts_BxT.shape[0], ANSWER_LEN), jnp.int32)], 1)
    done_B = jnp.zeros(prompts_BxT.shape[0], bool)
    masks = []
    for t in range(ANSWER_LEN):
      logits_BxV = apply(params, seq[:, :PROMPT_LEN + t])[:, -1]
      key, sub = jax.random.split(key)
      token_B = jnp.where(greedy, jnp.argmax(logits_BxV, -1), jax.random.categorical(sub, logits_BxV))
      token_B = jnp.where(done_B, PAD, token_B)
      masks.append(~done_B)
      seq = seq.at[:, PROMPT_LEN + t].set(token_B)
      done_B = done_B | (token_B == EOS)
    return seq[:, PROMPT_LEN:], jnp.stack(masks, 1)

  def correct(tokens_BxL, totals_B):
    return np.array([TOKENIZER.decode(row) == str(t) for row, t in zip(np.asarray(tokens_BxL), totals_B)])

  def evaluate(params):
    tokens, _ = generate(params, jnp.asarray(test_prompts), jax.random.PRNGKey(0), True)
    return correct(tokens, test_totals).mean()

  def answer_logp(p, prompts_BxT, answers_BxL):
    """Log-probs of the answer tokens, teacher-forced after the prompt: [B, ANSWER_LEN]."""
    inputs = jnp.concatenate([prompts_BxT, answers_BxL[:, :ANSWER_LEN - 1]], 1)
    logp_BxLxV = jax.nn.log_softmax(apply(p, inputs)[:, PROMPT_LEN - 1:])
    return jnp.take_along_axis(logp_BxLxV, answers_BxL[..., None], -1)[..., 0]

  def adam_step(lr, loss):
    """(jitted step(params, opt_state, *batch) -> (params, opt_state), optimizer) for `loss`."""
    optimizer = optax.adam(lr)

    @jax.jit
    def step(params, opt_state, *batch):
      grads = jax.grad(loss)(params, *batch)
      updates, opt_state = optimizer.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state
    return step, optimizer

  # Warm start: cross-entropy on answer + EOS tokens, stopped at the first eval >= threshold.
  def sft_loss(p, prompts_BxT, answers_BxL):
    mask_BxL = (jnp.cumsum(answers_BxL == EOS, 1) - (answers_BxL == EOS)) == 0
    return -jnp.sum(answer_logp(p, prompts_BxT, answers_BxL) * mask_BxL) / jnp.sum(mask_BxL)
  sft_step, optimizer = adam_step(1e-3, sft_loss)
  opt_state = optimizer.init(params)

  start, step, accuracy = time.time(), 0, 0.0
  while step < 4000:
    step += 1
    prompts, totals = problems(rng, 128)
    answers = np.array([answer_tokens(t) for t in totals], np.int32)
    params, opt_state = sft_step(params, opt_state, jnp.asarray(prompts), jnp.asarray(answers))
    if step >= args.min_steps and step % 5 == 0:
      accuracy = evaluate(params)
      if accuracy >= args.threshold:
        break
  print(f'{kind} seed {seed}: warm start {step} steps, {time.time() - start:.0f} s, '
        f'held-out {accuracy:.3f}', flush=True)

  # GRPO: token-mean policy gradient with group z-score advantages.
  def grpo_loss(p, prompts_BxT, tokens_BxL, mask_BxL, advantages_B):
    logp_BxL = answer_logp(p, prompts_BxT, tokens_BxL)
    return -jnp.sum(logp_BxL * advantages_B[:, None] * mask_BxL) / jnp.sum(mask_BxL)
  grpo_step, optimizer = adam_step(args.lr, grpo_loss)
  opt_state = optimizer.init(params)
  P, G = args.P, 8
  rng, key = np.random.default_rng([seed, rl_seed]), jax.random.PRNGKey(rl_seed)

  curve, samples, start = [(0, accuracy)], 0, time.time()
  while samples < args.samples:
    prompts, totals = problems(rng, P)
    prompts, totals = np.repeat(prompts, G, 0), np.repeat(totals, G)
    key, sub = jax.random.split(key)
    tokens, mask = generate(params, jnp.asarray(prompts), sub, False)
    rewards_PxG = correct(tokens, totals).astype(np.float32).reshape(P, G)
    advantages = (rewards_PxG - rewards_PxG.mean(1, keepdims=True)) / (rewards_PxG.std(1, keepdims=True) + 1e-6)
    params, opt_state = grpo_step(params, opt_state, jnp.asarray(prompts), tokens,
                                  mask.astype(jnp.float32), jnp.asarray(advantages.reshape(-1)))
    samples += P * G
    if samples % args.eval_every < P * G:
      curve.append((samples, evaluate(params)))
  gain = curve[-1][1] - curve[0][1]
  print(f'{kind} seed {seed} rl_seed {rl_seed}: ' + ' '.join(f'{s // 1000}k:{a:.3f}' for s, a in curve)
        + f' | +{100 * gain:.0f} points, {time.time() - start:.0f} s of RL', flush=True)
  return gain


def seed_list(text):
  try:
    return [int(s) for s in text.split(',')]
  except ValueError:
    raise argparse.ArgumentTypeError(f'expected comma-separated integers, got {text!r}') from None


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', choices=['prototype', 'rljax'], default='prototype')
  parser.add_argument('--seeds', type=seed_list, default=[0], help='warm-start seeds, comma-separated')
  parser.add_argument('--rl_seeds', type=seed_list, default=[0], help='RL seeds from each warm start')
  parser.add_argument('--threshold', type=float, default=0.3)
  parser.add_argument('--min_steps', type=common.positive_int, default=200,
                      help='warm-start steps before evaluating')
  parser.add_argument('--lr', type=float, default=5e-5)
  parser.add_argument('--P', type=common.positive_int, default=16)
  parser.add_argument('--samples', type=common.positive_int, default=40960)
  parser.add_argument('--eval_every', type=common.positive_int, default=8192)
  args = parser.parse_args()
  if not 0.0 <= args.threshold <= 1.0:
    parser.error(f'--threshold is an accuracy in [0, 1], got {args.threshold}')
  if not args.lr > 0:
    parser.error(f'--lr must be positive, got {args.lr}')
  gains = [run(args.model, s, r, args) for s in args.seeds for r in args.rl_seeds]
  print(f'{args.model}: gains ' + ', '.join(f'+{100 * g:.0f}' for g in gains) +
        f' points (mean +{100 * np.mean(gains):.0f})')


if __name__ == '__main__':
  main()
