"""Model presets: rljax ModelConfig fields (rljax/model/transformer.py) by name, for
`configs/grpo.py:model=NAME`.

The Qwen3 shapes are the published config.json values of the Hugging Face model cards
(https://huggingface.co/Qwen/<name>/blob/main/config.json), mapped as rljax/hf/checkpoint.py's
model_config maps them: hidden_size -> d_model, num_hidden_layers -> num_layers,
num_attention_heads -> num_heads, num_key_value_heads -> num_kv_heads, head_dim,
intermediate_size -> dense_hidden, num_experts / num_experts_per_tok /
moe_intermediate_size -> num_experts / experts_per_token / expert_hidden (num_experts=0: a dense
model), tie_word_embeddings, rope_theta, rms_norm_eps, initializer_range -> init_std,
max_position_embeddings -> max_seq_len. All four use vocab 151936, rope_theta 1e6,
rms_norm_eps 1e-6, initializer_range 0.02, max_position_embeddings 40960; the MoEs route every layer
(decoder_sparse_step 1, mlp_only_layers []) with norm_topk_prob true.
With --config.init.hf_path=DIR the checkpoint's own config.json is read instead
(rljax/hf/checkpoint.py).
"""

# How the large presets run: bf16 compute over f32 master weights, grouped matmuls, full remat.
_RUNTIME = dict(moe_impl='ragged', dtype='bfloat16', param_dtype='float32', remat='full')
_QWEN3 = dict(vocab_size=151936, head_dim=128, rope_theta=1e6, norm_eps=1e-6, init_std=0.02,
              max_seq_len=40960,
              experts_per_token=0, expert_hidden=0,  # dense unless set
              **_RUNTIME)

PRESETS = {
    # The CPU demo and test model (~0.5M parameters).
    'tiny': dict(vocab_size=16, d_model=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                 num_experts=4, experts_per_token=2, expert_hidden=128, dense_hidden=512,
                 moe_impl='bucketed', tie_embeddings=False, rope_theta=10000.0, norm_eps=1e-6,
                 init_std=0.02, dtype='float32', param_dtype='float32', remat='none',
                 max_seq_len=64),
    # A ~1.3B-parameter Qwen3-MoE-shaped model on the arithmetic task's 16-token vocabulary.
    # Small enough to keep its matmuls' outputs for the backward pass ('dots': 1.3x fewer FLOPs
    # than full remat; an update of 64 x 256 tokens fits an H200: docs/performance.md).
    'moe1b': dict(vocab_size=16, d_model=1024, num_layers=16, num_heads=16, num_kv_heads=4,
                  head_dim=128, num_experts=32, experts_per_token=4, expert_hidden=768,
                  dense_hidden=3072, tie_embeddings=False, rope_theta=1e6, norm_eps=1e-6,
                  init_std=0.02, max_seq_len=4096, **dict(_RUNTIME, remat='dots')),
    # Qwen/Qwen3-0.6B: dense, tied embeddings.
    'qwen3-0.6b': dict(_QWEN3, d_model=1024, num_layers=28, num_heads=16, num_kv_heads=8,
                       dense_hidden=3072, num_experts=0, tie_embeddings=True),
    # Qwen/Qwen3-8B: dense.
    'qwen3-8b': dict(_QWEN3, d_model=4096, num_layers=36, num_heads=32, num_kv_heads=8,
                     dense_hidden=12288, num_experts=0, tie_embeddings=False),
    # Qwen/Qwen3-30B-A3B: 128 experts, 8 per token.
    'qwen3-30b-a3b': dict(_QWEN3, d_model=2048, num_layers=48, num_heads=32, num_kv_heads=4,
                          dense_hidden=6144, num_experts=128, experts_per_token=8,
                          expert_hidden=768, tie_embeddings=False),
    # Qwen/Qwen3-235B-A22B: 128 experts, 8 per token.
    'qwen3-235b-a22b': dict(_QWEN3, d_model=4096, num_layers=94, num_heads=64, num_kv_heads=4,
                            dense_hidden=12288, num_experts=128, experts_per_token=8,
                            expert_hidden=1536, tie_embeddings=False),
}


def preset(name):
  """A copy of preset `name`'s model fields; ValueError naming the presets otherwise."""
  if name not in PRESETS:
    raise ValueError(f'unknown model preset {name!r}; choose one of {", ".join(PRESETS)}')
  return dict(PRESETS[name])
