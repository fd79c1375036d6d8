"""Hugging Face config.json <-> rljax ModelConfig for Qwen3 / Qwen3-MoE: which architectures rljax
computes exactly (the rest are rejected, never approximated), and the config.json of an export."""
import json
import os

from rljax.model import transformer as model_lib

SUPPORTED_TYPES = ('qwen3', 'qwen3_moe')
RUNTIME_FIELDS = ('moe_impl', 'dtype', 'param_dtype', 'remat', 'router_replay')  # not architecture


def read_json(path):
  """The JSON object in `path`; ValueError naming the file when it is anything else."""
  try:
    with open(path) as f:
      value = json.load(f)
  except OSError as error:
    raise ValueError(f'cannot read {path}: {error.strerror or error}') from None
  except ValueError as error:   # JSONDecodeError, UnicodeDecodeError
    raise ValueError(f'{path} is not valid JSON ({error})') from None
  if not isinstance(value, dict):
    raise ValueError(f'{path} is not a JSON object')
  return value


def read_config(hf_dir):
  path = os.path.join(hf_dir, 'config.json')
  if not os.path.exists(path):
    raise ValueError(f'{hf_dir} is not a Hugging Face model directory: no config.json')
  return read_json(path)


def _rope_theta(hf):
  """Plain RoPE only: transformers 4 writes rope_theta (+ rope_scaling),
  5 writes rope_parameters."""
  params = hf.get('rope_parameters') or {}
  scaling = hf.get('rope_scaling') or {}
  rope_type = params.get('rope_type', scaling.get('rope_type', scaling.get('type', 'default')))
  if rope_type != 'default':
    raise ValueError(f'rope type {rope_type!r} is not supported (only plain RoPE)')
  return float(params.get('rope_theta', hf.get('rope_theta', 10000.0)))


def model_config(hf, **runtime) -> model_lib.ModelConfig:
  """The rljax ModelConfig of a Qwen3 / Qwen3-MoE config.json dict; `runtime` sets moe_impl, dtypes,
  remat, router_replay. Architectures rljax cannot compute exactly are rejected, never
  approximated."""
  unknown = set(runtime) - set(RUNTIME_FIELDS)
  if unknown:
    raise ValueError(f'not runtime model fields: {sorted(unknown)}; allowed: {RUNTIME_FIELDS}')
  kind = hf.get('model_type')
  if kind not in SUPPORTED_TYPES:
    raise ValueError(f'model_type {kind!r} is not supported; supported: {SUPPORTED_TYPES}')
  if hf.get('attention_bias', False):
    raise ValueError('attention_bias=true is not supported (Qwen3 has no attention biases)')
  if hf.get('hidden_act', 'silu') != 'silu':
    raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported (only silu)")
  if hf.get('use_sliding_window', False) or 'sliding_attention' in (hf.get('layer_types') or []):
    raise ValueError('sliding-window attention is not supported')
  required = ['vocab_size', 'hidden_size', 'num_hidden_layers', 'num_attention_heads',
              'intermediate_size', 'rms_norm_eps']
  missing = [key for key in required if key not in hf]
  if missing:
    raise ValueError(f'config.json lacks {missing}')
  heads = hf['num_attention_heads']
  fields = dict(
      vocab_size=hf['vocab_size'], d_model=hf['hidden_size'], num_layers=hf['num_hidden_layers'],
      num_heads=heads, num_kv_heads=hf.get('num_key_value_heads') or heads,
      head_dim=hf.get('head_dim') or hf['hidden_size'] // heads,
      dense_hidden=hf['intermediate_size'], tie_embeddings=bool(hf.get('tie_word_embeddings')),
      rope_theta=_rope_theta(hf), norm_eps=float(hf['rms_norm_eps']),
      init_std=float(hf.get('initializer_range', 0.02)), num_experts=0)
  # transformers 5 writes the latter
  num_experts = hf.get('num_experts', hf.get('num_local_experts'))
  if kind == 'qwen3_moe' and num_experts:
    sparse_step, dense_layers = hf.get('decoder_sparse_step', 1), hf.get('mlp_only_layers') or []
    if sparse_step != 1 or dense_layers:
      raise ValueError(
          f'mixed dense/MoE layers (decoder_sparse_step={sparse_step}, mlp_only_layers='
          f'{dense_layers}) are not supported: rljax scans identical layers, so every layer must '
          f'be MoE (decoder_sparse_step=1, mlp_only_layers=[])')
    if not hf.get('norm_topk_prob', False):
      raise ValueError(
          'norm_topk_prob=false is not supported: rljax renormalises the top-k weights')
    if 'num_experts_per_tok' not in hf or 'moe_intermediate_size' not in hf:
      raise ValueError(
          'config.json of a Qwen3-MoE lacks num_experts_per_tok or moe_intermediate_size')
    fields.update(num_experts=num_experts, experts_per_token=hf['num_experts_per_tok'],
                  expert_hidden=hf['moe_intermediate_size'])
  return model_lib.ModelConfig(**fields, **runtime)


def hf_config(cfg: model_lib.ModelConfig, **extra) -> dict:
  """A transformers config.json dict for `cfg` (Qwen3 when dense, Qwen3-MoE otherwise)."""
  moe = bool(cfg.num_experts)
  config = dict(
      architectures=['Qwen3MoeForCausalLM' if moe else 'Qwen3ForCausalLM'],
      model_type='qwen3_moe' if moe else 'qwen3', vocab_size=cfg.vocab_size,
      hidden_size=cfg.d_model, num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim, intermediate_size=cfg.dense_hidden, hidden_act='silu',
      rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, rope_scaling=None,
      tie_word_embeddings=cfg.tie_embeddings, attention_bias=False, use_sliding_window=False,
      initializer_range=cfg.init_std, max_position_embeddings=40960)
  if moe:
    config.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.experts_per_token,
                  moe_intermediate_size=cfg.expert_hidden, norm_topk_prob=True,
                  decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.001)
  config.update(extra)
  return config
