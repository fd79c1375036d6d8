"""Model presets of the benchmarks (rljax.model.transformer.ModelConfig fields).

tiny   the runlocal model of configs/grpo.py (~0.3M params): a baseline that fits in any cache.
cpu    ~130M-param MoE (0.5 GB in f32, above this CPU's 480 MB L3): decode at low batch streams
       its weights from DRAM, the regime the memory roofline describes.
gpu1b  the ~1.3B-param Qwen3-MoE-shaped default model of configs/grpo.py (bf16 compute).
peer   the tiny Qwen3-MoE that bench/peers.py builds in both rljax and Tunix.
"""
from configs import common
from rljax.model import transformer as model_lib

PRESETS = {
    'tiny': common.model_preset(runlocal=True),
    'cpu': dict(common.model_preset(runlocal=True), vocab_size=4096, d_model=640, num_layers=6,
                num_heads=10, num_kv_heads=2, head_dim=64, num_experts=16, experts_per_token=2,
                expert_hidden=640),
    'gpu1b': common.model_preset(runlocal=False),
    'peer': dict(common.model_preset(runlocal=True), vocab_size=1024, d_model=256, num_layers=4,
                 num_heads=4, num_kv_heads=2, head_dim=64, num_experts=8, experts_per_token=2,
                 expert_hidden=256, rope_theta=1e6),
}


def get(name, **overrides):
  if name not in PRESETS:
    raise ValueError(f'unknown preset {name!r}; choose one of {sorted(PRESETS)}')
  return model_lib.ModelConfig.from_config(dict(PRESETS[name], **overrides))
