"""Builds the tiny Hugging Face test models and the reference outputs rljax must reproduce.

Needs torch + transformers + tokenizers (only to REGENERATE; the tests read the files):
  pip install torch==2.13.0 transformers tokenizers   # CPU build
  python tests/testdata/make_tiny_hf.py

Writes, next to this script:
  tiny_qwen3/, tiny_qwen3_moe/   config.json, safetensors (the MoE one sharded, with an index),
                                 tokenizer.json, tokenizer_config.json (+ chat template)
  <model>/reference.npz          tokens_BxT, mask_BxT, positions_BxT, logits_BxTxV (float32, from
                                 transformers), greedy_BxN (transformers' greedy generate),
                                 chat_ids (apply_chat_template of a sample question)
The tokenizer is a byte-level BPE trained with `tokenizers` on the sample math files, with
Qwen-style special tokens and a Qwen-style chat template. Weights are random but scaled so logits
are O(1) and greedy choices have clear margins (a tight parity check, not a near-uniform one).
"""
import json
import os
import shutil

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
SPECIAL = ['<|endoftext|>', '<|im_start|>', '<|im_end|>']
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
VOCAB = 512
MIN_DISTINCT = 4
MIN_MARGIN = 1e-2


def corpus():
  texts = []
  for name in ('gsm8k_sample.jsonl', 'math_sample.jsonl'):
    with open(os.path.join(HERE, name)) as f:
      texts += [value for line in f for value in json.loads(line).values()]
  return texts + [f'{i} + {j} = {i + j}' for i in range(20) for j in range(20)]


def make_tokenizer(out_dir):
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(corpus(), trainer)
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, eos_token='<|im_end|>', pad_token='<|endoftext|>')
  fast.chat_template = CHAT_TEMPLATE
  fast.save_pretrained(out_dir)
  return fast


def randomize(model, seed):
  """Random weights at scales that make every piece matter (norm weights included)."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      if 'norm' in name:
        p.copy_(1.0 + 0.3 * noise)
      elif 'embed' in name:
        p.copy_(0.3 * noise)   # small next to the layers' outputs, so outputs depend on context
      elif name.endswith('mlp.gate.weight'):
        p.copy_(0.8 * noise)   # router: varied, confident routing
      else:
        scale = 3.0 if name.startswith('lm_head') else 1.5
        p.copy_(noise * scale / p.shape[-1] ** 0.5)


def reference(model, tokenizer, questions, out_path, new_tokens=12):
  chats = [tokenizer.apply_chat_template([{'role': 'user', 'content': q}],
                                         add_generation_prompt=True, tokenize=True)
           for q in questions]
  chats = [list(c['input_ids']) if isinstance(c, dict) or hasattr(c, 'keys') else list(c)
           for c in chats]
  ids = [chats[0][:24], chats[1][:17]]    # two rows, the second left-padded by 7
  T = max(map(len, ids))
  tokens = np.full((len(ids), T), tokenizer.pad_token_id, np.int64)
  mask = np.zeros((len(ids), T), bool)
  for row, seq in enumerate(ids):
    tokens[row, T - len(seq):] = seq
    mask[row, T - len(seq):] = True
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
                position_ids=torch.tensor(positions))
    logits = out.logits.float().numpy()
    generated = model.generate(
        input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
        do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=None)
    scores = model(input_ids=generated, attention_mask=torch.cat(
        [torch.tensor(mask.astype(np.int64)),
         torch.ones(len(ids), new_tokens, dtype=torch.int64)], 1),
        position_ids=torch.tensor(np.concatenate(
            [positions, positions[:, -1:] + 1 + np.arange(new_tokens)], 1))).logits
  top2 = torch.topk(scores[:, T - 1:-1].float(), 2, dim=-1).values
  margin = float((top2[..., 0] - top2[..., 1]).min())
  distinct = min(len(set(row)) for row in generated[:, T:].tolist())
  print(f'{out_path}: min greedy margin {margin:.4f}, logits std {logits[mask].std():.3f}, '
        f'distinct greedy tokens per row >= {distinct}')
  if margin < MIN_MARGIN or distinct < MIN_DISTINCT:
    return False   # a near-tie or a degenerate (looping) output: a weak test; try another seed
  np.savez(out_path, tokens_BxT=tokens.astype(np.int32), mask_BxT=mask,
           positions_BxT=positions.astype(np.int32), logits_BxTxV=logits,
           greedy_BxN=generated[:, T:].numpy().astype(np.int32),
           chat_ids=np.asarray(chats[0], np.int32))
  return True


def build(name, config, questions, shard_size=None):
  """The first seed whose model gives a strong test (clear greedy margins, varied output)."""
  out_dir = os.path.join(HERE, name)
  for seed in range(50):
    shutil.rmtree(out_dir, ignore_errors=True)
    tokenizer = make_tokenizer(out_dir)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    randomize(model, seed)
    kwargs = dict(max_shard_size=shard_size) if shard_size else {}
    model.save_pretrained(out_dir, **kwargs)
    if reference(model, tokenizer, questions, os.path.join(out_dir, 'reference.npz')):
      print(f'{name}: seed {seed}')
      return
  raise RuntimeError(f'no seed gave a usable {name}')


def main():
  with open(os.path.join(HERE, 'gsm8k_sample.jsonl')) as f:
    questions = [json.loads(line)['question'] for line in f][:2]
  common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
                bos_token_id=None, eos_token_id=2, pad_token_id=0)
  build('tiny_qwen3', transformers.Qwen3Config(
      head_dim=16, tie_word_embeddings=True, rms_norm_eps=1e-6,
      rope_parameters={'rope_type': 'default', 'rope_theta': 500.0}, **common), questions)
  build('tiny_qwen3_moe', transformers.Qwen3MoeConfig(
      head_dim=8, tie_word_embeddings=False, rms_norm_eps=1e-5, num_experts=8,
      num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True, decoder_sparse_step=1,
      mlp_only_layers=[], rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0},
      **common), questions, shard_size='150KB')


if __name__ == '__main__':
  main()
